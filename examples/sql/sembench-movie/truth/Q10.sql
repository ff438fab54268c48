-- SemBench ranks by the audience score, which is not bundled; this ranks by the share of the movie's critics whose
-- review is labelled POSITIVE (the Tomatometer), from the same reviews.
SELECT id AS movieid, avg(CASE WHEN scoresentiment = 'POSITIVE' THEN 1.0 ELSE 0.0 END) AS moviescore
FROM movie.reviews GROUP BY id ORDER BY moviescore DESC
