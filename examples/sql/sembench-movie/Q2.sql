-- Five positive reviews for movie "taken_3". Return reviewId.
-- score: rows 5
SELECT reviewid
FROM movie.reviews
WHERE id = 'taken_3' AND sem_filter('{reviews.reviewtext} is a positive review')
LIMIT 5
