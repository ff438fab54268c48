SELECT count(*) AS positive_review_cnt FROM movie.reviews WHERE id = 'taken_3' AND scoresentiment = 'POSITIVE'
