# conditioned-attention: `make help` lists the targets.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
WHEELS ?= ../shared/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS),)
# the detection extra joins `make install` where an mmcv 2.1.0 wheel is at hand (DETECTION=auto),
# always (DETECTION=1: pip must then find or build one) or never (DETECTION=0)
DETECTION ?= auto
MMCV_WHEEL := $(wildcard $(WHEELS)/mmcv-2.1.0-*.whl)
WITH_DETECTION := $(if $(filter 1,$(DETECTION)),1,$(if $(filter auto,$(DETECTION)),$(if $(MMCV_WHEEL),1,),))
COMMA := ,
EXTRAS := dev$(if $(WITH_DETECTION),$(COMMA)detection,)

.DEFAULT_GOAL := help
.PHONY: help install run test test-slow test-full test-timm bench lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

install: ## create .venv and install the suite, its test tools and (see DETECTION) mmdetection
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --upgrade pip
	$(PYTHON) -m pip install $(FIND_LINKS) -e '.[$(EXTRAS)]'
	@$(if $(WITH_DETECTION),,echo "note: the detection extra was not installed (DETECTION=$(DETECTION), mmcv 2.1.0 wheel in $(WHEELS): $(if $(MMCV_WHEEL),yes,none)); README, section Detection, says how to add it")

run: ## train the embedded default (digits, attn=precond); ARGS="attn=spectral …" adds overrides
	$(PYTHON) -m src.run $(ARGS)

test: ## run the tests (the slow ones excluded; a few minutes)
	$(PYTHON) -m pytest -m "not slow"

test-slow: ## run only the slow tests (long end-to-end runs, full-size backbones)
	$(PYTHON) -m pytest -m slow

test-full: ## run every test: `make test` then `make test-slow` (what CI runs)
	$(MAKE) test
	$(MAKE) test-slow

test-timm: ## timm's own model tests on tiny models of each family, per variant; ARGS="precond -- -x"
	$(PYTHON) tests/timm_upstream/run.py $(ARGS)

bench: ## speed and memory of each attention variant; ARGS="--device cuda …" (python -m launch.bench --help)
	$(PYTHON) -m launch.bench $(ARGS)

lint: ## ruff
	$(PYTHON) -m ruff check src tasks launch tests

clean: ## remove caches and build leftovers (run folders are kept)
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
