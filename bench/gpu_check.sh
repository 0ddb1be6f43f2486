#!/usr/bin/env bash
# GPU check for a CUDA machine that already has torch, triton and transformers but no package
# registry: installs gpu-sampler without dependencies, runs the kernel tests on CUDA tensors,
# bench/gpu_workloads.py's checks and timings, the benchmarks, and writes everything into
# bench/results/gpu-<date>/. About 9.5 minutes at most (GPU_CHECK_BUDGET_S, default 570).
#
#   bash bench/gpu_check.sh            (or: make gpu-check)
#   PYTHON=python3.11 bash bench/gpu_check.sh
#   GPU_CHECK_FULL=1 bash bench/gpu_check.sh   # full-size generate benchmark (longer)
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python}
OUT=bench/results/gpu-$(date +%F)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
started=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-570}  # the whole script stays under 9.5 minutes
# cap N: N seconds, or what is left of the budget if that is less (at least 1).
cap() { local left=$(( BUDGET - ($(date +%s) - started) )); [ "$left" -lt "$1" ] && echo $(( left > 1 ? left : 1 )) || echo "$1"; }

note "gpu-sampler GPU check, $(date -Is), results in $OUT"

# 1. What machine and software this is.
(nvidia-smi && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
    --format=csv) > "$OUT/nvidia-smi.txt" 2>&1 || note "nvidia-smi failed (see nvidia-smi.txt)"
timeout "$(cap 30)" "$PY" - > "$OUT/versions.txt" 2>&1 <<'EOF'
import platform, sys
print("python", sys.version.replace("\n", " "))
print("platform", platform.platform())
for m in ("torch", "triton", "transformers", "numpy", "scipy", "pytest", "pytest_benchmark",
          "matplotlib"):
    try:
        mod = __import__(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", type(e).__name__)
import torch
print("cuda available", torch.cuda.is_available(), "cuda", torch.version.cuda)
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
EOF
cat "$OUT/versions.txt" | tee -a "$SUMMARY"
if ! timeout "$(cap 30)" "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    note "FAIL: torch sees no CUDA device; nothing to check"
    exit 1
fi

# 2. Install without touching any registry; if pip cannot (no setuptools/wheel), run from the
# source tree. gpu_sampler.kernels is the top-level kernels/ folder (see pyproject.toml), so the
# fallback links it into the package for the duration of this script.
LINK=""
if timeout "$(cap 60)" "$PY" -m pip install --no-deps --no-build-isolation --no-index -e . \
        > "$OUT/pip.log" 2>&1 && (cd /tmp && "$PY" -c "import gpu_sampler.kernels") >> "$OUT/pip.log" 2>&1; then
    note "install: pip install -e . (no deps) ok"
else
    note "install: pip failed (see pip.log); using PYTHONPATH=$ROOT"
    if [ ! -e gpu_sampler/kernels ]; then
        ln -s ../kernels gpu_sampler/kernels
        LINK=gpu_sampler/kernels
    fi
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
cleanup() { [ -n "$LINK" ] && rm -f "$LINK"; }
trap cleanup EXIT

# The benchmark suites import tests.models from the source tree.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GPU_SAMPLER_BENCH_DEVICE=cuda
unset TRITON_INTERPRET

# 3. Correctness, compiling as it goes, in parallel (nothing is timed here): the kernel tests on
# CUDA tensors (compiled Triton, not the interpreter) beside bench/gpu_determinism.py and
# bench/gpu_workloads.py's checks in four processes, which also fill Triton's cache for the
# timed runs below.
GPU_SAMPLER_TEST_DEVICE=cuda timeout "$(cap 200)" "$PY" -m pytest tests/test_sampler.py tests/test_gpu.py \
    -q -p no:cacheprovider -rs -n "${GPU_CHECK_TEST_WORKERS:-6}" --junitxml="$OUT/tests.xml" \
    > "$OUT/tests.log" 2>&1 &
tests_pid=$!
# run-to-run bits of the band and list settings (a barrier missing shows only on a GPU)
timeout "$(cap 200)" "$PY" bench/gpu_determinism.py --out "$OUT" --label check --repeats 10 \
    --budget-s 150 > "$OUT/gpu_determinism.log" 2>&1 &
for part in 1 2 3 4; do
    timeout "$(cap 200)" "$PY" bench/gpu_workloads.py --warm --part "$part/4" --out "$OUT" \
        > "$OUT/gpu_workloads-warm-$part.log" 2>&1 &
done
wait "$tests_pid"
rc=$?
note "kernel tests: exit $rc ($(tail -n 1 "$OUT/tests.log"))"
wait
note "gpu_determinism.py: $(grep -c '"rows_differing_any": 0,' "$OUT/gpu_determinism.log") of $(grep -c '"rows"' "$OUT/gpu_determinism.log") cases with no row differing"
note "gpu_workloads.py checks: $(cat "$OUT"/gpu_workloads-warm-*.log | grep -c '"bit_identical_chunks_1_5_and_sub_batch": true') cases bit-identical, $(cat "$OUT"/gpu_workloads-warm-*.log | grep -c '"error"') errors"

# 4. Timed, one at a time: issue 17's workload table (CUDA-graph replay per call, kernels per
# call), then the plain timing script against HF (effective bandwidth against a measured copy;
# needs no plugin), then where a call's time goes (host time check=True / False, graph replay
# against eager tokens, kernels and syncs per call), then the pytest-benchmark suites.
timeout "$(cap 170)" "$PY" bench/gpu_workloads.py --out "$OUT" --budget-s 120 > "$OUT/gpu_workloads.log" 2>&1
note "gpu_workloads.py: exit $?"
timeout "$(cap 90)" "$PY" bench/gpu_bench.py --device cuda --n 20 --out "$OUT" > "$OUT/gpu_bench.log" 2>&1
note "gpu_bench.py: exit $?"
timeout "$(cap 100)" "$PY" bench/gpu_profile.py --out "$OUT" > "$OUT/gpu_profile.log" 2>&1
note "gpu_profile.py: exit $?"
if "$PY" -c "import pytest_benchmark" 2>/dev/null; then
    for suite in sampler generate; do
        quick=""
        if [ "$suite" = generate ] && [ "${GPU_CHECK_FULL:-0}" != 1 ]; then quick=1; fi
        GPU_SAMPLER_BENCH_QUICK=$quick timeout "$(cap 100)" "$PY" -m pytest "bench/test_${suite}_bench.py" \
            -q -p no:cacheprovider --benchmark-only --benchmark-json="$OUT/${suite}-bench.json" \
            > "$OUT/${suite}-bench.log" 2>&1
        note "bench $suite${quick:+ (quick)}: exit $? ($(tail -n 1 "$OUT/${suite}-bench.log"))"
        if [ -f "$OUT/${suite}-bench.json" ]; then
            timeout "$(cap 20)" "$PY" bench/report.py "$OUT/${suite}-bench.json" > "$OUT/${suite}-report.log" 2>&1 \
                || note "report.py failed for $suite (see ${suite}-report.log)"
        fi
    done
else
    note "pytest-benchmark missing: plain timing script only"
fi
[ -f "$OUT/gpu_workloads.md" ] && cat "$OUT/gpu_workloads.md" | tee -a "$SUMMARY"
[ -f "$OUT/gpu_bench.md" ] && cat "$OUT/gpu_bench.md" | tee -a "$SUMMARY"
[ -f "$OUT/gpu_profile.md" ] && cat "$OUT/gpu_profile.md" | tee -a "$SUMMARY"
for md in "$OUT"/*-bench.md; do [ -f "$md" ] && cat "$md" | tee -a "$SUMMARY"; done

note "done in $(( $(date +%s) - started )) s; everything is in $OUT"
