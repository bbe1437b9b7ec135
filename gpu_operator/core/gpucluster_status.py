"""The GPUCluster's status, with NVIDIA's meaning (pure, no I/O).

NVIDIA's GPUCluster controller (controllers/gpucluster_controller.go at v26.7.0) writes `status.state`,
`status.namespace` and a Ready/Error pair of conditions (internal/conditions/gpucluster.go, reasons in
internal/conditions/consts.go):

- a prerequisite not met: `notReady`, Error=True reason `PrerequisiteNotMet`. NVIDIA's only one is "no
  ClusterPolicy", which this operator drops (both allocators run side by side, core/allocators.py);
- a state that fails to render or sync: `notReady`, `ReconcileFailed` ("Error syncing state ...");
  here the resource.k8s.io API not served (NVIDIA's message), and a spec that does not parse or a name
  other than gpu-cluster, which NVIDIA's CRD refuses before its controller sees them;
- operand pods not ready yet: `notReady`, `OperandNotReady` ("Waiting for operand pods to be ready");
  here the message names the workloads, the nodes waiting for their GPU pods to go before they move
  to DRA, and, on the first pass, the workloads whose admin-access claims wait for the operand
  namespace's label (core/gpucluster_plan.py);
- otherwise `ready`, Ready=True reason `Reconciled` ("All resources have been successfully
  reconciled"), or `NoGPUNodes` when it selects no GPU node.

Added to NVIDIA's: GPU nodes it selects that the ClusterPolicy keeps are a conflict, `notReady` with
NVIDIA's NVIDIADriver reason `ConflictingNodeSelector`. A GPUCluster being deleted gets no status.

    status = gpucluster_status(gc, split, ready, namespace=..., now=..., previous=..., generation=...)

`gc`: the GPUCluster (core/allocators.GPUClusterObject); `split`: split_allocators' answer; `ready`:
workload name → rolled out (`workloads(spec)` names them; absent: not created yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_operator.api.gpucluster import SINGLETON_MESSAGE, SINGLETON_NAME, GPUClusterSpec, GPUClusterStatus
from gpu_operator.api.status import (
    REASON_NO_GPU_NODES,
    REASON_OPERAND_NOT_READY,
    REASON_PREREQUISITE_NOT_MET,
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
)
from gpu_operator.core.allocators import NODES_NAMED, Allocator, AllocatorSplit, GPUClusterObject
from gpu_operator.core.gpucluster_render import NAMESPACE_LABELS
from gpu_operator.core.status import conditions_from

ALL_RECONCILED = "All resources have been successfully reconciled"
WAITING = "Waiting for operand pods to be ready"
NO_GPU_NODES = "GPUCluster is ready, but it selects no GPU node"
NO_CLUSTER_POLICY = (
    "no active ClusterPolicy: this operator runs the DRA stack beside a ClusterPolicy, which installs the "
    "driver and labels the GPU nodes (its driver section may be disabled for a driver on the host)"
)
DRA_NOT_SERVED = (
    "Error syncing state state-dra-driver: the resource.k8s.io DeviceClass API is not served by the "
    "cluster; ensure Dynamic Resource Allocation is enabled on the API server and kubelet"
)

Pair = tuple[str, str, str, str]


def workloads(spec: GPUClusterSpec) -> list[str]:
    """The DaemonSets (and the ComputeDomain controller's Deployment) a spec runs, in NVIDIA's state
    order: what must be rolled out for the GPUCluster to be ready."""
    names = ["nvidia-dra-driver-kubelet-plugin"]
    if spec.draDriver.compute_domains_enabled():
        names.append("nvidia-dra-driver-controller")
    if spec.dcgm_enabled():
        names.append("nvidia-dcgm-dra")
    if spec.exporter_enabled():
        names.append("nvidia-dcgm-exporter-dra")
    return [*names, "nvidia-dra-validator"]


def _ready(reason: str, message: str) -> tuple[Pair, ...]:
    return (("Ready", "True", reason, message), ("Error", "False", "Ready", ""))


def _error(reason: str, message: str) -> tuple[Pair, ...]:
    return (("Ready", "False", "Error", ""), ("Error", "True", reason, message))


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NODES_NAMED])
    more = len(names) - NODES_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def _decide(
    gc: GPUClusterObject,
    split: AllocatorSplit,
    ready: Mapping[str, bool],
    dra_served: bool,
    errors: Sequence[str],
    policy: bool = True,
    admin_access: bool = True,
    namespace: str = "",
) -> tuple[str, tuple[Pair, ...]]:
    if gc.name != SINGLETON_NAME:
        return "notReady", _error(REASON_RECONCILE_FAILED, f"ignored: {SINGLETON_MESSAGE}")
    if not policy:
        return "notReady", _error(REASON_PREREQUISITE_NOT_MET, NO_CLUSTER_POLICY)
    if gc.spec is None:
        said = "; ".join(errors) or "the spec does not parse"
        return "notReady", _error(
            REASON_RECONCILE_FAILED, f"invalid spec, its nodes are left as they are: {said}"
        )
    if not dra_served:
        return "notReady", _error(REASON_RECONCILE_FAILED, DRA_NOT_SERVED)
    if split.conflicts:
        conflict = split.conflicts[0]
        return "notReady", _error(conflict.reason, conflict.message())
    waiting = [name for name in workloads(gc.spec) if not ready.get(name, False)]
    held = sorted(n for n, a in split.nodes.items() if a.held and Allocator.DRA in (a.wanted, a.allocator))
    if waiting or held:
        parts = [f"{WAITING}: {_names(waiting)}"] if waiting else []
        if waiting and not admin_access:
            label = ", ".join(f"{key}={value}" for key, value in NAMESPACE_LABELS.items())
            parts.append(f"the admin-access claims wait for namespace {namespace} to be labelled {label}")
        if held:
            nodes, wait = (
                ("1 node", "waits for its") if len(held) == 1 else (f"{len(held)} nodes", "wait for their")
            )
            parts.append(f"{nodes} {wait} GPU pods to go before changing allocator: {_names(held)}")
        return "notReady", _error(REASON_OPERAND_NOT_READY, "; ".join(parts))
    if not split.on(Allocator.DRA):
        return "ready", _ready(REASON_NO_GPU_NODES, NO_GPU_NODES)
    return "ready", _ready(REASON_RECONCILED, ALL_RECONCILED)


def gpucluster_status(
    gc: GPUClusterObject,
    split: AllocatorSplit,
    ready: Mapping[str, bool],
    *,
    namespace: str,
    now: str,
    dra_served: bool = True,
    errors: Sequence[str] = (),
    previous: Mapping[str, Any] | None = None,
    generation: int | None = None,
    policy: bool = True,
    admin_access: bool = True,
) -> GPUClusterStatus | None:
    """The status to write on `gc` (None: none, it is being deleted). `errors`: why its spec does not
    parse; `previous`: the status it has now; `dra_served`: the cluster serves resource.k8s.io
    DeviceClasses; `policy`: a ClusterPolicy is active (PrerequisiteNotMet without one);
    `admin_access`: the operand namespace carries the label the admin-access claims need."""
    if gc.deleting:
        return None
    state, pairs = _decide(gc, split, ready, dra_served, errors, policy, admin_access, namespace)
    return GPUClusterStatus(
        state=state,  # type: ignore[arg-type]
        namespace=namespace,
        conditions=conditions_from(pairs, previous or {}, generation, now),
    )
