-- Count of positive reviews for movie "taken_3". Return the count as positive_review_cnt.
-- score: value
SELECT count(*) AS positive_review_cnt
FROM movie.reviews
WHERE id = 'taken_3' AND sem_filter('{reviews.reviewtext} is a positive review')
