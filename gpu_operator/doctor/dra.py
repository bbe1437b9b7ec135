"""Why a pod's ResourceClaims for NVIDIA GPUs are not allocated: kube-scheduler's DRA reasons, node by node
(pure, from the recorded state).

kube-scheduler's DynamicResources plugin (k8s.io/kubernetes v1.36
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go) says little: a claim that does not
exist yet (`waiting for resource claim to be created`), a DeviceClass that does not exist (`device class
NAME does not exist`), an allocated claim on another node (`resourceclaim not available on the node`)
and, for everything else on a node, `cannot allocate all claims`. doctor runs the node filters it models
(scheduling.py) and then, on the nodes that pass them, looks at what the allocator had: the node's
ResourceSlices of `gpu.nvidia.com`, the devices the DeviceClass selects there (its `type` attribute:
gpu.nvidia.com → gpu, mig.nvidia.com → mig) and those other claims already hold. A node without a
slice is followed down to who should publish it: NVIDIA's DRA kubelet plugin
(`nvidia-dra-driver-kubelet-plugin`, the GPUCluster's), which runs only on the nodes with
`nvidia.com/gpu.deploy.dra-driver=true` (its pod, its reason), which the operator sets only on the nodes
its GPUCluster selects (core/allocators.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.doctor import checklist
from gpu_operator.doctor.cluster import Cluster, listing, ref_of
from gpu_operator.doctor.scheduling import verdict
from gpu_operator.doctor.state import Finding

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"
DRA_LABEL = "nvidia.com/gpu.deploy.dra-driver"
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
CLASS_TYPES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "vfio.gpu.nvidia.com": "vfio"}
REASON_CANNOT_ALLOCATE = "cannot allocate all claims"
REASON_NOT_AVAILABLE = "resourceclaim not available on the node"


def _claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(the pod's name for it, the ResourceClaim's name or "" while it is not created yet)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    return [
        (str(c.get("name")), str(c.get("resourceClaimName") or made.get(c.get("name")) or ""))
        for c in spec.get("resourceClaims") or []
    ]


def _requests(claim: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(DeviceClass, count) of each request of the claim (`exactly` or the v1beta1 form)."""
    found = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly") or request
        if exactly.get("deviceClassName"):
            count = 1 if exactly.get("allocationMode", "ExactCount") == "ExactCount" else 0
            found.append((str(exactly["deviceClassName"]), int(exactly.get("count") or count)))
    return found


def _allocated(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(pool, device) of every gpu.nvidia.com device allocated to a claim, admin access aside."""
    held = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == DRIVER and not result.get("adminAccess"):
                held.add((str(result.get("pool")), str(result.get("device"))))
    return held


def _devices(slices: Iterable[Mapping[str, Any]], node: str, kind: str) -> list[tuple[str, str]]:
    found = []
    for piece in slices:
        spec = piece.get("spec") or {}
        if spec.get("driver") != DRIVER or spec.get("nodeName") != node:
            continue
        pool = str((spec.get("pool") or {}).get("name") or node)
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            if (attributes.get("type") or {}).get("string") == kind:
                found.append((pool, str(device.get("name"))))
    return found


def _no_slice(cluster: Cluster, node: str) -> str:
    """Why no DRA kubelet plugin publishes the node's GPUs, down to the operand."""
    labels = (cluster.nodes[node].get("metadata") or {}).get("labels") or {}
    if labels.get(DRA_LABEL) != "true":
        if not cluster.state.gpuclusters:
            return "no GPUCluster: nothing runs NVIDIA's DRA kubelet plugin (apply a GPUCluster)"
        return (
            f"the node is not on DRA ({DRA_LABEL} is not true): its GPUCluster's spec.nodeSelector does not "
            "select it, or it waits for its device-plugin GPU pods to go (kubectl get gpuclusters)"
        )
    pods = [
        p
        for p in cluster.state.pods
        if (p.get("spec") or {}).get("nodeName") == node
        and ((p.get("metadata") or {}).get("labels") or {}).get("app") == PLUGIN
    ]
    if not pods:
        return f"no {PLUGIN} pod on the node, which should publish its ResourceSlice"
    pod = pods[0]
    status = pod.get("status") or {}
    waiting = [
        (s.get("state") or {}).get("waiting", {}).get("reason")
        for s in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        if (s.get("state") or {}).get("waiting")
    ]
    said = f" ({', '.join(str(w) for w in waiting if w)})" if any(waiting) else ""
    return f"its {PLUGIN} pod {ref_of(pod)} has not published it yet: {status.get('phase', 'Pending')}{said}"


def _node_reason(cluster: Cluster, node: str, wanted: Mapping[str, int], held: set[tuple[str, str]]) -> str:
    slices = cluster.state.resource_slices or []
    if not any(
        (s.get("spec") or {}).get("driver") == DRIVER and (s.get("spec") or {}).get("nodeName") == node
        for s in slices
    ):
        return (
            f"{REASON_CANNOT_ALLOCATE}: no ResourceSlice of {DRIVER} for the node; {_no_slice(cluster, node)}"
        )
    short = []
    for device_class, count in sorted(wanted.items()):
        kind = CLASS_TYPES.get(device_class, "")
        devices = _devices(slices, node, kind)
        free = [d for d in devices if d not in held]
        if len(free) < count:
            short.append(
                f"{device_class} needs {count}, the node has {len(devices)} {kind} device"
                f"{'' if len(devices) == 1 else 's'}, {len(devices) - len(free)} allocated to other claims"
            )
    if short:
        return f"{REASON_CANNOT_ALLOCATE}: " + "; ".join(short)
    return ""


def _unallocated(cluster: Cluster, pod: Obj) -> Finding | None:
    ref = ref_of(pod)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    claims = {
        (str((c.get("metadata") or {}).get("namespace")), str((c.get("metadata") or {}).get("name"))): c
        for c in cluster.state.resource_claims or []
    }
    wanted: dict[str, int] = {}
    missing: list[str] = []
    for name, claim_name in _claim_names(pod):
        claim = claims.get((namespace, claim_name)) if claim_name else None
        if claim is None:
            missing.append(name)
            continue
        if (claim.get("status") or {}).get("allocation"):
            continue
        for device_class, count in _requests(claim):
            if device_class in CLASS_TYPES:
                wanted[device_class] = wanted.get(device_class, 0) + count
    commands = [checklist.describe_pod(*ref.split("/", 1))]
    if missing and not wanted:
        return Finding(
            "warning",
            "ResourceClaimMissing",
            f"pod {ref}",
            f"Pending: waiting for resource claim to be created ({', '.join(missing)}): its "
            "ResourceClaimTemplate may be missing (kube-controller-manager's resourceclaim controller "
            "makes it from the template)",
            pod=ref,
            commands=tuple(commands),
        )
    if not wanted:
        return None
    known = {str((c.get("metadata") or {}).get("name")) for c in cluster.state.device_classes or []}
    absent = sorted(c for c in wanted if c not in known)
    if cluster.state.device_classes is not None and absent:
        return Finding(
            "error",
            "DeviceClassMissing",
            f"pod {ref}",
            f"Pending: device class {', '.join(absent)} does not exist: the GPUCluster's DRA stack creates "
            "the NVIDIA DeviceClasses (kubectl get gpuclusters)",
            pod=ref,
            commands=(*commands, checklist.kubectl("get", "deviceclasses")),
        )
    held = _allocated(cluster.state.resource_claims or [])
    groups: dict[str, list[str]] = {}
    fits: list[str] = []
    for node in cluster.gpu_nodes:
        found = verdict(pod, cluster.nodes[node], cluster.state.requested.get(node, {}))
        reason = (
            f"{found.reason}: {found.detail}"
            if found is not None
            else _node_reason(cluster, node, wanted, held)
        )
        if reason:
            groups.setdefault(reason, []).append(node)
        else:
            fits.append(node)
    parts = [f"its claims fit on {listing(fits)} now; the scheduler will retry"] if fits else []
    parts += [f"on {listing(nodes)}: {reason}" for reason, nodes in sorted(groups.items())]
    return Finding(
        "warning" if fits else "error",
        "ResourceClaimUnallocatable",
        f"pod {ref}",
        "Pending: " + ("; ".join(parts) if parts else "no GPU node"),
        pod=ref,
        details=tuple(
            f"claim {name}: {claim_name or 'not created'}" for name, claim_name in _claim_names(pod)
        ),
        commands=(
            *commands,
            checklist.kubectl("get", "resourceslices", "-o", "wide"),
            checklist.kubectl("get", "resourceclaims", "-n", namespace),
        ),
    )


def dra_findings(cluster: Cluster) -> list[Finding]:
    """A finding per Pending, unscheduled pod whose NVIDIA GPU claims are not allocated."""
    if cluster.state.resource_claims is None:
        return []
    findings = []
    for pod in cluster.workloads:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if (
            spec.get("nodeName")
            or not spec.get("resourceClaims")
            or status.get("phase") not in (None, "Pending")
        ):
            continue
        found = _unallocated(cluster, pod)
        if found is not None:
            findings.append(found)
    return findings
