"""Kernel v3 under the interpreter: pure temperature in one read (stage 1's per-block draw
partials), its proof and its fallback, Gumbel noise of +inf, and per-row mixes; tokens equal to
the torch twin's, logprobs close, the same at any chunk count, reads counted."""
import math

import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_v2 import LogitReads, _run, _twin_tokens

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS:
    import triton
    import triton.language as tl
    from gpu_sampler.kernels import common, merge

    @triton.jit
    def _fast_gumbel_kernel(a_ptr, f_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(f_ptr + offs, common._gumbel_of_fast(tl.load(a_ptr + offs)))

    @triton.jit
    def _prune_bound_kernel(h_ptr, m_ptr, t_ptr, lb_ptr, NB: tl.constexpr):
        r = tl.program_id(0)
        h = tl.load(h_ptr + r * NB + tl.arange(0, NB))
        top_p = r >= 0
        lb = merge._prune_bound(h, tl.load(m_ptr + r), 0, tl.load(t_ptr + r), ~top_p, top_p,
                                NB, 16.0)
        tl.store(lb_ptr + r, lb)

    @triton.jit
    def _bound_at_max(hist, M, k, target, k_act, p_act, NB: tl.constexpr, INV_W: tl.constexpr):
        return M + 0.0 * target  # above tau in every row whose max alone is short of p


def _rows(V, g):
    """Four row kinds: N(0, 3^2), flat with integer ties, power-law, and a row with -inf
    (masked) tokens, including a whole masked 64-token block."""
    x = torch.randn(4, V, generator=g) * 3
    x[1] = torch.randint(0, 4, (V,), generator=g).float()  # flat, every value tied ~V/4 times
    rank = torch.randperm(V, generator=g).float() + 1
    x[2] = -1.1 * torch.log(rank) + 0.1 * torch.randn(V, generator=g)
    x[3, 64:128] = float("-inf")
    x[3, ::5] = float("-inf")
    return x


def test_pure_temperature_reads_once_and_matches_twin(monkeypatch):
    g = torch.Generator().manual_seed(17)
    V = 1000
    x = _rows(V, g)
    kw = dict(temperature=torch.tensor([1.0, 0.6, 1.3, 0.9]),
              top_k=torch.tensor([0, V, 0, 2 * V]), top_p=1.0, min_p=0.0,
              seed=torch.arange(4) + 5, offset=torch.tensor([0, 1, 2, 3]))
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, **kw)
    assert reads.bytes == x.numel() * 4  # one read: no second pass for pure temperature
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    for chunks in (1, 5):
        tok_c, lp_c = _run(x, tile=64, chunks=chunks, **kw)
        assert torch.equal(tok_c, tok) and torch.equal(lp_c, lp), chunks
    # a sub-batch gives the same rows bit for bit
    r = torch.tensor([2, 0])
    sub = {k: (v[r] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    tok_s, lp_s = _run(x[r], tile=64, chunks=3, **sub)
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])


def test_pure_temperature_many_seeds_bf16():
    """Many draws per row (offsets 0..15) on bf16 logits: every token the twin's."""
    g = torch.Generator().manual_seed(3)
    V = 600
    x = (torch.randn(1, V, generator=g) * 2).to(torch.bfloat16).expand(16, V).contiguous()
    kw = dict(temperature=0.8, seed=11, offset=torch.arange(16))
    tok, lp = _run(x, tile=64, **kw)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    assert len(set(tok.tolist())) > 4  # it does sample


def test_pure_temperature_unproven_row_falls_back(monkeypatch):
    """Logits near 1e6: the proof's slack 2^-20 (A + |M| + 64) ~ 2 exceeds the gaps between the
    best Gumbel scores, so the merge cannot prove the winner and draws over the row: still the
    twin's token. A row of ordinary logits in the same call stays proven."""
    g = torch.Generator().manual_seed(5)
    V = 640
    x = torch.randn(2, V, generator=g)
    x[0] = 1.0e6 + torch.randn(V, generator=g) * 2
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, seed=2, offset=torch.arange(2), temperature=1.0)
    assert reads.bytes == x.numel() * 4 + V * 4  # row 0 once more, row 1 once
    tw_tok, tw_lp = _twin_tokens(x, seed=2, offset=torch.arange(2), temperature=1.0)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


def test_pure_row_logprob_is_one_value_on_every_path():
    """A pure-temperature row's logprob is x - M - log Z with stage 1's Z, whichever path draws
    it: the proof from the blocks' partials, the candidate list or the merge's row pass (the
    fused contrastive path with alpha = beta = 0, whose scores are the logits), the second read
    (a min-p tensor of zeros). Rows 0-2 (logits ~1e6) are unproven, so they take the row pass
    or the second read; row 3 is flat with ties. Before the thirty-second session the list, the
    row pass and the second read summed the mass themselves: at this seed both the contrastive
    and the min-p call moved a logprob by an ulp."""
    g = torch.Generator().manual_seed(23)
    V, B = 640, 6
    x = torch.randn(B, V, generator=g) * 3
    for r in range(3):
        x[r] = 1.0e6 + torch.randn(V, generator=g) * (2 + 3 * r)
    x[3] = torch.randint(0, 4, (V,), generator=g).float()
    kw = dict(temperature=1.1, seed=torch.arange(B) + 11, offset=3, tile=64)
    want = _run(x, **kw)
    paths = {"contrastive": dict(amateur_logits=torch.randn(B, V, generator=g), cd_alpha=0.0,
                                 cd_beta=0.0),
             "second read": dict(min_p=torch.zeros(B)),
             "chunks": dict(chunks=3)}
    for name, extra in paths.items():
        got = _run(x, **kw, **extra)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name


def test_pure_temperature_near_float_max():
    """x = fl(xp / T) finite but xp * fl(1 / T) = -inf (T = 0.058078576, xp = -1.9763114e37):
    stage 1's approximate score is clamped at -FLT_MAX, so such tokens still score. Every token
    of row 0 ties at M, so the draw is the Gumbel argmax over the whole row (without the clamp
    stage 1 scored none of them and the merge 'proved' a block's first lane)."""
    V = 640
    x = torch.full((2, V), -1.9763114e37)
    x[1, ::3] = float("-inf")
    kw = dict(temperature=0.058078576, seed=torch.tensor([1, 2]), offset=0)
    tok, lp = _run(x, tile=64, **kw)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


def _seed_with_top_hash(V):
    """A seed whose hash bits reach h >> 8 = 2^24 - 1 (24-bit noise before the twenty-fifth
    session's clamp: u = 1.0, G = +inf) at some token id < V, from the bits themselves."""
    import numpy as np
    from gpu_sampler import rng
    ids = np.arange(V, dtype=np.uint32)
    for s in range(200000):
        lo, hi = rng.row_keys(torch.tensor([s]), torch.tensor([0]))
        h = rng.hash_np(lo.item(), hi.item(), ids)
        hit = (h >> np.uint32(8)) == 2 ** 24 - 1
        if hit.any():
            return s, torch.from_numpy(np.flatnonzero(hit))
    raise AssertionError("no seed found")


def _hash_floats():
    """Every value fl(h) takes for a 32-bit hash h: all of [0, 2^24), then 2^23 a binade up to
    2^32 (2^24 + 2^26 values; the noise depends on h only through fl(h))."""
    top = [2.0 ** k * (1.0 + torch.arange(1 << 23, dtype=torch.float64) * 2.0 ** -23)
           for k in range(24, 32)]
    return torch.cat([torch.arange(1 << 24, dtype=torch.float64)] + top + [
        torch.tensor([2.0 ** 32], dtype=torch.float64)]).to(torch.float32)


def test_fast_gumbel_within_its_bound_for_every_hash():
    """Stage 1's approximate scores use _gumbel_of_fast (short-polynomial logs): over every
    value the hash bits take, |G_fast - G| <= GUMBEL_FAST_ERR against the twin's fp32 chain
    (rng.gumbel_of_hash; the merge's slack budgets that much), and both are finite."""
    from gpu_sampler import rng
    a = _hash_floats()
    a = torch.cat([a, a[:(-a.numel()) % (1 << 16)]])  # whole launch blocks
    fast = torch.empty_like(a)
    _fast_gumbel_kernel[(a.numel() >> 16,)](a, fast, BLOCK=1 << 16)
    ref = rng.gumbel_of_hash(a)
    assert bool(torch.isfinite(ref).all()) and bool(torch.isfinite(fast).all())
    assert float((fast - ref).abs().max()) <= common.GUMBEL_FAST_ERR


def test_list_draw_won_by_token_zero():
    """The merge's draw over its list keeps per-lane maxima: token 0 winning must report its
    own x (a masked lane also carries id 0), so a finite logprob equal to the twin's; top-p and
    min-p rows whose kept sets (1 token, then 3 with a wide min-p list) start at token 0."""
    g = torch.Generator().manual_seed(8)
    V = 700
    x = torch.randn(3, V, generator=g)
    x[:, 0] = 9.0
    x[2, 1:3] = 8.5
    kw = dict(temperature=1.0, top_p=torch.tensor([0.5, 1.0, 1.0]),
              min_p=torch.tensor([0.0, 0.5, 0.001]), seed=3, offset=torch.arange(3))
    tok, lp = _run(x, tile=64, **kw)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok) and tok[0] == 0 and torch.isfinite(lp).all()
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


def test_top_hash_bits_are_no_forced_winner():
    """h >> 8 = 2^24 - 1 used to give u = fl(2^24 - 1/2) 2^-24 = 1.0, G = +inf: that token won
    any draw it was kept in (a floor of 2^-24 per kept token per draw). The noise is finite for
    every hash (w <= 1 - 2^-24 since the twenty-sixth session's 32-bit noise: such hashes give
    G near -2.8), and a token at e^-30 below the max does not win. Kernel and twin agree."""
    from gpu_sampler import rng
    V = 4096
    s, where = _seed_with_top_hash(V)
    lo, hi = rng.row_keys(torch.tensor([s]), torch.tensor([0]))
    u = rng.uniform(lo, hi, where[None])
    assert (u < 1.0).all() and torch.isfinite(rng.gumbel_rows(s, 0, where[None])).all()
    x = torch.full((1, V), -30.0)
    x[0, 0 if where.min() > 0 else V - 1] = 0.0
    top = int(x.argmax())
    tok, lp = _run(x, tile=256, seed=s, offset=0, temperature=1.0)
    tw_tok, _ = _twin_tokens(x, seed=s, offset=0, temperature=1.0)
    assert tok.item() == tw_tok.item() == top


def test_per_row_mix_of_settings():
    """One call with per-row tensors: greedy, pure temperature, top-p, top-k and min-p rows,
    on flat and peaked rows: the twin's tokens, HF's distribution, chunk invariance."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(23)
    V = 900
    x = torch.randn(6, V, generator=g) * torch.tensor([3.0, 1.0, 3.0, 0.3, 2.0, 1.0])[:, None]
    x[4, 7] = 14.0  # a confident row
    kw = dict(temperature=torch.tensor([0.0, 1.0, 1.0, 0.7, 1.0, 1.2]),
              top_k=torch.tensor([0, 0, 0, 50, 0, 0]),
              top_p=torch.tensor([1.0, 1.0, 0.95, 1.0, 1.0, 0.9]),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.1]))
    tok, lp = _run(x, tile=64, seed=torch.arange(6), offset=9, **kw)
    tw_tok, tw_lp = _twin_tokens(x, seed=torch.arange(6), offset=9, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    tok1, lp1 = _run(x, tile=64, chunks=1, seed=torch.arange(6), offset=9, **kw)
    assert torch.equal(tok1, tok) and torch.equal(lp1, lp)
    assert_matches_hf(_run(x, tile=64, write_probs=True, **kw), x, "per-row mix", **kw)


def test_min_p_makes_top_p_irrelevant(monkeypatch):
    """top-p 0.95 with min-p 0.05 on N(0, 3^2) rows: the nucleus outgrows the candidates (v2
    fell back to the row), but min-p's set, all candidates, holds less than p of the mass, so
    the kept set is min-p's alone: one read (16 slots per 256-token block), the twin's tokens,
    HF's distribution. A row where min-p's set holds more than p of the mass (a confident row)
    still searches top-p."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(31)
    V = 2048
    x = torch.randn(3, V, generator=g) * 3
    x[2, 5] = 30.0  # ~all the mass on one token: min-p's set is tiny, top-p decides
    kw = dict(temperature=1.0, top_p=0.95, min_p=torch.tensor([0.05, 0.2, 0.05]))
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=256, cand=16, seed=torch.arange(3), offset=4, **kw)
    assert reads.bytes == x.numel() * 4
    tw_tok, tw_lp = _twin_tokens(x, seed=torch.arange(3), offset=4, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    assert_matches_hf(_run(x, tile=256, cand=16, write_probs=True, **kw), x, "min-p over top-p",
                      **kw)
    # without min-p the same rows' nuclei outgrow the candidates: v2's fallback, counted
    reads.bytes = 0
    _run(x[:1], tile=256, cand=16, seed=0, offset=4, temperature=1.0, top_p=0.95)
    assert reads.bytes > 1.5 * V * 4


def test_dirty_blocks_are_reread_not_the_row(monkeypatch):
    """Confident rows: a block holding a dominant token keeps only it as a candidate (its next
    window holds the whole bulk), so its g_t lies above the top-k / top-p threshold. The merge
    re-reads those few blocks (every token >= the bound) instead of the whole row: the twin's
    tokens, HF's distribution, reads of 1 + (dirty blocks) / (blocks) passes. Includes a tie
    group straddling the threshold inside a dirty block and a per-row k of 1 and 3."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(41)
    V = 64 * 12
    x = torch.randn(5, V, generator=g) * 1.5
    x[:, 70] = 14.0   # block 1: one dominant token
    x[:, 300] = 12.5  # block 4
    x[3, 64:128] = torch.round(x[3, 64:128])  # ties in the dirty block at the cut-off
    x[3, 70] = 14.0
    # row 4: top-p alone at T 3, its nucleus reaching into the bulk behind the dominant token
    kw = dict(temperature=torch.tensor([0.7, 1.0, 1.0, 0.7, 3.0]),
              top_k=torch.tensor([20, 1, 3, 30, 0]),
              top_p=torch.tensor([0.8, 1.0, 1.0, 0.99, 0.2]))
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=8, seed=torch.arange(5), offset=1, **kw)
    assert x.numel() * 4 < reads.bytes < 1.3 * x.numel() * 4
    tw_tok, tw_lp = _twin_tokens(x, seed=torch.arange(5), offset=1, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    tok1, lp1 = _run(x, tile=64, cand=8, chunks=1, seed=torch.arange(5), offset=1, **kw)
    assert torch.equal(tok1, tok) and torch.equal(lp1, lp)
    assert_matches_hf(_run(x, tile=64, cand=8, write_probs=True, **kw), x, "dirty blocks", **kw)
    # many offsets on one row: every draw the twin's (ties between re-read and clean tokens)
    xs = x[:1].expand(12, V).contiguous()
    kws = dict(temperature=0.7, top_k=20, top_p=0.8)
    tok, _ = _run(xs, tile=64, cand=8, seed=5, offset=torch.arange(12), **kws)
    tw_tok, _ = _twin_tokens(xs, seed=5, offset=torch.arange(12), **kws)
    assert torch.equal(tok, tw_tok)


class KernelReads:
    """Bytes each kernel loads from one tensor, and the launches' grids (interpreter hooks)."""

    def __init__(self, t, monkeypatch):
        from triton.runtime import interpreter as ti
        import numpy as np
        lo = t.untyped_storage().data_ptr()
        hi = lo + t.untyped_storage().nbytes()
        self.bytes, self.grids, cur = {}, {}, ["?"]
        load, call = ti.InterpreterBuilder.create_masked_load, ti.GridExecutor.__call__

        def masked_load(b, ptrs, mask, other, cache_policy, is_volatile):
            a = np.asarray(ptrs.data, dtype=np.uint64)
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), a.shape)
            n = int((m & (a >= lo) & (a < hi)).sum()) * t.element_size()
            self.bytes[cur[0]] = self.bytes.get(cur[0], 0) + n
            return load(b, ptrs, mask, other, cache_policy, is_volatile)

        def run(ex, *args, **kwargs):
            cur[0] = ex.fn.__name__
            self.grids[cur[0]] = tuple(ex.grid)
            return call(ex, *args, **kwargs)

        monkeypatch.setattr(ti.InterpreterBuilder, "create_masked_load", masked_load)
        monkeypatch.setattr(ti.GridExecutor, "__call__", run)


def _second_rows(V, g):
    """Rows whose min-p / pure draw the candidates cannot finish (8 slots per 64-token block):
    flat N(0, 1), integer ties, -inf-heavy (a whole masked block), power-law; then a peaked
    greedy row and a pure-temperature row."""
    x = torch.randn(6, V, generator=g)
    x[1] = torch.randint(0, 4, (V,), generator=g).float()
    x[2, torch.rand(V, generator=g) < 0.8] = float("-inf")
    x[2, 128:192] = float("-inf")
    rank = torch.randperm(V, generator=g).float() + 1
    x[3] = -1.1 * torch.log(rank) + 0.1 * torch.randn(V, generator=g)
    x[4] *= 3
    kw = dict(temperature=torch.tensor([1.0, 0.8, 1.3, 1.0, 0.0, 1.0]),
              min_p=torch.tensor([0.05, 0.1, 0.02, 0.05, 0.0, 0.0]),
              seed=torch.arange(6) + 3, offset=torch.tensor([0, 1, 2, 3, 4, 5]))
    return x, kw


def test_min_p_second_read_is_parallel(monkeypatch):
    """Min-p alone on rows whose kept set outgrows the candidates: the merge reads no logits,
    the second read is a (B, C) launch that reads exactly the handed-over rows once more, and
    the tokens are the twin's, the same on a sub-batch at 3 chunks (odd V)."""
    g = torch.Generator().manual_seed(57)
    V = 4099
    x, kw = _second_rows(V, g)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=8, **kw)
    assert reads.bytes.get("_merge_kernel", 0) == 0
    assert reads.grids["_gather_kernel"][1] > 1  # C programs per row
    gathered = reads.bytes["_gather_kernel"]
    assert gathered == 3 * V * 4  # rows 0-2, once each (the power-law row's set is stored)
    assert reads.bytes["_stats_kernel"] == x.numel() * 4
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    r = torch.tensor([3, 1, 5])
    sub = {k: v[r] for k, v in kw.items()}
    tok_s, lp_s = _run(x[r], tile=64, cand=8, chunks=3, **sub)
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])


def test_min_p_few_dirty_blocks_are_reread_in_the_merge(monkeypatch):
    """Min-p alone whose kept set (x >= M + ln min_p) crowds one or two blocks past their
    candidate slots: the merge lists only candidates above the cut, re-reads those blocks
    (not the row) and draws exactly; no second read. Tie groups at the cut, per-row min-p and
    T, and the same tokens on a sub-batch at 3 chunks."""
    g = torch.Generator().manual_seed(59)
    V = 1031
    x = torch.randn(4, V, generator=g) - 12.0
    x[0, 200:230] = 0.0                                  # 30 tied tokens in one block
    x[1, 70:90] = torch.linspace(-2.0, 0.0, 20)          # one block, graded
    x[1, 900:905] = -2.0
    x[2, 10:40] = 0.0                                    # two blocks ...
    x[2, 600:620] = -3.0 * 0.7 + 1e-3                    # ... the second just above the cut
    x[3, 500:520] = 0.0                                  # min-p 1: only the tied maxima
    kw = dict(temperature=torch.tensor([1.0, 1.0, 0.7, 1.0]),
              min_p=torch.tensor([0.05, 0.1, float(torch.exp(torch.tensor(-3.0))), 1.0]),
              seed=torch.arange(4) + 11, offset=torch.tensor([3, 4, 5, 6]))
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=4, **kw)
    assert reads.bytes.get("_gather_kernel", 0) == 0  # no row handed to the second read
    assert reads.bytes["_merge_kernel"] == 7 * 64 * 4  # the dirty blocks only: 1 + 2 + 2 + 2
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    r = torch.tensor([2, 0])
    tok_s, lp_s = _run(x[r], tile=64, cand=4, chunks=3, **{k: v[r] for k, v in kw.items()})
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])
    many = x[:1].expand(64, V).contiguous()  # the 30 tied tokens, each drawn
    mk = dict(temperature=1.0, min_p=0.05, seed=5, offset=torch.arange(64))
    got, _ = _run(many, tile=64, cand=4, **mk)
    assert torch.equal(got, _twin_tokens(many, **mk)[0])
    assert set(got.tolist()) <= set(range(200, 230)) and len(set(got.tolist())) > 15


def test_min_p_second_read_distribution_and_bf16():
    """The distribution of handed-over rows (Z_f from the second read) is HF's; bf16 logits
    with many offsets draw the twin's tokens."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(58)
    V = 1031
    x, kw = _second_rows(V, g)
    kw = {k: v for k, v in kw.items() if k in ("temperature", "min_p")}
    assert_matches_hf(_run(x, tile=64, cand=8, write_probs=True, **kw), x, "second read", **kw)
    xb = x[:1].to(torch.bfloat16).expand(8, V).contiguous()
    kwb = dict(temperature=1.0, min_p=0.05, seed=4, offset=torch.arange(8))
    tok, lp = _run(xb, tile=64, cand=8, **kwb)
    tw_tok, tw_lp = _twin_tokens(xb, **kwb)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    assert len(set(tok.tolist())) > 3


def test_wide_nucleus_on_the_candidates_per_lane_rounds(monkeypatch):
    """Kept sets of 300-500 tokens that the candidates still decide (the merge's list spans
    several 256-entry blocks, so its pivot rounds keep per-lane partials): top-p alone, top-k
    300 alone (the count search), top-k 400 with top-p; no row pass, HF's distribution and the
    twin's tokens."""
    from hf_reference import assert_matches_hf
    g = torch.Generator().manual_seed(71)
    V = 8192
    x = torch.randn(3, V, generator=g) * 2
    kw = dict(temperature=0.7, top_k=torch.tensor([0, 300, 400]),
              top_p=torch.tensor([0.8, 1.0, 0.9]))
    reads = LogitReads(x, monkeypatch)
    tok, lp = _run(x, seed=torch.arange(3) + 9, offset=4, **kw)
    assert reads.bytes <= 1.5 * x.numel() * 4  # a row pass would add two passes of a row
    tw_tok, tw_lp = _twin_tokens(x, seed=torch.arange(3) + 9, offset=4, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    assert_matches_hf(_run(x, write_probs=True, **kw), x, "wide nucleus", **kw)


def _nucleus_floor(x, p):
    """The smallest kept x of top-p on one fp32 row, in float64."""
    xs = torch.sort(x.double(), descending=True).values
    w = torch.cumsum(torch.exp(xs - xs[0]), 0)
    return float(xs[int((w < p * w[-1]).sum())])


def test_list_bound_is_below_tau_and_within_a_bin_of_it():
    """The merge's list bound for top-p (merge._prune_bound) over the candidates' histogram
    (here every token of the row): never above the top-p threshold tau, and no lower than
    the threshold of p e^(1/16 + BIN_SLACK) less one bin (each bin's mass is under-counted by
    at most that factor); finite where the max alone holds nearly p of the mass (the bound
    two bins below gave -inf there, and a list of the whole row)."""
    from bench.rows import row_logits
    V, NB, W = 128256, 256, 16.0
    slack = merge.BIN_SLACK.value
    cases = [(kind, T, p) for kind in ("sigma3", "confident", "powerlaw", "flat")
             for T, p in ((0.6, 0.9), (1.0, 0.95), (0.8, 0.5))]
    x = torch.stack([row_logits(kind, 1, V, seed=3)[0] / T for kind, T, _ in cases])
    M = x.max(dim=1).values
    d = ((M[:, None] - x) * W).clamp(max=NB - 1).to(torch.int64)
    hist = torch.zeros(len(cases), NB, dtype=torch.int64).scatter_add_(
        1, d, torch.ones_like(d)).to(torch.int32)
    Z = torch.exp(x - M[:, None]).sum(dim=1)
    target = torch.tensor([p for _, _, p in cases]) * Z
    lb = torch.empty(len(cases))
    _prune_bound_kernel[(len(cases),)](hist, M, target, lb, NB=NB)
    for r, (kind, T, p) in enumerate(cases):
        tau = _nucleus_floor(x[r], p)
        assert lb[r] <= tau, (kind, T, p, float(lb[r]), tau)
        p_hi = p * math.exp(1 / W + slack)
        if p_hi < 0.999:
            floor = _nucleus_floor(x[r], p_hi) - 1 / W - slack - 1e-4
            assert lb[r] >= floor or M[r] - floor > (NB - 2) / W, (kind, T, p, float(lb[r]))
    conf = [r for r, c in enumerate(cases) if c[:2] == ("confident", 0.6)]
    assert torch.isfinite(lb[conf]).all() and (M[conf] - lb[conf] < 3.0).all()


def test_list_bound_above_tau_never_decides_a_token(monkeypatch):
    """A list bound above tau (here the row's max) leaves a list whose mass is short of p Z:
    the row is not exact on the candidates and the band read / row pass draws it, the twin's
    tokens, also on rows where every token is a candidate (a 'complete' list, which v3
    searched whatever its mass)."""
    g = torch.Generator().manual_seed(83)
    V = 1031
    x = torch.randn(4, V, generator=g) * 2
    x[1, 5] = x[1].max() + 1.0                          # the max alone: ~p of the mass
    x[2, torch.rand(V, generator=g) < 0.9] = float("-inf")  # few finite tokens
    kw = dict(temperature=torch.tensor([1.0, 0.7, 1.0, 0.6]),
              top_p=torch.tensor([0.9, 0.95, 0.8, 0.5]),
              seed=torch.arange(4) + 31, offset=torch.arange(4))
    monkeypatch.setattr(merge, "_prune_bound", _bound_at_max)
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    for cand in (8, 64):  # 64 slots a 64-token block: every token is a candidate
        tok, lp = _run(x, tile=64, cand=cand, **kw)
        assert torch.equal(tok, tw_tok), cand
        torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


class CandidateReads(KernelReads):
    """KernelReads of the candidate workspace [B, NT, KT] (pre-filled with a sentinel, so
    ``written`` counts the slots stage 1 wrote)."""
    SENTINEL = -(2 ** 62)

    def __init__(self, B, NT, KT, monkeypatch):
        from gpu_sampler.kernels import sampling
        self.ws = torch.full((B, NT, KT), self.SENTINEL, dtype=torch.int64)
        real = sampling._workspace
        monkeypatch.setattr(sampling, "_workspace", lambda shape, dtype, device: (
            self.ws if (tuple(shape), dtype) == ((B, NT, KT), torch.int64)
            else real(shape, dtype, device)))
        super().__init__(self.ws, monkeypatch)

    def written(self):
        return int((self.ws != self.SENTINEL).sum())


def test_list_visits_only_the_blocks_that_reach_its_bound(monkeypatch):
    """Top-p on confident rows (T 0.6: the max holds ~90% of the mass): the list bound lies
    within a few units of the max, so the merge compacts the candidates of the one block whose
    max reaches it, not every slot of the row: its reads of the candidate workspace are the
    histogram's (each written slot once) plus that block's slots. Tokens are the twin's."""
    g = torch.Generator().manual_seed(89)
    V, NT, KT = 4099, 65, 8
    x = torch.randn(2, V, generator=g) * 1.5
    x[0, 1000], x[0, 1010] = 14.0, 12.5                 # both in block 15
    x[1, 70], x[1, 4097] = 13.0, 12.0                  # blocks 1 and 64 (the short last one)
    reads = CandidateReads(2, NT, KT, monkeypatch)
    kw = dict(temperature=0.6, top_p=0.9, seed=torch.tensor([3, 4]), offset=torch.tensor([0, 1]))
    tok, lp = _run(x, tile=64, cand=KT, **kw)
    written = reads.written()
    assert written > 6 * NT                              # most blocks store candidates
    assert written < reads.bytes["_merge_kernel"] // 8 <= written + 3 * KT
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


def test_min_p_row_past_its_candidates_lists_nothing(monkeypatch):
    """Min-p alone on flat rows: a token left out of the candidates lies above the cut, so the
    candidates cannot finish the row; the merge reads none of them (no list, no dirty-block
    re-read) and hands the row to the second read. Tokens are the twin's."""
    g = torch.Generator().manual_seed(97)
    V, NT, KT = 2053, 33, 8
    x = torch.randn(3, V, generator=g)
    reads = CandidateReads(3, NT, KT, monkeypatch)
    kw = dict(temperature=1.0, min_p=torch.tensor([0.05, 0.1, 0.02]), seed=7,
              offset=torch.arange(3))
    tok, lp = _run(x, tile=64, cand=KT, **kw)
    assert reads.written() > 0 and reads.bytes.get("_merge_kernel", 0) == 0
    assert reads.grids["_gather_kernel"][1] > 1
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
