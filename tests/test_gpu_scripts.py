"""The GPU scripts of bench/ on CPU: a device call is scarce (minutes a task, when one is lent at
all), and a script that fails there loses its results. gpu_workloads.py's checks run here at a
small size under the interpreter; the others are imported and their case lists built."""
import os
import subprocess
import sys

import pytest

from conftest import BACKENDS, DEVICE

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)


@pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                    reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")
def test_gpu_workloads_checks_run_and_hold(tmp_path):
    import json

    import gpu_workloads
    for part, setting in (("1/7", "T1.0 p0.95"), ("7/7", "greedy per-row")):
        assert gpu_workloads.main(["--device", "cpu", "--smoke", "--part", part,
                                   "--out", str(tmp_path)]) == 0
        rows = json.load(open(tmp_path / "gpu_workloads.json"))["rows"]
        assert len(rows) == 1 and "error" not in rows[0], rows
        r = rows[0]
        assert r["setting"] == setting
        assert r["in_twin_support"] == r["tokens_equal_twin"] == r["rows"]
        assert r["bit_identical_chunks_1_5_and_sub_batch"] is True


def test_gpu_scripts_import_and_plan():
    import band_gpu  # noqa: F401
    import gpu_determinism
    import gpu_profile
    import gpu_sweep
    import gpu_workloads
    assert len(gpu_workloads.cases()) == 2 * 4 * 10 + 2 * 9 + 2 * 5 + 4
    assert {s for _, _, _, s in gpu_determinism.CASES} >= {"T1.0 p0.95", "mixed", "tuned"}
    assert gpu_sweep.GEOMS[0] == (None, None)  # the plan's own geometry first: the baseline
    assert "greedy" in gpu_profile.SETTINGS


def test_gpu_check_script_parses_and_runs_the_scripts():
    script = os.path.join(BENCH, "gpu_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    text = open(script).read()
    for name in ("gpu_workloads.py", "gpu_determinism.py", "gpu_bench.py", "gpu_profile.py"):
        assert name in text
