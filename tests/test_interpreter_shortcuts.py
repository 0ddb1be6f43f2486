"""kernels/interpreter.py's bookkeeping shortcuts change nothing a kernel computes: block types
and tensors built from shared shapes equal Triton's own (errors included), and int32
arithmetic that wraps gives the same bits with Triton's overflow check as without it."""
import pytest
import torch

from conftest import BACKENDS, DEVICE

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

if "triton" in BACKENDS and DEVICE == "cpu":
    import numpy as np
    import triton
    import triton.language as tl
    from triton.language import core, semantic

    from gpu_sampler.kernels import interpreter
    from gpu_sampler.kernels.common import _reciprocal

    @triton.jit
    def _mix_kernel(a_ptr, b_ptr, x_ptr, o_ptr, f_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        a = tl.load(a_ptr + i)
        b = tl.load(b_ptr + i)
        x = tl.load(x_ptr + i)
        # int32 products and sums past 2^31 wrap; the 2-D broadcasts build new shapes
        m = (a * b + a)[:, None] - (b * 65537)[None, :]
        tl.store(o_ptr + i[:, None] * N + i[None, :], m * 3 // 7 % 1000)
        # float ops of one type, with int and float scalars, a bf16 round trip, a select
        y = tl.exp(x - tl.max(x, axis=0)) / 3.0 + a.to(tl.float32) * 1e-9
        z = tl.where(y[:, None] > y[None, :], y[:, None] * 2, (y.to(tl.bfloat16).to(tl.float32)
                                                                - 1)[None, :])
        tl.store(f_ptr + i[:, None] * N + i[None, :], z)

    @triton.jit
    def _recip_kernel(d_ptr, o_ptr, N: tl.constexpr):
        for i in range(N):  # one scalar at a time: the memoized helpers' calls
            tl.store(o_ptr + i, _reciprocal(tl.load(d_ptr + i)))


def _own(name):
    assert interpreter.TRITON_OWN, "conftest installs the shortcuts"
    return interpreter.TRITON_OWN[name]


@pytest.mark.parametrize("elem", ["fp32", "int64", "ptr"])
@pytest.mark.parametrize("shape", [[1024], [64, 8], [1, 128], (tl.constexpr(4), 16)])
def test_shared_block_types_equal_tritons_own(elem, shape):
    ety = {"fp32": tl.float32, "int64": tl.int64, "ptr": tl.pointer_type(tl.int32)}[elem]
    dims = [int(tl.core._unwrap_if_constexpr(d)) for d in shape]
    shape = core.tuple(list(shape)) if isinstance(shape, tuple) else shape
    for _ in range(2):  # the second build takes the shared objects
        mine = core.block_type(ety, shape)
        own = core.block_type.__new__(core.block_type)
        _own("block_type")(own, ety, shape)
        assert (mine.name, mine.numel, list(mine.shape)) == (own.name, own.numel, dims)
        assert mine == own and mine.element_ty is ety
        t = core.tensor(None, mine)
        t_own = core.tensor.__new__(core.tensor)
        _own("tensor")(t_own, None, own)
        assert [d.value for d in t.shape] == [d.value for d in t_own.shape] == dims
        assert t.numel.value == t_own.numel.value and t.dtype == t_own.dtype == ety


@pytest.mark.parametrize("shape", [[12], [np.int64(8)], [], (8,), [8.0]])
def test_bad_shapes_raise_as_tritons_own(shape):
    with pytest.raises(Exception) as own:
        _own("block_type")(core.block_type.__new__(core.block_type), tl.float32, shape)
    for _ in range(2):
        with pytest.raises(own.type):
            core.block_type(tl.float32, shape)


def _mix(N, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-2**31, 2**31 - 1, (N,), dtype=torch.int32, generator=g)
    b = torch.randint(-2**31, 2**31 - 1, (N,), dtype=torch.int32, generator=g)
    x = torch.randn(N, generator=g) * 4
    o, f = torch.zeros(N, N, dtype=torch.int32), torch.zeros(N, N)
    _mix_kernel[(1,)](a, b, x, o, f, N)
    return a, b, o, f


def test_kernel_bits_equal_with_tritons_own_bookkeeping(monkeypatch):
    """The same kernel run with every shortcut and with all of Triton's own back in place
    (the type constructors, the equalities, the type check, the overflow check)."""
    mine = _mix(16, 30)
    for cls, attr, name in ((core.block_type, "__init__", "block_type"),
                            (core.tensor, "__init__", "tensor"), (core.tuple, "__eq__", "tuple_eq"),
                            (core.dtype, "__eq__", "dtype_eq"),
                            (semantic.TritonSemantic, "binary_op_sanitize_overflow_impl",
                             "sanitize"),
                            (semantic.TritonSemantic, "binary_op_type_checking_impl",
                             "type_check")):
        monkeypatch.setattr(cls, attr, _own(name))
    own = _mix(16, 30)
    for m, o in zip(mine, own):
        assert torch.equal(m, o)
    an, bn = (t.numpy() for t in mine[:2])
    with np.errstate(over="ignore"):
        m = ((an * bn + an)[:, None] - (bn * np.int32(65537))[None, :]) * np.int32(3)
    # Triton's integer // and % round toward zero (C), numpy's toward -inf
    want = np.fmod(np.trunc(m.astype(np.float64) / 7), 1000).astype(np.int32)
    assert torch.equal(mine[2], torch.from_numpy(want))


def test_memoized_reciprocal_equals_its_own_run(monkeypatch):
    """The MEMO_SCALAR helpers give the bits they give when run (first call per value, repeats,
    the all-ones significand, subnormal and huge divisors), and each call its own tensor."""
    d = torch.tensor([0.6, 0.6, 1.0, 3.0, -0.7, 1.9999999, 1e-45, 3e38, 0.6, -1e-40])
    interpreter.MEMO.clear()
    got = [torch.zeros_like(d) for _ in range(2)]
    for o in got:  # the second pass takes every value from the memo
        _recip_kernel[(1,)](d, o, d.numel())
    assert interpreter.MEMO
    monkeypatch.setattr(interpreter, "MEMO_SCALAR", frozenset())
    own = torch.zeros_like(d)
    _recip_kernel[(1,)](d, own, d.numel())
    for o in got:
        assert torch.equal(o.view(torch.int32), own.view(torch.int32))
    normal = d.abs() < 2.0 ** 125
    assert torch.equal(own[normal], (1.0 / d)[normal])
