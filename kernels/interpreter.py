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
"""


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
    return True
