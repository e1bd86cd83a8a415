# gpuq developer entry points. Every target installs what it needs (a .venv, the Go-built
# control-plane binaries cached under ~/.cache/gpuq/bin), so each works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Cluster shape for cluster-up (override: make cluster-up RACKS=2 NODES_PER_RACK=4)
RACKS ?= 4
NODES_PER_RACK ?= 8
GPUS_PER_NODE ?= 8

.PHONY: venv binaries test unit e2e lint cluster-up cluster-down demo bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

binaries:
	@bash hack/build-binaries.sh >/dev/null

lint: venv
	$(BIN)/ruff check operator tests e2e bench
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q tests

e2e: venv binaries
	$(BIN)/pytest -q e2e

# The README's test command: lint, unit/property tests, then e2e against a real local control plane.
test: venv binaries lint
	$(BIN)/pytest -q tests e2e

cluster-up: venv binaries
	$(BIN)/gpuq cluster up --racks $(RACKS) --nodes-per-rack $(NODES_PER_RACK) --gpus-per-node $(GPUS_PER_NODE)

cluster-down: venv
	$(BIN)/gpuq cluster down

# The README's main command: local cluster + operator + a scripted scenario in a live table (~2 min),
# then everything is stopped. Options: make demo DEMO_ARGS="--no-live --speed 2" (or --keep).
demo: venv binaries
	$(BIN)/gpuq demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
