-- Rank the movies: score every review from 1 to 5, then average the scores per movie. Return movieId, movieScore.
-- score: rank
SELECT id AS movieid,
       avg(sem_map('From 1 to 5, how much did the critic who wrote {reviews.reviewtext} like the movie?', 'integer')) AS moviescore
FROM movie.reviews
GROUP BY id
ORDER BY moviescore DESC
