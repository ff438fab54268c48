SELECT scoresentiment, count(*) AS count FROM movie.reviews WHERE id = 'taken_3' GROUP BY scoresentiment ORDER BY 1
