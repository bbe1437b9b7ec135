"""doctor and DRA (gpu_operator/doctor/dra.py): a pod Pending on an unallocatable NVIDIA GPU claim,
explained node by node with kube-scheduler's DRA reasons, down to the missing ResourceSlice and the
operand that should publish it; what doctor records for it, only when a pod names a claim."""

from __future__ import annotations

from typing import Any

from builders import node_body

from gpu_operator.doctor import recording
from gpu_operator.doctor.diagnosis import diagnose
from gpu_operator.doctor.state import ClusterState

NS = "gpu-operator"
PCI = {"feature.node.kubernetes.io/pci-10de.present": "true"}
DRA = {"nvidia.com/gpu.deploy.dra-driver": "true"}


def claim_pod(name: str = "job") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "cuda", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 cannot allocate all claims.",
                }
            ],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu-x"}],
        },
    }


def claim(name: str, allocated: tuple[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    if allocated:
        body["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"driver": "gpu.nvidia.com", "pool": allocated[0], "device": allocated[1]}]
                }
            }
        }
    return body


def resource_slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(devices)
            ],
        },
    }


def plugin_pod(node: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"plugin-{node}",
            "namespace": NS,
            "labels": {
                "app": "nvidia-dra-driver-kubelet-plugin",
                "app.kubernetes.io/managed-by": "gpu-operator",
            },
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": "driver-validation", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        },
    }


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return node_body(name, labels, status={"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}})


def state(**extra: Any) -> ClusterState:
    nodes = [
        node("dra-0", {**PCI, **DRA}),
        node("dra-1", {**PCI, **DRA}),
        node("classic-0", PCI),
    ]
    defaults: dict[str, Any] = {
        "namespace": NS,
        "now": "2026-12-01T00:00:00Z",
        "nodes": nodes,
        "pods": [claim_pod(), plugin_pod("dra-1")],
        "resource_claims": [claim("job-gpu-x"), claim("other", ("dra-0", "gpu-0"))],
        "resource_slices": [resource_slice("dra-0", 1)],
        "device_classes": [{"metadata": {"name": "gpu.nvidia.com"}}],
        "gpuclusters": [{"metadata": {"name": "gpu-cluster"}}],
    }
    return ClusterState(**{**defaults, **extra})


def test_each_node_says_why_the_claim_cannot_be_allocated() -> None:
    (finding,) = [f for f in diagnose(state()) if f.code == "ResourceClaimUnallocatable"]
    assert finding.severity == "error" and finding.pod == "default/job"
    cause = finding.cause
    # A node with a slice whose only GPU another claim holds.
    assert (
        "on dra-0: cannot allocate all claims: gpu.nvidia.com needs 1, the node has 1 gpu device, 1 allocated"
        in cause
    )
    # A DRA node whose kubelet plugin has not published its slice yet: its pod and reason.
    assert "on dra-1: cannot allocate all claims: no ResourceSlice of gpu.nvidia.com" in cause
    assert "plugin-dra-1" in cause and "PodInitializing" in cause
    # A device-plugin node: not selected by the GPUCluster.
    assert "on classic-0: cannot allocate all claims" in cause and "not on DRA" in cause


def test_a_free_gpu_fits() -> None:
    found = diagnose(state(resource_slices=[resource_slice("dra-0", 2)]))
    (finding,) = [f for f in found if f.code == "ResourceClaimUnallocatable"]
    assert finding.severity == "warning" and "fit on dra-0" in finding.cause


def test_missing_device_class_and_no_gpucluster() -> None:
    (finding,) = [f for f in diagnose(state(device_classes=[])) if f.code == "DeviceClassMissing"]
    assert "gpu.nvidia.com does not exist" in finding.cause
    found = diagnose(state(gpuclusters=[], resource_slices=[]))
    (finding,) = [f for f in found if f.code == "ResourceClaimUnallocatable"]
    assert "no GPUCluster" in finding.cause


def test_nothing_without_claims_recorded() -> None:
    assert not [f for f in diagnose(state(resource_claims=None)) if f.code.startswith("ResourceClaim")]


class Fake:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.listed: list[str] = []

    def list(self, api_version: str, kind: str, namespace: str = "", label_selector: str = "") -> list[Any]:
        self.listed.append(kind)
        return self.pods if kind == "Pod" else []

    def pod_log(self, *args: Any) -> str:
        return ""


def test_claims_are_read_only_when_a_pod_names_one() -> None:
    fake = Fake([claim_pod()])
    recorded = recording.record(fake, NS, 0)  # type: ignore[arg-type]
    assert {"ResourceClaim", "ResourceSlice", "DeviceClass", "GPUCluster"} <= set(fake.listed)
    assert recorded.resource_claims == [] and recorded.pods[0]["spec"]["resourceClaims"]
    quiet = Fake([])
    recording.record(quiet, NS, 0)  # type: ignore[arg-type]
    assert "ResourceClaim" not in quiet.listed
