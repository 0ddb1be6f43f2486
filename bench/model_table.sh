#!/usr/bin/env bash
# The modelled H100/H200 time (../shared/tools/gpu_model.py: a SASS-level model, not a
# measurement) of every bench/workloads.py setting on every row kind at (1, 128256) and
# (64, 128256), each with the batch's own chunk plan (bench/model_call.py), then the mixed
# serving batch. ~60-90 min on the 2-core machine (the top-p row passes dominate); KINDS picks
# the row kinds (half the table, ~25 min: KINDS="flat sigma3").
#     bash bench/model_table.sh [checkout] > table.txt
set -eu
project=${1:-.}
tool=$(dirname "$0")/../../shared/tools/gpu_model.py
cases=()
for B in 1 64; do
  for kind in ${KINDS:-flat powerlaw sigma3 confident}; do
    for s in '"temperature": 0.0' '"temperature": 1.0' '"temperature": 0.6, "top_p": 0.9' \
             '"temperature": 1.0, "top_p": 0.95' '"temperature": 1.0, "min_p": 0.05' \
             '"temperature": 1.0, "top_k": 50'; do
      cases+=(--case "$B,128256,0,{\"plan_batch\": $B, \"row_kind\": \"$kind\", $s}")
    done
    cases+=(--case "$B,128256,128,{\"plan_batch\": $B, \"row_kind\": \"$kind\", \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.8, \"repetition_penalty\": 1.05}")
  done
done
nice -n 19 python3 "$tool" --project "$project" --callable bench.model_call:sample_plan "${cases[@]}"
nice -n 19 python3 "$tool" --project "$project" --callable bench.model_call:sample_plan --rows 5 \
  --case '1,128256,0,{"plan_batch": 1, "mixed": true, "seed": 1, "row_kind": "flat"}' \
  --case '64,128256,0,{"plan_batch": 64, "mixed": true, "seed": 1, "row_kind": "flat"}' \
  --case '64,128256,0,{"plan_batch": 64, "mixed": true, "seed": 1, "row_kind": "sigma3"}'
