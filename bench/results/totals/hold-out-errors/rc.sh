#!/bin/bash
# BIN, OUT and STRETTO_HOME from the environment; $1 = binary tag, $2 = targets: "is a rave review" and the
# criticized-aspect map (a query whose 0.9 run lost 11.4 s in the committed report, there with the 1.5B as gold) over
# the first 200 reviews, a 30% sample (60 tuples), ladder SmolLM2-135M -> Qwen2.5-Coder-0.5B (gold), fresh memo
: "${BIN:?the stretto CLI}" "${OUT:?an output folder}" "${STRETTO_HOME:?the model home}"
export STRETTO_MEMO_DIR=$OUT/rcmemo-$1-$2
rm -rf $STRETTO_MEMO_DIR $OUT/rcrun-$1-$2
/usr/bin/time -f "wall %e s" $BIN query --dataset movie --query "{reviews.reviewtext} is a rave review -- Extract one aspect of the movie that is [criticized] in {reviews.reviewtext} (choose from plot, acting, cinematography, soundtrack, special effects, dialogue, or 'none' if no aspect is criticized)" --limit 200 --sample 0.3 --precision $2 --recall $2 --check --ladder smollm2-135m,qwen2.5-coder-0.5b --run-dir $OUT/rcrun-$1-$2 > $OUT/rc-$1-$2.out 2>&1
echo "exit $?" >> $OUT/rc-$1-$2.out
