-- The number of positive and negative reviews for movie "taken_3". Return scoreSentiment and count.
-- score: value
CREATE TABLE positive AS
SELECT reviewid FROM movie.reviews WHERE id = 'taken_3' AND sem_filter('{reviews.reviewtext} is a positive review');
SELECT CASE WHEN p.reviewid IS NULL THEN 'NEGATIVE' ELSE 'POSITIVE' END AS scoresentiment, count(*) AS count
FROM movie.reviews r LEFT JOIN (SELECT DISTINCT reviewid FROM positive) p ON r.reviewid = p.reviewid
WHERE r.id = 'taken_3'
GROUP BY 1
ORDER BY 1
