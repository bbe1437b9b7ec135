"""Acceptance tests of the e2e cluster itself: simulated nodes, kwok's pods, failures, the API server.

The operand emulators (the simulated kubelet of operand pods, the GPUs) have their own tests in
test_emulators.py.

They need the kwok simulation of hack/cluster.sh (nodes labelled ``gpu-operator.sim/simulated``)
and skip on a cluster without it. The API-server checks (TokenRequest, RBAC, owner references to
cluster-scoped objects) run on any cluster.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.runtime.sync_client import SyncKube

from .kube_helpers import (
    COMPONENT_LABEL,
    GPU_COUNT_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_NODE_LABEL,
    SIMULATED_NODE_LABEL,
    Cluster,
    FailureReason,
    clear_failure,
    client,
    create_object,
    daemonset_manifest,
    describe_pods,
    inject_failure,
    list_pods,
    pod_is_ready,
    token_client,
    wait_for,
    wait_for_daemonset,
    waiting_reasons,
)

pytestmark = pytest.mark.e2e

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
OS_LABELS = {
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/kernel-version.full": "5.15.0-105-generic",
}
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class SimNodes:
    gpu: list[str]  # gpu-node-0 .. gpu-node-N-1, in index order
    cpu: list[str]

    def timeout(self, seconds: float) -> float:
        """A timeout that grows with the cluster: DaemonSets over 1000 nodes take a while."""
        return seconds + 0.1 * len(self.gpu)


@pytest.fixture(scope="module")
def sim(api: SyncKube) -> SimNodes:
    nodes: list[Any] = client.CoreV1Api(api).list_node(label_selector=f"{SIMULATED_NODE_LABEL}=true").items
    names: list[str] = [n.metadata.name for n in nodes]
    if not names:
        pytest.skip("no simulated nodes: these tests need the kwok cluster of hack/cluster.sh")

    def index(name: str) -> int:
        return int(name.rsplit("-", 1)[1])

    return SimNodes(
        gpu=sorted((n for n in names if n.startswith("gpu-node-")), key=index),
        cpu=sorted((n for n in names if n.startswith("cpu-node-")), key=index),
    )


def daemonset(
    name: str, component: str, *, node_selector: dict[str, str], image: str = "example.invalid/x:1"
) -> dict[str, Any]:
    """A DaemonSet shaped like an operand (app + component labels) that kwok runs."""
    return daemonset_manifest(
        name, {COMPONENT_LABEL: component}, node_selector, containers=[{"name": "main", "image": image}]
    )


def test_nodes_ready_with_labels_and_taints(cluster: Cluster, sim: SimNodes) -> None:
    assert sim.gpu == [f"gpu-node-{i}" for i in range(len(sim.gpu))] and sim.gpu
    assert sim.cpu and sim.cpu[0] == "cpu-node-0"
    # Through kubectl, as a user would look.
    listed = json.loads(cluster.kubectl("get", "nodes", "-l", f"{SIMULATED_NODE_LABEL}=true", "-o", "json"))
    nodes = {n["metadata"]["name"]: n for n in listed["items"]}
    assert sorted(nodes) == sorted(sim.gpu + sim.cpu)
    for name, node in nodes.items():
        labels, status = node["metadata"]["labels"], node["status"]
        ready = [c["status"] for c in status["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], f"{name} not Ready: {status['conditions']}"
        for key, value in OS_LABELS.items():
            assert labels.get(key) == value, f"{name} {key}={labels.get(key)}"
        ips = [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]
        assert ips and all(ipaddress.ip_address(ip) in LOOPBACK for ip in ips), f"{name} IPs {ips}"
        taints = [t for t in node["spec"].get("taints", []) if t["key"] == "nvidia.com/gpu"]
        if name in sim.gpu:
            index = int(name.rsplit("-", 1)[1])
            assert labels.get(GPU_NODE_LABEL) == "true", name
            assert node["metadata"]["annotations"].get(GPU_COUNT_ANNOTATION) == "8", name
            assert taints == ([GPU_TAINT] if index % 2 else []), f"{name} taints {taints}"
            # The hardware is the emulators' to know; labels describing it come from GFD, once it runs.
            model = node["metadata"]["annotations"].get(GPU_MODEL_ANNOTATION)
            assert model == ("H100-80GB-HBM3" if index == 0 else "L4"), f"{name} model {model}"
        else:
            assert GPU_NODE_LABEL not in labels, name
            assert GPU_COUNT_ANNOTATION not in node["metadata"]["annotations"], name
            assert taints == [], name


def test_daemonset_runs_one_ready_pod_per_gpu_node(api: SyncKube, namespace: str, sim: SimNodes) -> None:
    create_object(
        api, daemonset("gpu-operand", "e2e-operand", node_selector={GPU_NODE_LABEL: "true"}), namespace
    )

    wait_for_daemonset(api, namespace, "gpu-operand", ready=len(sim.gpu), timeout=sim.timeout(60))
    pods = list_pods(api, namespace, labels="app=gpu-operand")
    assert sorted(p.spec.node_name for p in pods) == sorted(sim.gpu), describe_pods(pods)
    for pod in pods:
        assert pod_is_ready(pod), describe_pods(pods)
        assert pod.metadata.labels[COMPONENT_LABEL] == "e2e-operand"
        assert ipaddress.ip_address(pod.status.pod_ip) in LOOPBACK, pod.status.pod_ip
        assert ipaddress.ip_address(pod.status.host_ip) in LOOPBACK, pod.status.host_ip


@pytest.mark.parametrize("reason", ["CrashLoopBackOff", "ImagePullBackOff"])
def test_failure_injection_and_recovery(
    api: SyncKube, namespace: str, sim: SimNodes, failures: None, reason: FailureReason
) -> None:
    component = f"e2e-{reason.lower()}"
    target = sim.gpu[-1]
    inject_failure(api, component, target, reason)
    create_object(api, daemonset("operand", component, node_selector={GPU_NODE_LABEL: "true"}), namespace)

    def target_fails() -> Any:
        pods = list_pods(api, namespace, labels="app=operand")
        on_target = [p for p in pods if p.spec.node_name == target]
        assert len(on_target) == 1, describe_pods(pods)
        pod = on_target[0]
        assert waiting_reasons(pod) == [reason] and not pod_is_ready(pod), describe_pods(pods)
        statuses = pod.status.container_statuses
        if reason == "CrashLoopBackOff":
            assert pod.status.phase == "Running" and statuses[0].restart_count > 0, describe_pods(pods)
            assert statuses[0].last_state.terminated.exit_code == 1
        else:
            assert (
                pod.status.phase == "Pending"
                and "Back-off pulling image" in statuses[0].state.waiting.message
            )
        return pod

    failing = wait_for(target_fails, timeout=sim.timeout(30), what=f"{reason} on {target}")
    # Every other GPU node runs its pod; the DaemonSet counts the failing one as not ready.
    wait_for_daemonset(
        api, namespace, "operand", ready=len(sim.gpu) - 1, desired=len(sim.gpu), timeout=sim.timeout(60)
    )

    deleted = clear_failure(api, component, target)
    assert f"{namespace}/{failing.metadata.name}" in deleted

    def target_recovers() -> None:
        pods = list_pods(api, namespace, labels="app=operand")
        on_target = [p for p in pods if p.spec.node_name == target]
        assert len(on_target) == 1 and on_target[0].metadata.uid != failing.metadata.uid, describe_pods(pods)
        assert pod_is_ready(on_target[0]), describe_pods(pods)

    wait_for(target_recovers, timeout=sim.timeout(30), what=f"new pod Ready on {target}")
    wait_for_daemonset(api, namespace, "operand", ready=len(sim.gpu), timeout=sim.timeout(60))


def test_service_account_token_is_authorized_by_rbac(cluster: Cluster, api: SyncKube, namespace: str) -> None:
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}
    create_object(api, sa, namespace)
    token = cluster.kubectl("create", "token", "reader", "-n", namespace, "--duration=10m").strip()
    assert token.count(".") == 2, "not a JWT"

    as_reader = token_client(api, token)
    try:
        reader = client.CoreV1Api(as_reader)
        with pytest.raises(ApiException) as denied:
            reader.list_namespaced_pod(namespace)
        assert denied.value.status == 403, denied.value

        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        }
        create_object(api, role, namespace)
        create_object(api, binding, namespace)

        def allowed() -> None:
            try:
                reader.list_namespaced_pod(namespace)
            except ApiException as exc:
                raise AssertionError(f"still {exc.status}") from exc

        wait_for(allowed, timeout=30, what="RoleBinding takes effect")
    finally:
        as_reader.close()


def test_cluster_scoped_owner_reference_and_garbage_collection(api: SyncKube, namespace: str) -> None:
    """Namespaced objects owned by a cluster-scoped one (as operands by a ClusterPolicy)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    owner: Any = rbac.create_cluster_role(
        client.V1ClusterRole(metadata=client.V1ObjectMeta(name=f"e2e-owner-{uuid.uuid4().hex[:8]}"), rules=[])
    )
    try:
        ref = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        owned = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "owned", "ownerReferences": [ref]},
        }
        create_object(api, owned, namespace)
    finally:
        rbac.delete_cluster_role(owner.metadata.name)

    def collected() -> None:
        try:
            cm: Any = core.read_namespaced_config_map("owned", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        raise AssertionError(f"ConfigMap still there, owners {cm.metadata.owner_references}")

    wait_for(collected, timeout=60, what="garbage collector deletes the owned ConfigMap")


def test_audit_log_records_each_request_once(cluster: Cluster, api: SyncKube, namespace: str) -> None:
    if cluster.audit_log is None:
        pytest.skip("the audit log path is known only for the local kwok cluster")
    audit_log = cluster.audit_log
    name = f"audit-probe-{uuid.uuid4().hex[:8]}"
    create_object(api, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}, namespace)

    def logged() -> list[dict[str, Any]]:
        with audit_log.open(encoding="utf-8") as f:
            events = [json.loads(line) for line in f if name in line]
        creates = [e for e in events if e["verb"] == "create" and e["objectRef"].get("name") == name]
        assert creates, f"no audit event for {name} yet ({len(events)} mentioning it)"
        return creates

    creates = wait_for(logged, timeout=30, what=f"audit event for ConfigMap {name}")
    assert [e["stage"] for e in creates] == ["ResponseComplete"], creates
    event = creates[0]
    assert event["level"] == "Metadata" and "requestObject" not in event
    assert event["objectRef"]["resource"] == "configmaps" and event["objectRef"]["namespace"] == namespace
    assert event["user"]["username"], event["user"]
