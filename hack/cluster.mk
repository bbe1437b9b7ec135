# Local e2e cluster: pinned toolchain and a kwok-simulated GPU cluster (included by the Makefile).
# See hack/README.md. Variables below may be used by other makefile code and set on the command line.

HACK := hack
include $(HACK)/versions.env

# Toolchain: .cache/tools/<key>/bin, <key> = versions + hash of hack/tools/go.{mod,sum}.
TOOLS_KEY := $(shell $(HACK)/build-tools.sh key)
TOOLS_BIN := $(CURDIR)/.cache/tools/$(TOOLS_KEY)/bin
KUBECTL := $(TOOLS_BIN)/kubectl
HELM := $(TOOLS_BIN)/helm
KWOKCTL := $(TOOLS_BIN)/kwokctl

# Cluster shape and location (hack/cluster.sh documents each). NODES / CPU_NODES unset: a new
# cluster gets 4 GPU nodes and 1 CPU node, a running one keeps the nodes it has.
NODES ?=
CPU_NODES ?=
CLUSTER_NAME ?= gpu-operator
CLUSTER_PORT_BASE ?= 26000
# Emulator timing (hack/emulators/profile.py): instant (default, tests) or realistic; SIM_TIME_SCALE
# multiplies every emulated duration. A running cluster restarts its emulators when these change.
SIM_PROFILE ?= instant
SIM_TIME_SCALE ?= 1
CLUSTER_KUBECONFIG := $(CURDIR)/.cache/kwok/clusters/$(CLUSTER_NAME)/kubeconfig.yaml
CLUSTER_AUDIT_LOG := $(CURDIR)/.cache/kwok/clusters/$(CLUSTER_NAME)/logs/audit.log
CLUSTER_ENV := NODES=$(NODES) CPU_NODES=$(CPU_NODES) CLUSTER_NAME=$(CLUSTER_NAME) \
	CLUSTER_PORT_BASE=$(CLUSTER_PORT_BASE) PYTHON=$(CURDIR)/$(PY) SIM_PROFILE=$(SIM_PROFILE) SIM_TIME_SCALE=$(SIM_TIME_SCALE)

.PHONY: tools cluster-up cluster-down cluster-status kubeconfig audit-log

tools: ## build (or reuse the machine-wide cache of) etcd, kube-*, kubectl, kwok, kwokctl, helm
	@$(HACK)/build-tools.sh

cluster-up: tools venv ## start the kwok cluster (NODES=4 GPU nodes, CPU_NODES=1); no-op when up
	@$(CLUSTER_ENV) $(HACK)/cluster.sh up

cluster-down: ## stop the kwok cluster and delete its state (keeps the toolchain)
	@$(CLUSTER_ENV) $(HACK)/cluster.sh down

cluster-status: ## exit 0 when the kwok cluster is up and healthy
	@$(CLUSTER_ENV) $(HACK)/cluster.sh status

kubeconfig: ## print the kwok cluster's kubeconfig path (use with make -s)
	@echo $(CLUSTER_KUBECONFIG)

audit-log: ## print the kwok cluster's API server audit log path (use with make -s)
	@echo $(CLUSTER_AUDIT_LOG)
