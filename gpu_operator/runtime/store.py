"""What the watches last saw, in slim form: written by the informers and by the reconciler's writes (the
objects their applies returned), read by a pass as one snapshot. All of them run on the operator's one
event loop, so no write is ever half seen and no lock is needed.
The `record_*` methods turn a watched body into its slim record and say whether a pass must follow.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpu_operator.api import MAX_DEPTH, PolicyError, too_deep
from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.core.node_labels import NodeInfo, node_info
from gpu_operator.core.observed import (
    DaemonSetInfo,
    DriverRef,
    GPUClusterRef,
    ObjectInfo,
    ObjectKey,
    PodInfo,
    PolicyRef,
    component_of,
    config_map_keys,
    daemonset_info,
    object_info,
    object_key,
    pod_decides,
    pod_info,
    rollout,
)
from gpu_operator.core.ownership import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.core.plan import (
    GPUCLUSTER_CRD,
    NVIDIA_DRIVER_CRD,
    POLICY_CRD,
    SERVICE_MONITOR_CRD,
    Observed,
)
from gpu_operator.core.psa import NamespaceInfo, namespace_info
from gpu_operator.core.status import Operands, operands_of, pods_by_node
from gpu_operator.core.upgrade import (
    DriverPod,
    Facts,
    Revision,
    ValidatorPod,
    WorkloadPod,
    controller_revision,
    driver_daemonset,
    driver_pod,
    validator_pod,
    workload_pod,
)
from gpu_operator.runtime import safe_json

Body = Mapping[str, Any]
Spec = TypeVar("Spec")
WATCHED_CRDS = frozenset({POLICY_CRD, SERVICE_MONITOR_CRD, NVIDIA_DRIVER_CRD, GPUCLUSTER_CRD})


def policy_ref(body: Body) -> PolicyRef:
    spec = dict(body.get("spec") or {})
    if too_deep(spec) is not None:
        # Keep just enough for the planner to name the path (InvalidSpec); comparing or copying the
        # whole would recurse as deep as the content goes.
        spec = safe_json.truncated(spec, MAX_DEPTH + 1)
    return PolicyRef(
        name=body["metadata"]["name"],
        uid=body["metadata"]["uid"],
        generation=int(body["metadata"].get("generation") or 0),
        created=body["metadata"].get("creationTimestamp") or "",
        spec=spec,
        status=dict(body.get("status") or {}),
    )


def _parsed(raw: Body, parse: Callable[[Any], Spec]) -> tuple[Spec | None, tuple[Any, ...]]:
    """A custom resource's spec parsed, or the errors that name its fields; a spec nested past
    MAX_DEPTH is cut first, keeping enough for the errors to name the path."""
    if too_deep(raw) is not None:
        raw = safe_json.truncated(raw, MAX_DEPTH + 1)
    try:
        return parse(raw), ()
    except PolicyError as exc:
        return None, tuple(exc.errors)


def gpucluster_ref(body: Body) -> GPUClusterRef:
    """A GPUCluster's record, its spec parsed here once per event (every pass reads it)."""
    metadata = body["metadata"]
    spec, errors = _parsed(body.get("spec") or {}, parse_gpucluster_spec)
    return GPUClusterRef(
        name=metadata["name"],
        uid=metadata.get("uid") or "",
        generation=int(metadata.get("generation") or 0),
        spec=spec,
        errors=errors,
        deleting=bool(metadata.get("deletionTimestamp")),
        finalizers=tuple(str(f) for f in metadata.get("finalizers") or ()),
        resource_version=str(metadata.get("resourceVersion") or ""),
        status=dict(body.get("status") or {}),
    )


def driver_ref(body: Body) -> DriverRef:
    """An NVIDIADriver's record, its spec parsed here once per event (every pass reads it)."""
    metadata = body["metadata"]
    spec, errors = _parsed(body.get("spec") or {}, parse_driver_spec)
    return DriverRef(
        name=metadata["name"],
        uid=metadata.get("uid") or "",
        generation=int(metadata.get("generation") or 0),
        spec=spec,
        errors=errors,
        deleting=bool(metadata.get("deletionTimestamp")),
        status=dict(body.get("status") or {}),
    )


@dataclass
class Store:
    """The tables; read them only through `get`, `size` and `snapshot`."""

    policies: dict[str, PolicyRef] = field(default_factory=dict)
    drivers: dict[str, DriverRef] = field(default_factory=dict)
    gpuclusters: dict[str, GPUClusterRef] = field(default_factory=dict)
    """GPUCluster name → its record (empty while its CRD is absent)."""
    """NVIDIADriver name → its record (empty while its CRD is absent: the informer lists nothing)."""
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    daemonsets: dict[str, DaemonSetInfo] = field(default_factory=dict)
    objects: dict[ObjectKey, ObjectInfo] = field(default_factory=dict)
    config_maps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every ConfigMap of the operand namespace → its keys (users' ones feed the driver's mounts)."""
    crds: dict[str, bool] = field(default_factory=dict)
    """CRD name → established (only the CRDs the operator watches)."""
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    # What the driver-upgrade state machine decides on (gpu_operator/core/upgrade/).
    driver_pods: dict[str, DriverPod] = field(default_factory=dict)
    validator_pods: dict[str, ValidatorPod] = field(default_factory=dict)
    driver_daemonsets: dict[str, str] = field(default_factory=dict)
    """Driver DaemonSet UID → its name; its target revision comes from `revisions`."""
    revisions: dict[str, Revision] = field(default_factory=dict)
    """The driver DaemonSets' ControllerRevisions, by name."""
    node_pods: dict[str, dict[str, WorkloadPod]] = field(default_factory=dict)
    """Node → its pods by UID, only for the nodes being emptied (gpu_operator/runtime/drain_watches.py watches
    them); a node is here once its pods have been listed."""
    listing_pods: dict[str, dict[str, WorkloadPod]] = field(default_factory=dict)
    """The pods of a node whose first listing is under way (record_node_pod)."""
    speaking: dict[tuple[str, str], PodInfo] = field(default_factory=dict)
    """(component, node) → the pod that speaks for it (status.pods_by_node), kept with `pods`: a pass
    would otherwise sort out every operand pod of the cluster again."""
    slots: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(component, node) → the keys of its pods in `pods`."""
    operands: dict[str, Operands] = field(default_factory=dict)
    """Node → `speaking` of its components (status.operands_of), a new tuple whenever one changes: a
    pass tells an unchanged node by comparing one tuple, not by looking up each of its components."""
    node_moved: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    """Set, and replaced by a new one, whenever a node is recorded or forgotten: see `wait_node`."""
    shown: Callable[[], None] = field(default=lambda: None, compare=False)
    """Called when a change only shows in the status (a pod's reason or message): a pass is due soon,
    not at once (WorkQueue.add_soon). Most pod events are such changes: Init:1/4, Init:2/4, Running."""

    def _swap(self, table: str, key: Any, value: Any) -> Any:
        """Set or (value None) remove an entry; the entry it replaced (None if there was none)."""
        entries: dict[Any, Any] = getattr(self, table)
        before = entries.pop(key, None) if value is None else entries.get(key)
        if value is not None:
            entries[key] = value
        if table == "pods":
            self._speak(key, before, value)
        elif table == "nodes":
            self._node_moved()
        return before

    def _speak(self, key: str, before: PodInfo | None, after: PodInfo | None) -> None:
        """Keep `speaking`, `slots` and `operands` with a change of `pods`."""
        now = None if after is None else (after.component, after.node)
        for slot in {(p.component, p.node) for p in (before, after) if p is not None}:
            members = self.slots.setdefault(slot, set())
            if slot == now:
                members.add(key)
            else:
                members.discard(key)
            best = pods_by_node(self.pods[k] for k in members).get(slot)
            if best is None:
                self.slots.pop(slot, None)
            if best is self.speaking.get(slot):
                continue
            if best is None:
                self.speaking.pop(slot, None)
            else:
                self.speaking[slot] = best
            node = slot[1]
            row = operands_of(self.speaking, node)
            if any(pod is not None for pod in row):
                self.operands[node] = row
            else:
                self.operands.pop(node, None)

    def put(self, table: str, key: Any, value: Any) -> bool:
        """Set or (value None) remove an entry; True when that changed anything a decision reads (an
        entry is replaced even then: fields outside comparison, such as a resourceVersion, stay current)."""
        before = self._swap(table, key, value)
        return before is not None if value is None else bool(before != value)

    def retain(self, table: str, present: set[Any], applies: Callable[[Any], bool] = lambda _: True) -> bool:
        """Forget the entries (those `applies` to) that a fresh listing no longer has: deletions that
        happened while no watch was open. True when any was forgotten."""
        entries: dict[Any, Any] = getattr(self, table)
        gone = [key for key in entries if applies(key) and key not in present]
        for key in gone:
            before = entries.pop(key)
            if table == "pods":
                self._speak(key, before, None)
        return bool(gone)

    def retain_driver_daemonsets(self, present: set[str]) -> bool:
        """`retain` for the driver DaemonSets, kept by UID: those whose name a fresh listing lacks."""
        gone = [uid for uid, name in self.driver_daemonsets.items() if name not in present]
        for uid in gone:
            del self.driver_daemonsets[uid]
        return bool(gone)

    def get(self, table: str, key: Any) -> Any:
        return getattr(self, table).get(key)

    def size(self, table: str) -> int:
        return len(getattr(self, table))

    def snapshot(self, namespace: str, environ: Mapping[str, str]) -> Observed:
        return Observed(
            policies=tuple(self.policies.values()),
            drivers=tuple(self.drivers.values()),
            gpuclusters=tuple(self.gpuclusters.values()),
            driver_daemonsets=dict(self.driver_daemonsets),
            nodes=dict(self.nodes),
            pods=tuple(self.pods.values()),
            speaking=dict(self.speaking),
            operands=dict(self.operands),
            daemonsets={d.name: d for d in self.daemonsets.values()},
            objects=dict(self.objects),
            config_maps=dict(self.config_maps),
            namespace=namespace,
            environ=dict(environ),
            nvidia_driver_crd=self.crds.get(NVIDIA_DRIVER_CRD, False),
            service_monitor_crd=self.crds.get(SERVICE_MONITOR_CRD, False),
            operand_namespace=self.namespaces.get(namespace),
            upgrade=self._upgrade_facts(),
        )

    def _upgrade_facts(self) -> Facts:
        """The upgrade state machine's facts but the nodes and the time (the planner adds them)."""
        revisions = list(self.revisions.values())
        found = (driver_daemonset(name, uid, revisions) for uid, name in self.driver_daemonsets.items())
        return Facts(
            nodes=(),
            driver_daemonsets=tuple(d for d in found if d is not None),
            driver_pods=tuple(self.driver_pods.values()),
            validator_pods=tuple(self.validator_pods.values()),
            pods=tuple(p for pods in self.node_pods.values() for p in pods.values()),
            pods_known=frozenset(self.node_pods),
        )

    # --- what the watches report: (body, deleted) → whether a pass must follow -------------------

    def record_policy(self, body: Body, deleted: bool) -> bool:
        name = body["metadata"]["name"]
        if deleted:
            return self.put("policies", name, None)
        ref = policy_ref(body)
        before: PolicyRef | None = self._swap("policies", name, ref)
        # Our own status writes come back as events too; only spec or identity changes need a pass.
        return before is None or (before.spec, before.generation, before.uid) != (
            ref.spec,
            ref.generation,
            ref.uid,
        )

    def record_driver(self, body: Body, deleted: bool) -> bool:
        """An NVIDIADriver. As for a ClusterPolicy, our own status writes come back as events: only a
        change of what DriverRef compares (spec, identity, deletion) needs a pass."""
        name = body["metadata"]["name"]
        return self.put("drivers", name, None if deleted else driver_ref(body))

    def record_gpucluster(self, body: Body, deleted: bool) -> bool:
        """A GPUCluster: as for an NVIDIADriver, only a change of what GPUClusterRef compares needs a pass."""
        name = body["metadata"]["name"]
        return self.put("gpuclusters", name, None if deleted else gpucluster_ref(body))

    def record_gpucluster_status(self, name: str, status: Mapping[str, Any]) -> None:
        """The status our own write left on a GPUCluster; wakes no pass."""
        ref = self.gpuclusters.get(name)
        if ref is not None:
            self.gpuclusters[name] = replace(ref, status=dict(status))

    def record_driver_status(self, name: str, status: Mapping[str, Any]) -> None:
        """The status our own write left on an NVIDIADriver (a pass before its watch event must not
        write it again); wakes no pass."""
        ref = self.drivers.get(name)
        if ref is not None:
            self.drivers[name] = replace(ref, status=dict(status))

    def record_node(self, body: Body, deleted: bool) -> bool:
        """Also what our own node writes returned (the reconciler puts them in before the watch brings
        them). A watch event older than the node we hold is dropped: taken, it would undo our upgrade
        state until the next event, and a pass in between would count the limits wrongly."""
        name = body["metadata"]["name"]
        if deleted:
            return self.put("nodes", name, None)
        info = node_info(body)
        before = self.nodes.get(name)
        if before is not None and _older(info.resource_version, before.resource_version):
            return False
        self.nodes[name] = info
        self._node_moved()
        return before != info

    def _node_moved(self) -> None:
        self.node_moved.set()
        self.node_moved = asyncio.Event()

    async def wait_node(self, name: str, moved_from: str, timeout: float) -> tuple[bool, NodeInfo | None]:
        """For a write on node `name` at resourceVersion `moved_from` refused as stale: wait until the
        Store holds the node at another version, or not at all (its watch brought the change), at most
        `timeout` seconds. Whether it did, and the node the Store holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (node := self.nodes.get(name)) is not None and node.resource_version == moved_from:
            left = deadline - loop.time()
            if left <= 0:
                return False, node
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.node_moved.wait(), left)
        return True, node

    def record_pod(self, body: Body, deleted: bool) -> bool:
        """True when a decision may change (a pod came, went, got ready or not, started terminating:
        observed.pod_decides); a pod whose reason or message alone changed (observed.POD_SHOWN) only asks
        for a pass soon (`shown`)."""
        key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
        info = None if deleted else pod_info(body)
        before: PodInfo | None = self._swap("pods", key, info)
        changed = pod_decides(before) != pod_decides(info)
        if not changed and before != info:
            self.shown()
        component = info.component if info is not None else component_of(body["metadata"])
        if component == "driver":
            changed |= self.put("driver_pods", key, None if deleted else driver_pod(body))
        elif component == "operator-validator":
            changed |= self.put("validator_pods", key, None if deleted else validator_pod(body))
        return changed

    def record_managed(self, body: Body, deleted: bool) -> bool:
        """True when a decision may change. A DaemonSet's status updates (hundreds in a rollout) only
        count when they change its observed.rollout: the plan reads nothing else of them."""
        key = object_key(body)
        info = None if deleted else object_info(body)
        changed = _object_decides(self._swap("objects", key, info)) != _object_decides(info)
        if body["kind"] == "DaemonSet":
            ds = None if deleted else daemonset_info(body)
            changed |= rollout(self._swap("daemonsets", key, ds)) != rollout(ds)
            if component_of(body["metadata"]) == "driver":
                uid, name = body["metadata"].get("uid", ""), body["metadata"]["name"]
                changed |= self.put("driver_daemonsets", uid, None if deleted else name)
        return changed

    def record_revision(self, body: Body, deleted: bool) -> bool:
        """ControllerRevisions of the operator's DaemonSets; only the driver's are kept."""
        ours = component_of(body["metadata"]) == "driver"
        revision = None if deleted or not ours else controller_revision(body)
        return self.put("revisions", body["metadata"]["name"], revision)

    # --- the pods of nodes being emptied (gpu_operator/runtime/drain_watches.py)
    # ------------------------------

    def list_node_pods(self, node: str, bodies: Iterable[Body]) -> bool:
        """A node's pods listed at once (the tests', the bench's): the same two steps as a drain
        watch's informer, each pod and then the complete listing."""
        listed = list(bodies)
        for body in listed:
            self.record_node_pod(node, body, False)
        return self.node_pods_listed(
            node, {(b["metadata"].get("namespace", ""), b["metadata"]["name"]) for b in listed}
        )

    def record_node_pod(self, node: str, body: Body, deleted: bool) -> bool:
        """A pod of a node being emptied (gpu_operator/runtime/drain_watches.py). Until the node's first
        listing is complete its pods are kept aside: a pass must not take half a listing for all."""
        pod = None if deleted else workload_pod(body)
        uid = body["metadata"].get("uid", "")
        listed = node in self.node_pods
        pods = self.node_pods[node] if listed else self.listing_pods.setdefault(node, {})
        before = pods.get(uid)
        if pod is None or pod.node != node:
            pods.pop(uid, None)
            return listed and before is not None
        if before is None:
            # A name is one pod at a time: one deleted and created again under it (its DELETED event
            # lost to a relisting) is gone.
            for other in [u for u, p in pods.items() if (p.namespace, p.name) == (pod.namespace, pod.name)]:
                del pods[other]
        pods[uid] = pod
        return listed and before != pod

    def node_pods_listed(self, node: str, present: Iterable[tuple[str, str]]) -> bool:
        """A complete listing of the node's pods ((namespace, name) of each) has been recorded: those it
        does not name are gone, and the node's pods are known from now on (Facts.pods_known)."""
        names = set(present)
        before = self.node_pods.get(node)
        pods = self.listing_pods.pop(node, None) or dict(before or {})
        kept = {uid: pod for uid, pod in pods.items() if (pod.namespace, pod.name) in names}
        self.node_pods[node] = kept
        return before != kept

    def forget_node_pods(self, node: str) -> None:
        self.node_pods.pop(node, None)
        self.listing_pods.pop(node, None)

    def record_config_map(self, body: Body, deleted: bool) -> bool:
        """ConfigMaps are watched without the label selector: the driver mounts the files of users'
        ConfigMaps (repoConfig, certConfig, kernelModuleConfig) one by one, so it needs their keys."""
        ours = (body["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == FIELD_MANAGER
        changed = self.record_managed(body, deleted or not ours)
        keys = None if deleted else config_map_keys(body)
        return self.put("config_maps", body["metadata"]["name"], keys) or changed

    def record_crd(self, body: Body, deleted: bool) -> bool:
        """Only the CRDs decisions read: the ClusterPolicy CRD (gone means every ClusterPolicy is gone,
        and the reconciler may create it again), the Prometheus operator's and NVIDIADriver."""
        name = body["metadata"]["name"]
        if name not in WATCHED_CRDS:
            return False
        conditions = (body.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        changed = self.put("crds", name, False if deleted else established)
        if deleted and name == POLICY_CRD:
            changed |= self.retain("policies", set())
        return changed

    def crds_listed(self, present: set[str]) -> bool:
        """A complete listing of CRDs: those decisions read that it lacks are gone."""
        changed = False
        for name in WATCHED_CRDS - present:
            if self.get("crds", name) is not False:
                changed |= self.record_crd({"metadata": {"name": name}}, deleted=True)
        return changed

    def record_namespace(self, body: Body, deleted: bool) -> bool:
        """The operand namespace: a change of what NamespaceInfo compares (its pod-security labels, our
        marks, the admin-access label the DRA stack's claims wait for) needs a pass."""
        return self.put("namespaces", body["metadata"]["name"], None if deleted else namespace_info(body))


def _object_decides(info: ObjectInfo | None) -> ObjectInfo | None:
    """A DaemonSet's (or the DRA controller's Deployment's) edits show in its generation (plan.in_sync);
    its resourceVersion also moves with every status update."""
    if info is None or info.key[1] not in ("DaemonSet", "Deployment"):
        return info
    return replace(info, resource_version="")


def _older(version: str, than: str) -> bool:
    """resourceVersions are opaque to clients, but every API server in use writes etcd's revision: compare
    them as numbers when both are, and take anything else as new."""
    return version.isdigit() and than.isdigit() and int(version) < int(than)
