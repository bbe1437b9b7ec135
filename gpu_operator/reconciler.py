"""Carries out a plan: the watch caches in, API writes out, and only the writes that change something.

`Store` is filled by the watch handlers (on Kopf's event loop); `Reconciler.run_once` runs in a worker
thread on a snapshot of it. Writes happen only when the desired state differs from what the watches
show, so a converged cluster costs the API server nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpu_operator.api.status import REASON_OPERAND_NOT_READY
from gpu_operator.kube import ApiError, Kube
from gpu_operator.nodes import NodeInfo, gpu_nodes
from gpu_operator.observed import (
    HASH_ANNOTATION,
    DaemonSetInfo,
    ObjectInfo,
    ObjectKey,
    PodInfo,
    component_of,
    object_info,
    object_key,
)
from gpu_operator.plan import Note, Observed, Plan, PolicyRef, build, status_differs, with_apply_errors
from gpu_operator.psa import PRIVILEGED, NamespaceInfo, NamespaceWrite

log = logging.getLogger("gpu_operator")

SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"


@dataclass
class Store:
    """What the watches last saw, in slim form. Mutated from the event loop, read from the worker."""

    policies: dict[str, PolicyRef] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    daemonsets: dict[str, DaemonSetInfo] = field(default_factory=dict)
    objects: dict[ObjectKey, ObjectInfo] = field(default_factory=dict)
    config_maps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every ConfigMap of the operand namespace → its keys (users' ones feed the driver's mounts)."""
    crds: dict[str, bool] = field(default_factory=dict)
    """CRD name → established (only the CRDs the operator watches)."""
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, table: str, key: Any, value: Any) -> bool:
        """Set or (value None) remove an entry; True when that changed anything a decision reads (an
        entry is replaced even then: fields outside comparison, such as a resourceVersion, stay current)."""
        with self.lock:
            entries: dict[Any, Any] = getattr(self, table)
            if value is None:
                return entries.pop(key, None) is not None
            before = entries.get(key)
            entries[key] = value
            return bool(before != value)

    def snapshot(self, namespace: str, environ: Mapping[str, str], nvidia_driver_crd: bool) -> Observed:
        with self.lock:
            return Observed(
                policies=tuple(self.policies.values()),
                nodes=dict(self.nodes),
                pods=tuple(self.pods.values()),
                daemonsets={d.name: d for d in self.daemonsets.values()},
                objects=dict(self.objects),
                config_maps=dict(self.config_maps),
                namespace=namespace,
                environ=dict(environ),
                nvidia_driver_crd=nvidia_driver_crd,
                service_monitor_crd=self.crds.get(SERVICE_MONITOR_CRD, False),
                operand_namespace=self.namespaces.get(namespace),
            )


@dataclass(frozen=True)
class Applied:
    """What our own last apply of an object returned: later differences are someone else's edits."""

    hash: str
    generation: int
    resource_version: str


def in_sync(desired_hash: str, observed: ObjectInfo | None, applied: Applied | None) -> bool:
    """Whether an object needs no apply: present, at our desired content, and untouched since our apply.

    Objects with a spec generation (DaemonSets) count as edited when the generation moves; others
    (ConfigMaps, RBAC, ...) when the resourceVersion moves. Status updates by controllers move neither.
    """
    if observed is None or observed.applied_hash != desired_hash or applied is None:
        return False
    if applied.hash != desired_hash:
        return False
    if applied.generation:
        return observed.generation == applied.generation
    return observed.resource_version == applied.resource_version


WRITERS = 16
"""Concurrent API writes in one pass: enough to label 1000 nodes quickly, few enough for the API server."""


def _by_component(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for body in objects:
        groups.setdefault(component_of(body["metadata"]), []).append(body)
    return list(groups.values())


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    errors: Mapping[str, str]
    """What could not be written (component or object → the API server's message)."""
    gpu_nodes: int
    """Nodes detected as GPU nodes in this pass's snapshot."""
    stale: tuple[str, ...] = ()
    """Objects (node/..., namespace/...) that changed between the snapshot and their write: a new
    pass should follow soon."""


@contextmanager
def _recorded(errors: dict[str, str], what: str) -> Iterator[None]:
    """Run one write; a rejected write (4xx) is recorded, a transient failure aborts the pass."""
    try:
        yield
    except ApiError as exc:
        if exc.status >= 500 or exc.status in (0, 429):  # 0: no response at all
            raise
        log.warning("%s: %s", what, exc)
        errors.setdefault(what, str(exc))


def _unless_changed(what: str, stale: list[str], write: Callable[[], object]) -> bool:
    """Run a write that carries the resourceVersion the plan saw. A conflict (409) means the object
    changed since (a manager's pause, an admin's label): the write is left to the next pass, which is
    asked for. True when the write went through."""
    try:
        write()
    except ApiError as exc:
        if exc.status != 409:
            raise
        log.info("%s changed since this pass read it; the next pass decides again", what)
        stale.append(what)
        return False
    return True


@dataclass
class Reconciler:
    kube: Kube
    store: Store
    namespace: str
    environ: Mapping[str, str]
    nvidia_driver_crd: bool = False
    applied: dict[ObjectKey, Applied] = field(default_factory=dict)
    reported: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WRITERS, "gpu-operator-write")
    )
    """Policy name → the last (state, reason, notes...) we posted Events for."""

    def run_once(self) -> Outcome:
        """One pass. API errors on single objects do not stop the pass: every other object, node
        and status is still handled, and the errors go into the status and the returned Outcome.

        Writes run in parallel (a 1000-node rollout is 1000 label patches per stage), except that a
        component's own objects go in order: its ServiceAccount and RBAC before its DaemonSet."""
        stamp = now()
        observed = self.store.snapshot(self.namespace, self.environ, self.nvidia_driver_crd)
        plan = build(observed, stamp)
        errors: dict[str, str] = {}
        stale: list[str] = []
        if plan.spec is not None:
            self._in_parallel(
                partial(self._apply_objects, bodies, errors) for bodies in _by_component(plan.objects)
            )
        self._in_parallel(partial(self._delete, key, errors) for key in plan.deletes)
        self._in_parallel(
            partial(
                self._label, observed.nodes[node], labels, plan.label_releases.get(node, {}), errors, stale
            )
            for node, labels in plan.node_labels.items()
        )
        if plan.namespace_write is not None and observed.operand_namespace is not None:
            self._write_namespace(observed.operand_namespace, plan.namespace_write, errors, stale)
        if errors and plan.active is not None and plan.active.name in plan.statuses:
            plan.statuses[plan.active.name] = with_apply_errors(
                plan.active, plan.statuses[plan.active.name], errors, stamp
            )
        self._write_statuses(plan)
        return Outcome(plan, errors, len(gpu_nodes(observed.nodes.values())), tuple(sorted(stale)))

    def _in_parallel(self, jobs: Iterable[Callable[[], None]]) -> None:
        """Run the jobs on the worker pool; after all have finished, re-raise the first failure."""
        futures = [self.pool.submit(job) for job in jobs]
        wait(futures)
        for future in futures:
            future.result()

    def _apply_objects(self, bodies: list[dict[str, Any]], errors: dict[str, str]) -> None:
        for body in bodies:
            key = object_key(body)
            desired_hash = body["metadata"]["annotations"][HASH_ANNOTATION]
            with self.store.lock:
                observed = self.store.objects.get(key)
            if in_sync(desired_hash, observed, self.applied.get(key)):
                continue
            component = component_of(body["metadata"]) or key[1]
            with _recorded(errors, component):
                result = self.kube.apply(body)
                log.info("applied %s %s/%s", key[1], key[2], key[3])
                info = object_info(result)
                self.store.put("objects", key, info)
                self.applied[key] = Applied(desired_hash, info.generation, info.resource_version)

    def _delete(self, key: ObjectKey, errors: dict[str, str]) -> None:
        log.info("deleting %s %s/%s (no longer wanted)", key[1], key[2], key[3])
        with _recorded(errors, key[1] + "/" + key[3]):
            self.kube.delete(key)
            self.store.put("objects", key, None)
            self.applied.pop(key, None)

    def _label(
        self,
        node: NodeInfo,
        labels: Mapping[str, str],
        releases: Mapping[str, str],
        errors: dict[str, str],
        stale: list[str],
    ) -> None:
        log.info("node %s: operator labels %s", node.name, sorted(labels))
        with _recorded(errors, f"node/{node.name}"):
            # On the node as the plan saw it: if k8s-driver-manager or mig-manager changed a label since,
            # the write conflicts (409) rather than undo their pause, and the next pass decides again.
            apply = partial(self.kube.apply_node_labels, node.name, labels, node.resource_version)
            if _unless_changed(f"node/{node.name}", stale, apply) and releases:
                log.info("node %s: removing shared labels %s", node.name, sorted(releases))
                self.kube.rewrite_labels("Node", node.name, {k: (v, None) for k, v in releases.items()})

    def _write_namespace(
        self, namespace: NamespaceInfo, write: NamespaceWrite, errors: dict[str, str], stale: list[str]
    ) -> None:
        log.info("namespace %s: pod-security labels %s", namespace.name, write.labels or "released")
        what = f"namespace/{namespace.name}"
        with _recorded(errors, what):
            metadata = {
                "name": namespace.name,
                "resourceVersion": namespace.resource_version,
                "labels": write.labels,
                "annotations": write.annotations,
            }
            if write.restore:
                restore = {key: (PRIVILEGED, value) for key, value in write.restore.items()}
                self.kube.rewrite_labels("Namespace", namespace.name, restore)
                del metadata["resourceVersion"]  # the restore moved it on
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
            _unless_changed(what, stale, partial(self.kube.apply, body))

    def _write_statuses(self, plan: Plan) -> None:
        stamp = now()
        for name, status in plan.statuses.items():
            policy = next((p for p in self.store.policies.values() if p.name == name), None)
            if policy is None:
                continue
            if status_differs(policy.status, status):
                try:
                    self.kube.patch_status(name, status)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    continue  # deleted meanwhile; its DELETED event is on the way
            self._post_events(
                policy, status, plan.notes if plan.active and plan.active.name == name else [], stamp
            )

    def _event(self, ref: Mapping[str, str], type_: str, reason: str, message: str, stamp: str) -> None:
        # Events are a courtesy; the status already says it all, so a failure must not fail the pass.
        try:
            self.kube.post_event(ref, type_, reason, message, stamp)
        except ApiError as exc:
            log.warning("could not post Event %s on ClusterPolicy %s: %s", reason, ref["name"], exc)

    def _post_events(
        self, policy: PolicyRef, status: Mapping[str, Any], notes: Sequence[Note], stamp: str
    ) -> None:
        error: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Error"), {})
        signature = (str(status.get("state")), str(error.get("reason", "")), *notes)
        if self.reported.get(policy.name) == signature:
            return
        previous = self.reported.get(policy.name)
        self.reported[policy.name] = signature
        ref = {"name": policy.name, "uid": policy.uid}
        if previous is None and not status_differs(policy.status, status):
            return  # restarted operator, nothing new to say
        state = status.get("state")
        if state == "ready":
            self._event(ref, "Normal", "Ready", "all GPU operands are ready", stamp)
        elif state == "ignored":
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            self._event(ref, "Normal", "Ignored", ready["message"], stamp)
        elif error.get("reason") == REASON_OPERAND_NOT_READY and not any(
            c.get("nodesFailing") for c in status.get("components", [])
        ):
            # Rolling out, nothing failing: news, not a warning.
            self._event(ref, "Normal", "Progressing", error.get("message", ""), stamp)
        elif error.get("reason"):
            self._event(ref, "Warning", error["reason"], error.get("message", ""), stamp)
        for note in notes:
            if previous is None or note not in previous:
                self._event(ref, "Warning", note.reason, note, stamp)
