"""Carries out a plan: the watch caches in, API writes out, and only the writes that change something.

Only I/O: `Reconciler.run_once` takes a snapshot of the Store (filled by the watch handlers), lets the
pure core decide (plan.build), carries out the writes, hands what they returned back to the pure side
(plan.conclude: the final status and the Events) and writes that. Writes happen only when the desired
state differs from what the watches show, so a converged cluster costs the API server nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpu_operator.kube import ApiError, Kube
from gpu_operator.nodes import NodeInfo
from gpu_operator.observed import (
    HASH_ANNOTATION,
    ObjectKey,
    component_of,
    object_info,
    object_key,
)
from gpu_operator.plan import Applied, Conclusion, Plan, build, conclude, in_sync
from gpu_operator.psa import PRIVILEGED, NamespaceInfo, NamespaceWrite
from gpu_operator.settings import Settings
from gpu_operator.status import Signature
from gpu_operator.store import Store

log = logging.getLogger("gpu_operator")


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
    """The pass's plan, with the final statuses."""
    errors: Mapping[str, str]
    """What could not be written (component or object → the API server's message)."""
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
    settings: Settings
    nvidia_driver_crd: bool = False
    applied: dict[ObjectKey, Applied] = field(default_factory=dict)
    reported: dict[str, Signature] = field(default_factory=dict)
    """Policy name → what the Events posted for it have said."""
    pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(self.settings.writers, "gpu-operator-write")

    def run_once(self) -> Outcome:
        """One pass. API errors on single objects do not stop the pass: every other object, node
        and status is still handled, and the errors go into the status and the returned Outcome.

        Writes run in parallel (a 1000-node rollout is 1000 label patches per stage), except that a
        component's own objects go in order: its ServiceAccount and RBAC before its DaemonSet."""
        stamp = now()
        observed = self.store.snapshot(self.settings.namespace, self.settings.environ, self.nvidia_driver_crd)
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
        conclusion = conclude(plan, observed.policies, errors, self.reported, stamp)
        self._write_statuses(conclusion)
        return Outcome(conclusion.plan, errors, tuple(sorted(stale)))

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
            if in_sync(desired_hash, self.store.get("objects", key), self.applied.get(key)):
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

    def _write_statuses(self, conclusion: Conclusion) -> None:
        for name, events in conclusion.events.items():
            body = conclusion.status_writes.get(name)
            if body is not None:
                try:
                    self.kube.patch_status(name, body)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    continue  # deleted meanwhile; its DELETED event is on the way
            self.reported[name] = conclusion.reported[name]
            stamp = now()
            for event in events:
                # Events are a courtesy; the status already says it all, so a failure must not fail
                # the pass.
                try:
                    self.kube.post_event(
                        {"name": event.policy, "uid": event.uid},
                        event.type,
                        event.reason,
                        event.message,
                        stamp,
                    )
                except ApiError as exc:
                    log.warning("could not post Event %s on ClusterPolicy %s: %s", event.reason, name, exc)
