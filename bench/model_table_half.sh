#!/usr/bin/env bash
# Half of bench/model_table.sh: its settings on flat and sigma3 rows at (1, 128256) and
# (64, 128256), and the mixed batch on flat rows at B = 64 (~20 min on the 2-core machine).
#     bash bench/model_table_half.sh > table.txt
set -eu
cd "$(dirname "$0")/.."
tool=../shared/tools/gpu_model.py
cases=()
for B in 1 64; do
  for kind in flat sigma3; do
    for s in '"temperature": 0.0' '"temperature": 1.0' '"temperature": 0.6, "top_p": 0.9' \
             '"temperature": 1.0, "top_p": 0.95' '"temperature": 1.0, "min_p": 0.05' \
             '"temperature": 1.0, "top_k": 50'; do
      cases+=(--case "$B,128256,0,{\"plan_batch\": $B, \"row_kind\": \"$kind\", $s}")
    done
    cases+=(--case "$B,128256,128,{\"plan_batch\": $B, \"row_kind\": \"$kind\", \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.8, \"repetition_penalty\": 1.05}")
  done
done
nice -n 19 python3 "$tool" --project . --callable bench.model_call:sample_plan "${cases[@]}"
nice -n 19 python3 "$tool" --project . --callable bench.model_call:sample_plan --rows 5 \
  --case '64,128256,0,{"plan_batch": 64, "mixed": true, "seed": 1, "row_kind": "flat"}'
