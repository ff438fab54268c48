-- The critic's own score, on a 1-5 scale: 'a/b' scores only (letter grades and blanks are not scored).
SELECT reviewid,
       5.0 * CAST(split_part(originalscore, '/', 1) AS DOUBLE) / CAST(split_part(originalscore, '/', 2) AS DOUBLE) AS reviewscore
FROM movie.reviews
WHERE id = 'ant_man_and_the_wasp_quantumania' AND originalscore LIKE '%/%'
