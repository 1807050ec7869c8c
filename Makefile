# The two commands a new user needs: `make demo` and `make test`. Both set up .venv first.
# `make test-fast` runs only the unit tier (no database, no model): seconds.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup constraints demo test test-fast lint format bench clean

setup: $(STAMP)

# torch is installed first, as the CPU build: PyPI's torch for Linux is the CUDA build (several
# GB). For a GPU: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Every package at the version CI ran (constraints.txt, made by `make constraints`): a fresh
# machine in a year installs what was tested, not the newest releases pyproject.toml allows.
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) torch --extra-index-url $(TORCH_INDEX)
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

# constraints.txt anew: the newest releases pyproject.toml's bounds allow, installed in a venv of
# their own and frozen (docs/development.md, "Upgrading dependencies"). torch stays at the
# version constraints.txt names unless given: make constraints TORCH=2.13.1
TORCH ?= $(shell sed -n 's/^torch==//p' $(CONSTRAINTS))
FRESH := .venv-constraints
constraints:
	rm -rf $(FRESH)
	$(PYTHON) -m venv $(FRESH)
	$(FRESH)/bin/python -m pip install -q --upgrade pip
	$(FRESH)/bin/python -m pip install -q torch==$(TORCH) --extra-index-url $(TORCH_INDEX)
	$(FRESH)/bin/python -m pip install -q -e '.[dev]'
	{ echo "# Made by make constraints from pyproject.toml's bounds: the versions CI runs."; \
		$(FRESH)/bin/python -m pip freeze --exclude-editable \
		| sed 's/^\(torch==[^+]*\)+.*/\1/'; } > $(CONSTRAINTS)
	rm -rf $(FRESH)

demo: setup
	$(BIN)/pgembed demo

# Every tier, in TEST_WORKERS processes (pytest-xdist), each with its own embedded server, the
# model (one torch thread each: tests/conftest.py) and the session's template databases. One more
# process than the cores this process may use (a test waits on locks, timers and process starts a
# part of its time, which another one fills: docs/development.md), at most 8 (each holds about
# 1 GB). Work stealing: each process starts on its share of the tests, the longest tier,
# tests/acceptance, first, and one that runs out takes half of what another has left, so none
# waits at the end for a long file. TEST_WORKERS=0 runs them in this process, fast failures
# first: tests/unit, tests/integration, tests/acceptance (testpaths).
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1; print(min(n + 1, 8))')
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check pgembed tests bench examples
	$(BIN)/ruff format --check pgembed tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

format: setup
	$(BIN)/ruff check --fix pgembed tests bench examples
	$(BIN)/ruff format pgembed tests bench examples

bench: setup
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
