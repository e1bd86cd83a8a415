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
# PyTorch for the PyTorch example of docs/failover.md, in its own cached venv: PyPI's Linux wheel
# brings its CUDA libraries (~5 GB installed; it runs on CPU). `make test TORCH=0` skips it.
TORCH ?= 1
TORCH_VERSION := 2.15.0
TORCH_VENV ?= $(HOME)/.cache/gpuq/torch-$(TORCH_VERSION)
ifeq ($(TORCH),1)
TORCH_DEP := torch
TORCH_ENV := GPUQ_TORCH_PYTHON=$(TORCH_VENV)/bin/python
endif

.PHONY: venv binaries torch test unit e2e e2e-kind kind-node-image lint cluster-up cluster-down demo bench clean image

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,kind]'
	@touch $@

binaries:
	@bash hack/build-binaries.sh >/dev/null

torch: $(TORCH_VENV)/.installed

$(TORCH_VENV)/.installed:
	@echo "== one-time: PyTorch $(TORCH_VERSION) into $(TORCH_VENV) (~5 GB, a few minutes)"
	@test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --disable-pip-version-check torch==$(TORCH_VERSION) numpy \
		| grep -E '^(Collecting|Downloading|Installing|Successfully)' || true
	$(TORCH_VENV)/bin/python -c 'import torch; print("== torch", torch.__version__, "ready")'
	@touch $@

lint: venv
	$(BIN)/ruff check operator tests e2e bench
	$(BIN)/mypy

unit: venv $(TORCH_DEP)
	$(TORCH_ENV) $(BIN)/pytest -q tests

e2e: venv binaries
	$(BIN)/pytest -q e2e

# The README's test command: lint, unit/property tests, then e2e against a real local control plane.
# kind e2e: kind, its node image (offline: Debian packages + Go modules, cached by version) and the
# operator and kwok images, then the suites on a one-node kind cluster with the operator in-cluster.
# test_incluster.py last: it installs the operator cluster-wide, and a force-deleted replica may
# outlive its pod object long enough to hold the Lease while a later module's operator waits.
KIND_SUITES := e2e/test_operator_install.py e2e/test_operator.py e2e/test_constraints.py \
	e2e/test_failover.py e2e/test_existing_workloads.py e2e/test_pytorchjob.py e2e/test_incluster.py
kind-node-image:
	@bash hack/kind/node-image.sh

e2e-kind: venv binaries kind-node-image
	@images=$$(bash hack/kind/images.sh | tail -1) && \
	GPUQ_E2E_CLUSTER=kind GPUQ_KIND_IMAGES=$$images GPUQ_E2E_OPERATOR_IMAGE=$(IMAGE) $(BIN)/pytest -q $(KIND_SUITES)

# Kind, its node image, Prometheus and helm build in the background at nice 19 while the local suites
# run (hack/prebuild.sh): cold, that hides most of their 15-20 minutes of Go builds.
# The operator image is built first when a container engine can be had (GPUQ_REQUIRE_IMAGE=1, as in
# .ci/run, makes a failed build fatal); without one, the tests that run the image skip and say why.
# Then the kind suites (make e2e-kind), where a kind node can be built and run (GPUQ_REQUIRE_KIND=1
# makes that fatal; GPUQ_KIND=0 skips them).
test: venv binaries lint $(TORCH_DEP)
	@bash hack/prebuild.sh start
	@if bash hack/image.sh $(IMAGE); then export GPUQ_E2E_OPERATOR_IMAGE=$(IMAGE); \
	elif [ -n "$$GPUQ_REQUIRE_IMAGE" ]; then exit 1; \
	else echo "== no operator image: the tests that run it skip"; fi; \
	$(TORCH_ENV) $(BIN)/pytest -q tests e2e
	@bash hack/prebuild.sh wait
	@if [ "$${GPUQ_KIND:-1}" = 0 ]; then echo "== GPUQ_KIND=0: the kind e2e suites are skipped"; \
	elif bash hack/kind/node-image.sh >/dev/null; then $(MAKE) --no-print-directory e2e-kind; \
	elif [ -n "$$GPUQ_REQUIRE_KIND" ]; then exit 1; \
	else echo "== no kind node image could be built here: the kind e2e suites are skipped"; fi

cluster-up: venv binaries
	$(BIN)/gpuq cluster up --racks $(RACKS) --nodes-per-rack $(NODES_PER_RACK) --gpus-per-node $(GPUS_PER_NODE)

cluster-down: venv
	$(BIN)/gpuq cluster down

# The README's main command: local cluster + operator + a scripted scenario in a live table (~2 min),
# then everything is stopped. Options: make demo DEMO_ARGS="--no-live --speed 2" (or --keep).
demo: venv binaries
	$(BIN)/gpuq demo $(DEMO_ARGS)

# The operator image (Dockerfile) with docker or podman; offline, its base is built from Debian
# packages first. make image IMAGE=gpuq:dev ENGINE=podman
IMAGE ?= gpuq:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	@bash hack/image.sh $(IMAGE)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Prometheus and helm, built from Go modules into ~/.cache/gpuq/bin/{prometheus,helm}-<version>/
# (hack/tools.env pins them). The tests of deploy/ and charts/ build them on first use; without Go
# they skip, unless GPUQ_REQUIRE_PROMETHEUS / GPUQ_REQUIRE_HELM is set (as in .ci/run).
.PHONY: prometheus helm chart-files
prometheus:
	@bash hack/prometheus.sh
helm:
	@bash hack/helm.sh

# charts/gpuq/files/ holds copies of the generated CRDs and of deploy/'s alerts and dashboard
# (tests/deploy/test_chart.py fails when they differ): refresh them after changing the sources.
chart-files: venv
	$(BIN)/gpuq crds --write charts/gpuq/files/crds/ >/dev/null
	cp deploy/prometheus/gpuq-alerts.yaml deploy/grafana/gpuq-dashboard.json charts/gpuq/files/
