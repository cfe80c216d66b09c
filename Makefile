# Developer and CI entry points.  `make test` runs the whole suite on SQLite and on a
# throwaway PostgreSQL cluster, then the Django 6 legs (see tests/run_all.py); extra pytest
# args go in ARGS=...

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

# The Django 6 legs' virtualenv: Python 3.13 with the newest Django 6.x and the same extras.
# Python 3.13 is pyenv's 3.13.0 (found through `pyenv root`, else $PYENV_ROOT or ~/.pyenv),
# else a working python3.13 on PATH (a pyenv shim for a version that is not selected does not
# run, hence the check).
VENV6 ?= .venv-django6
VPY6 := $(VENV6)/bin/python
STAMP6 := $(VENV6)/.installed
PYTHON313 ?= $(shell for p in "$$(pyenv root 2>/dev/null)/versions/3.13.0/bin/python3" \
	"$${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.13.0/bin/python3" "$$(command -v python3.13)"; \
	do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 13)' >/dev/null 2>&1 \
	&& { echo "$$p"; break; }; done)
PMCP_TEST_DJANGO6 ?= 1

# The bench's peers that need Python >= 3.12 (oban, django-ox on Django 6.1): their own
# virtualenv, from pyenv's 3.12.1, else python3.12 on PATH, else the Python 3.13 above.
VENVB ?= .venv-bench-peers
VPYB := $(VENVB)/bin/python
STAMPB := $(VENVB)/.installed
PYTHON312 ?= $(shell for p in "$$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3" \
	"$${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.1/bin/python3" "$$(command -v python3.12)" \
	"$(PYTHON313)"; \
	do "$$p" -c 'import sys; assert sys.version_info[:2] >= (3, 12)' >/dev/null 2>&1 \
	&& { echo "$$p"; break; }; done)

.DEFAULT_GOAL := test
.PHONY: venv venv-django6 venv-bench-peers print-python313 test test-sqlite test-postgres \
	test-django6 lint demo serve clean distclean bench bench-quick

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

print-python313:
	@echo "$(PYTHON313)"

# Without Python 3.13 there is no virtualenv: tests/run_all.py then skips the Django 6 legs
# loudly, or fails them when CI=true or PMCP_REQUIRE_DJANGO6=1.
venv-django6:
ifeq ($(PMCP_TEST_DJANGO6),0)
else ifeq ($(PYTHON313),)
	@echo "make: no Python 3.13 (pyenv's 3.13.0 or python3.13 on PATH): no $(VENV6)" >&2
else
	@$(MAKE) --no-print-directory $(STAMP6)
endif

$(VPY6):
	$(PYTHON313) -m venv $(VENV6)

$(STAMP6): pyproject.toml | $(VPY6)
	$(VPY6) -m pip install --upgrade -e '.[test,postgres,api,mcp]' 'Django>=6,<7'
	touch $@

test: venv venv-django6
	PMCP_DJANGO6_PYTHON=$(VPY6) PMCP_TEST_DJANGO6=$(PMCP_TEST_DJANGO6) \
		$(VPY) -m tests.run_all $(ARGS)

test-sqlite: venv
	PMCP_TEST_DBS=sqlite PMCP_TEST_DJANGO6=0 $(VPY) -m tests.run_all $(ARGS)

test-postgres: venv
	PMCP_TEST_DBS=postgres PMCP_TEST_DJANGO6=0 $(VPY) -m tests.run_all $(ARGS)

# The Django 6 legs alone (both databases, or PMCP_TEST_DBS=sqlite for one).
test-django6: venv
	@$(MAKE) --no-print-directory venv-django6 PMCP_TEST_DJANGO6=only
	PMCP_DJANGO6_PYTHON=$(VPY6) PMCP_TEST_DJANGO6=only $(VPY) -m tests.run_all $(ARGS)

# ruff, then mypy over parallel_mcp (pyproject.toml's [tool.mypy]: django-stubs and
# djangorestframework-stubs). `python -m` puts the checkout first on sys.path, where mypy's
# Django plugin imports tests.settings.
lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VPY) -m mypy

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
	find . \( -path ./$(VENV) -o -path ./$(VENV6) -o -path ./$(VENVB) \) -prune -o -type d -name __pycache__ -prune \
		-exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(VENV6) $(VENVB)

# Without Python >= 3.12 there is no peers virtualenv: the bench reports oban and django-ox
# as skipped, with the reason.
venv-bench-peers:
ifeq ($(PYTHON312),)
	@echo "make: no Python >= 3.12 (pyenv's 3.12.1, python3.12 or 3.13): no $(VENVB)" >&2
else
	@$(MAKE) --no-print-directory $(STAMPB)
endif

$(VPYB):
	$(PYTHON312) -m venv $(VENVB)

$(STAMPB): pyproject.toml | $(VPYB)
	$(VPYB) -m pip install -q -e '.[bench-peers]'
	touch $@

# Benchmarks (bench/README.md): ~20 min on 2 cores, results in bench/results/.
# BENCH_ARGS="--only throughput --db sqlite-full" narrows the run.
bench: venv venv-bench-peers
	$(VPY) -m pip install -q -e '.[bench]'
	PMCP_BENCH_PEERS_PYTHON=$(abspath $(VPYB)) $(VPY) -m bench.run $(BENCH_ARGS)

bench-quick: venv venv-bench-peers
	$(VPY) -m pip install -q -e '.[bench]'
	PMCP_BENCH_PEERS_PYTHON=$(abspath $(VPYB)) $(VPY) -m bench.run --quick $(BENCH_ARGS)
