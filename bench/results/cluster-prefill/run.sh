#!/bin/bash
# Cold cluster run (empty shared KV dir, empty memos): 400 reviews in 4 parquet files, scheduler + 2 executors.
set -u
export STRETTO_HOME=/work/scratch/s98/home
M=/work/scratch/m
Q="SELECT reviewid, sem_map('The movie title named in {reviews.reviewtext}') AS title FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive')"
for v in ${VS:-before after}; do
  W=$M/w-$v; rm -rf $W; mkdir -p $W/reviews
  B=$M/stretto-$v
  for i in 0 1 2 3; do
    $B sql "COPY (SELECT reviewid, reviewtext FROM movie.reviews ORDER BY reviewid LIMIT 100 OFFSET $((i*100))) TO '$W/reviews/part-$i.parquet'" > /dev/null 2>&1
  done
  P=$((51000 + RANDOM % 1000))
  RUST_LOG=info $B scheduler --port $P > /dev/null 2> $W/scheduler.log & S=$!
  sleep 3
  EX=()
  for i in 0 1; do
    RUST_LOG=info $B executor --scheduler 127.0.0.1:$P --id ex$i --port $((P+10+i)) --grpc-port $((P+20+i)) --work-dir $W/ex$i \
      --kv-dir $W/kv --memo-dir $W/ex$i/memo --ladder smollm2-135m --models minilm,smollm2-135m > /dev/null 2> $W/ex$i.log &
    EX+=($!)
  done
  for i in 0 1; do until grep -q "Connected to scheduler" $W/ex$i.log 2>/dev/null; do sleep 1; done; done
  sleep 1
  STRETTO_KV_DIR=$W/kv STRETTO_MEMO_DIR=$W/client-memo /usr/bin/time -f "%e s wall" -o $W/time.txt $B sql --cluster 127.0.0.1:$P --input reviews=$W/reviews/ --ladder smollm2-135m --models minilm,smollm2-135m \
     --json "$Q" > $W/out.json 2> $W/client.log
  echo "$v exit $?: $(cat $W/time.txt)"
  kill ${EX[@]} $S; wait 2>/dev/null
done
echo finished > $M/finished
