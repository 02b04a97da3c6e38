# The two commands of the README: `make demo` and `make test`. Both set up .venv on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Where pip finds torch. Empty: the configured index (a CPU wheel where a local mirror provides one).
# On a plain PyPI, `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` avoids the CUDA
# build and its gigabytes; a GPU machine wants the cu130 index or the default.
TORCH_INDEX ?=
TORCH_INDEX_ARGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: install demo test lint format clean

install: $(STAMP)

# torch first, pinned: a plain `torch` requirement would pull the newest CUDA build and its
# gigabytes of packages; once 2.13.0 is in, the project's `torch>=2.13,<2.14` installs nothing more.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH_INDEX_ARGS) torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,offline]'
	$(PY) -m pip check
	touch $@

# TASK=hotpot (the default), fever (configs/demo-fever.yaml) or all (both, one after the other)
TASK ?= hotpot
demo: install
	$(if $(filter hotpot all,$(TASK)),$(PY) -m workflows.demo --config configs/demo.yaml)
	$(if $(filter fever all,$(TASK)),$(PY) -m workflows.demo --config configs/demo-fever.yaml)

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: install lint
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
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
