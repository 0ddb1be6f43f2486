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

import pytest  # noqa: E402


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
