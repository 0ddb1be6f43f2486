"""kernels/interpreter.py's tree reduction gives what Triton's one-at-a-time fold gives, for
the user combines the kernels use (stats.py's _maxmin_combine) and for a tie-breaking one."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as ti

    from gpu_sampler.kernels import interpreter
    from gpu_sampler.kernels.stats import _maxmin_combine

    @triton.jit
    def _first_max_combine(a, ai, b, bi):
        first = (a > b) | ((a == b) & (ai < bi))
        return tl.where(first, a, b), tl.where(first, ai, bi)

    @triton.jit
    def _probe_kernel(x_ptr, o_ptr, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr,
                      KEEP: tl.constexpr, N: tl.constexpr):
        r = tl.arange(0, R)[:, None]
        c = tl.arange(0, C)[None, :]
        x = tl.load(x_ptr + r * C + c)
        ids = r * C + c
        mx, mn = tl.reduce((x, tl.where(x == x, x, 0.0)), AXIS, _maxmin_combine, keep_dims=KEEP)
        bv, bi = tl.reduce((x, ids), AXIS, _first_max_combine, keep_dims=KEEP)
        n = N
        k = tl.reshape(tl.arange(0, N), mx.shape)
        tl.store(o_ptr + k, mx)
        tl.store(o_ptr + n + k, mn)
        tl.store(o_ptr + 2 * n + k, bv)
        tl.store(o_ptr + 3 * n + k, bi.to(tl.float32))


@pytest.mark.parametrize("R,C,axis,keep", [(4, 64, 1, False), (32, 8, 0, False),
                                           (2, 128, 1, True), (16, 2, 0, True)])
def test_tree_reduce_matches_tritons_fold(R, C, axis, keep):
    assert interpreter.TRITON_GENERIC_REDUCE, "conftest installs the tree reduction"
    g = torch.Generator().manual_seed(R * C + axis)
    x = (torch.randn(R, C, generator=g) * 2).round()  # ties at the max
    x[0, 1] = float("-inf")
    x[1, C - 1] = float("nan")
    x[-1, :] = float("-inf")
    outs = []
    for fold in (interpreter.TRITON_GENERIC_REDUCE[0], interpreter._tree_reduce):
        ti.ReduceOps.generic_reduce = fold
        try:
            n = R if axis == 1 else C
            o = torch.full((4 * n,), 99.0)
            _probe_kernel[(1,)](x, o, R, C, axis, keep, n)
        finally:
            ti.ReduceOps.generic_reduce = interpreter._tree_reduce
        outs.append(o)
    assert torch.equal(outs[0].isnan(), outs[1].isnan())
    assert torch.equal(torch.nan_to_num(outs[0], 5.0), torch.nan_to_num(outs[1], 5.0))
    assert not torch.all(outs[1] == 99.0)
