"""The GPU rounds as the interpreter and the twin do: no product-and-sum contracted into one fma.

Triton 3.9 compiles with enable_fp_fusion=True unless a launch says otherwise (its knob warns
that the default changes in 3.10), so on a GPU `a * b + c` became one fma.rn.f32, one rounding,
where the interpreter and the torch twin round twice. The penalties' xp - (pres + freq * count)
is such a sum (stats:per-row+pf's PTX held 24 contracted fmas on that line): with frequency /
presence penalties a GPU's xp could differ from the twin's in the last bit, and with it a tie
group or a threshold. Every launch now passes kernels.launch.exact_fp(); an explicit tl.fma
(the noise's series, the quotient's correction) still rounds once on both sides.
"""
import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gpu_sampler.kernels import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _launches(path):
    """(line, has exact_fp()) of each `kernel[grid](...)` call in a source file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            spread = [k.value for k in node.keywords if k.arg is None]
            ok = any(isinstance(v, ast.Call) and getattr(v.func, "id", "") == "exact_fp"
                     for v in spread)
            out.append((node.lineno, ok))
    return out


def test_every_launch_turns_contraction_off():
    # (kernels/ holds every launch: the ops above it call launchers, never a kernel)
    files = [p for p in (ROOT / "kernels").glob("*.py") if p.name != "aot.py"]
    found = {p.name: _launches(p) for p in files}
    missing = [(name, ln) for name, calls in found.items() for ln, ok in calls if not ok]
    assert not missing, missing
    # every kernel module's launches were seen (sampling.py alone has eleven)
    assert sum(len(c) for c in found.values()) >= 13, found
    assert len(found["sampling.py"]) >= 11


def test_exact_fp_options(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert launch.exact_fp() == {"enable_fp_fusion": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter takes no compile options
    assert launch.exact_fp() == {}


def test_penalty_sum_differs_when_contracted():
    """Why it matters: for freq 0.1, count 3 and presence 0.5 (a common setting), one rounding
    of 0.1 x 3 + 0.5 is not the twin's fl(fl(0.1 x 3) + 0.5) for some logits' neighbours: the
    sum itself differs, so xp - sum can too."""
    interpreter = pytest.importorskip("triton._C.libtriton").interpreter
    freq = np.full(4096, 0.1, np.float32) * (1 + np.arange(4096, dtype=np.float32) * 2 ** -20)
    cnt = np.full_like(freq, 3.0)
    pres = np.full_like(freq, 0.5)
    twice = (freq * cnt) + pres
    once = interpreter.fma_fp32(freq, cnt, pres)
    assert (twice != once).any()


_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, c_ptr, o_ptr, pres, freq):
    i = tl.arange(0, 128)
    c = tl.load(c_ptr + i)
    x = tl.load(x_ptr + i) - (tl.where(c > 0, pres, 0.0) + freq * c.to(tl.float32))
    tl.store(o_ptr + i, x)
'''

_COMPILE = '''
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
from gpu_sampler.kernels import launch
import kern
sig = {"x_ptr": "*fp32", "c_ptr": "*i32", "o_ptr": "*fp32", "pres": "fp32", "freq": "fp32"}
for opts in ({}, launch.exact_fp()):
    ck = triton.compile(ASTSource(fn=kern.k, signature=sig), target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=4, **opts))
    print(ck.asm["ptx"].count("fma.rn.f32"))
'''


def test_penalty_line_compiles_without_fma(tmp_path):
    """The penalty sum as the kernels write it: contracted by default, two roundings with
    exact_fp() (the PTX for sm_90; no driver needed)."""
    pytest.importorskip("triton")
    (tmp_path / "kern.py").write_text(textwrap.dedent(_KERNEL))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    fused, exact = (int(v) for v in r.stdout.split())
    assert fused > 0 and exact == 0, r.stdout
