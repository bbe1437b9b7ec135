# gpu-operator: every developer and CI entry point. `make demo` and `make test` do everything on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

# Cluster toolchain, cluster-up/down, kubeconfig (hack/cluster.mk).
include hack/cluster.mk
include hack/chart.mk
include hack/bench.mk

.PHONY: help venv lint typecheck test test-unit test-e2e test-e2e-realistic test-chaos crd demo down bench

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## create the virtualenv with the package and dev tools

lint: venv ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test-unit: venv ## unit tests (no cluster)
	$(BIN)/pytest -q tests/unit

CRDS := clusterpolicy nvidiadriver gpucluster

crd: venv ## regenerate crds/*.yaml (ClusterPolicy, NVIDIADriver, GPUCluster), the chart's copies, values schema and operand RBAC from the code
	for name in $(CRDS); do \
	  $(BIN)/gpu-operator crd $$name > crds/$$name.yaml && \
	  cp crds/$$name.yaml charts/gpu-operator/crds/$$name.yaml || exit 1; \
	done
	$(PY) hack/values_schema.py --write
	$(PY) hack/operand_rbac.py --write

test: lint chart-lint test-unit test-e2e ## every test: lint, types, unit and end to end

test-e2e: venv tools ## end-to-end tests (local control plane, or the cluster in $$KUBECONFIG), less the long chaos faults
	$(BIN)/pytest -q tests/e2e -m "not chaos"

test-e2e-realistic: venv tools ## test-e2e with the emulated images taking (5x scaled) real time: SIM_PROFILE=realistic SIM_TIME_SCALE=0.2; not in `make test`
	SIM_PROFILE=realistic SIM_TIME_SCALE=0.2 $(BIN)/pytest -q tests/e2e -m "not chaos"

test-chaos: venv tools ## the whole chaos suite (tests/e2e/test_chaos.py, local cluster only; about 30 min)
	$(BIN)/pytest -q tests/e2e/test_chaos.py

demo: venv tools ## the main job: local cluster, CRD, operator, the sample ClusterPolicy; waits until ready and shows it
	@KUBECTL=$(KUBECTL) HELM=$(HELM) hack/demo.sh

down: ## stop what `make demo` started (operator and cluster)
	@KUBECTL=$(KUBECTL) HELM=$(HELM) hack/demo.sh down
