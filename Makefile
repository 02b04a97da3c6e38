# The two commands of the README: `make demo` and `make test`. Both set up .venv on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist; whole files go to one process, which keeps module fixtures built once).
# 0, the default, runs everything in one process; two took 1,050 s against one's 1,358 s on the
# development environment, not yet measured on one built as CI builds it (docs/testing.md).
TEST_WORKERS ?= 0
# Every package but torch at one version with its hashes, for CPython 3.11 on Linux x86_64 (CI, the image);
# `make lock` refreshes it, `make install` installs exactly it.
LOCK := requirements.lock
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

.PHONY: install lock demo test lint format clean

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
$(STAMP): pyproject.toml $(LOCK) | $(UV)
	$(PY) -m pip install --quiet --no-deps $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION)
	$(UV) pip install --quiet --python $(PY) --no-deps --require-hashes --compile-bytecode -r $(LOCK)
	$(PY) -m pip install --quiet $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION)
	$(UV) pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

# Resolves pyproject.toml (every extra) against the torch build `make install` takes here (pip downloads
# it from the same index, TORCH_INDEX included), so torch's dependencies in the lock are that build's:
# on a CPU machine no CUDA package, and the lock then forces none anywhere. torch itself is left out.
LOCK_TMP := $(VENV)/lock-torch
lock: $(UV)
	rm -rf $(LOCK_TMP)
	$(PY) -m pip download --quiet --no-deps $(TORCH_INDEX_ARGS) torch==$(TORCH_VERSION) -d $(LOCK_TMP)
	echo "torch @ file://$$(ls $(abspath $(LOCK_TMP))/torch-*.whl)" > $(LOCK_TMP)/torch.in
	$(UV) pip compile pyproject.toml $(LOCK_TMP)/torch.in --all-extras --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-emit-package torch --generate-hashes \
		--custom-compile-command "make lock" --quiet $(LOCK_ARGS) -o $(LOCK)
	rm -rf $(LOCK_TMP)
	@if grep -qE '^(nvidia-|triton==)' $(LOCK); then \
		echo "make lock: $(LOCK) names CUDA packages: torch came as a CUDA build; set TORCH_INDEX to PyTorch's CPU index" >&2; \
		exit 1; fi

# TASK=hotpot (the default), fever (configs/demo-fever.yaml) or all (both, one after the other)
TASK ?= hotpot
demo: install
	$(if $(filter hotpot all,$(TASK)),$(VENV)/bin/xh demo --config configs/demo.yaml)
	$(if $(filter fever all,$(TASK)),$(VENV)/bin/xh demo --config configs/demo-fever.yaml)

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: install lint
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
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
