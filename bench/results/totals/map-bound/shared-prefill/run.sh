#!/bin/bash
# usage: q.sh BIN TAG
BIN=$1; TAG=$2
rm -rf /tmp/q-$TAG; mkdir -p /tmp/q-$TAG
cd /tmp/q-$TAG
STRETTO_KV_DIR=/tmp/q-$TAG/kv STRETTO_MEMO_DIR=/tmp/q-$TAG/memo /usr/bin/time -v $BIN query --dataset ecommerce --limit 200 \
  --query "{products.description} contains warranty information -- Extract the [brand_name] mentioned in {products.description}; return null if no brand is explicitly mentioned" \
  --ladder smollm2-135m,qwen2.5-coder-0.5b --precision 0.7 --recall 0.7 --disk-budget 4000000000 --json --run-dir /tmp/q-$TAG/run > /tmp/q-$TAG/out.json 2> /tmp/q-$TAG/err.log
echo rc=$?
