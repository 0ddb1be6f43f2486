"""The band read (kernels/band.py) under the interpreter: top-p rows without top-k whose nucleus
outgrows the candidates take two reads over the grid (stage 1 + the gather) instead of the
merge's row pass; tokens equal to the torch twin's, logprobs close, the same at any chunk
count and on a sub-batch; rows whose band fails fall back to the row pass with the same answer.

Small geometry on purpose: 64-token blocks with 8 candidate slots (CAP = NT * 8 band tokens), so
a flat row's bin (~170 tokens at V = 4096) is a realistic fraction of the capacity."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_v2 import _run, _twin_tokens
from test_kernel_v3 import KernelReads

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

GEOM = dict(tile=64, cand=8)


def _band_rows(V, g):
    """Flat N(0, 1), power-law and flat N(0, 1) at T 0.6: nuclei of thousands of tokens."""
    x = torch.randn(3, V, generator=g)
    rank = torch.randperm(V, generator=g).float() + 1
    x[1] = -1.1 * torch.log(rank) + 0.1 * torch.randn(V, generator=g)
    kw = dict(temperature=torch.tensor([1.0, 1.0, 0.6]), top_p=torch.tensor([0.95, 0.95, 0.9]),
              seed=torch.arange(3) + 7, offset=torch.tensor([0, 1, 2]))
    return x, kw


def _check(x, kw, tok, lp):
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)


def test_band_rows_read_twice_and_match_twin(monkeypatch):
    """Two reads of each band row, both over (B, C) (the merge and the finish read no logits),
    in four launches (the merge plans the band), the twin's tokens, the same at 1 / 3 chunks
    (the sub-batch) and on a sub-batch."""
    g = torch.Generator().manual_seed(61)
    V = 4099
    x, kw = _band_rows(V, g)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert list(reads.grids) == ["_stats_kernel", "_merge_kernel", "_band_gather_kernel",
                                 "_band_finish_kernel"]
    assert reads.bytes["_stats_kernel"] == x.numel() * 4
    assert reads.bytes["_band_gather_kernel"] == x.numel() * 4  # every row once more
    assert reads.bytes.get("_merge_kernel", 0) == 0
    assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no band failed
    assert reads.grids["_band_gather_kernel"][1] > 1  # C programs per row
    _check(x, kw, tok, lp)
    tok_c, lp_c = _run(x, chunks=1, **GEOM, **kw)
    assert torch.equal(tok_c, tok) and torch.equal(lp_c, lp)
    r = torch.tensor([2, 0])
    sub = {k: v[r] for k, v in kw.items()}
    tok_s, lp_s = _run(x[r], chunks=3, **GEOM, **sub)
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])


def test_band_finish_programs_do_not_change_the_answer(monkeypatch):
    """The finish splits each band row's list over 1 to 16 programs (fewer at large batches:
    sampling._band_programs) and its last program merges them: tokens and logprobs are the
    same bits for every split (fixed-point kept masses, slices in list order), including a
    row whose tau sits in a bucket of tied values (logits on a 1/16 grid) and a min-p row."""
    from test_kernel_v2 import _ks
    g = torch.Generator().manual_seed(66)
    V = 3001
    x = torch.randn(3, V, generator=g)
    x[1] = torch.round(x[1] * 16) / 16
    kw = dict(temperature=torch.tensor([1.0, 1.0, 0.7]), top_p=torch.tensor([0.95, 0.9, 0.9]),
              min_p=torch.tensor([0.0, 0.0, 0.02]), seed=torch.arange(3) + 5, offset=1)
    out = {}
    for fp in (1, 4, 16):
        monkeypatch.setattr(_ks(), "_band_programs", lambda B, dev, fp=fp: fp)  # at _setup
        reads = KernelReads(x, monkeypatch)
        out[fp] = _run(x, **GEOM, **kw)
        assert reads.grids["_band_finish_kernel"][1] == fp
        assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no band failed
    _check(x, kw, *out[16])
    for fp in (1, 4):
        assert torch.equal(out[fp][0], out[16][0]) and torch.equal(out[fp][1], out[16][1])


def test_band_finish_filters_a_slice_of_several_tiles(monkeypatch):
    """One finish program filters a band slice longer than two of its 512-entry tiles (each
    tile's loads issued while the one before is filtered, kernels/band.py _band_filter): the
    same bits as four slices of one tile each, and the twin's token. V = 12289 at the small
    geometry: a flat row's band holds 1420 tokens."""
    from gpu_sampler.kernels.band_plan import I_N, NBI
    from test_kernel_v2 import _ks
    g = torch.Generator().manual_seed(67)
    x = torch.randn(1, 12289, generator=g)
    kw = dict(temperature=1.0, top_p=0.95, seed=3, offset=5)
    made = []
    alloc = _ks()._workspace
    monkeypatch.setattr(_ks(), "_workspace", lambda *a: made.append(alloc(*a)) or made[-1])
    out = {}
    for fp in (1, 4):
        monkeypatch.setattr(_ks(), "_band_programs", lambda B, dev, fp=fp: fp)  # at _setup
        made.clear()
        reads = KernelReads(x, monkeypatch)
        out[fp] = _run(x, **GEOM, **kw)
        assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no band failed
        (bi,) = [t for t in made if t.dtype == torch.int32 and t.shape == (1, NBI.value)]
        assert bi[0, I_N.value] > 2 * 512
    assert torch.equal(out[1][0], out[4][0]) and torch.equal(out[1][1], out[4][1])
    _check(x, kw, *out[1])


def test_band_gather_ranks_at_full_blocks(monkeypatch):
    """1024-token blocks at 4 warps, the GPU's geometry (the tests above use 64-token blocks,
    where the rank is a plain cumsum): the gather ranks a block's band tokens with the packed
    scan (common._kept_slots), or with a cumsum under presence / frequency penalties (the
    packed fields spilled at that variant's register cap). Both place every band token where
    the plan's offsets say: the twin's tokens, one read by the gather, the same bits on one
    chunk."""
    g = torch.Generator().manual_seed(68)
    V = 8191
    x = torch.randn(2, V, generator=g)
    ids = torch.randint(0, V, (2, 24), generator=g)
    for pen in ({}, dict(presence_penalty=0.4, frequency_penalty=0.2, input_ids=ids)):
        kw = dict(temperature=1.0, top_p=0.95, seed=torch.tensor([5, 6]), offset=2, **pen)
        reads = KernelReads(x, monkeypatch)
        tok, lp = _run(x, num_warps=4, **kw)
        assert reads.bytes["_band_gather_kernel"] == x.numel() * 4
        assert reads.bytes.get("_band_finish_kernel", 0) == 0  # no band failed
        _check(x, kw, tok, lp)
        tok_c, lp_c = _run(x, num_warps=4, chunks=1, **kw)
        assert torch.equal(tok_c, tok) and torch.equal(lp_c, lp)


@pytest.mark.slow  # 14 s; the default run keeps bf16 band rows in test_kernel_speculative.py
def test_band_per_row_mix_bf16(monkeypatch):
    """Per-row tensors mixing greedy, top-k, top-p, top-p + min-p and min-p rows on bf16 logits:
    the top-p rows take the band, every token the twin's; many offsets on one band row draw
    the twin's tokens (the band does sample)."""
    g = torch.Generator().manual_seed(62)
    V = 2500
    x = torch.randn(5, V, generator=g).to(torch.bfloat16)
    kw = dict(temperature=torch.tensor([0.0, 0.8, 1.0, 1.0, 1.0]),
              top_k=torch.tensor([0, 40, 0, 0, 0]),
              top_p=torch.tensor([1.0, 0.9, 0.95, 0.9, 1.0]),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.05, 0.1]),
              seed=torch.arange(5), offset=3)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    # the two top-p rows, and the min-p row's second read: a small batch with both hand-overs
    # runs that read's gather in the band gather's launch (sampling._Call.fuse)
    assert reads.bytes["_band_gather_kernel"] == 3 * V * 2
    assert "_gather_kernel" not in reads.grids
    _check(x, kw, tok, lp)
    xs = x[2:3].expand(4, V).contiguous()
    kws = dict(temperature=1.0, top_p=0.95, seed=4, offset=torch.arange(4))
    tok, lp = _run(xs, **GEOM, **kws)
    _check(xs, kws, tok, lp)
    assert len(set(tok.tolist())) > 2


def test_band_failures_take_the_row_pass(monkeypatch):
    """Row 0: one slot per block, so the boundary bin alone holds more tokens than the band's
    capacity (the plan fails: no gather read, the row pass in the finish). Row 1: integer ties,
    each value ~V/4 times (a tie group wider than the capacity). Both the twin's tokens."""
    g = torch.Generator().manual_seed(63)
    V = 2048
    x = torch.randn(2, V, generator=g)
    x[1] = torch.randint(0, 4, (V,), generator=g).float()
    kw = dict(temperature=1.0, top_p=0.9, seed=torch.tensor([3, 4]), offset=0)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=1, **kw)
    assert reads.bytes.get("_band_gather_kernel", 0) == 0
    assert reads.bytes["_band_finish_kernel"] >= 2 * 2 * V * 4  # a search round + the draw, each
    _check(x, kw, tok, lp)


def test_band_misestimate_fails_validation_and_takes_the_row_pass(monkeypatch):
    """The estimate takes a bin's mass at a uniform density: 30 tokens at x = -0.88 (the top of
    bin [-1, -0.875)) weigh 6% more than estimated, 20 at x = -3 (a bin's bottom) 6% less. With
    p inside that error (W(-0.88) >= p Z, the estimate's head < p Z) the plan puts the boundary
    in the -3 bin and the band cannot hold both groups (CAP = 32): the gather reads the row, the
    finish finds W_above >= p Z and runs the row pass. Still the twin's token."""
    V = 2048
    x = torch.full((1, V), float("-inf"))
    x[0, 5] = 0.0
    x[0, 64:94] = -0.88
    x[0, 128:148] = -3.0
    kw = dict(temperature=1.0, top_p=0.929, seed=torch.tensor([9]), offset=0)
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, tile=64, cand=1, **kw)
    assert reads.bytes["_band_gather_kernel"] == V * 4  # the plan found a band
    assert reads.bytes["_band_finish_kernel"] >= 2 * V * 4  # validation failed: the row pass
    _check(x, kw, tok, lp)


class SlotReads:
    """Bytes each kernel loads from stage 1's candidate slots (the launcher's int64 [B, NT, KT]
    workspace), by address (interpreter hooks)."""

    def __init__(self, monkeypatch):
        import numpy as np
        from triton.runtime import interpreter as ti
        from test_kernel_v2 import _ks
        ks = _ks()
        from gpu_sampler.kernels.stats import I_NCAND, NI
        self.bytes, ranges, cur, wi = {}, [], ["?"], []
        alloc, load, call = ks._workspace, ti.InterpreterBuilder.create_masked_load, \
            ti.GridExecutor.__call__

        def workspace(shape, dtype, device):
            t = alloc(shape, dtype, device)
            if dtype == torch.int64 and len(shape) == 3:  # one a call: the latest call's
                lo = t.untyped_storage().data_ptr()
                ranges[:] = [(lo, lo + t.untyped_storage().nbytes())]
            if dtype == torch.int32 and len(shape) == 3 and shape[1] == NI.value:
                wi.append(t)
            return t

        def masked_load(b, ptrs, mask, other, cache_policy, is_volatile):
            a = np.asarray(ptrs.data, dtype=np.uint64)
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), a.shape)
            for lo, hi in ranges:
                n = int((m & (a >= lo) & (a < hi)).sum()) * 8
                self.bytes[cur[0]] = self.bytes.get(cur[0], 0) + n
            return load(b, ptrs, mask, other, cache_policy, is_volatile)

        def run(ex, *args, **kwargs):
            cur[0] = ex.fn.__name__
            return call(ex, *args, **kwargs)

        self.ncand = lambda: int(wi[-1][:, I_NCAND.value].sum())  # stored by the last call
        monkeypatch.setattr(ks, "_workspace", workspace)
        monkeypatch.setattr(ti.InterpreterBuilder, "create_masked_load", masked_load)
        monkeypatch.setattr(ti.GridExecutor, "__call__", run)


def test_band_ties_at_tau(monkeypatch):
    """Logits on a 1/16 grid (every value tied ~30-100 times, so tau always sits on a tie group
    inside the band) at T 1.0 and 0.7: the band read (no row pass), the twin's tokens, the same
    at 1 chunk and on a sub-batch."""
    g = torch.Generator().manual_seed(64)
    V = 4099
    x = torch.round(torch.randn(3, V, generator=g) * 16) / 16
    kw = dict(temperature=torch.tensor([1.0, 0.7, 1.0]), top_p=torch.tensor([0.95, 0.9, 0.6]),
              seed=torch.arange(3) + 2, offset=torch.tensor([4, 5, 6]))
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert reads.bytes["_band_gather_kernel"] == x.numel() * 4  # every row took the band
    assert reads.bytes.get("_band_finish_kernel", 0) == 0  # and its validation passed
    _check(x, kw, tok, lp)
    tok_c, lp_c = _run(x, chunks=1, **GEOM, **kw)
    assert torch.equal(tok_c, tok) and torch.equal(lp_c, lp)
    r = torch.tensor([1])
    tok_s, lp_s = _run(x[r], **GEOM, **{k: v[r] for k, v in kw.items()})
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])


def test_merge_compacts_only_candidates_that_can_hold_p(monkeypatch):
    """Row 0 (flat): an upper bound of the candidates' mass from the blocks' maxima (ncand_t
    e^(m_t - M) a block) is below p Z, so the merge reads no slot (no histogram, no
    compaction). Row 1: the candidates (0 and 5 tokens at -0.1 in each 64-token block; 8
    slots a block) hold 176.8 of Z ~ 194.2; the maxima's bound (192) and the histogram's
    (192) are >= p Z ~ 184.5: the merge reads the slots for the histogram, compacts them (a
    second read), finds 176.8 < p Z and hands the row to the band read (the tail,
    N(-5.14, 1), holds the rest). Both the twin's tokens."""
    g = torch.Generator().manual_seed(65)
    V = 2048
    x = torch.randn(2, V, generator=g)
    x[1] = -5.14 + torch.randn(V, generator=g)
    x[1].view(-1, 64)[:, 0] = 0.0
    x[1].view(-1, 64)[:, 1:6] = -0.1
    kw = dict(temperature=1.0, top_p=0.95, seed=torch.tensor([1, 2]), offset=0)
    reads = KernelReads(x, monkeypatch)
    slots = SlotReads(monkeypatch)
    tok, lp = _run(x[:1], **GEOM, **{**kw, "seed": kw["seed"][:1]})
    assert slots.ncand() > 0 and slots.bytes.get("_merge_kernel", 0) == 0
    assert reads.bytes["_band_gather_kernel"] == V * 4
    slots.bytes.clear()
    tok1, lp1 = _run(x[1:], **GEOM, **{**kw, "seed": kw["seed"][1:]})
    assert slots.bytes["_merge_kernel"] == 2 * 8 * slots.ncand()  # + the compaction's
    assert reads.bytes["_band_gather_kernel"] == 2 * V * 4  # row 1 took the band too
    _check(x, kw, torch.cat([tok, tok1]), torch.cat([lp, lp1]))


def test_band_per_row_mix_min_p_and_sub_batches(monkeypatch):
    """One call mixing band rows (flat at p 0.95; tied values; flat with a min-p cut above tau,
    so the finish's draw drops band lanes by min-p) with rows the candidates finish (N(0, 3^2)
    at T 0.6 p 0.9) and a greedy row: the twin's tokens, bit-identical on a
    sub-batch in another order."""
    g = torch.Generator().manual_seed(66)
    V = 2500
    x = torch.randn(5, V, generator=g)
    x[1] = torch.round(x[1] * 16) / 16
    x[3] *= 3
    kw = dict(temperature=torch.tensor([1.0, 1.0, 1.0, 0.6, 0.0]),
              top_p=torch.tensor([0.95, 0.9, 0.95, 0.9, 1.0]),
              min_p=torch.tensor([0.0, 0.0, 0.02, 0.0, 0.0]),
              seed=torch.arange(5) + 20, offset=torch.tensor([1, 2, 3, 4, 5]))
    reads = KernelReads(x, monkeypatch)
    tok, lp = _run(x, **GEOM, **kw)
    assert reads.bytes["_band_gather_kernel"] == 3 * V * 4  # rows 0-2
    assert reads.bytes.get("_band_finish_kernel", 0) == 0
    _check(x, kw, tok, lp)
    r = torch.tensor([4, 2, 0])  # another batch composition and order
    tok_s, lp_s = _run(x[r], **GEOM, **{k: v[r] for k, v in kw.items()})
    assert torch.equal(tok_s, tok[r]) and torch.equal(lp_s, lp[r])


@pytest.mark.parametrize("p", [0.0, -0.0])
def test_top_p_zero_keeps_the_top_tie_group(p):
    """top_p = 0 keeps the top tie group (as any p below the top token's share). A row whose
    ties fill every block's candidate slots (all equal; 20 tied maxima spread over blocks)
    left the merge an empty candidate list, which held the target p Z = 0 and gave tau = +inf:
    token -1, logprob +inf, an all-zero distribution. So did a list holding only values below
    the row's max (row 3: tied blocks and one block of three smaller values), where a pivot
    above the list's max held p Z = 0. The twin's tokens, logprob -ln(group)."""
    V = 640
    x = torch.zeros(4, V)
    x[1] = torch.randn(V, generator=torch.Generator().manual_seed(5))
    x[1, 3::32] = 4.0                                     # 20 tied maxima, 2 a block
    x[2] = torch.randn(V, generator=torch.Generator().manual_seed(6))
    x[3, 576:] = float("-inf")                            # the last block: 3 candidates
    x[3, 600:603] = torch.tensor([-0.01, -0.02, -0.03])
    kw = dict(temperature=1.0, top_p=p, seed=torch.tensor([1, 2, 3, 4]), offset=0)
    tok, lp = _run(x, **GEOM, **kw)
    _check(x, kw, tok, lp)
    group = (x == x.max(1, keepdim=True).values).sum(1)
    assert bool((x.gather(1, tok[:, None])[:, 0] == x.max(1).values).all()), tok
    torch.testing.assert_close(lp, -torch.log(group.float()))
    probs = _run(x, **GEOM, write_probs=True, temperature=1.0, top_p=p)
    want = (x == x.max(1, keepdim=True).values).float() / group[:, None]
    torch.testing.assert_close(probs, want)
