"""The kernel compiles for sm_90 (Hopper) on this GPU-less machine.

Named to sort first: with a cold Triton cache (a fresh CI machine) this file is the suite's
longest (~5 min on the 2-core machine), and `make test` hands files out in name order
(`--no-loadscope-reorder`: by default xdist starts the files with the most tests first, which
left this one-test file last).

The interpreter runs the kernel's Python semantics but not the compiler's type rules, layout
passes or register allocation; this runs the real Triton pipeline down to a cubin in a fresh
process (without TRITON_INTERPRET) for the constexpr variants of every kernel, and checks that the
registers and spills reported are those of the cubin Triton built (ptxas with Triton's flags), that
none spills but the variants of aot.SPILL_BOUND, each within its bound, that no fp32 division is
approximate, and that every read of a row's list that other threads stored is behind a barrier.
"""
import os
import re
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def test_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "gpu_sampler.kernels.aot"], env=env,
                       capture_output=True, text=True, timeout=900)  # a hang guard: ~2-5 min
    assert r.returncode == 0, r.stderr[-3000:]
    from gpu_sampler.kernels import sampling
    from gpu_sampler.kernels.aot import MERGE_SPILL_BOUND, SPILL_BOUND, VARIANTS
    lines = [ln for ln in r.stdout.splitlines() if "sm_90 cubin" in ln]
    assert len(lines) == len(VARIANTS), r.stdout
    # the usage reported is the launched cubin's: ptxas run with Triton's flags wrote the same
    # bytes (bare, it allocated otherwise and reported fewer spills: aot.PTXAS_FLAGS)
    assert not [ln for ln in lines if "NOT THE BUILT CUBIN" in ln or "unavailable" in ln]
    # no variant spills but those named in SPILL_BOUND, each within its bound; the merges'
    # one-program-per-SM caps (the launcher's at most one row an SM) are variants of their
    # own and spill nothing
    spills = []
    for ln in lines:
        m = re.match(r"(.*): sm_90 cubin \d+ bytes; \d+ registers, (\d+) bytes spilled", ln)
        if m and int(m.group(2)) > SPILL_BOUND.get(m.group(1), 0):
            spills.append(ln)
    assert not spills, spills
    assert all(VARIANTS[n + " one per SM"][1]["maxnreg"] == sampling.MERGE_REGS_ONE
               for n in MERGE_SPILL_BOUND)
    # every fp32 division is exact: Triton's `/` (div.full.f32, within 2 ulps) is nowhere
    # (common._quotient, tests/test_quotient.py)
    approx = [ln for ln in lines if "APPROX" in ln]
    assert not approx, approx
    # a list stored by some threads and read back by others needs a bar.sync between
    # (aot.unfenced_list_reads; an H200 read stale band-list entries without one)
    racy = [ln for ln in lines if "UNFENCED" in ln]
    assert not racy, racy


def test_unfenced_list_read_is_found():
    """The PTX check flags a list load that follows a list store with no barrier between, and
    passes it once a bar.sync lies between (a hand-made PTX over this repo's band.py lines)."""
    from gpu_sampler.kernels import aot, band
    path = band.__file__
    src = open(path).read().splitlines()
    st = next(i + 1 for i, ln in enumerate(src) if "tl.store(xs_ptr " in ln)
    ld = next(i + 1 for i, ln in enumerate(src) if "tl.load(xs_ptr " in ln)
    body = [f'.loc 1 {st} 5', 'st.global.b32 [%rd1], %r1;', f'.loc 1 {ld} 13',
            'ld.global.b32 %r2, [%rd2];', f'.file 1 "{path}"']
    assert aot.unfenced_list_reads("\n".join(body)) == [("band.py", ld)]
    assert aot.unfenced_list_reads("\n".join(body[:2] + ["bar.sync 0;"] + body[2:])) == []
    # a cached PTX may name another checkout's copy (Triton's cache keys on the source): the
    # check reads the file beside aot.py (a removed worktree's path raised FileNotFoundError)
    body[-1] = '.file 1 "/gone/checkout/gpu_sampler/kernels/band.py"'
    assert aot.unfenced_list_reads("\n".join(body)) == [("band.py", ld)]


def test_approximate_division_is_found():
    """The PTX check names the line of a div.full.f32 (Triton's fp32 `/`) and passes div.rn."""
    from gpu_sampler.kernels import aot
    body = ['.file 1 "/x/common.py"', '.loc 1 603 13', 'div.full.f32 %r2, %r1, %r5;',
            '.loc 1 610 9', 'div.rn.f32 %r3, %r1, %r5;']
    assert aot.approx_divisions("\n".join(body)) == [("common.py", 603)]
    assert aot.approx_divisions("\n".join(body[:1] + body[3:])) == []


def test_merge_cap_follows_rows_per_sm():
    """The merge's register cap (sampling._merge_regs): 168 while each SM runs at most one of
    its programs (no occupancy to lose: the exact quotient's merges spill nothing there), 128
    past one row an SM (two programs per SM; aot.MERGE_SPILL_BOUND's few bytes), 192 for the
    row-state and direct-history merges as before."""
    import types

    import torch

    from gpu_sampler.kernels import sampling
    if torch.version.hip:
        pytest.skip("no register caps on ROCm")
    c = types.SimpleNamespace(top=types.SimpleNamespace(state=False), const={})
    cpu = torch.device("cpu")
    assert sampling._merge_regs(c, 1, cpu) == {"maxnreg": sampling.MERGE_REGS_ONE}
    assert sampling._merge_regs(c, sampling.SMS, cpu) == {"maxnreg": sampling.MERGE_REGS_ONE}
    assert sampling._merge_regs(c, sampling.SMS + 1, cpu) == {"maxnreg": sampling.MERGE_REGS}
    c.const = {"HDIRECT": True}
    assert sampling._merge_regs(c, 1, cpu) == {"maxnreg": sampling.MERGE_REGS_STATE}


def test_one_per_sm_variants_take_their_base_ptx():
    """aot compiles a merge's one-program-per-SM variant as its base variant's PTX with
    another .maxnreg line (Triton's PTX differs in nothing else between caps: all seven, cubins
    byte for byte, bench/aot_derived.py): that line alone changes, and every such
    variant has its base among the variants."""
    from gpu_sampler.kernels import aot
    ptx = ('.version 8.7\n.target sm_90a\n.visible .entry k(\n.param .u64 p\n)\n.maxnreg 128\n'
           '{\nmov.u32 %r1, 128;\n// .maxnreg 128\n}\n')
    assert aot.at_cap(ptx, 168) == ptx.replace("\n.maxnreg 128\n", "\n.maxnreg 168\n")
    derived = [n for n in aot.VARIANTS if n.endswith(aot.ONE_PER_SM)]
    assert len(derived) == len(aot.MERGE_SPILL_BOUND)
    assert all(n[:-len(aot.ONE_PER_SM)] in aot.VARIANTS for n in derived)
