#!/bin/bash
# BIN, OUT and STRETTO_HOME (a model home holding the demo's models and KV caches) from the environment; $1 = binary
# tag, $2 = targets: the demo's query, models and 30% sample over the first 200 reviews, a fresh memo and cost record
: "${BIN:?the stretto CLI}" "${OUT:?an output folder}" "${STRETTO_HOME:?the model home}"
Q="{reviews.reviewtext} discusses the story or the plot -- Say whether the [sentiment] of {reviews.reviewtext} is positive or negative"
export STRETTO_MEMO_DIR=$OUT/memo-$1-$2
rm -rf $STRETTO_MEMO_DIR $OUT/run-$1-$2
/usr/bin/time -f "wall %e s" $BIN query --dataset movie --limit 200 --models smollm2-135m,qwen2.5-coder-0.5b,minilm \
  --sample 0.3 --precision $2 --recall $2 --check --query "$Q" --run-dir $OUT/run-$1-$2 > $OUT/$1-$2.out 2>&1
echo "exit $?" >> $OUT/$1-$2.out
