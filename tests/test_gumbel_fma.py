"""The draw's noise on a GPU vs the torch twin: FMA contraction of _exp1_of's series (fuzz28,
twenty-sixth session; fixed by explicit fmas on both sides).

kernels/common.py _exp1_of sums E = w (1 + w/2 + ... + w^5/6) for w < 1/16 by Horner, s = s * w + c.
Triton compiles GPU kernels with enable_fp_fusion=True by default (then only the CD launches turned
it off; every launch does since the thirty-fifth session, kernels/launch.py exact_fp), so each
step became one fma (one rounding) on the GPU, while
rng.gumbel_of_hash rounds the product and the sum apart (two torch ops). The old noise
-ln(-ln u) had no multiply-add, so this is new with 6ec939f: over all 2^24 + 2^26 distinct fl(h),
58,976 values (1.7e-4 of the hash mass) get a G one ulp apart (e.g. fl(h) = 464350: twin 9.1322603,
kernel 9.1322613), and a non-CD launch draws from different noise than a CD launch or the twin.

Suggested fix: write the fma explicitly on both sides: tl.fma in _exp1_of (the interpreter's
tl.fma also rounds once: triton's fma_fp32), and in the twin each step as
(s.double() * w.double() + c).float(), which equals the single-rounding fma for every w < 1/16
(checked exhaustively: 0 of 50,331,648 differ; w s is exact in float64 and no sum lands on a
float32 midpoint).
"""
import numpy as np
import pytest
import torch

from gpu_sampler import rng

# distinct fl(h) whose G differs between the fused and the unfused series (the first ten)
H = [464350, 733612, 869770, 1102147, 1315059, 1353955, 1480875, 1530004, 1697856, 1830903]


def _fma32(a, b, c):
    """Single-rounding float32 fma (as fma.rn.f32 on the GPU), exactly: the helper the Triton
    interpreter runs tl.fma with (an internal name: the test skips where it is missing)."""
    interpreter = pytest.importorskip("triton._C.libtriton").interpreter
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                  np.asarray(c, np.float32))
    return interpreter.fma_fp32(np.ascontiguousarray(a), np.ascontiguousarray(b),
                                np.ascontiguousarray(c))


def _gumbel_as_gpu_kernel(h):
    """kernels/common.py _gumbel_of as the GPU compiles it (each Horner step one fma), with the
    twin's log so that only the contraction differs."""
    a = torch.tensor(h, dtype=torch.float32)
    w = ((a + 0.5) * 2.3283064365386963e-10).clamp_max(rng.U_MAX).numpy()
    c = [np.float32(v) for v in rng._E_COEF]
    s = _fma32(w, c[0], c[1])
    for ci in c[2:]:
        s = _fma32(s, w, ci)
    s = _fma32(s, w, np.float32(1.0))
    assert (w < 0.0625).all()
    e = torch.from_numpy((w * s).astype(np.float32))
    return 0.0 - torch.log(e)


def test_twin_noise_matches_the_gpu_kernels_fused_series():
    twin = rng.gumbel_of_hash(torch.tensor(H, dtype=torch.int64))
    kernel = _gumbel_as_gpu_kernel(H)
    assert torch.equal(twin, kernel), (twin - kernel).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (compiled kernel)")
def test_compiled_kernel_noise_matches_the_twin_on_gpu():
    import triton
    import triton.language as tl
    from gpu_sampler.kernels import common

    @triton.jit
    def k(a_ptr, g_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(g_ptr + o, common._gumbel_of(tl.load(a_ptr + o)))

    a = torch.tensor(H + [0] * (16 - len(H)), dtype=torch.float32, device="cuda")
    g = torch.empty_like(a)
    k[(1,)](a, g, N=16)
    assert torch.equal(g[:len(H)].cpu(), rng.gumbel_of_hash(a[:len(H)]).cpu())
