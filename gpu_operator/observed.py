"""Slim records of the cluster objects the operator watches, extracted from full bodies.

Watches deliver whole objects; only these few fields are kept in memory, so a 1000-node cluster
with nine operands (9000 pods) stays small, and decisions never depend on fields we did not look at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.components import BY_LABEL
from gpu_operator.labels import COMPONENT_LABEL

HASH_ANNOTATION = "nvidia.com/gpu-operator.applied-hash"

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

    @property
    def failing(self) -> bool:
        return not self.ready and self.reason not in STARTING_REASONS


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
    return PodInfo(
        name=metadata.get("name", ""),
        component=component,
        node=node,
        ready=ready and not terminating,
        reason=reason,
        message=message,
        terminating=terminating,
        created=metadata.get("creationTimestamp") or "",
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
    """What drift detection needs of any managed object."""

    key: ObjectKey
    component: str
    applied_hash: str
    generation: int
    resource_version: str
    owner_uid: str


def object_info(body: Mapping[str, Any]) -> ObjectInfo:
    metadata = body.get("metadata") or {}
    owners = [o for o in metadata.get("ownerReferences") or [] if o.get("controller")]
    return ObjectInfo(
        key=object_key(body),
        component=component_of(metadata),
        applied_hash=(metadata.get("annotations") or {}).get(HASH_ANNOTATION, ""),
        generation=int(metadata.get("generation") or 0),
        resource_version=str(metadata.get("resourceVersion") or ""),
        owner_uid=owners[0].get("uid", "") if owners else "",
    )


def config_map_keys(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The file names a ConfigMap holds (text and binary)."""
    return tuple(sorted({*(body.get("data") or {}), *(body.get("binaryData") or {})}))
