#!/bin/bash
# Experiment 1 on one dataset of the small scale with the bench's ladder (SmolLM2-135M, Qwen2.5-Coder-0.5B,
# Qwen2.5-Coder-1.5B as gold), a fresh memo. DATASET (movie, ecommerce, email or photos), BIN (the CLI), OUT (a new
# folder), STRETTO_HOME (a model home holding the models) and STRETTO_KV_DIR (a KV directory; caches it lacks are
# built first, in no total) from the environment. Prefill beforehand, beside other work, with
#   "$BIN" bench all --scale small --datasets "$DATASET" --prefill-only
# and let nothing else run during this script: each answer is priced at the seconds it took.
: "${DATASET:?movie, ecommerce, email or photos}" "${BIN:?the stretto CLI}" "${OUT:?an output folder}"
: "${STRETTO_HOME:?the model home}" "${STRETTO_KV_DIR:?a KV directory}"
export STRETTO_MEMO_DIR=$OUT/memo STRETTO_DISK_BUDGET=50000000000
rm -rf "$STRETTO_MEMO_DIR" "$OUT/out"
/usr/bin/time -v "$BIN" bench exp1 --scale small --datasets "$DATASET" --out "$OUT/out" > "$OUT/log.out" 2>&1
echo "exit $?" >> "$OUT/log.out"
python3 "$(dirname "$0")/combine.py" "$DATASET=$OUT/out/results.csv"
