-- Positivity ratio of reviews for movie "taken_3". Return the ratio as positivity_ratio.
-- The certified filter picks the positive reviews; the ratio is relational.
-- score: value
CREATE TABLE positive AS
SELECT reviewid FROM movie.reviews WHERE id = 'taken_3' AND sem_filter('{reviews.reviewtext} is a positive review');
SELECT CAST((SELECT count(*) FROM positive) AS DOUBLE) / count(*) AS positivity_ratio
FROM movie.reviews
WHERE id = 'taken_3'
