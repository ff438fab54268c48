SELECT DISTINCT r1.id, r1.reviewid AS reviewid1, r2.reviewid AS reviewid2
FROM movie.reviews r1 JOIN movie.reviews r2 ON r1.id = r2.id AND r1.reviewid <> r2.reviewid
WHERE r1.id = 'ant_man_and_the_wasp_quantumania' AND r1.scoresentiment = r2.scoresentiment
