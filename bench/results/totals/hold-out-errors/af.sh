#!/bin/bash
# BIN, OUT and STRETTO_HOME from the environment; $1 = binary tag, $2 = targets: the activity-and-fit maps over the
# first 200 e-commerce descriptions, a 30% sample (60 tuples), ladder SmolLM2-135M -> Qwen2.5-Coder-0.5B (gold), fresh memo
: "${BIN:?the stretto CLI}" "${OUT:?an output folder}" "${STRETTO_HOME:?the model home}"
export STRETTO_MEMO_DIR=$OUT/afmemo-$1-$2
rm -rf $STRETTO_MEMO_DIR $OUT/afrun-$1-$2
/usr/bin/time -f "wall %e s" $BIN query --dataset ecommerce --query "Extract the intended [activity] or sport (e.g., football, running, training, casual) mentioned in {products.description}; return null if not specified -- Extract the [fitting] or fit type (e.g., regular, comfort, athletic, fitted) mentioned in {products.description}; return null if not mentioned" --limit 200 --sample 0.3 --precision $2 --recall $2 --check --ladder smollm2-135m,qwen2.5-coder-0.5b --run-dir $OUT/afrun-$1-$2 > $OUT/af-$1-$2.out 2>&1
echo "exit $?" >> $OUT/af-$1-$2.out
