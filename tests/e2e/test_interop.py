"""The operator next to NVIDIA's operand managers and the Prometheus operator, end to end.

The managers' label writes are played with their own field managers and patch types (strategic merge
for k8s-driver-manager, JSON merge for mig-manager), exactly as hack/operand_managers.py transcribes
them from their sources; the real images run as those ServiceAccounts, a test client is enough here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.runtime.client import path

from .conftest import install_crds
from .kube_helpers import (
    Cluster,
    clear_failure,
    client,
    emulated_host,
    inject_failure,
    list_pods,
    pod_is_ready,
    wait_for,
)
from .operator_process import ROOT, OperatorProcess
from .test_operator import (
    COMPONENT,
    CONVERGE,
    DRIVER,
    NS,
    apply_policy,
    condition,
    get_policy,
    label_node,
    node_labels,
    owners,
    policy_from,
    wait_state,
    waits_in_init,
)

sys.path.insert(0, str(ROOT))
from hack import operand_managers

DRIVER_MANAGER = "k8s-driver-manager"
MIG_MANAGER = "nvidia-mig-manager"
DEPLOY = "nvidia.com/gpu.deploy."


def manager_patch(
    cluster: Cluster, node: str, manager: str, labels: dict[str, str], merge: bool = False
) -> None:
    """A label patch as the operand manager sends it: its own field manager, operation Update."""
    cluster.api.request(
        "PATCH",
        path("v1", "Node", name=node),
        body={"metadata": {"labels": labels}},
        query={"fieldManager": manager},
        content_type="application/merge-patch+json" if merge else "application/strategic-merge-patch+json",
    )


def component_status(cluster: Cluster, name: str) -> dict[str, Any]:
    status = get_policy(cluster, "cluster-policy").get("status", {})
    return next((c for c in status.get("components", []) if c["name"] == name), {})


def running_on(cluster: Cluster, component: str, node: str) -> bool:
    return any(
        pod_is_ready(p) for p in list_pods(cluster.api, NS, labels=f"{COMPONENT}={component}", node=node)
    )


@pytest.fixture
def manager_labels(cluster: Cluster) -> Iterator[list[str]]:
    """Nodes whose labels a test let a manager write: what the managers alone own is removed after."""
    touched: list[str] = []
    try:
        yield touched
    finally:
        for node in touched:
            left = {
                k: None for k, v in node_labels(cluster, node).items() if k.startswith(DEPLOY) and v != "true"
            }
            left.update({k: None for k in node_labels(cluster, node) if k == DEPLOY + "nvsm"})
            if left:
                label_node(cluster, node, **left)


def test_fresh_node_marked_by_the_driver_manager_comes_up(
    cluster: Cluster, clean: OperatorProcess, failures: None, manager_labels: list[str]
) -> None:
    node = "gpu-node-2"
    manager_labels.append(node)
    # A driver an earlier test left loaded on the emulated host (its pod was deleted under GPU clients).
    loaded = bool(emulated_host(cluster.api, node).get("driver"))
    inject_failure(cluster.api, DRIVER, node, "CrashLoopBackOff")  # the driver is still being built
    apply_policy(cluster, policy_from("empty"))

    def driver_pod() -> None:
        assert list_pods(cluster.api, NS, labels=f"{COMPONENT}={DRIVER}", node=node), "no driver pod yet"

    wait_for(driver_pod, timeout=CONVERGE, what="the driver pod on the marked node")
    # Its init container, k8s-driver-manager, finds no driver loaded and "reschedules" the operands:
    # "" for every operand label that is absent (NVIDIA's B1 trap: "" is not an opt-out), `true` kept.
    manager_patch(
        cluster, node, DRIVER_MANAGER, operand_managers.driver_manager_reschedule(node_labels(cluster, node))
    )

    def marked() -> Any:
        # The toolkit once the driver pod is past its init containers (its main container crash-loops),
        # a "" taken over, the operator's alone: k8s-driver-manager never paused and restored it, a
        # driver loaded on the node or not. Its pod waits in Init for the driver.
        labels = node_labels(cluster, node)
        assert labels[DEPLOY + "container-toolkit"] == "true", labels
        assert owners(cluster, node, DEPLOY + "container-toolkit") == {"gpu-operator"}
        assert labels[DEPLOY + "operator-validator"] == "", labels
        pods = list_pods(cluster.api, NS, labels=f"{COMPONENT}=container-toolkit", node=node)
        assert len(pods) == 1 and waits_in_init(pods[0], "driver-validation"), pods
        return pods[0]

    waiting = wait_for(marked, timeout=CONVERGE, what="the toolkit deployed, the validator marked")

    def waits_for_the_driver() -> None:
        for name, waits_for in (("container-toolkit", "driver"), ("operator-validator", "container-toolkit")):
            status = component_status(cluster, name)
            problems = {(p["node"], p["reason"], p["message"]) for p in status.get("problems", [])}
            assert (node, "WaitingForDependency", f"waiting for {waits_for}") in problems, status
            assert status["nodesDesired"] == 4, status

    wait_for(
        waits_for_the_driver, timeout=CONVERGE, what="the toolkit waits for the driver on the marked node"
    )
    clear_failure(cluster.api, DRIVER, node)
    wait_state(cluster, "cluster-policy", "ready")
    for component in ("container-toolkit", "operator-validator", "device-plugin", "dcgm-exporter"):
        assert node_labels(cluster, node)[DEPLOY + component] == "true"
        assert "gpu-operator" in owners(cluster, node, DEPLOY + component)
        assert running_on(cluster, component, node)
    if not loaded:
        # The very pod that waited. With a driver loaded, the driver pod that clear_failure re-creates
        # pauses and restores the (labelled) toolkit, as k8s-driver-manager does on every driver restart.
        toolkit = list_pods(cluster.api, NS, labels=f"{COMPONENT}=container-toolkit", node=node)
        assert [p.metadata.uid for p in toolkit] == [waiting.metadata.uid]


def test_driver_upgrade_pause_is_respected_and_the_restore_brings_everything_back(
    cluster: Cluster, clean: OperatorProcess, manager_labels: list[str]
) -> None:
    node = "gpu-node-1"
    manager_labels.append(node)
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    # A new driver pod: k8s-driver-manager evicts every operand on the node before it unloads the driver.
    manager_patch(
        cluster, node, DRIVER_MANAGER, operand_managers.driver_manager_evict(node_labels(cluster, node))
    )

    def paused() -> None:
        plugin = component_status(cluster, "device-plugin")
        expected = {
            "node": node,
            "reason": "Paused",
            "message": f"paused-for-driver-upgrade by {DRIVER_MANAGER}",
        }
        assert expected in plugin.get("problems", []), plugin
        assert not running_on(cluster, "device-plugin", node)

    wait_for(paused, timeout=CONVERGE, what="the pause reported and the device plugin gone from the node")
    policy = wait_state(cluster, "cluster-policy", "notReady")
    assert f"paused-for-driver-upgrade by {DRIVER_MANAGER} on {node}" in condition(policy, "Error")["message"]
    assert node_labels(cluster, node)[DEPLOY + "device-plugin"] == "paused-for-driver-upgrade", (
        "pause overwritten"
    )
    assert node_labels(cluster, node)[DEPLOY + "driver"] == "true"
    # The driver is back: the manager restores every label it paused.
    manager_patch(
        cluster, node, DRIVER_MANAGER, operand_managers.driver_manager_reschedule(node_labels(cluster, node))
    )
    wait_state(cluster, "cluster-policy", "ready")
    assert running_on(cluster, "device-plugin", node)
    # Restored by the manager, and the operator's again (both own it): deleting the policy removes it.
    wait_for(
        lambda: assert_owned(cluster, node, DEPLOY + "device-plugin", {"gpu-operator", DRIVER_MANAGER}),
        timeout=CONVERGE,
    )
    client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
    )

    def only_the_managers_marks_left() -> None:
        left = {k: v for k, v in node_labels(cluster, node).items() if k.startswith(DEPLOY)}
        assert all(v == "" for v in left.values()), left  # "" for operands nobody deployed, the manager's

    wait_for(only_the_managers_marks_left, timeout=CONVERGE, what="the operator's labels removed")


def assert_owned(cluster: Cluster, node: str, key: str, expected: set[str]) -> None:
    assert owners(cluster, node, key) == expected


def test_mig_reconfiguration_pause_is_respected_and_restored(
    cluster: Cluster, clean: OperatorProcess, manager_labels: list[str]
) -> None:
    node = "gpu-node-0"  # the MIG-capable one
    manager_labels.append(node)
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    manager_patch(
        cluster, node, MIG_MANAGER, operand_managers.mig_manager_pause(node_labels(cluster, node)), merge=True
    )

    def paused() -> None:
        for name in ("device-plugin", "dcgm", "gpu-feature-discovery"):
            problems = component_status(cluster, name).get("problems", [])
            assert {
                "node": node,
                "reason": "Paused",
                "message": f"paused-for-mig-change by {MIG_MANAGER}",
            } in problems
        assert not running_on(cluster, "device-plugin", node)
        assert running_on(cluster, "mig-manager", node)

    wait_for(paused, timeout=CONVERGE, what="the MIG pause reported")
    manager_patch(
        cluster,
        node,
        MIG_MANAGER,
        operand_managers.mig_manager_restore(node_labels(cluster, node)),
        merge=True,
    )
    wait_state(cluster, "cluster-policy", "ready")
    assert running_on(cluster, "device-plugin", node) and running_on(cluster, "dcgm-exporter", node)


def test_pre_installed_driver_counts_as_satisfied(
    cluster: Cluster, clean: OperatorProcess, manager_labels: list[str]
) -> None:
    node = "gpu-node-3"
    manager_labels.append(node)
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    manager_patch(cluster, node, DRIVER_MANAGER, dict(operand_managers.DRIVER_MANAGER_HOST_DRIVER))

    def driver_left_the_node() -> None:
        assert not list_pods(cluster.api, NS, labels=f"{COMPONENT}=driver", node=node)
        assert component_status(cluster, "driver").get("nodesDesired") == 3

    wait_for(driver_left_the_node, timeout=CONVERGE, what="the containerized driver gone from the node")
    wait_state(cluster, "cluster-policy", "ready")
    assert node_labels(cluster, node)[DEPLOY + "driver"] == "pre-installed"
    assert running_on(cluster, "device-plugin", node)


# --- dcgmExporter.serviceMonitor with and without the Prometheus operator --------------------------

SERVICE_MONITOR_CRD_NAME = "servicemonitors.monitoring.coreos.com"
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": SERVICE_MONITOR_CRD_NAME},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def service_monitors(cluster: Cluster) -> list[str]:
    found = client.CustomObjectsApi(cluster.api).list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NS, "servicemonitors"
    )
    return [item["metadata"]["name"] for item in found["items"]]


@pytest.fixture
def no_service_monitor_crd(cluster: Cluster) -> Iterator[None]:
    extensions = client.ApiextensionsV1Api(cluster.api)

    def gone() -> None:
        names = [c.metadata.name for c in extensions.list_custom_resource_definition().items]
        assert SERVICE_MONITOR_CRD_NAME not in names

    gone()
    try:
        yield
    finally:
        try:
            extensions.delete_custom_resource_definition(SERVICE_MONITOR_CRD_NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise
        wait_for(gone, timeout=60, what="ServiceMonitor CRD deleted")


def test_service_monitor_waits_for_its_crd_and_goes_when_turned_off(
    cluster: Cluster, clean: OperatorProcess, no_service_monitor_crd: None, tmp_path: Path
) -> None:
    body = policy_from("empty")
    body["spec"] = {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}
    apply_policy(cluster, body)
    policy = wait_state(cluster, "cluster-policy", "ready")  # NVIDIA's chart default, no Prometheus operator
    assert (
        "ServiceMonitor CRD (servicemonitors.monitoring.coreos.com) is not installed"
        in condition(policy, "Ready")["message"]
    )
    # The Prometheus operator arrives later: noticed without a restart.
    crd_file = tmp_path / "servicemonitor-crd.json"
    crd_file.write_text(json.dumps(SERVICE_MONITOR_CRD))
    install_crds(cluster, crd_file)
    wait_for(
        lambda: assert_equal(service_monitors(cluster), ["nvidia-dcgm-exporter"]),
        timeout=CONVERGE,
        what="ServiceMonitor created",
    )

    def note_gone() -> None:
        assert "ServiceMonitor" not in condition(get_policy(cluster, "cluster-policy"), "Ready")["message"]

    wait_for(note_gone, timeout=CONVERGE, what="the note gone from the status")
    # After a restart (nothing remembered in memory), turning it off deletes it: ServiceMonitors are watched.
    clean.stop()
    clean.start()
    body["spec"] = {"dcgmExporter": {"serviceMonitor": {"enabled": False}}}
    apply_policy(cluster, body)
    wait_for(
        lambda: assert_equal(service_monitors(cluster), []), timeout=CONVERGE, what="ServiceMonitor deleted"
    )
    wait_state(cluster, "cluster-policy", "ready")


def assert_equal(found: Any, expected: Any) -> None:
    assert found == expected


# --- psa.enabled -----------------------------------------------------------------------------------

ENFORCE, AUDIT, WARN = (f"pod-security.kubernetes.io/{m}" for m in ("enforce", "audit", "warn"))
PREVIOUS = "nvidia.com/gpu-operator.psa-previous"


def namespace_metadata(cluster: Cluster) -> tuple[dict[str, str], dict[str, str]]:
    found: Any = client.CoreV1Api(cluster.api).read_namespace(NS)
    return dict(found.metadata.labels or {}), dict(found.metadata.annotations or {})


def test_psa_labels_the_namespace_and_puts_back_what_was_there(
    cluster: Cluster, clean: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api)
    core.patch_namespace(NS, {"metadata": {"labels": {ENFORCE: "baseline"}}})  # the cluster admin's level
    try:
        body = policy_from("empty")
        for turn_off in ("disable", "delete"):
            body["spec"] = {"psa": {"enabled": True}}
            apply_policy(cluster, body)

            def privileged() -> None:
                labels, annotations = namespace_metadata(cluster)
                assert {k: labels.get(k) for k in (ENFORCE, AUDIT, WARN)} == dict.fromkeys(
                    (ENFORCE, AUDIT, WARN), "privileged"
                )
                assert annotations.get(PREVIOUS) == f'{{"{ENFORCE}": "baseline"}}'

            wait_for(privileged, timeout=CONVERGE, what="namespace labelled privileged")
            wait_state(cluster, "cluster-policy", "ready")
            if turn_off == "disable":
                body["spec"] = {"psa": {"enabled": False}}
                apply_policy(cluster, body)
            else:
                client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
                    "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
                )

            def reverted() -> None:
                labels, annotations = namespace_metadata(cluster)
                assert labels.get(ENFORCE) == "baseline" and AUDIT not in labels and WARN not in labels, (
                    labels
                )
                assert PREVIOUS not in annotations

            wait_for(reverted, timeout=CONVERGE, what=f"pod-security labels reverted ({turn_off})")
    finally:
        core.patch_namespace(NS, {"metadata": {"labels": {ENFORCE: None}}})
