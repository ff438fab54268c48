#!/bin/bash
# LOTUS' plan on each committed shared profile (bench/results/runs/*/profile.json): the committed plan (proxy chosen
# by separation, the old rule's fallback) against a plan optimized now (the cheapest uncompressed LLM rung), both
# replayed on the profile. Run from the repository root with the CLI built: bash bench/results/totals/lotus-proxy/compare.sh
set -u
B=${STRETTO:-target/debug/stretto}
out=$(mktemp -d)
for d in bench/results/runs/*/; do
  n=$(basename "$d")
  for t in 0.5 0.7 0.9; do
    [ -f "$d/lotus-$t/plan.json" ] || continue
    old=$($B replay --profile "$d/profile.json" --plan "$d/lotus-$t/plan.json" | tr -d '\n')
    $B optimize --profile "$d/profile.json" --precision $t --recall $t --method lotus --out "$out/$n-$t.json" > /dev/null
    new=$($B replay --profile "$d/profile.json" --plan "$out/$n-$t.json" | tr -d '\n')
    echo "$n $t OLD $old NEW $new"
  done
done
