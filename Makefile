# Two entry points: `make demo` and `make test`. Each creates .venv if missing.
PYTHON ?= python3
VENV ?= .venv
# torch first, from the spec below, so that pip never resolves a multi-GB CUDA build
# as a dependency of something else. Override on a GPU box: make test TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
# The transformers the suite is pinned to (generate() supports 5.x; the GPU image runs 5.17):
# a new minor release renames arguments (5.24: past_key_values -> cache), so CI on a clean
# clone tests the version the code was checked against. Override: make test HF_SPEC=transformers
HF_SPEC ?= transformers==5.24.0
# Test processes (pytest-xdist, one file a process at a time): the suite is mostly the Triton
# interpreter, one core each; 2 is the CI machine's core count.
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.gpu-sampler-installed

.PHONY: test demo bench gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q "$(HF_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test,demo]"
	touch $(STAMP)

# files in name order (xdist would start the files with the most tests first): the sm_90
# compile test (tests/test_aot_compile.py, ~5 min with a cold Triton cache) starts first
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

demo: $(STAMP)
	$(BIN)/gpu-sampler demo

bench: $(STAMP)
	$(BIN)/gpu-sampler bench

# On a CUDA machine with torch/triton/transformers already installed and no registry.
gpu-check:
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info
