"""Kernel tests run under the Triton interpreter on CPU tensors.

TRITON_INTERPRET is read when @triton.jit runs, i.e. when gpu_sampler.kernels is first
imported, so it is set here, before any test module imports the package.
"""
import os

if os.environ.get("GPU_SAMPLER_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The embedded default model untrained (a second to build, not minutes): the tests check the
# loading path and the paths' agreement, not the text. tests/test_cli.py trains a few steps.
os.environ.setdefault("GPU_SAMPLER_TINY_STEPS", "0")

# One intra-op thread: the tests' tensors are tiny, and with two threads on the 2-core CI
# machine any other busy process turns torch's thread hand-offs into spin-waits
# (tests/test_generate.py + test_beam.py under load: 131 s with 2 threads, 25 s with 1).
# Set before torch is imported so subprocesses (tests/test_distributed.py) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ["OMP_NUM_THREADS"] == "1":
    torch.set_num_threads(1)


DEVICE = os.environ.get("GPU_SAMPLER_TEST_DEVICE", "cpu")
SLOW = os.environ.get("GPU_SAMPLER_SLOW") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (run with GPU_SAMPLER_SLOW=1)")


def pytest_collection_modifyitems(config, items):
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow: set GPU_SAMPLER_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


def triton_runs_here():
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


BACKENDS = ["torch"] + (["triton"] if triton_runs_here() else [])


def _skip_repeated_language_patching():
    """Triton's interpreter patches triton.language for a launch (inspect.getmembers over tl,
    tl.tensor and tl.math, ~0.5 ms) and restores it when the grid ends, but it patches again
    on every call of a @triton.jit helper made inside the kernel (InterpretedFunction.__call__),
    where nothing is left to patch: a third of the kernel tests' time (the hash, the bin rule
    and the pivots are helpers called per block). Such a call now skips the repeat when the
    language its module sees is already patched; any other call takes Triton's own path. The
    numpy dtype of a Triton dtype is looked up in a memo."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
        cls, core, own_call = ti.InterpretedFunction, tl.core, ti.InterpretedFunction.__call__
        error, own_dtype = ti.InterpreterError, ti._get_np_dtype
    except (ImportError, AttributeError):  # another Triton: its own interpreter as it is
        return
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

    cls.__call__ = call
    dtypes = {}

    def np_dtype(tt_dtype):
        # Triton rebuilds a 20-entry dict on each of these lookups (hundreds of thousands a test)
        try:
            return dtypes[tt_dtype]
        except KeyError:
            got = dtypes[tt_dtype] = own_dtype(tt_dtype)
            return got
        except TypeError:
            return own_dtype(tt_dtype)

    ti._get_np_dtype = np_dtype


if os.environ.get("TRITON_INTERPRET") == "1":
    _skip_repeated_language_patching()
