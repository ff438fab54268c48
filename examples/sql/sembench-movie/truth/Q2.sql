SELECT reviewid FROM movie.reviews WHERE id = 'taken_3' AND scoresentiment = 'POSITIVE'
