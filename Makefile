# The two commands of the README: `make demo` and `make test`. Both set up .venv on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test clean

install: $(STAMP)

# torch first, pinned: a plain `torch` requirement would pull the newest CUDA build and its
# gigabytes of packages; once 2.13.0 is in, the project's `torch>=2.13,<2.14` installs nothing more.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,offline]'
	$(PY) -m pip check
	touch $@

demo: install
	$(PY) -m workflows.demo --config configs/demo.yaml

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: install
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf runs .pytest_cache
