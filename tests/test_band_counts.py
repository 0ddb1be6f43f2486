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
    from gpu_sampler.kernels.stats import _block_bands

    @triton.jit
    def _bands_kernel(v_ptr, hb_ptr, f_ptr, tdiv, TILE: tl.constexpr):
        t = tl.program_id(0)
        v = tl.load(v_ptr + t * TILE + tl.arange(0, TILE))
        _block_bands(v, tl.max(v, axis=0), v > float("-inf"), tdiv, hb_ptr, f_ptr, t)


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
