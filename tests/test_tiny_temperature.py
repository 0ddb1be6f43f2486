"""A tiny temperature makes x = fl(xp / T) large (|x| ~ 1e4 .. 3e6), where x's own rounding
(ulp(x) up to 0.25) is no longer small: Z must be the mass of the rounded x, as the thresholds
sum it. Stage 1 took z's exponent on xp ((xp - vm) log2(e) / T, unrounded) and the twin took
Z = e^(logsumexp(x) - M), rounded at ulp(M); both moved top-p's cut by whole tie groups
(logprobs off by up to 0.08 at |x| ~ 3e6). Flat rows, top-p 0.95: the band read at
|x| ~ 1e4, the row pass at 3e6 (past band_plan.F_BAND_MAX, where the band bins stop being
exact); the kernel's tokens are the twin's, both logprobs the float64 answer's."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_band import GEOM, _check
from test_kernel_v2 import _run, _twin_tokens
from test_kernel_v3 import KernelReads

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")


def _exact_logprobs(x, T, p, tok):
    """log P(tok) under top-p on x = fl32(xp / T), sums in float64, tie groups whole."""
    out = []
    for row, t in zip(x / torch.tensor(T, dtype=torch.float32), tok.tolist()):
        xr = row.double()
        e = torch.exp(xr - xr.max())
        vals = torch.unique(xr, sorted=True).flip(0)
        W = torch.stack([e[xr >= v].sum() for v in vals])
        tau = vals[(W >= p * e.sum()).nonzero()[0, 0]]
        out.append(float(xr[t] - xr.max() - torch.log(e[xr >= tau].sum())))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("T,base", [(1e-6, 3.0), (1e-4, 1.0)])
def test_tiny_temperature_top_p_matches_the_exact_masses(T, base, monkeypatch):
    g = torch.Generator().manual_seed(5)
    x = base + T * torch.randn(2, 2053, generator=g)  # x ~ base / T + N(0, 1): a flat row
    kw = dict(temperature=T, top_p=0.95, seed=torch.tensor([7, 8]), offset=torch.tensor([0, 1]))
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    banded = reads.bytes.get("_band_gather_kernel", 0) == x.numel() * 4
    assert banded == (base / T < 2.0 ** 20), reads.bytes
    _check(x, kw, tok, lp)
    want = _exact_logprobs(x, T, 0.95, tok)
    torch.testing.assert_close(lp.double(), want, atol=1e-5, rtol=0)
    _, tw_lp = _twin_tokens(x, **kw)
    torch.testing.assert_close(tw_lp.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("base", [40.0, 2.0, 1.2])
def test_pure_temperature_logprobs_are_the_rounded_x_masses(base):
    """Pure temperature at T 0.01: x ~ 4000 and ~200 take stage 1's exact path (|x| >= X_EXACT
    = 128), x ~ 120 its fast one (Z's exponent on xp, within ulp(x) / 2 <= 2^-18 of the
    rounded x's). At X_EXACT = 4096 the first row's logprob was off the float64 answer by
    ~1e-4 (the exponent's x, unrounded, against the rounded x the logprob sums)."""
    T = 0.01
    g = torch.Generator().manual_seed(6)
    x = base + T * torch.randn(4, 300, generator=g)  # x ~ base / T + N(0, 1)
    kw = dict(temperature=T, seed=torch.arange(4) + 3, offset=torch.arange(4))
    tok, lp = _run(x, **GEOM, **kw)
    xr = (x / torch.tensor(T, dtype=torch.float32)).double()
    want = xr.gather(1, tok[:, None])[:, 0] - torch.logsumexp(xr, 1)
    torch.testing.assert_close(lp.double(), want, atol=1e-5, rtol=0)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(tw_lp.double(), want, atol=1e-5, rtol=0)
