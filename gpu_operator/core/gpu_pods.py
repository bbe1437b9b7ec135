"""Which pods use a node's GPUs, and through which allocator (pure, no I/O): what core/allocators.py
needs to know before a node may change allocator.

- Through the device plugin: a container requests or limits `nvidia.com/gpu` or a MIG resource
  (`nvidia.com/mig-*`), the rule of the driver upgrade (core/upgrade/facts.py).
- Through DRA: one of the pod's ResourceClaims is allocated devices of the `gpu.nvidia.com` driver
  (NVIDIA's PodHasNVIDIAGPUClaim, controllers/nodelabeling_controller.go). The claim's name is the pod's
  `resourceClaimName`, or for a claim made from a template the one its status names. A claim that
  cannot be read counts as a GPU claim (overcounting only delays a move; undercounting would take the
  kubelet plugin away from pods whose claims it must still unprepare); one not allocated yet does not.
  Admin-access results (the DRA stack's own DCGM, exporter and validator) count only with
  `include_admin`: they share the GPUs without holding them, and leave with the stack.

A pod that finished (Succeeded, Failed) and is not being deleted holds nothing any more; a terminating
one still does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.core.allocators import Allocator, current_allocator
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.ownership import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.core.upgrade.facts import GPU_RESOURCE_PREFIXES, WorkloadPod

DRA_DRIVER_NAME = "gpu.nvidia.com"
"""The DRA driver that allocates NVIDIA GPUs (NVIDIAGPUDRADriverName)."""

Claims = Mapping[tuple[str, str], Mapping[str, Any]]
"""(namespace, name) → ResourceClaim body; a claim absent from it could not be read."""


def _device_plugin(spec: Mapping[str, Any]) -> bool:
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            if any(str(key).startswith(GPU_RESOURCE_PREFIXES) for key in resources.get(section) or {}):
                return True
    return False


def _claim_names(pod: Mapping[str, Any]) -> list[str]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    names = []
    for claim in spec.get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or generated.get(claim.get("name"))
        if name:  # none yet: nothing is allocated for it
            names.append(str(name))
    return names


def _nvidia_gpu_claim(claim: Mapping[str, Any] | None, include_admin: bool) -> bool:
    if claim is None:
        return True
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return False
    results = (allocation.get("devices") or {}).get("results") or []
    return any(
        result.get("driver") == DRA_DRIVER_NAME and (include_admin or not result.get("adminAccess"))
        for result in results
    )


def pod_allocators(
    pod: Mapping[str, Any], claims: Claims, include_admin: bool = False
) -> frozenset[Allocator]:
    """The allocators through which `pod` holds GPUs now (empty: none, or it has finished)."""
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed") and not metadata.get("deletionTimestamp"):
        return frozenset()
    found = set()
    if _device_plugin(pod.get("spec") or {}):
        found.add(Allocator.DEVICE_PLUGIN)
    namespace = str(metadata.get("namespace") or "")
    if any(_nvidia_gpu_claim(claims.get((namespace, name)), include_admin) for name in _claim_names(pod)):
        found.add(Allocator.DRA)
    return frozenset(found)


def gpu_pod_counts(
    nodes: Iterable[NodeInfo], pods: Iterable[Mapping[str, Any]], claims: Claims
) -> dict[str, int]:
    """Per GPU node, the pods holding its GPUs through the allocator it has now (`split_allocators`'s
    `gpu_pods`); nodes without any are left out."""
    current = {node.name: current_allocator(node.labels) for node in nodes if node.is_gpu}
    counts: dict[str, int] = {}
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        allocator = current.get(node)
        if allocator is not None and allocator in pod_allocators(pod, claims):
            counts[node] = counts.get(node, 0) + 1
    return counts


def workload_pod_counts(pods: Iterable[WorkloadPod]) -> dict[str, dict[Allocator, int]]:
    """Per node, the pods holding its GPUs per allocator, from the pods the per-node watches keep
    (core/upgrade/facts.WorkloadPod: the pods of the nodes that may move). Their claims are not read: a
    pod with any ResourceClaim counts on the DRA side (overcounting only delays a move off DRA). The
    operator's own operand pods (the DRA stack's admin-access claims among them) leave with their stack
    and never hold a node."""
    counts: dict[str, dict[Allocator, int]] = {}
    for pod in pods:
        if (not pod.active and not pod.terminating) or pod.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER:
            continue
        found = counts.setdefault(pod.node, {})
        if pod.gpu:
            found[Allocator.DEVICE_PLUGIN] = found.get(Allocator.DEVICE_PLUGIN, 0) + 1
        if pod.claims:
            found[Allocator.DRA] = found.get(Allocator.DRA, 0) + 1
    return {node: found for node, found in counts.items() if found}
