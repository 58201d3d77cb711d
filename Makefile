# conditioned-attention: `make help` lists the targets.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
WHEELS ?= ../shared/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS),)

.DEFAULT_GOAL := help
.PHONY: help install run test test-slow test-full lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

install: ## create .venv and install the suite with its test tools
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --upgrade pip
	$(PYTHON) -m pip install $(FIND_LINKS) -e '.[dev]'

run: ## train the embedded default (digits, attn=precond); ARGS="attn=spectral …" adds overrides
	$(PYTHON) -m src.run $(ARGS)

test: ## run the tests (the slow ones excluded; a few minutes)
	$(PYTHON) -m pytest -m "not slow"

test-slow: ## run only the slow tests (long end-to-end runs, full-size backbones)
	$(PYTHON) -m pytest -m slow

test-full: ## run every test: `make test` then `make test-slow` (what CI runs)
	$(MAKE) test
	$(MAKE) test-slow

lint: ## ruff
	$(PYTHON) -m ruff check src tests

clean: ## remove caches and build leftovers (run folders are kept)
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
