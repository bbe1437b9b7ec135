"""The objects the unit tests are built of, in one place: API bodies (Node, Pod, DaemonSet) as the
watches and the fake API servers hand them over, the small records the planner decides on (NodeInfo,
PodInfo, DaemonSetInfo), and a clock a test moves by hand.

Imported as `builders` (pytest puts tests/unit on the path, as for upgrade_world). Each builder writes
only the fields it is given, so a body is no richer than the test that reads it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import DaemonSetInfo, PodInfo
from gpu_operator.core.ownership import COMPONENT_LABEL, FIELD_MANAGER

PCI = "feature.node.kubernetes.io/pci-10de.present"
"""NFD's label for an NVIDIA PCI device: what makes a node a GPU node."""

NAMESPACE = "gpu-operator"


class Clock:
    """A clock that moves only when the test moves it (`clock.now += seconds`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- API bodies -------------------------------------------------------------------------------------


def condition(kind: str, status: bool) -> dict[str, str]:
    """A status condition as the API reports it ("True" / "False")."""
    return {"type": kind, "status": str(status)}


def label_owner(
    keys: Iterable[str], manager: str = FIELD_MANAGER, operation: str = "Apply"
) -> dict[str, Any]:
    """A managedFields entry: `manager` owns the labels `keys`, by `operation`: "Apply" (a server-side
    apply; the operator's by default) or "Update" (a patch, kubectl label)."""
    owned: dict[str, Any] = {f"f:{key}": {} for key in keys}
    return {"manager": manager, "operation": operation, "fieldsV1": {"f:metadata": {"f:labels": owned}}}


def node_body(
    name: str = "gpu-0",
    labels: Mapping[str, str] | None = None,
    *,
    uid: str | None = None,
    resource_version: str | None = None,
    annotations: Mapping[str, str] | None = None,
    managed_fields: list[dict[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    typed: bool = False,
) -> dict[str, Any]:
    """A Node: `labels` always (empty if none), the other metadata (`managed_fields`: entries of
    `label_owner`), spec and status when given; `typed` adds apiVersion and kind, as a GET or a watch
    event has them."""
    metadata: dict[str, Any] = {"name": name}
    if uid is not None:
        metadata["uid"] = uid
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    metadata["labels"] = dict(labels or {})
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if managed_fields is not None:
        metadata["managedFields"] = managed_fields
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node"} if typed else {}
    body["metadata"] = metadata
    if spec is not None:
        body["spec"] = dict(spec)
    if status is not None:
        body["status"] = dict(status)
    return body


def pod_body(
    name: str,
    node: str = "gpu-0",
    *,
    namespace: str = NAMESPACE,
    labels: Mapping[str, str] | None = None,
    uid: str | None = None,
    owners: list[dict[str, Any]] | None = None,
    created: str | None = None,
    deleted: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, str]] | None = None,
    status: Mapping[str, Any] | None = None,
    typed: bool = False,
) -> dict[str, Any]:
    """A Pod scheduled to `node`: its status is `status`, or just `conditions`; the other metadata
    (`deleted`: its deletionTimestamp, a pod terminating), its containers and volumes when given;
    `typed` adds apiVersion and kind."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid is not None:
        metadata["uid"] = uid
    if labels is not None:
        metadata["labels"] = dict(labels)
    if owners is not None:
        metadata["ownerReferences"] = owners
    if created is not None:
        metadata["creationTimestamp"] = created
    if deleted is not None:
        metadata["deletionTimestamp"] = deleted
    spec: dict[str, Any] = {"nodeName": node}
    if containers is not None:
        spec["containers"] = containers
    if volumes is not None:
        spec["volumes"] = volumes
    found: dict[str, Any] = dict(status or {})
    if conditions is not None:
        found["conditions"] = conditions
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"} if typed else {}
    return body | {"metadata": metadata, "spec": spec, "status": found}


def operand_pod_body(
    name: str,
    component: str,
    node: str = "gpu-0",
    *,
    deleted: str | None = None,
    conditions: list[dict[str, str]] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod of one of the operator's DaemonSets (labelled with its component)."""
    labels = {COMPONENT_LABEL: component}
    return pod_body(name, node, labels=labels, deleted=deleted, conditions=conditions, status=status)


def gpu_request_pod(resources: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A workload's pod spec alone (what the scheduler's filters read): one container asking for one
    GPU unless `resources` says otherwise."""
    wanted = dict(resources) if resources is not None else {"limits": {"nvidia.com/gpu": "1"}}
    return {"spec": {"containers": [{"name": "c", "resources": wanted}], **spec}}


def daemonset_body(
    name: str,
    component: str,
    *,
    ready: int,
    desired: int,
    resource_version: str,
    updated: int | None = None,
    generation: int = 1,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An operand DaemonSet in the operator's namespace, `ready` of its `desired` pods ready and
    available, `updated` of them on the current template (all unless given)."""
    metadata = {
        "name": name,
        "namespace": NAMESPACE,
        "generation": generation,
        "resourceVersion": resource_version,
        "labels": {**(labels or {}), COMPONENT_LABEL: component},
    }
    status = {"observedGeneration": 1, "desiredNumberScheduled": desired, "numberReady": ready}
    status |= {"updatedNumberScheduled": desired if updated is None else updated, "numberAvailable": ready}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata, "status": status}


# --- what the planner decides on ----------------------------------------------------------------------


def gpu_node(
    name: str = "gpu-0",
    labels: Mapping[str, str] | None = None,
    *,
    own_labels: frozenset[str] = frozenset(),
    shared_labels: frozenset[str] = frozenset(),
    uid: str = "",
    resource_version: str = "",
) -> NodeInfo:
    """A node NFD found an NVIDIA PCI device on, with `labels` besides."""
    return NodeInfo(
        name,
        {PCI: "true", **(labels or {})},
        own_labels=own_labels,
        shared_labels=shared_labels,
        uid=uid,
        resource_version=resource_version,
    )


def watched_node(name: str = "gpu-0") -> NodeInfo:
    """A GPU node as its watch event put it in the Store: with the uid and resourceVersion that label
    writes carry."""
    return gpu_node(name, uid=f"uid-{name}", resource_version="1")


def operand_pod(
    name: str,
    component: str,
    node: str,
    ready: bool = True,
    reason: str = "",
    message: str = "",
    *,
    terminating: bool = False,
    created: str = "t",
    initialized: bool = False,
) -> PodInfo:
    """An operand pod as the Store keeps it."""
    return PodInfo(name, component, node, ready, reason, message, terminating, created, initialized)


def operand_daemonset(name: str, component: str, desired: int = 1, ready: int | None = None) -> DaemonSetInfo:
    """An operand DaemonSet on its current generation, every pod updated, `ready` of them ready and
    available (all unless given)."""
    ready = desired if ready is None else ready
    return DaemonSetInfo(name, component, 1, 1, desired, ready, desired, ready, 0, False)
