-- Every clearly positive review: a right answer is any five of them.
SELECT reviewid FROM movie.reviews WHERE scoresentiment = 'POSITIVE'
