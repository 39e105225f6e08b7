# runfold's one entry point for people and CI. `make test` installs what it needs, then lints,
# type-checks and runs the whole suite.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: install demo lint test test-deep bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The main job: a workflow run through the engine on the embedded SQLite file runfold.db (run it
# twice: two runs).
demo: install
	$(VENV)/bin/runfold demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	bash scripts/ensure-postgres.sh
	$(VENV)/bin/pytest
	$(PY) -m benchmarks --quick --out $(or $(TMPDIR),/tmp)/runfold-bench-quick

# Long property runs: thousands of examples per law.
test-deep: install
	bash scripts/ensure-postgres.sh
	HYPOTHESIS_PROFILE=deep RUNFOLD_CONFORMANCE_EXAMPLES=500 $(VENV)/bin/pytest

bench: install
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
