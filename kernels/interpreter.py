"""A faster Triton interpreter for the project's own instruments (tests/conftest.py,
bench/traffic.py, bench/workloads.py, bench/model_call.py): never imported by the library.

Triton's interpreter patches ``triton.language`` for a launch (``inspect.getmembers`` over tl,
tl.tensor and tl.math, ~0.5 ms) and restores it when the grid ends, but it patches again on
every call of a ``@triton.jit`` helper made inside the kernel (``InterpretedFunction.__call__``),
where nothing is left to patch. Our kernels call helpers per block (the hash, the bin rule, the
pivots): 130K such calls, 68 of 191 s, in one band test. ``skip_repeated_language_patching()``
makes such a call skip the repeat when the language its module sees is already patched (any
other call takes Triton's own path) and memoizes the numpy dtype of a Triton dtype (Triton
rebuilds a 20-entry dict per lookup). What the kernels compute, load and store is unchanged.

It also replaces the interpreter's reduction with a user combine function (``tl.reduce`` with
stats.py's ``_maxmin_combine``): Triton folds it one element at a time in Python, ~2000 combine
calls a stage-1 block, 50 of 60 s of a (2, 32000) call. ``_tree_reduce`` folds the same
function over halves of the axis instead (log2 n vectorised calls, left operand the lower
indices, as the GPU's tree), which gives the same result for the combines the kernels use
(max, min, integer sums: exact in any order). A float sum in a user combine (common.py's
_edges_combine: the band gather's masses, the pivot searches' W(t)) is folded by this tree,
not by numpy's tl.sum: the kernels compare such sums only with sums made the same way.

Two more shortcuts cut the per-op bookkeeping (thirtieth session; a band test 29.5 -> 13.2 s,
the suite 707 -> 461 s): tensors and block types built for dims already seen take the shape
objects built then (_share_shapes), and the int32 overflow check, whose only effect is a
device_assert that Triton drops without debug, is skipped without debug
(_skip_unasserted_overflow_checks). Values, loads and stores are unchanged
(tests/test_interpreter_shortcuts.py).

The helpers of MEMO_HELPERS are functions of their one argument's value alone (no load, no
program id): common.py's exact reciprocal, ~20 scalar ops (four Newton steps), which the GPU
compiler hoists out of a block loop and the interpreter reran in every block and program (9 of
96 s in two band tests, thirty-sixth session). Called with one scalar, such a helper runs once
per distinct (dtype, bits) and later calls take a copy of that value. Asked for by the tests
and the fuzzer, not by bench/model_call.py: the model's trace sees every program's code.
"""
import builtins

import numpy as np

TRITON_GENERIC_REDUCE = []  # Triton's own generic_reduce, once replaced
TRITON_OWN = {}  # Triton's own type constructors and overflow check, once replaced (tests)
MEMO_HELPERS = frozenset({"_reciprocal", "_reciprocal_normal", "_divisor_scale"})  # common.py
MEMO_SCALAR = frozenset()  # the helpers memoized: MEMO_HELPERS once asked for, else none
MEMO = {}  # (helper, dtype, argument bytes) -> its value; tests clear it


def skip_repeated_language_patching(memo=False):
    """Install the shortcuts once (memo: MEMO_HELPERS too); a Triton without these internals
    keeps its own."""
    global MEMO_SCALAR
    if memo:
        MEMO_SCALAR = MEMO_HELPERS
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
        cls, core, own_call = ti.InterpretedFunction, tl.core, ti.InterpretedFunction.__call__
        error, own_dtype = ti.InterpreterError, ti._get_np_dtype
    except (ImportError, AttributeError):
        return False
    if getattr(own_call, "_gpu_sampler", False):
        return True
    langs = {}

    def patched(lang):
        return not core.is_builtin(getattr(lang, "where", None))

    def call(self, *args, **kwargs):
        seen = langs.get(self.fn)
        if seen is None:
            seen = langs[self.fn] = [v for v in self.fn.__globals__.values()
                                     if v is tl or v is core]
        if not seen or not all(patched(lang) for lang in seen):
            return own_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            if self.fn.__name__ in MEMO_SCALAR and len(args) == 1 and not kwargs:
                return _memo_scalar(core, self.fn, fn, args[0])
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    dtypes = {}

    def np_dtype(tt_dtype):
        try:
            return dtypes[tt_dtype]
        except KeyError:
            got = dtypes[tt_dtype] = own_dtype(tt_dtype)
            return got
        except TypeError:
            return own_dtype(tt_dtype)

    call._gpu_sampler = True
    cls.__call__ = call
    ti._get_np_dtype = np_dtype
    _share_shapes(core)
    _skip_unasserted_overflow_checks()
    _same_type_operands(core)
    if hasattr(ti, "ReduceOps") and hasattr(ti.ReduceOps, "generic_reduce"):
        TRITON_GENERIC_REDUCE.append(ti.ReduceOps.generic_reduce)  # tests compare with it
        ti.ReduceOps.generic_reduce = _tree_reduce
    return True


def _memo_scalar(core, key_fn, fn, arg):
    """fn(arg) for a MEMO_SCALAR helper: computed once per scalar argument's dtype and bits, a
    fresh tensor over a copy of the value each call; a block or non-tensor argument runs fn."""
    if not isinstance(arg, core.tensor) or arg.type.is_block():
        return fn(arg)
    key = (key_fn, arg.dtype.name, arg.handle.data.tobytes())
    got = MEMO.get(key)
    if got is None:
        got = MEMO[key] = fn(arg)
    h = got.handle
    return core.tensor(type(h)(h.data.copy(), h.dtype), got.type)


def _share_shapes(core):
    """Every interpreted op builds a tensor and usually a block_type, and each builds its shape
    as a new tl.tuple (a tuple_type of constexpr types per dim): 13 + 13 of 97 s in a band
    test's profile. Both now take the shape objects built the first time for the same dims
    (block_type: its shape, numel and name; tensor: its constexpr shape and numel), and a tuple
    equals itself without normalising both sides. Any other argument (a non-int dim, a shape
    that is neither list nor tuple) takes Triton's own path, errors included."""
    own_block, own_tensor, own_eq = (core.block_type.__init__, core.tensor.__init__,
                                     core.tuple.__eq__)
    blocks, tensors = {}, {}

    def block_type_init(self, element_ty, shape):
        dims = _int_dims(core, shape)
        key = None if dims is None else (str(element_ty), dims)
        got = None if key is None else blocks.get(key)
        if got is None:
            own_block(self, element_ty, shape)
            if key is not None:
                blocks[key] = (self.shape, self.numel, self.name)
            return
        self.element_ty = element_ty
        self.shape, self.numel, self.name = got

    def tensor_init(self, handle, type):
        dims = builtins.tuple(type.shape.values) if type.is_block() else ()
        got = tensors.get(dims)
        if got is None:
            own_tensor(self, handle, type)
            tensors[dims] = (self.shape, self.numel)
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.shape, self.numel = got

    def tuple_equals(self, other):
        if other is self:
            return core.constexpr(True)
        if type(other) is list and all(type(d) is int for d in other):
            # Triton's own: other normalised to a tuple of the same ints, values compared
            return core.constexpr(self.values == other)
        return own_eq(self, other)

    def dtype_equals(self, other):
        return True if other is self else own_dtype_eq(self, other)

    own_dtype_eq = core.dtype.__eq__
    TRITON_OWN.update(block_type=own_block, tensor=own_tensor, tuple_eq=own_eq,
                      dtype_eq=own_dtype_eq)
    core.block_type.__init__ = block_type_init
    core.tensor.__init__ = tensor_init
    core.tuple.__eq__ = tuple_equals
    core.dtype.__eq__ = dtype_equals


def _skip_unasserted_overflow_checks():
    """Every int32 add, sub and mul is redone in int64 and range-checked for a device_assert
    (sanitize_overflow, on by default), and device_assert drops the check unless the options
    have debug: ~2 int64 casts, an op, two compares and an and per int op, computed and thrown
    away (14 of 56 s in a band test). Without debug the check is skipped; with it, Triton's."""
    from triton.language import semantic
    own = semantic.TritonSemantic.binary_op_sanitize_overflow_impl

    def sanitize(self, lhs, rhs, binary_op):
        if self.builder.options.debug:
            return own(self, lhs, rhs, binary_op)
        return None

    TRITON_OWN["sanitize"] = own
    semantic.TritonSemantic.binary_op_sanitize_overflow_impl = sanitize


def _same_type_operands(core):
    """A binary op's type check (implicit casts to the computation type, then broadcasts)
    returns both operands as they are when they are tensors of one type whose computation type
    is that type: no cast, equal shapes. Most ops of the kernels are such pairs; they now skip
    the check's ~20 calls. Which scalar types qualify is asked of Triton's own
    computation_type_impl, once per (type, div_or_mod); everything else takes the full check."""
    from triton.language import semantic
    own = semantic.TritonSemantic.binary_op_type_checking_impl
    same = {}

    def check(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
              div_or_mod=False):
        if arithmetic_check and isinstance(lhs, core.tensor) and type(lhs) is type(rhs):
            lt, rt = lhs.type, rhs.type
            if lt is rt or lt == rt:
                sca = lt.scalar
                key = (sca.name, div_or_mod)
                ok = same.get(key)
                if ok is None:
                    ok = same[key] = (not sca.is_ptr()) and self.computation_type_impl(
                        sca, False, sca, False, div_or_mod) == sca
                if ok:
                    return lhs, rhs
        return own(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    TRITON_OWN["type_check"] = own
    semantic.TritonSemantic.binary_op_type_checking_impl = check


def _int_dims(core, shape):
    """shape's dims as a builtins tuple when it is a list or tl.tuple of plain ints (constexpr
    wrapped or not), else None."""
    if type(shape) is core.tuple:
        dims = builtins.tuple(shape.values)
        if all(type(d) is int for d in dims):  # a block_type's own shape
            return dims
    elif not isinstance(shape, (list, core.tuple)):
        return None
    dims = builtins.tuple(d.value if isinstance(d, core.constexpr) else d for d in shape)
    return dims if all(type(d) is int for d in dims) else None


def _tree_reduce(self, input):
    """ReduceOps.generic_reduce by a pairwise tree along the axis: each step combines element
    2i (left) with 2i + 1 (right) of every operand in one call; an odd last element waits for
    the next step. Output packed as Triton's own (keep_dims, axis=None)."""
    import triton.language as tl
    axis = self.axis
    data = [a.handle.data for a in input]
    if axis is None:
        axis, data = 0, [d.reshape(-1) for d in data]
    dts = [a.dtype for a in input]
    shape = data[0].shape  # after the flattening, as Triton's (axis=None: keep_dims gives (1,))
    while data[0].shape[axis] > 1:
        n = data[0].shape[axis]
        h = n // 2
        left = [self.to_tensor(np.take(d, np.arange(0, 2 * h, 2), axis=axis), t)
                for d, t in zip(data, dts)]
        right = [self.to_tensor(np.take(d, np.arange(1, 2 * h, 2), axis=axis), t)
                 for d, t in zip(data, dts)]
        got = self.combine_fn.fn(*left, *right)
        got = got if isinstance(got, tuple) else (got,)
        nxt = [np.broadcast_to(g.handle.data if isinstance(g, tl.core.tensor) else g,
                               left[0].handle.data.shape).astype(d.dtype)
               for g, d in zip(got, data)]
        if n % 2:
            nxt = [np.concatenate([x, np.take(d, [n - 1], axis=axis)], axis=axis)
                   for x, d in zip(nxt, data)]
        data = nxt
    ret = []
    for d, t in zip(data, dts):
        d = np.squeeze(d, axis=axis)
        if self.keep_dims:
            d = np.expand_dims(d, axis) if self.axis is not None else d.reshape((1,) * len(shape))
        elif self.axis is None:
            d = d.item()
        ret.append(self.to_tensor(d, t))
    return ret
