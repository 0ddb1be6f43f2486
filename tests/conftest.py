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


if os.environ.get("TRITON_INTERPRET") == "1":
    try:  # kernels/interpreter.py: Triton's interpreter without its per-helper re-patching
        from gpu_sampler.kernels.interpreter import skip_repeated_language_patching
        skip_repeated_language_patching(memo=True)
    except ImportError:  # no triton: the torch backend only
        pass
