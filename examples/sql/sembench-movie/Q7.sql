-- All pairs of reviews that express the *opposite* sentiment (one positive, the other negative) for movie
-- 'ant_man_and_the_wasp_quantumania'. Return id, reviewId from first review, reviewId from second review.
-- Project, then join: the certified filter labels each of the 256 reviews once; the pairs are relational.
-- score: rows
CREATE TABLE positive AS
SELECT reviewid FROM movie.reviews WHERE id = 'ant_man_and_the_wasp_quantumania' AND sem_filter('{reviews.reviewtext} is a positive review');
CREATE TABLE labelled AS
SELECT r.id, r.reviewid, p.reviewid IS NOT NULL AS positive
FROM movie.reviews r LEFT JOIN (SELECT DISTINCT reviewid FROM positive) p ON r.reviewid = p.reviewid
WHERE r.id = 'ant_man_and_the_wasp_quantumania';
SELECT DISTINCT r1.id, r1.reviewid AS reviewid1, r2.reviewid AS reviewid2
FROM labelled r1 JOIN labelled r2 ON r1.id = r2.id AND r1.reviewid <> r2.reviewid
WHERE r1.positive <> r2.positive
