-- Ten pairs of reviews that express the *same* sentiment (both positive or both negative) for movie
-- 'ant_man_and_the_wasp_quantumania'. Return id, reviewId from first review, reviewId from second review.
-- A semantic join: sem_filter in JOIN ... ON judges the pairs of the movie's reviews (each of its 128 reviews is
-- listed twice, so each side reads them once: 16,256 pairs). The predicate compares one property of the two sides,
-- so its reference is project-then-join (each review projected once onto "positive or negative", a pair scored by
-- whether its sides agree); the LLM reading the pair and the reviews' embedding cosine are its other candidates.
-- score: rows 10
SELECT r1.id, r1.reviewid AS reviewid1, r2.reviewid AS reviewid2
FROM (SELECT DISTINCT id, reviewid, reviewtext FROM movie.reviews WHERE id = 'ant_man_and_the_wasp_quantumania') r1
JOIN (SELECT DISTINCT id, reviewid, reviewtext FROM movie.reviews WHERE id = 'ant_man_and_the_wasp_quantumania') r2
  ON r1.id = r2.id AND r1.reviewid <> r2.reviewid
 AND sem_filter('{r1.reviewtext} and {r2.reviewtext} express the same sentiment')
LIMIT 10
