"""The merge's reached-block order (kernels/merge.py _reached_order): the reached blocks'
keys in block order, for any reached set, at the block counts the launcher uses."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl

    from gpu_sampler.kernels.merge import _reached_order

    @triton.jit
    def _order_kernel(r_ptr, c_ptr, o_ptr, N: tl.constexpr):
        tt = tl.arange(0, N)
        reach = tl.load(r_ptr + tt) != 0
        tl.store(o_ptr + tt, _reached_order(reach, tt * 65536 + tl.load(c_ptr + tt), N))


@pytest.mark.parametrize("n", [2, 16, 128])
def test_reached_order_lists_the_reached_blocks_in_order(n):
    g = torch.Generator().manual_seed(n)
    for dens in (0.0, 0.05, 0.5, 0.95, 1.0):
        reach = (torch.rand(n, generator=g) < dens).to(torch.int32)
        reach[-1] = int(dens > 0.5)  # the last block, reached or not
        cnt = torch.randint(0, 65, (n,), generator=g, dtype=torch.int32)
        out = torch.full((n,), -7, dtype=torch.int32)
        _order_kernel[(1,)](reach, cnt, out, n)
        ids = torch.nonzero(reach).flatten()
        assert torch.equal(out[:len(ids)], (ids * 65536 + cnt[ids]).to(torch.int32)), (dens,)
