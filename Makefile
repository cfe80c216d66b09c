# Developer and CI entry points.  `make test` runs the whole suite on SQLite and on a
# throwaway PostgreSQL cluster (see tests/run_all.py); extra pytest args go in ARGS=...

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.DEFAULT_GOAL := test
.PHONY: venv test test-sqlite test-postgres lint demo serve clean distclean

venv: $(STAMP)

# Create the virtualenv only if it is missing (or broken).
$(VPY):
	$(PYTHON) -m venv $(VENV)

# (Re-)install the project whenever pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -e '.[test,postgres,api,mcp]'
	touch $@

test: venv
	$(VPY) -m tests.run_all $(ARGS)

test-sqlite: venv
	PMCP_TEST_DBS=sqlite $(VPY) -m tests.run_all $(ARGS)

test-postgres: venv
	PMCP_TEST_DBS=postgres $(VPY) -m tests.run_all $(ARGS)

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The example project: a fresh SQLite database, two workers, a live view of one demo run.
demo: venv
	$(VPY) example_project/demo.py

# The example project's site (the admin at /admin/) on 127.0.0.1:8000.
serve: venv
	$(VPY) example_project/manage.py migrate --noinput --verbosity 0
	$(VPY) example_project/manage.py runserver 127.0.0.1:8000

clean:
	rm -rf build dist .eggs *.egg-info .pytest_cache .ruff_cache .mypy_cache .coverage htmlcov
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# Benchmarks (bench/README.md): ~10 min on 2 cores, results in bench/results/.
# BENCH_ARGS="--only throughput --db sqlite-full" narrows the run.
bench: venv
	$(VPY) -m pip install -q -e '.[bench]'
	$(VPY) -m bench.run $(BENCH_ARGS)

bench-quick: venv
	$(VPY) -m pip install -q -e '.[bench]'
	$(VPY) -m bench.run --quick $(BENCH_ARGS)
