SELECT CAST(sum(CASE WHEN scoresentiment = 'POSITIVE' THEN 1 ELSE 0 END) AS DOUBLE) / count(*) AS positivity_ratio
FROM movie.reviews WHERE id = 'taken_3'
