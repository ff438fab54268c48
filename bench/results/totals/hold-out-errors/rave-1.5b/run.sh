#!/bin/bash
# BIN, OUT and STRETTO_HOME (a model home holding the three models) from the environment; $1 = binary tag, $2 = run
# tag, $3 = targets: "is a rave review" and the criticized-aspect map over the first 400 reviews, the default sample
# (15%, 60 tuples), the bench's ladder SmolLM2-135M -> Qwen2.5-Coder-0.5B -> Qwen2.5-Coder-1.5B (gold), fresh memo;
# the first run builds the KV caches it lacks (its KV-cache phase is counted in no total)
: "${BIN:?the stretto CLI}" "${OUT:?an output folder}" "${STRETTO_HOME:?the model home}"
export STRETTO_MEMO_DIR=$OUT/memo-$1-$2 STRETTO_DISK_BUDGET=50000000000
rm -rf $STRETTO_MEMO_DIR $OUT/run-$1-$2
/usr/bin/time -f "wall %e s" $BIN query --dataset movie --query "{reviews.reviewtext} is a rave review -- Extract one aspect of the movie that is [criticized] in {reviews.reviewtext} (choose from plot, acting, cinematography, soundtrack, special effects, dialogue, or 'none' if no aspect is criticized)" --limit 400 --precision $3 --recall $3 --check --ladder smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b --run-dir $OUT/run-$1-$2 > $OUT/$1-$2-$3.out 2>&1
echo "exit $?" >> $OUT/$1-$2-$3.out
