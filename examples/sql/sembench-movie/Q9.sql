-- Score from 1 to 5 how much the reviewer liked the movie, for the reviews of movie
-- 'ant_man_and_the_wasp_quantumania'. Return reviewId, reviewScore.
-- score: rank
SELECT reviewid,
       sem_map('From 1 to 5, how much did the critic who wrote {reviews.reviewtext} like the movie?', 'integer') AS reviewscore
FROM movie.reviews
WHERE id = 'ant_man_and_the_wasp_quantumania'
