# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to its CPU build for the tests and the demo; a bare `torch` pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench bench-all vllm-env gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev,lora]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m capacity_advisor.advisor.cli.demo

# Everything, with the slowest tests listed at the end (mark the long ones `@pytest.mark.slow`).
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=30

# All but the tests marked slow: about two minutes on two cores.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/scoring.py

bench-all: $(STAMP)
	$(BIN)/python benchmarks/scoring.py
	$(BIN)/python benchmarks/wall_time.py

# vLLM pins its own torch and transformers, so it gets its own environment (GPU machines; docs/vllm.md).
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[vllm,lora]'
	touch $@

gpu-check: vllm-env
	$(VLLM_VENV)/bin/python benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) demo-out
