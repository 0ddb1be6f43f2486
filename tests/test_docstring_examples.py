"""The ``>>>`` examples of the library's docstrings run and print what they claim.

One test per module that has examples (gpu_sampler/**/*.py and kernels/*.py, the latter imported
as gpu_sampler.kernels.*), with the standard library's doctest and NORMALIZE_WHITESPACE |
ELLIPSIS. tests/conftest.py sets TRITON_INTERPRET=1 before gpu_sampler is imported, so kernel
examples would run under the Triton interpreter on CPU tensors. Examples that need CUDA or the
model hub are marked ``# doctest: +SKIP`` in the docstring, or their module is listed in
NEEDS_CUDA below.
"""
import doctest
import importlib
import io
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS

# module name -> why its examples cannot run on a CPU-only machine
NEEDS_CUDA = {}


def _module_names():
    names = []
    for path in sorted((ROOT / "gpu_sampler").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if "kernels" not in rel.parts:
            names.append((path, ".".join(p for p in rel.parts if p != "__init__")))
    for path in sorted((ROOT / "kernels").glob("*.py")):
        suffix = "" if path.stem == "__init__" else "." + path.stem
        names.append((path, "gpu_sampler.kernels" + suffix))
    return [name for path, name in names if ">>>" in path.read_text()]


MODULES = _module_names()


def test_modules_with_examples_are_found():
    assert {"gpu_sampler.sampler", "gpu_sampler.hf.cache"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in NEEDS_CUDA:
        if not torch.cuda.is_available():
            pytest.skip(NEEDS_CUDA[name])
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    runner = doctest.DocTestRunner(optionflags=FLAGS, verbose=False)
    report = io.StringIO()
    try:
        for test in tests:
            runner.run(test, out=report.write)
    finally:
        # an example that failed between init_process_group and destroy_process_group
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert tests, f"{name} has '>>>' lines but no docstring examples were collected"
    assert runner.failures == 0, report.getvalue()
