"""The GPUCluster's part of a pass (pure, no I/O): which node is whose (core/allocators.py), the DRA
stack's objects (core/gpucluster_render.py), its teardown in NVIDIA's order, and its status
(core/gpucluster_status.py).

`plan.build` calls `plan_gpuclusters` only when a GPUCluster exists: without one a pass costs nothing
more than before, and renders, labels and writes exactly what it did.

- **Whose GPU pods.** A node moves between allocators only once the GPU pods of the old one are gone
  (core/allocators.py). Its pods are known only for the nodes whose allocator may change (the CRs
  want another one than its labels say): those are watched one by one, as the driver upgrade watches the
  nodes it empties (`pods_needed`, runtime/drain_watches.py); a cluster at rest watches none.
- **The device plugin goes first.** A node that is to move to DRA loses the device plugin's label at
  once (`AllocatorSplit.withheld`), so that no new `nvidia.com/gpu` pod lands there while the old ones
  finish; the DRA labels follow once none is left.
- **Ownership.** The DRA stack is owned by its GPUCluster (NVIDIA's SetControllerReference), so the
  garbage collector removes it with the GPUCluster.
- **Teardown, NVIDIA's order** (gpucluster_controller.go reconcileDelete): the GPUCluster carries the
  finalizer `gpucluster.nvidia.com/dra-resourceclaim`. Once it is being deleted, the DaemonSets whose
  pods hold ResourceClaims (DCGM, the exporter, the validator) are deleted first, with foreground
  propagation (each stays until its pods are gone, i.e. their claims unprepared), while the kubelet plugin
  stays; the finalizer goes once none is left and no node still holds DRA GPU pods, and the garbage
  collector removes the rest. Its nodes go back to the device plugin as their GPU pods go.
- **The namespace.** The operand namespace gets `resource.kubernetes.io/admin-access=true`, never removed
  (NVIDIA's ensureAdminAccessLabel). The API server refuses a ResourceClaimTemplate with an adminAccess
  request, even in a dry run, from a namespace without it; NVIDIA labels the namespace before it syncs
  any state. Here the pass that writes the label has proven its change already, so the admin-access
  templates and the DaemonSets whose pods claim from them are withheld (`needs_admin_access`) until the
  namespace's watch shows the label, whose event wakes the pass that applies them; meanwhile those that
  exist are left as they are. The GPUCluster says its workloads wait (OperandNotReady), as for pods
  not ready yet: a normal first step, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_operator.api.gpucluster import API_VERSION, KIND, SINGLETON_NAME
from gpu_operator.api.nvidiadriver import REASON_CONFLICTING_NODE_SELECTOR
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.allocators import Allocator, AllocatorSplit, GPUClusterObject, split_allocators
from gpu_operator.core.caches import Caches
from gpu_operator.core.driver_pool_status import DriverEvent
from gpu_operator.core.gpu_pods import workload_pod_counts
from gpu_operator.core.gpucluster_render import NAMESPACE_LABELS, render_gpucluster
from gpu_operator.core.gpucluster_status import gpucluster_status, workloads
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import DaemonSetInfo, GPUClusterRef, ObjectInfo, ObjectKey, object_key
from gpu_operator.core.ownership import owned
from gpu_operator.core.render import ClusterFacts
from gpu_operator.core.upgrade.facts import WorkloadPod

FINALIZER = "gpucluster.nvidia.com/dra-resourceclaim"
"""NVIDIA's (gpuClusterFinalizer): holds the GPUCluster until the claim-holding DaemonSets are gone."""


@dataclass(frozen=True)
class DRAPlan:
    """The GPUCluster's part of a pass."""

    split: AllocatorSplit
    objects: list[dict[str, Any]] = field(default_factory=list)
    """The DRA stack's objects, owned by the GPUCluster and hash-annotated."""
    foreground: frozenset[ObjectKey] = frozenset()
    """The claim-holding DaemonSets a GPUCluster being deleted removes first (foreground propagation)."""
    withheld: frozenset[ObjectKey] = frozenset()
    """Objects left out of `objects` until the namespace carries NAMESPACE_LABELS (`needs_admin_access`):
    neither applied nor deleted."""
    finalizers: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """GPUCluster name → (the resourceVersion it was read at, the finalizers to write)."""
    status_writes: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """GPUCluster name → its status body, for those that differ from the cluster's."""
    events: Mapping[str, tuple[DriverEvent, ...]] = field(default_factory=dict)
    pods_needed: frozenset[str] = frozenset()
    """The nodes whose pods decide whether they may change allocator."""
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels to add to the operand namespace (empty: none)."""
    nodes: Mapping[str, int] = field(default_factory=dict)
    """Allocator → GPU nodes on it (the metrics)."""
    held: int = 0
    """GPU nodes waiting to change allocator (the metrics)."""
    state: str | None = None
    """The status.state of the GPUCluster in charge (None: none, or being deleted)."""


def gpucluster_object(ref: GPUClusterRef) -> GPUClusterObject:
    return GPUClusterObject(ref.name, ref.spec, ref.deleting)


def claim_holders(objects: Iterable[Mapping[str, Any]]) -> set[str]:
    """The DaemonSets among `objects` whose pods hold ResourceClaims (NVIDIA's teardown drains them)."""
    return {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "DaemonSet" and (o["spec"]["template"]["spec"].get("resourceClaims"))
    }


def _admin_requests(request: Mapping[str, Any]) -> bool:
    """A device request asks for admin access (resource.k8s.io/v1 `exactly`, or v1beta1's flat form)."""
    exactly = request.get("exactly") or {}
    return bool(exactly.get("adminAccess") or request.get("adminAccess"))


def _claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if obj["kind"] == "ResourceClaimTemplate":
        return dict((obj.get("spec") or {}).get("spec") or {})
    return dict(obj.get("spec") or {})


def needs_admin_access(objects: Iterable[Mapping[str, Any]]) -> set[ObjectKey]:
    """The objects among `objects` that wait for the namespace's admin-access label: the
    ResourceClaimTemplates and ResourceClaims with an adminAccess request (the API server refuses them
    without it), and the DaemonSets whose pods claim from them (each component comes whole, template
    first, as NVIDIA applies a state's objects in order: a DaemonSet without its template would start
    pods whose claims cannot be made)."""
    claims = {
        (o["kind"], o["metadata"]["name"]): object_key(o)
        for o in objects
        if o["kind"] in ("ResourceClaimTemplate", "ResourceClaim")
        and any(_admin_requests(r) for r in (_claim_spec(o).get("devices") or {}).get("requests") or [])
    }
    found = set(claims.values())
    for obj in objects:
        if obj["kind"] != "DaemonSet":
            continue
        for claim in obj["spec"]["template"]["spec"].get("resourceClaims") or []:
            template = claim.get("resourceClaimTemplateName")
            source = (
                ("ResourceClaimTemplate", template)
                if template
                else ("ResourceClaim", claim.get("resourceClaimName"))
            )
            if source in claims:
                found.add(object_key(obj))
    return found


def _rendered(caches: Caches, ref: GPUClusterRef, facts: ClusterFacts) -> list[dict[str, Any]]:
    assert ref.spec is not None
    spec = ref.spec
    key = json.dumps(
        [ref.name, ref.uid, spec.model_dump(mode="json"), asdict(facts)], sort_keys=True, default=str
    )
    return caches.rendered.get(
        "gpucluster",
        (key,),
        lambda: [owned(obj, API_VERSION, KIND, ref.name, ref.uid) for obj in render_gpucluster(spec, facts)],
    )


def _ready(
    spec_workloads: Sequence[str],
    daemonsets: Mapping[str, DaemonSetInfo],
    objects: Mapping[ObjectKey, ObjectInfo],
    namespace: str,
) -> dict[str, bool]:
    ready = {}
    for name in spec_workloads:
        daemonset = daemonsets.get(name)
        if daemonset is not None:
            ready[name] = daemonset.rolled_out
        elif ("apps/v1", "Deployment", namespace, name) in objects:
            ready[name] = True  # the ComputeDomain controller: created (its rollout is not watched)
    return ready


def _status_writes(
    refs: Sequence[GPUClusterRef],
    split: AllocatorSplit,
    ready: Mapping[str, bool],
    namespace: str,
    now: str,
    policy: bool = True,
    admin_access: bool = True,
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[DriverEvent, ...]]]:
    writes: dict[str, dict[str, Any]] = {}
    events: dict[str, tuple[DriverEvent, ...]] = {}
    for ref in refs:
        status = gpucluster_status(
            gpucluster_object(ref),
            split,
            ready,
            namespace=namespace,
            now=now,
            errors=[str(e) for e in ref.errors],
            previous=ref.status,
            generation=ref.generation or None,
            policy=policy,
            admin_access=admin_access,
        )
        if status is None:
            continue
        body = status.model_dump(mode="json", exclude_none=True)
        if body == {k: v for k, v in ref.status.items() if v is not None}:
            continue
        writes[ref.name] = body
        reason = _error_reason(body)
        if reason == REASON_CONFLICTING_NODE_SELECTOR and _error_reason(ref.status) != reason:
            message = next(c["message"] for c in body["conditions"] if c["type"] == "Error")
            events[ref.name] = (DriverEvent(ref.name, ref.uid, "Warning", reason, message),)
    return writes, events


def _error_reason(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "Error"
            and condition.get("status") == "True"
        ):
            return str(condition.get("reason") or "")
    return ""


def plan_gpuclusters(
    refs: Sequence[GPUClusterRef],
    nodes: Collection[NodeInfo],
    policy: ClusterPolicySpec | None,
    facts: ClusterFacts,
    daemonsets: Mapping[str, DaemonSetInfo],
    objects: Mapping[ObjectKey, ObjectInfo],
    pods: Iterable[WorkloadPod],
    pods_known: frozenset[str] | None,
    admin_access: bool,
    now: str,
    caches: Caches,
) -> DRAPlan:
    """The GPUClusters' part of a pass (see the module's docstring). `pods`, `pods_known`: the pods of
    the nodes watched one by one, and those nodes (None: every node's pods are in `pods`);
    `admin_access`: the operand namespace carries NAMESPACE_LABELS."""
    gcs = [gpucluster_object(ref) for ref in refs]
    # Which nodes the CRs would move: only their pods are needed.
    first = split_allocators(nodes, policy, gcs)
    needed = frozenset(name for name, a in first.nodes.items() if a.wanted is not a.current)
    if needed:
        counts = workload_pod_counts(p for p in pods if p.node in needed)
        unlisted = frozenset() if pods_known is None else needed - pods_known
        split = split_allocators(nodes, policy, gcs, dict(counts), unlisted)
    else:
        split = first
    chosen = next((ref for ref in refs if ref.name == SINGLETON_NAME), None)
    rendered: list[dict[str, Any]] = []
    foreground: frozenset[ObjectKey] = frozenset()
    withheld: frozenset[ObjectKey] = frozenset()
    finalizers: dict[str, tuple[str, tuple[str, ...]]] = {}
    namespace_labels: dict[str, str] = {}
    if chosen is not None and chosen.spec is not None:
        rendered = _rendered(caches, chosen, facts)
        if chosen.deleting:
            holders = claim_holders(rendered)
            rendered = [
                o for o in rendered if o["metadata"]["name"] not in holders or o["kind"] != "DaemonSet"
            ]
            draining = {
                key
                for key, info in objects.items()
                if key[1] == "DaemonSet" and key[3] in holders and info.owner_uid == chosen.uid
            }
            foreground = frozenset(draining)
            if not draining and not split.on(Allocator.DRA) and FINALIZER in chosen.finalizers:
                finalizers[chosen.name] = (
                    chosen.resource_version,
                    tuple(f for f in chosen.finalizers if f != FINALIZER),
                )
        else:
            if FINALIZER not in chosen.finalizers:
                finalizers[chosen.name] = (chosen.resource_version, (*chosen.finalizers, FINALIZER))
            if not admin_access:
                namespace_labels = dict(NAMESPACE_LABELS)
                withheld = frozenset(needs_admin_access(rendered))
                rendered = [o for o in rendered if object_key(o) not in withheld]
    elif (
        chosen is not None
        and chosen.deleting
        and FINALIZER in chosen.finalizers
        and not split.on(Allocator.DRA)
    ):
        # A spec that does not parse renders nothing: nothing of it is left to drain.
        finalizers[chosen.name] = (
            chosen.resource_version,
            tuple(f for f in chosen.finalizers if f != FINALIZER),
        )
    spec_workloads = workloads(chosen.spec) if chosen is not None and chosen.spec is not None else []
    ready = _ready(spec_workloads, daemonsets, objects, facts.namespace)
    writes, events = _status_writes(refs, split, ready, facts.namespace, now, admin_access=admin_access)
    counted = {a.value: len(split.on(a)) for a in Allocator}
    held = sum(1 for a in split.nodes.values() if a.held and a.wanted is not None)
    state = None
    if chosen is not None and not chosen.deleting:
        shown = writes.get(chosen.name) or chosen.status
        state = str(shown.get("state")) if shown.get("state") else None
    return DRAPlan(
        split,
        rendered,
        foreground,
        withheld,
        finalizers,
        writes,
        events,
        needed,
        namespace_labels,
        counted,
        held,
        state,
    )


def without_policy(refs: Sequence[GPUClusterRef], namespace: str, now: str) -> DRAPlan:
    """No ClusterPolicy is active: the DRA stack is not run (its objects go with the ClusterPolicy's,
    the nodes' labels too), and the GPUClusters say why (PrerequisiteNotMet); a finalizer is let go."""
    split = split_allocators((), None, [gpucluster_object(ref) for ref in refs])
    writes, events = _status_writes(refs, split, {}, namespace, now, policy=False)
    finalizers = {
        ref.name: (ref.resource_version, tuple(f for f in ref.finalizers if f != FINALIZER))
        for ref in refs
        if ref.deleting and FINALIZER in ref.finalizers
    }
    return DRAPlan(split, finalizers=finalizers, status_writes=writes, events=events)


def wanted_keys(plan: DRAPlan) -> set[ObjectKey]:
    return {object_key(o) for o in plan.objects}


__all__ = [
    "FINALIZER",
    "DRAPlan",
    "claim_holders",
    "needs_admin_access",
    "plan_gpuclusters",
    "wanted_keys",
    "without_policy",
]
