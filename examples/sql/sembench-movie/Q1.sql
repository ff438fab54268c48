-- Five clearly positive reviews (any movie). Return reviewId.
-- score: rows 5
SELECT reviewid
FROM movie.reviews
WHERE sem_filter('{reviews.reviewtext} is clearly positive')
LIMIT 5
