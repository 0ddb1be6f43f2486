"""The band read's screened draw (kernels/band.py _screened_winner, band_plan._band_screen_bound;
common.py, "the draw's screen") under the interpreter: a block scores its tokens' Gumbel noise
(two logs a token) only when one of its kept tokens can reach the row's bound
S = ln(p Z) - SCREEN_C; the finish checks the winner against S and takes the row pass below it,
so the tokens are the twin's for any noise. The band finish screens its slices' draw over the
band list (_band_filter) the same way.

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

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl

    from gpu_sampler.kernels.common import _screened

    @triton.jit
    def _screen_kernel(a_ptr, e_ptr, ks, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        a = tl.load(a_ptr + i)
        keep = _screened(a == a, a, tl.load(e_ptr + i), ks, True)
        tl.store(out_ptr + i, keep.to(tl.int8))


def _modules():
    from gpu_sampler.kernels import band, band_plan, sampling
    return band, band_plan, sampling


def _screen_on(monkeypatch):
    """The launcher screens above SCREEN_PROGRAMS programs (B C); these small batches are
    below it."""
    monkeypatch.setattr(_modules()[2], "SCREEN_PROGRAMS", 0)


class ScoredBlocks:
    """How many gather blocks took the exact draw (n: calls of band.py's _gumbel_of from
    _screened_winner, one a block whose screen let a lane through); the same for the finish's
    band-list tiles (tiles_scored, of tiles: its _hash32 calls from _band_filter)."""

    def __init__(self, monkeypatch):
        band = _modules()[0]
        gumbel_of, hash32 = band._gumbel_of, band._hash32
        self.n = self.tiles = self.tiles_scored = 0

        def caller():
            return sys._getframe(2).f_code.co_name

        def counted(a):
            if caller() == "_screened_winner":
                self.n += 1
            elif caller() == "_band_filter":
                self.tiles_scored += 1
            return gumbel_of(a)

        def tile(k0, k1, offs):
            self.tiles += caller() == "_band_filter"
            return hash32(k0, k1, offs)

        monkeypatch.setattr(band, "_gumbel_of", counted)
        monkeypatch.setattr(band, "_hash32", tile)


def _flat_rows(B, V, g):
    """Flat N(0, 1) rows at T 1.0 / top-p 0.95, a seed each: nuclei of thousands of tokens."""
    x = torch.randn(B, V, generator=g)
    return x, dict(temperature=1.0, top_p=0.95, seed=torch.arange(B) + 100,
                   offset=torch.arange(B))


def test_screen_scores_few_blocks_and_keeps_the_twins_tokens(monkeypatch):
    """Eight flat band rows, 65 blocks each: the blocks that score are a small share (~e^3 / p
    tokens a row can reach S), and so are the finish's band-list tiles; the reads stay two,
    every token and logprob is the twin's."""
    V = 4099
    x, kw = _flat_rows(8, V, torch.Generator().manual_seed(71))
    reads = KernelReads(x, monkeypatch)
    scored = ScoredBlocks(monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert reads.bytes["_band_gather_kernel"] == x.numel() * 4
    assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no row fell back
    blocks = 8 * ((V + 63) // 64)
    assert 0 < scored.n < blocks // 3, (scored.n, blocks)
    # the finish's band-list tiles are screened the same way (128 tiles, 4 scoring here)
    assert 0 < 4 * scored.tiles_scored < scored.tiles, (scored.tiles_scored, scored.tiles)
    _check(x, kw, tok, lp)


def test_min_p_band_rows_score_every_block(monkeypatch):
    """With min-p beside top-p the kept mass has no bound (min-p may cut below p Z): no screen,
    every block with a kept token above the band scores, the twin's tokens."""
    V = 4099
    x, kw = _flat_rows(2, V, torch.Generator().manual_seed(72))
    kw["min_p"] = 0.02
    _screen_on(monkeypatch)
    scored = ScoredBlocks(monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert scored.n >= 2 * ((V + 63) // 64) * 0.9, scored.n
    _check(x, kw, tok, lp)


def test_winner_below_the_bound_takes_the_row_pass(monkeypatch):
    """SCREEN_C = -200 puts S above every score: no block scores, the finish finds the winner
    below S and runs the row pass (its reads), still the twin's tokens."""
    import triton.language as tl
    from gpu_sampler.kernels import common
    monkeypatch.setattr(common, "SCREEN_C", tl.constexpr(-200.0))
    _screen_on(monkeypatch)
    V = 2053
    x, kw = _flat_rows(2, V, torch.Generator().manual_seed(73))
    reads = KernelReads(x, monkeypatch)
    scored = ScoredBlocks(monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert scored.n == 0
    assert reads.bytes["_band_finish_kernel"] >= 2 * 2 * V * 4  # a search round + the draw, each
    _check(x, kw, tok, lp)


def test_one_program_a_block_scores_every_block(monkeypatch):
    """At most one gather program a SM (B C <= SCREEN_PROGRAMS: B = 1) runs unscreened, each
    program one block: every block scores, the same tokens as screened."""
    V = 4099
    x, kw = _flat_rows(2, V, torch.Generator().manual_seed(74))
    sampling = _modules()[2]
    monkeypatch.setattr(sampling, "SCREEN_PROGRAMS", 10 ** 9)
    scored = ScoredBlocks(monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert scored.n == 2 * ((V + 63) // 64)
    _check(x, kw, tok, lp)
    _screen_on(monkeypatch)
    n0 = scored.n
    tok_s, lp_s = _run(x, **GEOM, **kw)
    assert scored.n - n0 < n0 // 2
    assert torch.equal(tok_s, tok) and torch.equal(lp_s, lp)


def test_screen_on_the_hash_bits_keeps_every_lane_the_exact_test_keeps():
    """common._screened tests the hash bits a = fl(h) (w = (a + 1/2) 2^-32) against
    fl(e fl(ks 2^32)): every lane with w <= e ks (1 - 2^-20) in exact arithmetic passes (the
    2^-20 is the product's rounding, far inside the screen's 2^-7 slack, common.SCREEN_M) near
    the edge on both sides, e ks from 2^-34 to 2^3, ks = +inf; and few others."""
    import numpy as np
    g = torch.Generator().manual_seed(75)
    n = 4096
    for ks in (1.0, 3.7e-3, 21.3, 5.0e4, float("inf")):
        t = torch.rand(n, generator=g, dtype=torch.float64) * 37 - 34   # e ks in 2^[-34, 3)
        e = (2.0 ** t / (ks if ks != float("inf") else 1.0)).float()
        e[:8] = 0.0
        w = e.double() * ks  # exact in float64 (24 x 24 bits)
        edge = torch.floor(w * 2.0 ** 32 - 0.5).clamp(0, 2 ** 32 - 1)
        step = torch.where(edge < 2 ** 24, 1.0, 2.0 ** (torch.log2(edge.clamp(min=1)).floor() - 23))
        h = (edge + torch.randint(-2, 3, (n,), generator=g) * step).clamp(0, 2 ** 32 - 1)
        a = h.float()  # fl(h), as the kernel's _hash32 converts it
        out = torch.zeros(n, dtype=torch.int8)
        _screen_kernel[(1,)](a, e, ks, out, N=n)
        exact = (a.double() + 0.5) * 2.0 ** -32 <= w * (1 - 2.0 ** -20)
        got = out.bool()
        assert not (exact & ~got).any(), (ks, np.flatnonzero((exact & ~got).numpy())[:5])
        assert (got & ~(a.double() * 2.0 ** -32 <= w * (1 + 2.0 ** -20))).sum() == 0
