#!/usr/bin/env bash
# `make demo`: local cluster with simulated GPU nodes, the CRDs and the chart's RBAC, the operator
# running as the chart's ServiceAccount, the seed article's ClusterPolicy and the ConfigMaps it refers
# to, and NVIDIADriver pools for the driver it delegates (two driver versions); waits until the policy
# is ready and GFD has labelled every GPU node, and shows it.
# `make down` (this script with `down`) stops the operator and the cluster; `hack/demo.sh stop` stops
# the operator and removes what the demo installed, leaving the cluster up.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${KUBECTL:?run through make}" "${HELM:?run through make}"
STATE=.cache/demo
PIDFILE=$STATE/operator.pid
LOG=$STATE/operator.log
NS=gpu-operator
POLICY=${POLICY:-examples/clusterpolicy.yaml}
# The NVIDIADrivers that run the driver the seed sample delegates (useNvidiaDriverCRD): the default on
# every GPU node, and the `lts` pool on the node labelled driver-pool=lts.
DRIVERS=${DRIVERS:-examples/nvidiadrivers.yaml}
LTS_NODE=${LTS_NODE:-gpu-node-1}
# The ConfigMaps examples/clusterpolicy.yaml names (devicePlugin.config, migManager.config).
CONFIGS=${CONFIGS:-examples/device-plugin-config.yaml examples/mig-config.yaml}
TIMEOUT=${DEMO_TIMEOUT:-300}
OPERATOR_KUBECONFIG=$STATE/operator-kubeconfig.yaml

stop_operator() {
  if [[ -f $PIDFILE ]]; then
    local pid
    pid=$(cat "$PIDFILE")
    # Only our own process: the pid file names it, and (pids get reused) it must still run with the
    # demo's kubeconfig in its environment.
    if kill -0 "$pid" 2>/dev/null \
      && tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "KUBECONFIG=$OPERATOR_KUBECONFIG"; then
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
  fi
}

policy_name() {
  .venv/bin/python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$POLICY"
}

if [[ ${1:-up} == down ]]; then
  stop_operator
  make --no-print-directory cluster-down
  exit 0
fi
if [[ ${1:-up} == stop ]]; then
  export KUBECONFIG
  KUBECONFIG=$(make --no-print-directory -s kubeconfig)
  # The operator removes the operands of a deleted policy: delete it while the operator still runs.
  "$KUBECTL" delete clusterpolicy "$(policy_name)" --ignore-not-found --wait >/dev/null
  "$KUBECTL" delete -f "$DRIVERS" --ignore-not-found >/dev/null
  "$KUBECTL" label node "$LTS_NODE" driver-pool- >/dev/null 2>&1 || true
  "$KUBECTL" wait --for=delete pods -n "$NS" -l app.kubernetes.io/managed-by=gpu-operator --timeout=120s >/dev/null 2>&1 || true
  stop_operator
  # shellcheck disable=SC2086 # a list of files
  for f in $CONFIGS; do "$KUBECTL" delete -f "$f" --ignore-not-found >/dev/null; done
  "$HELM" uninstall gpu-operator --namespace "$NS" --wait >/dev/null 2>&1 || true
  echo "demo: stopped the operator and removed the demo's policy, ConfigMaps and chart; the cluster keeps running"
  exit 0
fi

mkdir -p "$STATE"
make --no-print-directory cluster-up
export KUBECONFIG
KUBECONFIG=$(make --no-print-directory -s kubeconfig)

echo "demo: installing the CRD and the chart's ServiceAccount and RBAC (operator runs locally)"
"$KUBECTL" apply --server-side --force-conflicts -f crds/clusterpolicy.yaml -f crds/nvidiadriver.yaml >/dev/null
"$HELM" upgrade --install gpu-operator charts/gpu-operator --namespace "$NS" --create-namespace --wait \
  --set operator.replicas=0 --set clusterPolicy.create=false >/dev/null

echo "demo: starting the operator as system:serviceaccount:$NS:gpu-operator (log: $LOG)"
stop_operator
# The admin kubeconfig's cluster, with a fresh token of the chart's ServiceAccount (gpu_operator/runtime/kubeconfig.py).
.venv/bin/gpu-operator kubeconfig --service-account "$NS/gpu-operator" --duration 86400 \
  --output "$OPERATOR_KUBECONFIG" >/dev/null
KUBECONFIG=$OPERATOR_KUBECONFIG setsid .venv/bin/gpu-operator run --namespace "$NS" --listen 127.0.0.1:0 \
  >"$LOG" 2>&1 < /dev/null &
echo $! > "$PIDFILE"

name=$(policy_name)
# shellcheck disable=SC2086 # a list of files
for f in $CONFIGS; do "$KUBECTL" apply --server-side -f "$f" >/dev/null; done
echo "demo: the NVIDIADrivers of $DRIVERS, $LTS_NODE in the lts pool"
"$KUBECTL" label node "$LTS_NODE" driver-pool=lts --overwrite >/dev/null
"$KUBECTL" apply --server-side -f "$DRIVERS" >/dev/null
echo "demo: applying $POLICY (ClusterPolicy $name) and its ConfigMaps ($CONFIGS)"
"$KUBECTL" apply --server-side -f "$POLICY" >/dev/null
start=$(date +%s)
until [[ $("$KUBECTL" get clusterpolicy "$name" -o jsonpath='{.status.state}') == ready ]]; do
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "demo: the operator exited; its log:" >&2
    tail -30 "$LOG" >&2
    exit 1
  fi
  if (( $(date +%s) - start > TIMEOUT )); then
    echo "demo: the ClusterPolicy did not become ready in ${TIMEOUT}s; status and operator log:" >&2
    "$KUBECTL" get clusterpolicy "$name" -o yaml >&2
    tail -30 "$LOG" >&2
    exit 1
  fi
  "$KUBECTL" wait --for=jsonpath='{.status.state}'=ready "clusterpolicy/$name" --timeout=5s >/dev/null 2>&1 || true
done
echo "demo: ready after $(( $(date +%s) - start ))s"
# GFD publishes its labels once its pod runs; the policy can be ready a moment before nfd-master copied them.
gpu_nodes=$("$KUBECTL" get nodes -l feature.node.kubernetes.io/pci-10de.present=true -o name | wc -l)
until (( $("$KUBECTL" get nodes -l nvidia.com/gpu.product -o name | wc -l) == gpu_nodes )); do
  (( $(date +%s) - start > TIMEOUT )) && { echo "demo: GFD labels missing on some GPU nodes after ${TIMEOUT}s" >&2; exit 1; }
  sleep 1 # polling node labels another process writes; nothing to block on
done
echo
"$KUBECTL" get clusterpolicy -o wide
echo
"$KUBECTL" get nvidiadrivers
echo
"$KUBECTL" get daemonsets -n "$NS"
echo
# What GPU Feature Discovery found on each node (the seed article, section 4.5), each node's driver (its
# pool's: section 4.3) and what it advertises.
"$KUBECTL" get nodes -o custom-columns='NODE:.metadata.name,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product,MEMORY-MIB:.metadata.labels.nvidia\.com/gpu\.memory,COUNT:.metadata.labels.nvidia\.com/gpu\.count,FAMILY:.metadata.labels.nvidia\.com/gpu\.family,MIG-CAPABLE:.metadata.labels.nvidia\.com/mig\.capable,CUDA:.metadata.labels.nvidia\.com/cuda\.runtime-version\.full,DRIVER:.metadata.labels.nvidia\.com/cuda\.driver-version\.full,POOL:.metadata.labels.nvidia\.com/gpu-operator\.driver\.owner,GPUS:.status.allocatable.nvidia\.com/gpu'
echo
url=$(grep -o 'serving /metrics, /healthz and /readyz on http://[^ ]*' "$LOG" | tail -1 | awk '{print $NF}')
echo "The cluster and the operator keep running: export KUBECONFIG=$KUBECONFIG, then try"
echo "'$KUBECTL get clusterpolicy $name -o yaml' or 'kubectl describe clusterpolicy $name',"
echo "'.venv/bin/gpu-operator doctor' and 'curl -s $url/metrics | grep ^gpu_operator'; 'make down' stops everything."
