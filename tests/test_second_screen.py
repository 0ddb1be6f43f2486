"""The second read's screened draw (kernels/second.py _gather_block; common.py, "the draw's
screen") under the interpreter: min-p rows the candidates cannot finish are handed to a second
read whose blocks score their tokens' Gumbel noise only where a kept token can reach the
merge's bound S = ln W - SCREEN_C (W: the candidates' kept mass); the finish checks the winner
against S and re-draws the row unscreened below it, so the tokens are the twin's for any noise,
in the second read's own finish and in the band finish that finishes both hand-overs.

64-token blocks with 8 candidate slots, as tests/test_kernel_band.py."""
import sys

import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_band import GEOM, _check
from test_kernel_v2 import _run
from test_kernel_v3 import KernelReads

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")


class ScoredBlocks:
    """Second-read blocks that took the exact draw (second.py's _gumbel_of from _gather_block)."""

    def __init__(self, monkeypatch):
        from gpu_sampler.kernels import second
        inner = second._gumbel_of
        self.n = 0

        def counted(u):
            self.n += sys._getframe(1).f_code.co_name == "_gather_block"
            return inner(u)

        monkeypatch.setattr(second, "_gumbel_of", counted)


def _screen(monkeypatch, on):
    """The launcher screens above SCREEN_PROGRAMS programs (B C): on or off whatever the grid."""
    from gpu_sampler.kernels import sampling
    monkeypatch.setattr(sampling, "SCREEN_PROGRAMS", 0 if on else 10 ** 9)


def _min_p_rows(B, V, seed):
    """Flat N(0, 1) rows at min-p 0.02 / 0.05: the kept sets outgrow the candidates."""
    x = torch.randn(B, V, generator=torch.Generator().manual_seed(seed))
    mp = torch.tensor([0.02, 0.05] * B)[:B]
    return x, dict(temperature=1.0, min_p=mp, seed=torch.arange(B) + 40, offset=torch.arange(B))


def test_screen_scores_few_blocks_and_keeps_the_twins_tokens(monkeypatch):
    """Two flat min-p rows of 313 blocks: a small share of the second read's blocks score
    (~e^3 W_kept / W tokens a row can reach S; unscreened, every block of a row handed over
    does), the finish reads no logits (no row re-drawn), the tokens and logprobs are the
    unscreened run's, bit for bit, and the twin's."""
    V = 20011
    x, kw = _min_p_rows(2, V, 81)
    scored = ScoredBlocks(monkeypatch)
    _screen(monkeypatch, False)
    tok0, lp0 = _run(x, **GEOM, **kw)
    blocks = scored.n
    assert blocks == 2 * ((V + 63) // 64), blocks  # every row handed over
    _screen(monkeypatch, True)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert reads.bytes["_gather_kernel"] == x.numel() * 4
    assert reads.bytes.get("_finish_kernel", 0) == 0
    assert 0 < scored.n - blocks < blocks // 3, (scored.n - blocks, blocks)
    assert torch.equal(tok, tok0) and torch.equal(lp, lp0)
    _check(x, kw, tok, lp)


def _unscreened_then_bound_above_all(monkeypatch, x, kw):
    """(unscreened tokens, logprobs), then the screened run's and its logit reads with
    SCREEN_C = -200, which puts S above every score: no block scores."""
    import triton.language as tl
    from gpu_sampler.kernels import common
    _screen(monkeypatch, False)
    tok0, lp0 = _run(x, **GEOM, **kw)
    monkeypatch.setattr(common, "SCREEN_C", tl.constexpr(-200.0))
    _screen(monkeypatch, True)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    return tok0, lp0, tok, lp, reads


def test_winner_below_the_bound_redraws_the_row(monkeypatch):
    """With S above every score the finish (each row's last gather program) finds no winner
    above S and re-draws the row unscreened (a second read of its logits in the gather
    launch, no finish launch): the unscreened tokens."""
    x, kw = _min_p_rows(3, 2053, 82)
    tok0, lp0, tok, lp, reads = _unscreened_then_bound_above_all(monkeypatch, x, kw)
    assert "_finish_kernel" not in reads.grids
    assert reads.bytes["_gather_kernel"] == 2 * x.numel() * 4
    assert torch.equal(tok, tok0) and torch.equal(lp, lp0)


def test_band_finish_redraws_a_second_read_row(monkeypatch):
    """A batch with band rows (top-p 0.95) and min-p rows: the band finish finishes the second
    read's rows too; with S above every score it re-draws them there, the unscreened tokens."""
    V = 2053
    x = torch.randn(4, V, generator=torch.Generator().manual_seed(83))
    kw = dict(temperature=1.0, top_p=torch.tensor([0.95, 1.0, 0.95, 1.0]),
              min_p=torch.tensor([0.0, 0.05, 0.0, 0.1]), seed=torch.arange(4) + 9,
              offset=torch.arange(4))
    tok0, lp0, tok, lp, reads = _unscreened_then_bound_above_all(monkeypatch, x, kw)
    assert "_finish_kernel" not in reads.grids  # the band finish finished both hand-overs
    assert reads.bytes["_band_finish_kernel"] >= 2 * V * 4  # the two min-p rows re-drawn
    assert torch.equal(tok, tok0) and torch.equal(lp, lp0)
    _check(x, kw, tok, lp)


def test_kept_tokens_whose_mass_flushes_to_zero(monkeypatch):
    """min-p 1e-40 keeps tokens down to x - M = ln 1e-40 = -92.1; a third of each row lies at
    x - M in [-92, -88], where e^(x - M) < 2^-126 is subnormal in the twin and 0 in the reads
    (common._mass_of). A min-p row (the second read's gather) and a top-p 0.999 + min-p row (the
    band gather), in one band launch, screened: the twin's tokens at every offset (the tail
    never wins: its scores are below -65, the top token's above -4) and its logprobs (the
    tail's mass is nothing next to Z)."""
    g = torch.Generator().manual_seed(83)
    V = 2053
    x = torch.randn(2, V, generator=g)
    tail = torch.rand(2, V, generator=g) < 1 / 3
    deep = x.max(1, keepdim=True).values - 88.0 - 4.0 * torch.rand(2, V, generator=g)
    x = torch.where(tail, deep, x)
    _screen(monkeypatch, True)
    for off in range(4):
        kw = dict(temperature=1.0, min_p=1e-40, top_p=torch.tensor([1.0, 0.999]),
                  seed=torch.tensor([3, 4]), offset=off)
        reads = KernelReads(x, monkeypatch)
        tok, lp = _run(x, **GEOM, **kw)
        assert reads.bytes["_band_gather_kernel"] == x.numel() * 4  # both rows read again
        assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no row re-drawn
        assert not tail.gather(1, tok[:, None]).any()
        _check(x, kw, tok, lp)
