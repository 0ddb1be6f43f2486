"""Stage 1's band counts (kernels/stats.py's _block_bands: NBIN counts a block, each finite
token in bin j = min(F - floor(xp s), NBIN - 1), F = floor(vm s)) count every finite token
exactly once and nothing else: rows with -inf lanes, an all -inf block, and blocks whose F
is just under 2^24, where F - 127 is still exact (past 2^24 it rounds, to F - 128 at 2^25: a
bin 128 the histogram drops, so the plan refuses such rows, band_plan.F_BAND_MAX; the row
pass takes them, tests/test_tiny_temperature.py). The band read's list is exact only if these
counts are."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl

    from gpu_sampler.kernels.common import NBIN
    from gpu_sampler.kernels.stats import _band_cands, _block_bands

    @triton.jit
    def _bands_kernel(v_ptr, hb_ptr, f_ptr, tdiv, TILE: tl.constexpr):
        t = tl.program_id(0)
        v = tl.load(v_ptr + t * TILE + tl.arange(0, TILE))
        _block_bands(v, tl.max(v, axis=0), v > float("-inf"), tdiv, hb_ptr, f_ptr, t)

    @triton.jit
    def _cands_kernel(v_ptr, hb_ptr, f_ptr, cand_ptr, out_ptr, gout_ptr, tdiv,
                      TILE: tl.constexpr, KT: tl.constexpr):
        t = tl.program_id(0)
        offs = t * TILE + tl.arange(0, TILE)
        v = tl.load(v_ptr + offs)
        nfin, nkeep, g = _band_cands(v, offs, tl.max(v, axis=0), v > float("-inf"), tdiv,
                                     cand_ptr, hb_ptr, f_ptr, 0, 0, t, TILE, KT, 8, -2, 32)
        tl.store(out_ptr + 2 * t, nfin)
        tl.store(out_ptr + 2 * t + 1, nkeep)
        tl.store(gout_ptr + t, g)


def _want(v, tdiv):
    """The counts from the bin rule in float32 torch arithmetic (finite lanes only)."""
    s = torch.tensor(8.0) / torch.tensor(tdiv, dtype=torch.float32)
    out = []
    for row in v:
        fin = row > float("-inf")
        if not fin.any():
            out.append(torch.zeros(int(NBIN), dtype=torch.int64))
            continue
        F = torch.floor(row[fin].max() * s)
        y = torch.maximum(row[fin] * s, F - (int(NBIN) - 1))
        j = F.to(torch.int64) - torch.floor(y).to(torch.int64)
        out.append(torch.bincount(j, minlength=int(NBIN)))
    return torch.stack(out)


@pytest.mark.parametrize("tdiv", [1.0, 0.7])
def test_band_counts_count_each_finite_token_once(tdiv):
    tile = 256
    g = torch.Generator().manual_seed(17)
    v = torch.randn(5, tile, generator=g) * 4
    v[1, ::2] = float("-inf")                              # half the lanes masked
    v[2] = float("-inf")                                   # no finite token
    v[3] = 2.0 ** 20 * tdiv + 24 * torch.randn(tile, generator=g)  # F ~ 2^23
    v[4, :200] = float("-inf")
    v[4, 200:] = (2.0 ** 21 - 64 + torch.arange(56.0)) * tdiv  # F just under 2^24, ties
    hb = torch.full((5, int(NBIN)), -7, dtype=torch.int16)
    f = torch.zeros(5)
    _bands_kernel[(5,)](v, hb, f, tdiv, TILE=tile)
    assert torch.equal(hb.to(torch.int64), _want(v, tdiv))
    assert torch.equal(hb.sum(1), (v > float("-inf")).sum(1))


def _want_window(row, tdiv, kt):
    """The candidates _band_cands must keep: the finite tokens of the top bins [0, e_j] for
    the widest window j holding <= kt of them, e_j = min(ceil(2^(j + 1) / T) - 1, 126) for
    j < 7 (_block_cands' windows of 2^(j - 2) units of xp) and e_7 = 127 (bin 127 is every
    bin below: all finite tokens); none if no window holds <= kt. From the bin rule in
    float32 torch arithmetic."""
    fin = row > float("-inf")
    keep = torch.zeros_like(fin)
    if not fin.any():
        return keep
    t32 = torch.tensor(tdiv, dtype=torch.float32)
    s = torch.tensor(8.0) / t32
    F = torch.floor(row[fin].max() * s)
    j = F.to(torch.int64) - torch.floor(torch.maximum(row * s, F - 127)).to(torch.int64)
    for w in range(8):
        e = 127 if w == 7 else int(min(max(torch.ceil(torch.tensor(2.0 ** (w + 1)) / t32) - 1,
                                           0), 126))
        sel = fin & (j <= e)
        if sel.sum() <= kt:
            keep = sel
    return keep


@pytest.mark.parametrize("tdiv", [1.0, 0.55, 3.0, 0.02])
def test_band_candidates_are_the_windows_read_off_the_bins(tdiv):
    """The candidates of a BANDS launch (stage 1's one histogram, kernels/stats.py
    _band_cands): an upper set of the block, the widest of the windows (2^(j - 2) units of
    xp as bins of 1/8 unit of x) holding <= KT (every finite token when the block holds <= KT,
    none when no window does), in id order in the first slots; nfin every finite token, g the
    largest one not stored. Rows: Gaussian, -inf lanes, no finite token, <= KT finite
    tokens, a top bin of KT + 1 ties, ties everywhere (equal values share a bin), a confident
    head."""
    tile, kt = 256, 16
    g = torch.Generator().manual_seed(23)
    v = torch.randn(7, tile, generator=g) * 3
    v[1, ::3] = float("-inf")
    v[2] = float("-inf")
    v[3, 10:] = float("-inf")                               # 10 finite: all candidates
    v[4] = v[4].clamp(max=4.0)
    v[4, : kt + 1] = 5.0                                    # top bin: kt + 1 tied tokens
    v[5] = torch.round(v[5])                                # ties everywhere
    v[6, 7], v[6, 99] = 30.0, 29.0                          # a confident head
    hb = torch.zeros((7, int(NBIN)), dtype=torch.int16)
    f = torch.zeros(7)
    cand = torch.full((7 * kt,), -1, dtype=torch.int64)
    out = torch.zeros(14, dtype=torch.int32)
    gout = torch.zeros(7)
    _cands_kernel[(7,)](v, hb, f, cand, out, gout, tdiv, TILE=tile, KT=kt)
    kept = 0
    for t in range(7):
        row = v[t]
        keep = _want_window(row, tdiv, kt)
        n = int(keep.sum())
        kept += n
        assert out[2 * t] == int((row > float("-inf")).sum())
        assert out[2 * t + 1] == n
        ids = (cand[t * kt: t * kt + n] >> 32).to(torch.int64) - t * tile
        assert torch.equal(ids, torch.nonzero(keep).flatten())  # id order, those tokens
        rest = row[(row > float("-inf")) & ~keep]
        assert gout[t] == (rest.max() if rest.numel() else float("-inf"))
        if n:
            assert row[keep].min() > (rest.max() if rest.numel() else float("-inf"))
    assert kept > 10 + 2  # more than the <= KT row and the confident head
