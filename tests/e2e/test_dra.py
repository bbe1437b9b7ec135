"""Dynamic Resource Allocation beside the device plugin, per node pool (issue 37), end to end.

A GPUCluster whose spec.nodeSelector picks one GPU node of the simulated cluster: that node gets the DRA
stack (the emulated DRA kubelet plugin publishes its GPUs as a resource.k8s.io/v1 ResourceSlice) and
loses the device plugin; a pod asking for a GPU through a ResourceClaimTemplate of DeviceClass
gpu.nvidia.com is scheduled there by the real kube-scheduler with its claim allocated, while a classic
`nvidia.com/gpu` pod runs on a device-plugin node; the node then moves back to the device plugin once the
GPU pod of the DRA side is gone. NVIDIA's GPUCluster sample is accepted by the CRD as is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chaos import ROOT, record
from .kube_helpers import Cluster, assert_true, client, gpu_nodes, wait_for, wait_timeout
from .operator_process import OperatorProcess
from .test_operator import apply_policy, wait_state, writes_by
from .test_upgrade import upgrade_policy

pytestmark = pytest.mark.e2e

NS = "gpu-operator"
GROUP, VERSION, PLURAL = "nvidia.com", "v1alpha1", "gpuclusters"
NAME = "gpu-cluster"
POOL_LABEL = "e2e.gpu-operator/allocator"
DRA_DEPLOY = "nvidia.com/gpu.deploy.dra-driver"
DP_DEPLOY = "nvidia.com/gpu.deploy.device-plugin"
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "nvidia" / "gpucluster-sample.yaml"
CONVERGE = wait_timeout(120.0, node_starts=2)
WORKLOADS = "e2e-dra"
USER = f"system:serviceaccount:{NS}:gpu-operator"
RESULTS = ROOT / ".cache" / "dra-results.json"
"""How long a node took to move and what the operator asked of the API server meanwhile, for the note."""
IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
"""Workload pods are kwok's (the emulators run only the operator's): Running until deleted."""


def custom(cluster: Cluster) -> Any:
    return client.CustomObjectsApi(cluster.api)


def gpucluster(selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUCluster",
        "metadata": {"name": NAME},
        "spec": {"nodeSelector": selector},
    }


def get_gpucluster(cluster: Cluster) -> dict[str, Any]:
    found: dict[str, Any] = custom(cluster).get_cluster_custom_object(GROUP, VERSION, PLURAL, NAME)
    return found


def delete_gpucluster(cluster: Cluster) -> None:
    cluster.kubectl("delete", f"{PLURAL}.{GROUP}", NAME, "--ignore-not-found", "--wait=false")


def node_labels(cluster: Cluster, node: str) -> dict[str, str]:
    labels: dict[str, str] = client.CoreV1Api(cluster.api).read_node(node).metadata.labels or {}
    return labels


def label_node(cluster: Cluster, node: str, value: str | None) -> None:
    client.CoreV1Api(cluster.api).patch_node(node, {"metadata": {"labels": {POOL_LABEL: value}}})


def resource_slices(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    listing = json.loads(
        cluster.kubectl(
            "get", "resourceslices.resource.k8s.io", "-o", "json", f"--field-selector=spec.nodeName={node}"
        )
    )
    return [s for s in listing["items"] if s["spec"].get("driver") == "gpu.nvidia.com"]


def claim_pod(name: str) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate for one gpu.nvidia.com GPU and a pod that uses it."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "cuda",
                    "image": IMAGE,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    return [template, pod]


def classic_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "cuda",
                    "image": IMAGE,
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }


def apply(cluster: Cluster, body: dict[str, Any] | list[dict[str, Any]]) -> None:
    items = body if isinstance(body, list) else [body]
    cluster.kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )


@pytest.fixture
def dra(cluster: Cluster, clean: OperatorProcess) -> Iterator[OperatorProcess]:
    """A namespace for the workloads; afterwards no workload, no GPUCluster, no pool label (then `clean`
    removes the ClusterPolicy and checks that nothing of the operator is left)."""
    apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}})
    try:
        yield clean
    finally:
        cluster.kubectl(
            "delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s"
        )
        delete_gpucluster(cluster)
        wait_for(
            lambda: assert_true(NAME not in cluster.kubectl("get", f"{PLURAL}.{GROUP}", "-o", "name")),
            timeout=CONVERGE,
            what="the GPUCluster gone (its finalizer removed once its claim holders are gone)",
        )
        for node in gpu_nodes(cluster.api):
            label_node(cluster, node, None)


def measure(cluster: Cluster, move: str, since: float) -> None:
    """Record a move: seconds until it was seen done, and the operator's requests since it began
    (writes, dry runs and reads; the leader election's Lease renewals apart), where there is an audit
    log to count them in."""
    if cluster.audit_log is None:
        return
    requests = (
        writes_by(cluster, USER, since)
        + writes_by(cluster, USER, since, dry_runs=True)
        + writes_by(cluster, USER, since, verbs=("get", "list"))
    )
    requests = [r for r in requests if not r.startswith("update leases/")]
    record(move, RESULTS, seconds=round(time.time() - since, 2), requests=len(requests))


def test_nvidias_sample_is_accepted_as_is(cluster: Cluster, clean: OperatorProcess) -> None:
    """The operator creates the GPUCluster CRD; NVIDIA's sample passes its schema and rules unchanged
    (a server-side dry run: the sample selects every GPU node, which would move the whole cluster)."""
    sample = yaml.safe_load(SAMPLE.read_text())
    wait_for(
        lambda: custom(cluster).create_cluster_custom_object(GROUP, VERSION, PLURAL, sample, dry_run="All"),
        timeout=60,
        what="NVIDIA's GPUCluster sample accepted (dry run)",
    )


def test_a_pool_on_dra_beside_the_device_plugin(cluster: Cluster, dra: OperatorProcess) -> None:
    nodes = gpu_nodes(cluster.api)
    assert len(nodes) >= 2, nodes
    dra_node, dp_node = nodes[0], nodes[1]
    apply_policy(cluster, upgrade_policy("595.91.07"))
    wait_state(cluster, "cluster-policy", "ready")
    label_node(cluster, dra_node, "dra")
    moving = time.time()
    apply(cluster, gpucluster({POOL_LABEL: "dra"}))

    # The pool's node: the DRA stack's labels, no device plugin; the others keep it.
    def moved() -> None:
        labels = node_labels(cluster, dra_node)
        assert labels.get(DRA_DEPLOY) == "true" and DP_DEPLOY not in labels, labels
        others = node_labels(cluster, dp_node)
        assert others.get(DP_DEPLOY) == "true" and DRA_DEPLOY not in others, others

    wait_for(moved, timeout=CONVERGE, what=f"{dra_node} on DRA, {dp_node} on the device plugin")

    # The emulated kubelet plugin publishes the node's GPUs, as its own ServiceAccount.
    def published() -> list[dict[str, Any]]:
        found = resource_slices(cluster, dra_node)
        assert found, f"no gpu.nvidia.com ResourceSlice on {dra_node}"
        return found

    slices = wait_for(published, timeout=CONVERGE, what=f"a gpu.nvidia.com ResourceSlice for {dra_node}")
    measure(cluster, "to-dra", moving)
    device = slices[0]["spec"]["devices"][0]
    assert {"uuid", "productName", "architecture", "driverVersion"} <= device["attributes"].keys(), device
    assert "memory" in device["capacity"], device

    # The GPUCluster's status: NVIDIA's shape, in the operand namespace, no conflict.
    def status() -> dict[str, Any]:
        found = get_gpucluster(cluster).get("status") or {}
        assert found.get("namespace") == NS and found.get("state") in ("ready", "notReady"), found
        reasons = {c["reason"] for c in found.get("conditions") or [] if c["status"] == "True"}
        assert not reasons & {"ReconcileFailed", "ConflictingNodeSelector"}, found
        return found

    wait_for(status, timeout=CONVERGE, what="the GPUCluster's status")
    assert get_gpucluster(cluster)["metadata"].get("finalizers") == [
        "gpucluster.nvidia.com/dra-resourceclaim"
    ]
    namespace = client.CoreV1Api(cluster.api).read_namespace(NS)
    assert (namespace.metadata.labels or {}).get("resource.kubernetes.io/admin-access") == "true"

    # A claim for a gpu.nvidia.com GPU: the real scheduler allocates it on the DRA node.
    apply(cluster, claim_pod("dra-job"))
    apply(cluster, classic_pod("classic-job", dp_node))
    core = client.CoreV1Api(cluster.api)

    def allocated() -> None:
        pod = core.read_namespaced_pod("dra-job", WORKLOADS)
        assert pod.spec.node_name == dra_node, (pod.spec.node_name, pod.status.conditions)
        statuses = pod.status.resource_claim_statuses or []
        assert statuses and statuses[0].resource_claim_name, statuses
        claim = json.loads(
            cluster.kubectl(
                "get",
                "resourceclaims.resource.k8s.io",
                "-n",
                WORKLOADS,
                statuses[0].resource_claim_name,
                "-o",
                "json",
            )
        )
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []
        assert results and results[0]["driver"] == "gpu.nvidia.com" and results[0]["pool"] == dra_node, claim

    wait_for(allocated, timeout=CONVERGE, what="the claim pod scheduled on the DRA node, its claim allocated")
    wait_for(
        lambda: assert_true(core.read_namespaced_pod("classic-job", WORKLOADS).spec.node_name == dp_node),
        timeout=CONVERGE,
        what="the nvidia.com/gpu pod scheduled on the device-plugin node",
    )

    # The node leaves the pool: it stays on DRA while its claim pod runs (the GPUCluster says why)...
    label_node(cluster, dra_node, None)

    def held() -> None:
        labels = node_labels(cluster, dra_node)
        assert labels.get(DRA_DEPLOY) == "true" and DP_DEPLOY not in labels, labels
        message = json.dumps(get_gpucluster(cluster).get("status") or {})
        assert dra_node in message and "GPU pod" in message, message

    wait_for(held, timeout=CONVERGE, what=f"{dra_node} held on DRA by its claim pod")
    # ... and moves to the device plugin once it is gone; its ResourceSlice goes with the plugin.
    moving = time.time()
    core.delete_namespaced_pod("dra-job", WORKLOADS, grace_period_seconds=0)

    def back() -> None:
        labels = node_labels(cluster, dra_node)
        assert labels.get(DP_DEPLOY) == "true" and DRA_DEPLOY not in labels, labels
        assert not resource_slices(cluster, dra_node), "its ResourceSlice is still there"

    wait_for(back, timeout=CONVERGE, what=f"{dra_node} back on the device plugin")
    measure(cluster, "to-device-plugin", moving)
