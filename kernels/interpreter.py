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
"""
import numpy as np

TRITON_GENERIC_REDUCE = []  # Triton's own generic_reduce, once replaced


def skip_repeated_language_patching():
    """Install both shortcuts once; a Triton without these internals keeps its own."""
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
    if hasattr(ti, "ReduceOps") and hasattr(ti.ReduceOps, "generic_reduce"):
        TRITON_GENERIC_REDUCE.append(ti.ReduceOps.generic_reduce)  # tests compare with it
        ti.ReduceOps.generic_reduce = _tree_reduce
    return True


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
