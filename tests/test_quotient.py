"""x = xp / T in the kernels (kernels/common.py _quotient) is the twin's quotient bit for bit:
Markstein's correction of fl(xp fl(1 / T)) by one exact remainder (two fmas), for the row
temperatures and repetition penalties users send and for divisors whose reciprocal rounds
worst (an all-ones significand). Triton's fp32 `/` compiles to PTX div.full.f32 (within 2
ulps); the interpreter divides exactly, so that difference only shows in the compile
(kernels/aot.py approx_divisions); this checks the replacement's arithmetic, which the
interpreter runs with the GPU's single-rounding fma. Dividends are logit-like values and random
bit patterns with |x| in [2^-60, 2^61): every fp32 dividend from 2^-102 up, for a few divisors,
is `python bench/quotient_exhaustive.py`."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl

    from gpu_sampler.kernels.common import _quotient

    @triton.jit
    def _quotient_kernel(x_ptr, d_ptr, out_ptr, N: tl.constexpr):
        i = tl.program_id(0)
        offs = tl.arange(0, N)
        d = tl.load(d_ptr + i)
        tl.store(out_ptr + i * N + offs, _quotient(tl.load(x_ptr + offs), d))


def _divisors(g):
    bits = torch.tensor([0x3FFFFFFF, 0x3F7FFFFF, 0x3F800001, 0x3FFFFFFE, 0x3E7FFFFF],
                        dtype=torch.int32).view(torch.float32)
    common = torch.tensor([0.6, 0.7, 0.3, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 2.5,
                           3.0, 0.1, 0.01, 1e-3, 13.7, 100.0])
    rand = torch.exp(torch.empty(40).uniform_(-5.0, 3.0, generator=g))
    return torch.cat([bits, common, rand]).float()


def _dividends(g, n):
    """Logit-like values, random bit patterns over the normal range, and the special values."""
    x = torch.cat([torch.randn(n // 4, generator=g) * 10,
                   torch.empty(n // 4).uniform_(-100.0, 100.0, generator=g)])
    e = torch.randint(-60, 61, (n // 2 - 8,), generator=g).float()
    m = torch.empty(n // 2 - 8).uniform_(1.0, 2.0, generator=g)
    s = torch.where(torch.rand(n // 2 - 8, generator=g) < 0.5, -1.0, 1.0)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                            2.0 ** -100, -(2.0 ** 60), 1.0])
    return torch.cat([x, s * m * torch.exp2(e), special]).float()


def test_quotient_is_the_correctly_rounded_one():
    g = torch.Generator().manual_seed(71)
    N = 4096
    x, d = _dividends(g, N), _divisors(g)
    out = torch.empty(d.numel(), N)
    _quotient_kernel[(d.numel(),)](x, d, out, N=N)
    want = x[None, :] / d[:, None]
    # equal values are the same bits but for the zero's sign (-0 / T gives +0: unobservable)
    same = (out == want) | (out.isnan() & want.isnan())
    bad = (~same).nonzero()
    assert bad.numel() == 0, [(x[j].item(), d[i].item(), out[i, j].item(), want[i, j].item())
                              for i, j in bad[:5].tolist()]


def test_quotient_by_a_divisor_without_a_normal_reciprocal():
    """A subnormal or tiny T (1 / T overflows or is not normal) and a huge one divide the pair
    scaled by 2^+-24 (common._divisor_scale): the same quotient as torch's, +-inf where it
    overflows and 0 for xp = 0 (not 0 x inf = NaN), the policy tests' T 1e-45 included."""
    g = torch.Generator().manual_seed(72)
    N = 4096
    d = torch.tensor([1e-45, 2.0 ** -149, 3.5e-42, 2.0 ** -127, 2.0 ** -126, 1.1e-38,
                      2.0 ** -125 * 0.75, 2.0 ** 126, 3e38, 2.0 ** 125 * 1.5])
    x = _dividends(g, N)
    tiny = torch.cat([torch.tensor([1e-7, -3e-7, 4.7e-7, 5e-7, 1e-30, 2.0 ** -100]),
                      torch.empty(58).uniform_(-1e-6, 1e-6, generator=g)])
    x = torch.cat([x[:N - tiny.numel()], tiny]).float()
    out = torch.empty(d.numel(), N)
    _quotient_kernel[(d.numel(),)](x, d, out, N=N)
    want = x[None, :] / d[:, None]
    # a huge T makes a quotient below 2^-126 (subnormal) where exactness is not claimed
    claimed = (want.abs() >= 2.0 ** -126) | (want == 0) | want.isnan()
    same = (out == want) | (out.isnan() & want.isnan())
    bad = (claimed & ~same).nonzero()
    assert bad.numel() == 0, [(x[j].item(), d[i].item(), out[i, j].item(), want[i, j].item())
                              for i, j in bad[:5].tolist()]
    assert not out[:, x == 0].isnan().any()
