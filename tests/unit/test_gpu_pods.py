"""Which pods hold a node's GPUs, and through which allocator (core/gpu_pods.py): NVIDIA's rules for
claims (PodHasNVIDIAGPUClaim) and the driver upgrade's for device-plugin resources."""

from __future__ import annotations

from typing import Any

from builders import gpu_node, gpu_request_pod, pod_body

from gpu_operator.core.allocators import Allocator
from gpu_operator.core.gpu_pods import gpu_pod_counts, pod_allocators

DP, DRA = Allocator.DEVICE_PLUGIN, Allocator.DRA


def claim(name: str, *results: dict[str, Any], allocated: bool = True, namespace: str = "apps") -> Any:
    status = {"allocation": {"devices": {"results": list(results)}}} if allocated else {}
    return (namespace, name), {"metadata": {"name": name, "namespace": namespace}, "status": status}


def gpu(admin: bool = False, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    result: dict[str, Any] = {"driver": driver, "pool": "node-a", "device": "gpu-0", "request": "gpu"}
    if admin:
        result["adminAccess"] = True
    return result


def claiming(
    name: str = "p",
    node: str = "a",
    *,
    template: bool = False,
    phase: str = "Running",
    deleted: str | None = None,
) -> Any:
    """A pod of namespace apps with one claim: `c`, or one made from a template (named in its status)."""
    entry = (
        {"name": "gpu", "resourceClaimTemplateName": "t"}
        if template
        else {"name": "gpu", "resourceClaimName": "c"}
    )
    body = pod_body(name, node, namespace="apps", status={"phase": phase}, deleted=deleted)
    body["spec"]["resourceClaims"] = [entry]
    if template:
        body["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]
    return body


def test_device_plugin_resources() -> None:
    pod = gpu_request_pod({"limits": {"nvidia.com/gpu": 1}})
    assert pod_allocators(pod, {}) == {DP}
    mig = gpu_request_pod({"requests": {"nvidia.com/mig-1g.10gb": 1}})
    assert pod_allocators(mig, {}) == {DP}
    assert pod_allocators(pod_body("cpu", node="a"), {}) == frozenset()


def test_allocated_gpu_claims() -> None:
    assert pod_allocators(claiming(), dict([claim("c", gpu())])) == {DRA}
    # A claim made from a template is named in the pod's status.
    assert pod_allocators(claiming(template=True), dict([claim("p-gpu-x1", gpu())])) == {DRA}


def test_claims_that_hold_no_nvidia_gpu() -> None:
    assert pod_allocators(claiming(), dict([claim("c", allocated=False)])) == frozenset()
    assert pod_allocators(claiming(), dict([claim("c", gpu(driver="example.com/nic"))])) == frozenset()
    # Admin access (the DRA stack's own monitoring) shares the GPUs without holding them.
    assert pod_allocators(claiming(), dict([claim("c", gpu(admin=True))])) == frozenset()
    assert pod_allocators(claiming(), dict([claim("c", gpu(admin=True))]), include_admin=True) == {DRA}


def test_an_unreadable_claim_counts_and_a_claim_not_made_yet_does_not() -> None:
    assert pod_allocators(claiming(), {}) == {DRA}
    pending = claiming(template=True)
    pending["status"]["resourceClaimStatuses"] = []
    assert pod_allocators(pending, {}) == frozenset()


def test_finished_pods_hold_nothing_but_terminating_ones_do() -> None:
    claims = dict([claim("c", gpu())])
    assert pod_allocators(claiming(phase="Succeeded"), claims) == frozenset()
    terminating = claiming(phase="Succeeded", deleted="2026-12-06T08:00:00Z")
    assert pod_allocators(terminating, claims) == {DRA}


def test_counts_are_of_the_nodes_current_allocator() -> None:
    nodes = [
        gpu_node("a", {"nvidia.com/gpu.deploy.device-plugin": "true"}),
        gpu_node("b", {"nvidia.com/gpu.deploy.dra-driver": "true"}),
        gpu_node("c"),
    ]
    claims = dict([claim("c", gpu())])
    pods = [
        gpu_request_pod({"limits": {"nvidia.com/gpu": 1}}, nodeName="a"),
        claiming("on-a", "a"),  # a claim on a device-plugin node: not of its allocator
        claiming("on-b", "b"),
        gpu_request_pod({"limits": {"nvidia.com/gpu": 1}}, nodeName="c"),  # no allocator yet
    ]
    assert gpu_pod_counts(nodes, pods, claims) == {"a": 1, "b": 1}
