# Quick start: `make demo` (a full migration on the embedded database) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat setup.py | cksum | cut -d' ' -f1)

.PHONY: test test-engine demo ui clean-db

$(STAMP): setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $(STAMP)

# TEST_WORKERS pytest-xdist workers (tests/conftest.py: whole modules per worker, the whole-stack
# tests one after another on one worker, while the other worker takes the modules). 2 on a 2-core
# machine: the suite in ~10-11 min, not ~18 serially (both measured beside other work, load 5-9);
# `make test TEST_WORKERS=2` was green twice in a row before it became the default. 0 = serial.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest -q --durations=25 $(XDIST)

# The engine's tests only (used by CI against a second PostgreSQL server).
test-engine: $(STAMP)
	$(PY) -m pytest -q $(XDIST) tests/engine

demo: $(STAMP)
	$(VENV)/bin/migrate demo

# Issue 9's cutover on a live sandbox account: migrate while it changes, stop the changes, sync,
# and print the verify result from the source (with the full run's and the sync's cost).
.PHONY: demo-live
demo-live: $(STAMP)
	$(VENV)/bin/migrate demo --live

# The Dagster UI on the embedded database, with a sandbox Pipedrive account as the source.
# UI_ARGS: more options of `migrate ui` (e.g. UI_ARGS='--sandbox-port 8766' beside a `migrate sandbox`).
UI_ARGS ?=
ui: $(STAMP)
	$(VENV)/bin/migrate ui --sandbox $(UI_ARGS)

clean-db:
	$(VENV)/bin/migrate db stop --force || true
	rm -rf .migrate

# The chaos test alone (drainer processes under SIGKILL and pg_terminate_backend); CHAOS_SEED=<n>
# replays a schedule. The long version with its figures: $(PY) bench/chaos.py
.PHONY: chaos
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m chaos tests/chaos

# The quick benches, one after another, each printing its ratios last and all ratios repeated at
# the end (bench/README.md says what each measures and how to read it). dlt, the entity bench's
# comparison, is the optional `bench` extra: installed here when it can be, skipped (saying so) when not.
.PHONY: bench
bench: $(STAMP)
	@$(PY) -c "import dlt" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]' >/dev/null 2>&1 \
		|| echo "make bench: the bench extra (dlt) did not install; the entity bench runs the engine alone"
	$(PY) bench/quick.py
