"""The second reads' share of the grid (kernels/second.py _row_share) under the interpreter: the
rows that take the band read or the second read get all B C programs of the gather's grid, not
only their own C, and every block is still read once, by one program; the answer is the same
bits as each row sampled alone, on any chunk count, fused in one gather launch or not."""
import numpy as np
import pytest
import torch

from conftest import BACKENDS, DEVICE
from test_kernel_v2 import _ks, _run, _twin_tokens

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

GEOM = dict(tile=64, cand=8)


class ProgramRows:
    """Per kernel, which programs (grid positions) loaded each row of one [B, V] tensor, and
    how many of its elements each row had loaded (every unmasked lane, by address)."""

    def __init__(self, t, monkeypatch):
        from triton.runtime import interpreter as ti
        lo = t.untyped_storage().data_ptr()
        row_bytes, n_bytes = t.stride(0) * t.element_size(), t.untyped_storage().nbytes()
        self.programs, self.loads, cur = {}, {}, ["?"]
        load, call = ti.InterpreterBuilder.create_masked_load, ti.GridExecutor.__call__

        def masked_load(b, ptrs, mask, other, cache_policy, is_volatile):
            a = np.asarray(ptrs.data, dtype=np.uint64).astype(np.int64) - lo
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), a.shape)
            rows = a[m & (a >= 0) & (a < n_bytes)] // row_bytes
            for r, n in zip(*np.unique(rows, return_counts=True)):
                self.programs.setdefault(cur[0], {}).setdefault(int(r), set()).add(b.grid_idx)
                key = (cur[0], int(r))
                self.loads[key] = self.loads.get(key, 0) + int(n)
            return load(b, ptrs, mask, other, cache_policy, is_volatile)

        def run(ex, *args, **kwargs):
            cur[0] = ex.fn.__name__
            return call(ex, *args, **kwargs)

        monkeypatch.setattr(ti.InterpreterBuilder, "create_masked_load", masked_load)
        monkeypatch.setattr(ti.GridExecutor, "__call__", run)


def _mixed(V, g):
    """A serving batch where two rows of six take a second read: a flat top-p row (the band
    read) and a flat min-p row (the second read); the others finish in the merge (greedy,
    top-k 50, N(0, 3^2) at T 0.6 p 0.9, a confident min-p row)."""
    x = torch.randn(6, V, generator=g)
    x[2] *= 3
    x[5] *= 3
    x[5, 7] = 12.0
    kw = dict(temperature=torch.tensor([0.0, 1.0, 0.6, 0.7, 1.0, 1.0]),
              top_k=torch.tensor([0, 0, 0, 50, 0, 0]),
              top_p=torch.tensor([1.0, 0.95, 0.9, 1.0, 1.0, 1.0]),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.05]),
              seed=torch.arange(6) + 40, offset=torch.tensor([3, 1, 4, 1, 5, 9]))
    return x, kw


@pytest.mark.parametrize("fused", [True, False])
def test_busy_rows_share_the_whole_grid(monkeypatch, fused):
    """At 4 chunks a row (C = 4 of 33 blocks), the band row and the min-p row are each read
    once more by 17 programs (6 x 4 programs over 2 rows, 2 blocks each), not 4: the gathers
    give the grid to the rows that take them. One gather launch for both (fused) or two. The
    twin's tokens; the same bits as every row alone and as the default chunking."""
    g = torch.Generator().manual_seed(71)
    V = 2053
    x, kw = _mixed(V, g)
    if not fused:
        monkeypatch.setattr(_ks(), "GATHER_SLOTS_WIDE", 0)  # at _setup: two gather launches
    seen = ProgramRows(x, monkeypatch)
    tok, lp = _run(x, chunks=4, **GEOM, **kw)
    gathers = ["_band_gather_kernel"] + ([] if fused else ["_gather_kernel"])
    assert sorted(k for k in seen.programs if "gather" in k) == sorted(gathers)
    by_row = {}
    for k in gathers:
        for r, progs in seen.programs[k].items():
            by_row.setdefault(r, set()).update((k, p) for p in progs)
    assert sorted(by_row) == [1, 4]  # only the rows that take a second read are read again
    for r in (1, 4):
        assert len(by_row[r]) == 17  # ceil(33 / 2) programs: 2 blocks each, not 9
        assert sum(seen.loads.get((k, r), 0) for k in gathers) == V  # each block once
    tw_tok, tw_lp = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)
    torch.testing.assert_close(lp, tw_lp, atol=1e-5, rtol=1e-5)
    if fused:
        tok_d, lp_d = _run(x, **GEOM, **kw)
        assert torch.equal(tok_d, tok) and torch.equal(lp_d, lp)
    for r in (1, 4):  # alone: its own C = 4 programs, the same blocks' partials
        one = {k: v[r:r + 1] for k, v in kw.items()}
        tok_r, lp_r = _run(x[r:r + 1], chunks=4, **GEOM, **one)
        assert torch.equal(tok_r, tok[r:r + 1]) and torch.equal(lp_r, lp[r:r + 1])


def test_every_row_busy_keeps_stage_one_blocks(monkeypatch):
    """With every row a band row the share is stage 1's: program (row, c) reads row `row`'s
    blocks [c TPC, (c + 1) TPC)."""
    g = torch.Generator().manual_seed(72)
    V = 2049
    x = torch.randn(3, V, generator=g)
    kw = dict(temperature=1.0, top_p=0.95, seed=torch.tensor([1, 2, 3]), offset=0)
    seen = ProgramRows(x, monkeypatch)
    tok, lp = _run(x, chunks=4, **GEOM, **kw)
    progs = seen.programs["_band_gather_kernel"]
    assert {r: sorted(p[:2] for p in progs[r]) for r in progs} == {
        r: [(r, c) for c in range(4)] for r in range(3)}
    tw_tok, _ = _twin_tokens(x, **kw)
    assert torch.equal(tok, tw_tok)


def test_band_finish_slices_spread_over_the_grid(monkeypatch):
    """The band finish's grid (B, F) gives its programs to the band rows too: with F = 2 a row
    (forced) and one band row of six, that row's list is cut into min(16, 6 * 2) = 12 slices
    (each writes its partials), not 2; with every row a band row, 2. Fixed-point sums in list
    order: the same bits as the default split."""
    sampling = _ks()
    g = torch.Generator().manual_seed(73)
    V = 2053
    x, kw = _mixed(V, g)
    spi_seen, alloc = [], sampling._workspace

    def workspace(shape, dtype, device):
        t = alloc(shape, dtype, device)
        if dtype == torch.int64 and len(shape) == 2 and shape[1] == 3 * sampling.BAND_SLICES:
            t.fill_(-7)  # the finish slices' int64 partials (band.NSPI = 3 a slice)
            spi_seen.append(t)
        return t

    monkeypatch.setattr(sampling, "_workspace", workspace)
    tok_d, lp_d = _run(x, **GEOM, **kw)
    monkeypatch.setattr(sampling, "_band_programs", lambda B, dev: 2)  # at _setup
    spi_seen.clear()
    tok, lp = _run(x, **GEOM, **kw)
    assert torch.equal(tok, tok_d) and torch.equal(lp, lp_d)
    slices = (spi_seen[-1][1, 2 * 16:3 * 16] != -7).sum().item()  # SI_Z, written by each
    assert slices == 12
    xb = x[[1, 1, 1]]
    kb = dict(temperature=1.0, top_p=0.95, seed=torch.tensor([1, 2, 3]), offset=0)
    _run(xb, **GEOM, **kb)
    assert [(spi_seen[-1][r, 2 * 16:3 * 16] != -7).sum().item() for r in range(3)] == [2, 2, 2]
