# runfold's one entry point for people and CI. `make test` installs what it needs, then lints,
# type-checks and runs the whole suite; `make check` is the quick loop while working.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-package

.PHONY: install demo lint check test test-deep bench mutation kit-under-load faults-soak test-ha test-citus bench-citus docs clean

# Everything: the package with its extras, and the development tools of the `dev` dependency
# group (PEP 735, not published with the package; `--group` needs pip >= 25.1).
install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=25.1"
	$(PY) -m pip install -q -e ".[postgres-binary,conformance,otel,ui]" --group dev
	touch $(STAMP)

# The package alone: what the demo needs.
$(DEMO_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e .
	touch $(DEMO_STAMP)

# The main job: a workflow run through the engine on the embedded SQLite file runfold.db (run it
# twice: two runs).
demo: $(DEMO_STAMP)
	$(VENV)/bin/runfold demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Lint, types and the fast tests: everything not marked slow, postgres or browser (pytest
# markers, pyproject.toml), property tests at a fifth of their examples and the conformance
# kit's at 10 (25 by default). About a minute; needs no PostgreSQL server and no browser.
check: lint
	HYPOTHESIS_PROFILE=quick RUNFOLD_CONFORMANCE_EXAMPLES=10 \
		$(VENV)/bin/pytest -m "not slow and not postgres and not browser"

test: lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(or $(TMPDIR),/tmp)/runfold-site
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	$(VENV)/bin/pytest
	$(PY) -m benchmarks --quick --out $(or $(TMPDIR),/tmp)/runfold-bench-quick

# Long property runs: thousands of examples per law.
test-deep: install
	bash scripts/ensure-postgres.sh
	HYPOTHESIS_PROFILE=deep RUNFOLD_CONFORMANCE_EXAMPLES=500 $(VENV)/bin/pytest

# The conformance kit's mutation score: every mutant of MemoryStore the kit does not kill must be
# listed as equivalent in benchmarks/mutation_equivalent.txt, else this fails.
mutation: install
	$(PY) -m benchmarks.mutation --jobs 2

# The whole kit on every bundled store, ten rounds, with two CPU-bound processes hogging the cores.
kit-under-load: install
	bash scripts/ensure-postgres.sh
	$(PY) scripts/kit_under_load.py --rounds 10 --hogs 2

# 64 durable workflows per cut rate (3% and 40% of appends) through a proxy that cuts PostgreSQL
# connections around commits and black-holes them: no run may fail, no attempt be spent, nothing
# run or recorded twice, no store call outlast its deadline by more than a second.
faults-soak: install
	bash scripts/ensure-postgres.sh
	$(PY) scripts/faults_soak.py

# Three failovers of a two-node Patroni cluster (etcd, synchronous replication) on loopback under
# 64 workflows: no error may reach the application, no acknowledged event be lost, throughput
# back to half within 2 s of the promotion. It installs what is missing itself (Debian's patroni,
# etcd-server and PostgreSQL 15 packages) and checks its ports are free. Not part of `make test`
# nor of CI: it needs root (apt-get, and the nodes run as the postgres user via runuser) and
# Debian's packages, which CI's runners do not give a job, and it takes about three minutes
# (building the cluster, then each failover waits out Patroni's ttl of 10 s and the old primary's
# rejoin), more than the suite's time limit leaves.
test-ha: install
	bash scripts/ha-cluster.sh ensure
	dir=$$(mktemp -d /tmp/runfold-ha.XXXXXX); chmod 755 $$dir; \
	trap 'bash scripts/ha-cluster.sh stop '"$$dir" EXIT; \
	bash scripts/ha-cluster.sh start $$dir && $(PY) scripts/ha_failover.py $$dir; rc=$$?; \
	bash scripts/ha-cluster.sh stop $$dir; \
	if [ $$rc = 0 ]; then rm -rf $$dir; else echo "test-ha: the cluster's logs are in $$dir"; fi; \
	exit $$rc

# PostgresStore on a Citus cluster (a coordinator and two workers on loopback, ports 55441-55443,
# data in a fresh /tmp folder, stopped afterwards): the whole conformance kit with the tables
# distributed by the store itself, a feed race (16 writers, 20 s, two tailing readers), and the
# engine and flow suites on the cluster. Citus comes from ../shared/citus (its install.sh); where
# neither it nor an installed Citus is found, this says so and exits 0. Not part of `make test`:
# the kit alone takes about 9 minutes here (each check distributes a schema of its own) and the
# three servers share CI's two cores.
test-citus: install
	dir=$$(mktemp -d /tmp/runfold-citus.XXXXXX); chmod 755 $$dir; \
	bash scripts/citus-cluster.sh start $$dir; rc=$$?; \
	if [ $$rc = 3 ]; then echo "test-citus: skipped (no Citus)"; exit 0; fi; \
	if [ $$rc = 0 ]; then \
	  dsn=postgresql://postgres@127.0.0.1:55441/postgres; \
	  RUNFOLD_TEST_CITUS_DSN=$$dsn $(VENV)/bin/pytest -p no:randomly tests/stores/test_citus.py \
	  && RUNFOLD_TEST_CITUS=1 RUNFOLD_TEST_POSTGRES_DSN=$$dsn RUNFOLD_TEST_BACKENDS=postgres \
	     $(VENV)/bin/pytest tests/engine/test_engine.py tests/flow/test_flow.py; rc=$$?; \
	fi; \
	bash scripts/citus-cluster.sh stop $$dir; rm -rf $$dir; exit $$rc

# The Citus row of the benchmarks alone, on a cluster started and stopped as for test-citus.
bench-citus: install
	dir=$$(mktemp -d /tmp/runfold-citus.XXXXXX); chmod 755 $$dir; \
	bash scripts/citus-cluster.sh start $$dir; rc=$$?; \
	if [ $$rc = 0 ]; then \
	  RUNFOLD_BENCH_CITUS_DSN=postgresql://postgres@127.0.0.1:55441/postgres \
	    $(PY) -m benchmarks --only citus --out $(or $(TMPDIR),/tmp)/runfold-bench-citus; rc=$$?; \
	fi; \
	bash scripts/citus-cluster.sh stop $$dir; rm -rf $$dir; exit $$rc

# The documentation site, built into site/ with --strict (a broken link, a page missing from the
# nav or a docstring griffe cannot read fails it); `make docs SERVE=1` serves it on
# http://127.0.0.1:8000 with live reload instead.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs $(if $(SERVE),serve --dev-addr 127.0.0.1:8000,build --site-dir site) --strict

bench: install
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
