#!/usr/bin/env bash
# End-to-end tests on kind with the operator running in the cluster (needs docker and kind):
# create a kind cluster, build the image, load it, install the chart, run tests/e2e against it,
# delete the cluster. `make e2e-kind` calls this; it cannot run on machines without Docker.
#
# Environment: IMAGE (default gpu-operator:dev), HELM, KUBECTL, KIND, PYTHON (defaults: on PATH),
# KIND_CLUSTER (default gpu-operator-e2e), KEEP_CLUSTER=1 to keep it afterwards,
# PYTEST_ARGS (default "-m e2e tests/e2e").
#
# kind nodes have no GPUs: the script labels the workers as NFD would
# (feature.node.kubernetes.io/pci-10de.present=true) so the operator deploys its DaemonSets there.
# Operand pods then pull NVIDIA's images and cannot become Ready without GPUs, so the in-cluster
# part proves the image, RBAC, CRD, node labelling and uninstall. Of the pytest suite,
# test_cluster.py skips without kwok; tests that wait for `state: ready` need operand pods that
# become Ready (GPU nodes, or kwok's simulated pods) and fail on plain kind.
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-gpu-operator:dev}
HELM=${HELM:-helm}
KUBECTL=${KUBECTL:-kubectl}
KIND=${KIND:-kind}
PYTHON=${PYTHON:-python3}
KIND_CLUSTER=${KIND_CLUSTER:-gpu-operator-e2e}
NAMESPACE=gpu-operator
read -r -a pytest_args <<<"${PYTEST_ARGS:--m e2e tests/e2e}"

for tool in docker "$KIND" "$HELM" "$KUBECTL"; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 2; }
done

workdir=$(mktemp -d)
export KUBECONFIG="$workdir/kubeconfig"

cleanup() {
  local status=$?
  if [ "$status" -ne 0 ]; then
    "$KUBECTL" -n "$NAMESPACE" logs deploy/gpu-operator --tail=200 2>/dev/null || true
  fi
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    echo "kind-e2e: kept cluster $KIND_CLUSTER (KUBECONFIG=$KUBECONFIG)"
  else
    "$KIND" delete cluster --name "$KIND_CLUSTER" || true
    rm -rf "$workdir"
  fi
  exit "$status"
}
trap cleanup EXIT

cat >"$workdir/kind.yaml" <<'YAML'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
YAML

"$KIND" create cluster --name "$KIND_CLUSTER" --config "$workdir/kind.yaml" --kubeconfig "$KUBECONFIG" --wait 120s
docker build -t "$IMAGE" .
"$KIND" load docker-image "$IMAGE" --name "$KIND_CLUSTER"

for node in $("$KUBECTL" get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  "$KUBECTL" label --overwrite "$node" feature.node.kubernetes.io/pci-10de.present=true
done

# The image is local (`kind load`): no registry prefix, never pulled.
repository=${IMAGE%:*}
tag=${IMAGE##*:}
"$HELM" install gpu-operator charts/gpu-operator --namespace "$NAMESPACE" --create-namespace \
  --set operator.image.repository= \
  --set operator.image.name="$repository" \
  --set operator.image.tag="$tag" \
  --set operator.image.pullPolicy=Never \
  --set operator.logFormat=plain \
  --wait --timeout 3m
"$KUBECTL" -n "$NAMESPACE" rollout status deploy/gpu-operator --timeout 120s

# The operator in the cluster must have labelled the GPU nodes and created its operands.
"$KUBECTL" wait nodes -l feature.node.kubernetes.io/pci-10de.present=true \
  --for=jsonpath='{.metadata.labels.nvidia\.com/gpu\.present}'=true --timeout 120s
"$KUBECTL" -n "$NAMESPACE" get daemonsets -l app.kubernetes.io/managed-by=gpu-operator

# Uninstall must leave no operand and no operator node label (the pre-delete hook runs for real here).
"$HELM" uninstall gpu-operator --namespace "$NAMESPACE" --wait --timeout 3m
left=$("$KUBECTL" get daemonsets,clusterroles,runtimeclasses -A -l app.kubernetes.io/managed-by=gpu-operator -o name)
labels=$("$KUBECTL" get nodes -o jsonpath='{range .items[*]}{.metadata.labels}{"\n"}{end}' | grep -c 'nvidia.com/gpu.deploy\|nvidia.com/gpu.present' || true)
if [ -n "$left" ] || [ "$labels" != 0 ]; then
  echo "kind-e2e: uninstall left objects [$left] or node labels on $labels node(s)" >&2
  exit 1
fi

# The e2e suite against the same cluster (it installs the chart itself where it needs it).
"$PYTHON" -m pytest "${pytest_args[@]}"
