"""What the state machine asks the caller to do: three kinds of API writes, and Events.

Each node's writes come in order and the caller stops at the first one that fails: the node patch
(state label, annotations and cordon in one merge patch, so a state never lands without its side
effects) always comes first, so a pod is evicted only from a node that is already cordoned and whose
label already says so. An eviction's answer, whatever it is, is an observation, not a failure: the
caller records it in Facts.evictions (by pod UID) and goes on. After a node patch the caller must
put the returned Node into its cache before the next pass, or the limits would be counted on a stale
view. Different nodes' writes may run in parallel, except that the nodes that start their upgrade in
this pass (`NodeActions.starts`) go after all the others, and only once those succeeded: the slot
and the cordon they take may be the ones a finishing node gives back in the same pass, and the
API server must never show both at once.

| write      | API call                                                                  | body            |
|------------|---------------------------------------------------------------------------|-----------------|
| PatchNode  | PATCH /api/v1/nodes/{node}, application/merge-patch+json                  | `body()`        |
| EvictPod   | POST /api/v1/namespaces/{ns}/pods/{name}/eviction                         | `body()`        |
| DeletePod  | DELETE /api/v1/namespaces/{ns}/pods/{name}                                | `body()`        |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gpu_operator.api import nvidiadriver
from gpu_operator.core.upgrade.states import AUTO_UPGRADE_ANNOTATION, EVENT_REASON


@dataclass(frozen=True)
class PatchNode:
    """Labels and annotations to set (None: remove) and the cordon to apply (None: leave as it is)."""

    node: str
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    unschedulable: bool | None = None

    def body(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        body: dict[str, Any] = {"metadata": metadata}
        if self.unschedulable is not None:
            # Merge patch: null removes the field, which is how `kubectl uncordon` leaves a node too.
            body["spec"] = {"unschedulable": True if self.unschedulable else None}
        return body


@dataclass(frozen=True)
class EvictPod:
    """Evict through the Eviction API, so PodDisruptionBudgets hold. The UID precondition keeps a
    replacement pod of the same name (StatefulSet) from being evicted by a stale decision."""

    namespace: str
    name: str
    uid: str

    def body(self) -> dict[str, Any]:
        return {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "deleteOptions": {"preconditions": {"uid": self.uid}},
        }


@dataclass(frozen=True)
class DeletePod:
    """Delete a pod: the old driver pod at pod-restart-required (its DaemonSet is OnDelete), the
    operator-validator pod that validated the previous driver at validation-required, or, with
    `force` once the timeout has passed, a pod whose eviction is still refused."""

    namespace: str
    name: str
    uid: str
    why: Literal["driver-restart", "validator-restart", "forced"]

    def body(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": self.uid}}


Write = PatchNode | EvictPod | DeletePod


@dataclass(frozen=True)
class UpgradeEvent:
    """An Event on the node (`node` set); about the upgrade itself (`node` None), on the NVIDIADriver
    whose pool upgrades (`pool` set) or else on the ClusterPolicy."""

    node: str | None
    type: Literal["Normal", "Warning"]
    message: str
    reason: str = EVENT_REASON
    pool: str | None = None
    """The NVIDIADriver whose pool's plan made it (core/driver_pool_upgrade.py addressed); None for the
    ClusterPolicy's plan."""


@dataclass(frozen=True)
class NodeActions:
    """One node's writes, in order (stop at the first failure), and the Events to post once they
    succeeded."""

    node: str
    writes: tuple[Write, ...]
    events: tuple[UpgradeEvent, ...] = ()
    starts: bool = False
    """The node starts its upgrade in this pass (see the module docstring for the order)."""


def announcements(actions: tuple[NodeActions, ...]) -> tuple[list[NodeActions], list[NodeActions]]:
    """(the nodes whose only write sets or removes NVIDIA's auto-upgrade annotation, the others).

    The caller writes the first before any object. k8s-driver-manager reads the annotation once, when
    it starts in a driver pod: without it, it cordons the node and evicts GPU pods itself, and, when
    its pod is deleted half-way, leaves that cordon behind, which no later k8s-driver-manager lifts
    once the annotation is there (k8s-driver-manager v0.12.0 main.go:639-651; hack/emulators/driver.py
    plays it). A driver DaemonSet created in the same pass could start one before the annotation is
    written.
    """

    def announces(action: NodeActions) -> bool:
        return not action.events and all(
            isinstance(w, PatchNode)
            and not w.labels
            and w.unschedulable is None
            and set(w.annotations) == {AUTO_UPGRADE_ANNOTATION}
            for w in action.writes
        )

    first: list[NodeActions] = []
    rest: list[NodeActions] = []
    for action in actions:
        (first if action.writes and announces(action) else rest).append(action)
    return first, rest


def rounds(rest: list[NodeActions]) -> tuple[list[NodeActions], list[NodeActions]]:
    """The writes after the pass's objects, in two rounds: the nodes that go on with (or end) their
    upgrade, then the nodes that start it. The caller runs the second only if every node of the first
    succeeded (see the module docstring: a starting node may take the slot a finishing one gives back)."""
    return [a for a in rest if not a.starts], [a for a in rest if a.starts]


def event_subject(
    event: UpgradeEvent,
    node_uids: Mapping[str, str],
    policy: Mapping[str, str],
    driver_uids: Mapping[str, str] = MappingProxyType({}),
) -> tuple[Mapping[str, str], tuple[str, str]]:
    """What an upgrade Event is about, as (name and uid, (apiVersion, kind)): its node; when it names
    none, the NVIDIADriver of its pool (`driver_uids`: name → uid) or else the ClusterPolicy (`policy`:
    its name and uid)."""
    if event.node is not None:
        return {"name": event.node, "uid": node_uids.get(event.node, "")}, ("v1", "Node")
    if event.pool is not None:
        driver = {"name": event.pool, "uid": driver_uids.get(event.pool, "")}
        return driver, (nvidiadriver.API_VERSION, nvidiadriver.KIND)
    return policy, ("nvidia.com/v1", "ClusterPolicy")
