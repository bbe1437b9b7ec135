# `make bench`: the operator against the control plane's own limit, on fresh kwok clusters of 10, 100 and
# 1000 simulated GPU nodes (bench/README.md). Never part of `make test`. Included by the Makefile.
#
#   make bench                      every size (about 30 minutes on 2 cores)
#   make bench NODES=10             one size only
#   make bench BENCH_ROUNDS="10=5"  runs per size (default 3 at 10 and 100, 1 at 1000)
#   make bench BENCH_PROFILE=realistic BENCH_TIME_SCALE=0.2   emulated images take (scaled) real time
#   make nvidia-operator && make bench NODES=10 BENCH_ARGS=--side-by-side   ours against NVIDIA's operator
#
# Writes bench/results/latest.json and bench/results/latest.md; logs under .cache/bench/.

BENCH_SIZES ?= 10 100 1000
ifeq ($(origin NODES),command line)
BENCH_SIZES := $(NODES)
endif
BENCH_ROUNDS ?= 10=3 100=3 1000=1
BENCH_REST_SECONDS ?= 300
# Its own cluster, never the tests' (CLUSTER_NAME=gpu-operator); ports 29747..29943 and the operator's
# probe on 29590, all below the Linux ephemeral range (32768+).
BENCH_CLUSTER_NAME ?= bench
BENCH_PORT_BASE ?= 29500
BENCH_ARGS ?=
# Timing of the emulated operand images (hack/emulators/profile.py): instant, or realistic (driver
# build/load tens of seconds, toolkit a few, the rest about one) scaled by BENCH_TIME_SCALE.
# Results go to bench/results/latest.* (instant) or latest-realistic.* (realistic).
BENCH_PROFILE ?= instant
BENCH_TIME_SCALE ?= 1
BENCH_OUT := bench/results/latest$(if $(filter realistic,$(BENCH_PROFILE)),-realistic,)

.PHONY: bench nvidia-operator

# NVIDIA's operator built from its source at hack/versions.env's NVIDIA_OPERATOR_VERSION, for
# `--side-by-side` (bench/nvidia.py). NVIDIA_OPERATOR_GIT: a local clone or mirror instead of GitHub.
nvidia-operator: ## build (or reuse) NVIDIA's operator from its Go source (NVIDIA_OPERATOR_GIT=clone); .cache/tools/nvidia-*
	@$(HACK)/build-nvidia-operator.sh

bench: venv tools ## benchmarks vs the control plane's limit (NODES=10: one size); bench/results/latest.{json,md}
	$(PY) -m bench.run --sizes $(BENCH_SIZES) --rounds $(BENCH_ROUNDS) --rest-seconds $(BENCH_REST_SECONDS) \
		--cluster-name $(BENCH_CLUSTER_NAME) --port-base $(BENCH_PORT_BASE) \
		--sim-profile $(BENCH_PROFILE) --sim-time-scale $(BENCH_TIME_SCALE) --out $(BENCH_OUT) $(BENCH_ARGS)

# A driver upgrade of BENCH_UPGRADE_NODES nodes, maxParallelUpgrades BENCH_UPGRADE_PARALLEL, against the
# DaemonSet controller's RollingUpdate (bench/upgrade.py); bench/results/upgrade.{json,md}.
BENCH_UPGRADE_NODES ?= 100
BENCH_UPGRADE_PARALLEL ?= 10
BENCH_UPGRADE_ROUNDS ?= 2

.PHONY: bench-upgrade

bench-upgrade: venv tools ## driver upgrade of 100 nodes vs RollingUpdate; bench/results/upgrade.{json,md}
	$(PY) -m bench.upgrade --nodes $(BENCH_UPGRADE_NODES) --parallel $(BENCH_UPGRADE_PARALLEL) \
		--rounds $(BENCH_UPGRADE_ROUNDS) --cluster-name $(BENCH_CLUSTER_NAME) --port-base $(BENCH_PORT_BASE) \
		$(BENCH_ARGS)
