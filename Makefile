# Developer and CI entry points.  `make test` runs the whole suite on SQLite and on a
# throwaway PostgreSQL cluster (see tests/run_all.py); extra pytest args go in ARGS=...

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
ARGS ?=
# One install stamp per need, so that `make demo` installs only what the demo uses. STAMP:
# tests, lint and benchmarks (every extra the suite uses); DEMO_STAMP: the demo (the project and
# Django, nothing else); SERVE_STAMP: the example site (the demo's plus the `api` extra).
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
SERVE_STAMP := $(VENV)/.installed-serve

.DEFAULT_GOAL := test
.PHONY: venv test test-sqlite test-postgres lint demo serve clean distclean

venv: $(STAMP)

# Create the virtualenv only if it is missing (or broken).
$(VPY):
	$(PYTHON) -m venv $(VENV)

# (Re-)install whenever pyproject.toml is newer than the stamp. A bigger install satisfies the
# smaller needs too, so it touches their stamps.
$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -e '.[test,postgres,api,mcp]'
	touch $@ $(SERVE_STAMP) $(DEMO_STAMP)

$(SERVE_STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -e '.[api]'
	touch $@ $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -e .
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
demo: $(DEMO_STAMP)
	$(VPY) example_project/demo.py

# The example project's site on 127.0.0.1:8000: the admin at /admin/, the API at /api/pmcp/.
# DEBUG is off (DJANGO_DEBUG=1 turns it on), so --insecure has runserver serve the static files.
serve: $(SERVE_STAMP)
	$(VPY) example_project/manage.py migrate --noinput --verbosity 0
	$(VPY) example_project/manage.py runserver --insecure 127.0.0.1:8000

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
