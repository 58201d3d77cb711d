# conditioned-attention: `make help` lists the targets.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
WHEELS ?= ../shared/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS),)
# the tested versions (pyproject.toml keeps the ranges); CONSTRAINTS= installs the newest in range instead
CONSTRAINTS ?= constraints.txt
# where `make detection` keeps the mmcv wheel it builds (about 30 minutes on 2 cores) or reuses
MMCV_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/conditioned-attention/wheels
# the detection extra joins `make install` where an mmcv 2.1.0 wheel is at hand in WHEELS or
# MMCV_CACHE (DETECTION=auto), always (DETECTION=1: `make detection` builds one when none is) or never (0)
DETECTION ?= auto
MMCV_WHEEL := $(wildcard $(WHEELS)/mmcv-2.1.0-*.whl)
MMCV_CACHED := $(wildcard $(MMCV_CACHE)/mmcv-2.1.0-*.whl $(MMCV_CACHE)/*/mmcv-2.1.0-*.whl)
WITH_DETECTION := $(if $(filter 1,$(DETECTION)),1,$(if $(filter auto,$(DETECTION)),$(MMCV_WHEEL)$(MMCV_CACHED),))
# a wheel in WHEELS (CI) joins install's one pip command; otherwise `make detection` finds or builds one
DETECTION_BY := $(if $(WITH_DETECTION),$(if $(MMCV_WHEEL),pip,build),)
COMMA := ,
EXTRAS := dev$(if $(filter pip,$(DETECTION_BY)),$(COMMA)detection,)

.DEFAULT_GOAL := help
.PHONY: help install detection run test test-slow test-full test-timm bench gpu-check docs docs-serve docs-check lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

install: ## create .venv and install the suite, its test tools and (see DETECTION) mmdetection
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --upgrade pip
	$(PYTHON) -m pip install $(FIND_LINKS) $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[$(EXTRAS)]'
ifeq ($(DETECTION_BY),build)
	$(MAKE) detection
endif
	@$(if $(WITH_DETECTION),,echo "note: the detection extra was not installed (DETECTION=$(DETECTION), mmcv 2.1.0 wheel in $(WHEELS) or $(MMCV_CACHE): $(if $(MMCV_WHEEL)$(MMCV_CACHED),yes,none)); \`make detection\` builds one (about 30 minutes on 2 cores)")

# `make detection` builds CUDA ops where torch sees a GPU (nvcc of torch's CUDA needed) or nvcc is here;
# MMCV_CPU=1 builds CPU ops even on a GPU machine (a detection run on that GPU then refuses to start)
detection: ## install the detection extra, building mmcv 2.1.0's ops for this machine once (CPU ~30 min; MMCV_CACHE; JOBS=n)
	test -x $(PYTHON) || $(MAKE) install DETECTION=0
	$(PYTHON) -m launch.tools.mmcv_build --install --cache $(MMCV_CACHE) $(if $(FIND_LINKS),--find-links $(WHEELS)) $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 1,$(MMCV_CPU)),--cpu)
	$(PYTHON) -m pip install --find-links $(MMCV_CACHE) -e '.[dev,detection]'
	$(PYTHON) -m launch.tools.mmcv_build --check --cache $(MMCV_CACHE)

run: ## train the embedded default (digits, attn=precond); ARGS="attn=spectral …" adds overrides
	$(PYTHON) -m src.run $(ARGS)

# the fast tests on up to 4 processes (pytest-xdist; a module's tests stay together, so its fixtures
# are built once), each on one torch thread: their tiny models run fastest so
TEST_WORKERS ?= auto --maxprocesses 4
test: ## run the tests (the slow ones excluded; about 13 minutes on 2 cores)
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# the slow tests on up to 2 processes, each on one torch thread: most are end-to-end runs of tiny
# models already pinned to one thread (trainer.threads=1), so two side by side take about 40% less
# time than one after the other; a module's tests stay together (the SLURM cluster's fixture)
SLOW_WORKERS ?= auto --maxprocesses 2
test-slow: ## run only the slow tests (default runs, resume, DDP, SLURM, full-size backbones on meta; ~15 min)
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -m slow -n $(SLOW_WORKERS) --dist loadscope --no-loadscope-reorder

test-full: ## run every test: `make test` then `make test-slow` (what CI runs)
	$(MAKE) test
	$(MAKE) test-slow

test-timm: ## timm's own model tests on tiny models of each family, per variant, two at a time; ARGS="precond -- -x"
	$(PYTHON) tests/timm_upstream/run.py $(ARGS)

bench: ## speed and memory of each attention variant; ARGS="--device cuda …" (python -m launch.tools.bench --help)
	$(PYTHON) -m launch.tools.bench $(ARGS)

gpu-check: ## the GPU check (< 8 min on one GPU): fails on a stated threshold → outputs/gpu_check/; ARGS="--dry"
	$(PYTHON) -m launch.tools.gpu_check $(ARGS)

docs: ## build the docs site into site/ (mkdocs-material; --strict: a broken link fails)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

docs-serve: ## serve the docs at http://127.0.0.1:8000/, rebuilt on save (search needs this: it is dead from file://)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs serve

docs-check: docs ## screenshot the landing page and a long page into outputs/docs-screenshots/ (apt-get install chromium-headless-shell)
	$(PYTHON) docs/screenshots.py site outputs/docs-screenshots

lint: ## ruff
	$(PYTHON) -m ruff check src tasks launch tests

clean: ## remove caches and build leftovers (run folders are kept)
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
