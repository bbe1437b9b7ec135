"""Slim records of the cluster objects the operator watches, extracted from full bodies.

Watches deliver whole objects; only these few fields are kept in memory, so a 1000-node cluster
with nine operands (9000 pods) stays small, and decisions never depend on fields we did not look at.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple

from gpu_operator.api import FieldError
from gpu_operator.api.gpucluster import GPUClusterSpec
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec
from gpu_operator.core.components import BY_LABEL
from gpu_operator.core.ownership import COMPONENT_LABEL, FIELD_MANAGER, HASH_ANNOTATION

# Container states that mean "still coming up", as opposed to failing.
STARTING_REASONS = frozenset(
    {"", "ContainerCreating", "PodInitializing", "Pending", "Running", "Terminating"}
)


def component_of(metadata: Mapping[str, Any]) -> str:
    """The component an object belongs to, from its `app.kubernetes.io/component` label."""
    value = str((metadata.get("labels") or {}).get(COMPONENT_LABEL) or "")
    known = BY_LABEL.get(value)
    return known.name if known is not None else value


@dataclass(frozen=True)
class PolicyRef:
    """One ClusterPolicy as the watch last saw it."""

    name: str
    uid: str
    generation: int
    created: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass(frozen=True)
class DriverRef:
    """One NVIDIADriver as the watch last saw it, its spec parsed (runtime/store.py driver_ref)."""

    name: str
    uid: str
    generation: int
    spec: NVIDIADriverSpec | None
    """None when the spec does not parse (`errors` says why): its nodes are held (core/driver_pools.py)."""
    errors: tuple[FieldError, ...] = ()
    deleting: bool = False
    """metadata.deletionTimestamp is set."""
    status: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The status as last written, only to tell whether the plan's differs: our own status writes come
    back as watch events, which must wake no pass (outside comparison for that)."""


@dataclass(frozen=True)
class GPUClusterRef:
    """One GPUCluster as the watch last saw it, its spec parsed (runtime/store.py gpucluster_ref)."""

    name: str
    uid: str
    generation: int
    spec: GPUClusterSpec | None
    """None when the spec does not parse (`errors` says why): its nodes are held (core/allocators.py)."""
    errors: tuple[FieldError, ...] = ()
    deleting: bool = False
    """metadata.deletionTimestamp is set."""
    finalizers: tuple[str, ...] = ()
    resource_version: str = field(default="", compare=False)
    """The finalizer writes carry it (a list is replaced whole: a stale write must not drop another's)."""
    status: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The status as last written (outside comparison: our own status writes wake no pass)."""


@dataclass(frozen=True)
class PodInfo:
    name: str
    component: str
    node: str
    ready: bool
    reason: str
    """Why it is not ready: a container waiting reason, Unschedulable, Terminating, ... ('' if ready)."""
    message: str
    terminating: bool
    created: str
    initialized: bool = False
    """Its init containers are done (the `Initialized` condition): for the driver, k8s-driver-manager
    has finished with the node's operand labels."""

    @property
    def failing(self) -> bool:
        return not self.ready and self.reason not in STARTING_REASONS


POD_SHOWN = frozenset({"reason", "message"})
"""The fields of an operand pod the planner reads only for what the status says (a node's problem, how
many nodes fail): a change of these alone asks for a pass soon, not at once (runtime/store.py
record_pod). The planner decides on every other field (status.pods_by_node, readiness, started), so a
field added to PodInfo for a decision wakes a pass at once without touching the Store;
tests/unit/test_wake_rules.py checks that these two change no decision."""

_POD_DECIDES = attrgetter(*(f.name for f in fields(PodInfo) if f.name not in POD_SHOWN))


def pod_decides(pod: PodInfo | None) -> tuple[object, ...] | None:
    """What of a pod the plan decides on: every field but POD_SHOWN (None: no pod)."""
    return None if pod is None else _POD_DECIDES(pod)


def waiting_reason(statuses: list[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first container waiting or terminated (not Completed), if any."""
    for status in statuses:
        state = status.get("state") or {}
        for key in ("waiting", "terminated"):
            if state.get(key):
                reason = state[key].get("reason") or key.capitalize()
                if key == "terminated" and reason == "Completed":
                    continue
                return reason, (state[key].get("message") or "")[:200]
    return None


def pod_info(body: Mapping[str, Any]) -> PodInfo | None:
    """Readiness and the most telling reason of one operand pod; None for pods not bound to a component."""
    metadata = body.get("metadata") or {}
    component = component_of(metadata)
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    node = spec.get("nodeName") or _affinity_node(spec)
    if not component or not node:
        return None
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    terminating = bool(metadata.get("deletionTimestamp"))
    reason, message = "", ""
    if terminating:
        reason = "Terminating"
    elif not ready:
        scheduled = conditions.get("PodScheduled") or {}
        found = waiting_reason(status.get("initContainerStatuses") or []) or waiting_reason(
            status.get("containerStatuses") or []
        )
        if scheduled.get("status") == "False":
            reason, message = scheduled.get("reason") or "Unschedulable", scheduled.get("message") or ""
        elif found:
            reason, message = found
        else:
            reason = status.get("phase") or "Pending"
            if reason == "Running":
                reason = "NotReady"
    # The node, component, reason and creation second repeat across thousands of pods: one copy each.
    return PodInfo(
        name=metadata.get("name", ""),
        component=sys.intern(component),
        node=sys.intern(node),
        ready=ready and not terminating,
        reason=sys.intern(reason),
        message=message,
        terminating=terminating,
        created=sys.intern(metadata.get("creationTimestamp") or ""),
        initialized=(conditions.get("Initialized") or {}).get("status") == "True",
    )


def _affinity_node(spec: Mapping[str, Any]) -> str | None:
    """DaemonSet pods are pinned by node affinity before they are bound; use it for unscheduled pods."""
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for term in terms:
            for field in term.get("matchFields") or []:
                if field.get("key") == "metadata.name" and field.get("values"):
                    return str(field["values"][0])
    except (KeyError, TypeError):
        return None
    return None


@dataclass(frozen=True)
class DaemonSetInfo:
    name: str
    component: str
    generation: int
    observed_generation: int
    desired: int
    ready: int
    updated: int
    available: int
    unavailable: int
    on_delete: bool

    @property
    def rolled_out(self) -> bool:
        """NVIDIA's isDaemonSetReady, except that OnDelete pods on an older revision still count."""
        if self.observed_generation < self.generation or self.unavailable:
            return False
        if self.on_delete:
            return self.ready == self.desired
        return self.updated == self.desired and self.available == self.desired


class Rollout(NamedTuple):
    """All the planner reads of a DaemonSet (status._component_status): whether it rolled out, and then
    on how many nodes. The Store wakes a pass only when this changes (runtime/store.py record_managed):
    a rollout brings hundreds of DaemonSet status updates that change nothing else."""

    done: bool
    desired: int
    """Nodes it runs on once rolled out (0 before: not read then)."""


def rollout(ds: DaemonSetInfo | None) -> Rollout | None:
    """What the planner reads of `ds` (None: not there)."""
    if ds is None:
        return None
    done = ds.rolled_out
    return Rollout(done, ds.desired if done else 0)


def daemonset_info(body: Mapping[str, Any]) -> DaemonSetInfo:
    metadata = body.get("metadata") or {}
    status = body.get("status") or {}
    strategy = ((body.get("spec") or {}).get("updateStrategy") or {}).get("type")
    return DaemonSetInfo(
        name=metadata.get("name", ""),
        component=component_of(metadata),
        generation=int(metadata.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        desired=int(status.get("desiredNumberScheduled") or 0),
        ready=int(status.get("numberReady") or 0),
        updated=int(status.get("updatedNumberScheduled") or 0),
        available=int(status.get("numberAvailable") or 0),
        unavailable=int(status.get("numberUnavailable") or 0),
        on_delete=strategy == "OnDelete",
    )


ObjectKey = tuple[str, str, str, str]
"""(apiVersion, kind, namespace or '', name)."""


def object_key(body: Mapping[str, Any]) -> ObjectKey:
    metadata = body.get("metadata") or {}
    return (body["apiVersion"], body["kind"], metadata.get("namespace") or "", metadata["name"])


@dataclass(frozen=True)
class ObjectInfo:
    """What drift detection and the ownership rule need of an object with one of our names or labels."""

    key: ObjectKey
    component: str
    applied_hash: str
    generation: int
    resource_version: str
    owner_uid: str
    """The uid of its controller, when that is a ClusterPolicy or an NVIDIADriver ('' otherwise)."""
    managers: tuple[str, ...] = ()
    """The field managers that wrote it (metadata.managedFields), sorted."""
    adopt: bool = False
    """Its owner handed it over to the operator (ADOPT_ANNOTATION)."""
    deleting: bool = False
    """metadata.deletionTimestamp is set: it is going (its finalizers, such as the garbage collector's
    `orphan`, hold it for a while)."""


ADOPT_ANNOTATION = "nvidia.com/gpu-operator.adopt"
"""Set to "true" on an object that has an operand's name to let the operator take it over (an object of
another tool, or of NVIDIA's operator under another ClusterPolicy); without it such an object is
reported as a conflict and left alone."""


def object_info(body: Mapping[str, Any], key: ObjectKey | None = None) -> ObjectInfo:
    """The slim record of an object; `key` when the body does not say (a metadata-only lookup)."""
    metadata = body.get("metadata") or {}
    owners = [
        o
        for o in metadata.get("ownerReferences") or []
        if o.get("controller") and o.get("kind") in OWNER_KINDS and _is_policy_group(o.get("apiVersion"))
    ]
    annotations = metadata.get("annotations") or {}
    return ObjectInfo(
        key=key or object_key(body),
        component=component_of(metadata),
        applied_hash=annotations.get(HASH_ANNOTATION, ""),
        generation=int(metadata.get("generation") or 0),
        resource_version=str(metadata.get("resourceVersion") or ""),
        owner_uid=owners[0].get("uid", "") if owners else "",
        managers=tuple(sorted({str(m.get("manager") or "") for m in metadata.get("managedFields") or []})),
        adopt=annotations.get(ADOPT_ANNOTATION) == "true",
        deleting=bool(metadata.get("deletionTimestamp")),
    )


OWNER_KINDS = frozenset({"ClusterPolicy", "NVIDIADriver", "GPUCluster"})
"""The kinds whose objects own what the operator creates: a ClusterPolicy its operands, an NVIDIADriver
its pool's driver DaemonSets (core/driver_pool_plan.py), a GPUCluster its DRA stack
(core/gpucluster_plan.py)."""


def _is_policy_group(api_version: Any) -> bool:
    return str(api_version or "").startswith("nvidia.com/")


def created_by_us(info: ObjectInfo, active_uid: str | None, policy_uids: Collection[str]) -> bool:
    """Whether the operator created this object and may delete it: it is controlled by the active
    ClusterPolicy (or by one that no longer exists: left over from a deleted policy, which the garbage
    collector removes as well), or by an NVIDIADriver (a pool's driver DaemonSet), and written by the
    operator's field manager. Our labels alone prove
    nothing: anyone can set them."""
    if not info.owner_uid or FIELD_MANAGER not in info.managers:
        return False
    return info.owner_uid == active_uid or info.owner_uid not in policy_uids


def may_rewrite(info: ObjectInfo, active_uid: str | None, policy_uids: Collection[str]) -> bool:
    """Whether the operator may apply its content over this existing object: it created it, or the
    object's owner handed it over (ADOPT_ANNOTATION)."""
    return info.adopt or created_by_us(info, active_uid, policy_uids)


def config_map_keys(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The file names a ConfigMap holds (text and binary)."""
    return tuple(sorted({*(body.get("data") or {}), *(body.get("binaryData") or {})}))
