#!/bin/bash
# BIN, OUT and STRETTO_KV_DIR from the environment; $1 = binary tag, $2 = run tag, $3 = target; activity + fit maps over 400 e-commerce rows, bench ladder (1.5B gold), bench KV caches, fresh memo
: "${BIN:?the stretto CLI}" "${OUT:?an output folder}" "${STRETTO_KV_DIR:?the bench KV caches}"
export STRETTO_MEMO_DIR=$OUT/memo-$1-$2 STRETTO_DISK_BUDGET=50000000000
rm -rf $STRETTO_MEMO_DIR $OUT/run-$1-$2
/usr/bin/time -f "wall %e s" $BIN query --dataset ecommerce --query "Extract the intended [activity] or sport (e.g., football, running, training, casual) mentioned in {products.description}; return null if not specified -- Extract the [fitting] or fit type (e.g., regular, comfort, athletic, fitted) mentioned in {products.description}; return null if not mentioned" --limit 400 --precision $3 --recall $3 --check --ladder smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b --run-dir $OUT/run-$1-$2 --output $OUT/$1-$2.csv > $OUT/$1-$2.out 2>&1
echo "exit $?" >> $OUT/$1-$2.out
