"""kernels/common.py's _kept_slots (the rank of each kept lane among the block's kept lanes,
from one packed scan of two int32 words over the program's threads) equals the plain
exclusive cumsum, on its packed geometries (the GPU's 1024-token blocks at 4 and 8 warps,
256-token blocks) and its fallback ones, for sparse, dense, empty and full masks."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl

    from gpu_sampler.kernels.common import _kept_slots

    @triton.jit
    def _slots_kernel(keep_ptr, o_ptr, TILE: tl.constexpr, R: tl.constexpr):
        lane = tl.arange(0, TILE)
        keep = tl.load(keep_ptr + tl.program_id(0) * TILE + lane) != 0
        tl.store(o_ptr + tl.program_id(0) * TILE + lane, _kept_slots(keep, TILE, R))


# (TILE, R): packed with FW 8 (4 warps: 8 and 2 rows a thread), FW 16 (8 warps), and the
# cumsum fallbacks (one row a thread; 16 rows of 8 bits do not fit two words)
@pytest.mark.parametrize("tile,r", [(1024, 128), (256, 128), (1024, 256), (64, 64), (2048, 128)])
def test_kept_slots_is_the_exclusive_cumsum(tile, r):
    g = torch.Generator().manual_seed(tile + r)
    rows = [torch.rand(tile, generator=g) < q for q in (0.01, 0.3, 0.97)]
    rows += [torch.zeros(tile, dtype=torch.bool), torch.ones(tile, dtype=torch.bool)]
    keep = torch.stack(rows).to(torch.int32)
    out = torch.full_like(keep, -1)
    _slots_kernel[(keep.shape[0],)](keep, out, TILE=tile, R=r)
    want = torch.cumsum(keep, 1) - keep
    assert torch.equal(torch.where(keep != 0, out, -1), torch.where(keep != 0, want, -1))
