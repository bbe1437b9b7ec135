"""Carries out a plan: the watch caches in, API writes out, and only the writes that change something.

Only I/O: `Reconciler.run_once` takes a snapshot of the Store (filled by the informers) and lets the
pure core decide: gpu_operator/core/proof.py plans the pass and asks, step by step, what it needs to
prove the change (lookups, dry runs), which this module answers; it carries out the writes of a proven
change in the order and at the pace the core sets (gpu_operator/core/writes.py), hands what they
returned back to the pure side (plan.conclude: the final status and the Events) and writes that. What
a pass leaves for the next is the core's Memory (gpu_operator/core/memory.py): the reconciler holds it
and records in it what the API server answered. Writes, and the questions before them, happen only
when the desired state differs from what the watches show, so a converged cluster costs the API
server nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

from gpu_operator.api import gpucluster, nvidiadriver
from gpu_operator.api.crd import CLUSTER_POLICY, RESOURCES, Resource, definition
from gpu_operator.core.answers import (
    Failure,
    changed_since_read,
    eviction_result,
    gone,
    nothing_to_delete,
)
from gpu_operator.core.driver_pool_status import DriverEvent
from gpu_operator.core.gpucluster_plan import FINALIZER, DRAPlan
from gpu_operator.core.memory import Memory
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import (
    ObjectKey,
    component_of,
    object_info,
    object_key,
)
from gpu_operator.core.ownership import HASH_ANNOTATION
from gpu_operator.core.plan import (
    Applied,
    Conclusion,
    LabelRewrites,
    Observed,
    Plan,
    conclude,
    content_hash,
    unlisted_pods,
)
from gpu_operator.core.proof import Answer, LookUp, Proven, Question, prove
from gpu_operator.core.psa import NamespaceInfo, NamespaceWrite
from gpu_operator.core.upgrade import (
    DeletePod,
    EvictionResult,
    EvictPod,
    NodeActions,
    PatchNode,
    UpgradeEvent,
    announcements,
    event_subject,
    rounds,
)
from gpu_operator.core.upgrade.facts import format_time
from gpu_operator.core.vetting import Lookup, Verdict
from gpu_operator.core.writes import (
    deletes_after,
    in_waves,
    label_version,
    labelled_components,
    next_pass_at,
    paced_statuses,
    unsettled,
    version_after_conflict,
)
from gpu_operator.runtime.client import ApiError, Kube, NotLeader, preconditioned
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

log = logging.getLogger("gpu_operator")
T = TypeVar("T")


CRD_API = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CRD_HASH_ANNOTATION = "nvidia.com/gpu-operator.crd-hash"


async def ensure_crd(kube: Kube, create: bool, resource: Resource = CLUSTER_POLICY) -> bool:
    """Server-side apply one of our CRDs when the cluster's differs, so a `helm upgrade` (Helm never
    upgrades CRDs) or a new image never runs against a stale schema that prunes new fields; create it
    when it is absent only with `create` (the chart's operator.createCRD). True when it is current."""
    body = definition(resource)
    body["metadata"].setdefault("annotations", {})[CRD_HASH_ANNOTATION] = content_hash(body)
    try:
        current = await kube.get(*CRD_API, resource.name)
    except ApiError as exc:
        if not gone(exc.failure):
            log.warning("cannot read the %s CRD (%s); leaving it as it is", resource.kind, exc)
            return False
        if not create:
            # Without the ClusterPolicy's nothing runs; without NVIDIADriver's, only that API is missing.
            level = logging.WARNING if resource is CLUSTER_POLICY else logging.DEBUG
            log.log(level, "the %s CRD is not installed (operator.createCRD is off)", resource.kind)
            return False
        current = {}
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if annotations.get(CRD_HASH_ANNOTATION) == body["metadata"]["annotations"][CRD_HASH_ANNOTATION]:
        return True
    try:
        await kube.apply(body)
    except ApiError as exc:
        log.warning("cannot apply the %s CRD (%s); it may be stale", resource.kind, exc)
        return False
    log.info("%s the %s CRD", "updated" if current else "created", resource.kind)
    return True


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodWatches(Protocol):
    """What the reconciler asks of gpu_operator/runtime/drain_watches.py: watch the pods of exactly these
    nodes,
    and wait (bounded) for the first listing of nodes newly watched."""

    def follow(self, nodes: Iterable[str]) -> None: ...

    async def wait_listed(self, nodes: Iterable[str], timeout: float) -> bool: ...


LISTING_SECONDS = 5.0
"""How long a pass waits for the pods of nodes whose upgrade it starts, before it plans again."""


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    """The pass's plan, with the final statuses."""
    errors: Mapping[str, str]
    """What could not be written, and why (component, object or generation → message): retried."""
    stale: tuple[str, ...] = ()
    """Objects (node/..., namespace/...) that changed between the snapshot and their write: a new
    pass should follow soon."""
    wake_at: float | None = None
    """Run a pass at this time (Unix seconds) even if no watch event comes: the driver upgrade's next
    timeout or eviction retry."""


def _log_rewrites(node: str, rewrites: LabelRewrites) -> None:
    removed = sorted(key for key, (_, new) in rewrites.items() if new is None)
    changed = {key: new for key, (_, new) in sorted(rewrites.items()) if new is not None}
    if removed:
        log.info("node %s: removing labels %s", node, removed)
    if changed:
        log.info("node %s: setting labels %s", node, changed)


@asynccontextmanager
async def _recorded(errors: dict[str, str], what: str) -> AsyncIterator[None]:
    """Run one write; whatever the API server answers (a refusal, a 5xx, no answer at all), the failure
    is recorded and the pass goes on with every other object, node and status: the work queue retries the
    pass with backoff. Except NotLeader: a replica that lost the lease stops writing at once."""
    try:
        yield
    except NotLeader:
        raise
    except ApiError as exc:
        log.warning("%s: %s", what, exc)
        errors.setdefault(what, str(exc))


async def _unless_changed(what: str, stale: list[str], write: Callable[[], Awaitable[object]]) -> bool:
    """Run a write that carries the uid and resourceVersion the plan saw. An object changed since (a
    manager's pause, an admin's label), deleted or replaced (answers.changed_since_read) leaves the
    write to the next pass, which is asked for. True when the write went through."""
    try:
        await write()
    except ApiError as exc:
        if not changed_since_read(exc.failure):
            raise
        _left_to_next_pass(what, stale)
        return False
    return True


def _left_to_next_pass(what: str, stale: list[str]) -> None:
    log.info("%s changed since this pass read it; the next pass decides again", what)
    stale.append(what)


@dataclass
class Reconciler:
    kube: Kube
    store: Store
    settings: Settings
    crds_current: set[str] = field(default_factory=set)
    """Our CRDs found at our schema (each checked again when its watch says it went)."""
    memory: Memory = field(default_factory=Memory)
    """What each pass leaves for the next (core/memory.py): one for the operator's life."""
    pod_watches: PodWatches | None = None
    """The pods of the nodes a driver upgrade empties (None: none are watched, as in unit tests that
    feed the Store themselves)."""
    writers: asyncio.Semaphore = field(init=False)
    """Writes in flight at once: node labels, deletes, upgrade writes, lookups and dry runs."""
    appliers: asyncio.Semaphore = field(init=False)
    """Applies of operand objects in flight at once, beside the writers."""

    async def run_once(self) -> Outcome:
        """One pass. A change is proven before any of it is written (gpu_operator/core/vetting.py); API
        errors on single objects do not stop the pass: every other object, node and status is still
        handled, and the errors go into the status and the returned Outcome.

        Writes run in parallel (a rollout is a label patch per node and stage), the objects in
        waves (`writes.in_waves`): a component's DaemonSet after its ServiceAccount, RBAC and ConfigMaps."""
        # A pass's own limits (passes run one at a time), on the event loop that runs it.
        self.writers = asyncio.Semaphore(self.settings.writers)
        self.appliers = asyncio.Semaphore(self.settings.appliers)
        await self._ensure_crds()
        clock = time.time()
        stamp = format_time(clock)
        observed, plan, verdict = await self._plan(stamp, clock)
        unlisted = unlisted_pods(observed, plan)
        if (
            unlisted
            and self.pod_watches is not None
            and await self.pod_watches.wait_listed(unlisted, LISTING_SECONDS)
        ):
            # Nodes about to start their upgrade (or met mid-way after a restart): with their pods
            # listed, this pass takes them as far as they go (cordon, evictions, driver restart) instead
            # of cordoning them and waiting for a pass of their own.
            clock = time.time()
            stamp = format_time(clock)
            observed, plan, verdict = await self._plan(stamp, clock)
        errors: dict[str, str] = {}
        label_errors: dict[str, str] = {}
        stale: list[str] = []
        # The node labels go out with the objects, not after them, each within a limit of their own
        # (the writers, the appliers): a deploy label needs nothing but the proven plan (the DaemonSet
        # controller creates the pods once both are there), and neither queues behind the other. After
        # the objects, a stage's labels would wait for every component's chain of applies; behind a
        # large stage's labels, the driver's DaemonSet would wait for all of them, and with it the
        # pods the labels are for (measured: bench/README.md).
        labelling = [
            partial(
                self._label,
                observed.nodes[node],
                labels,
                plan.label_rewrites.get(node, {}),
                label_errors,
                stale,
            )
            for node, labels in plan.node_labels.items()
        ]
        # Nodes with only labels to rewrite (an uninstall's: the operand managers' deploy labels).
        labelling += [
            partial(self._rewrite, node, rewrites, label_errors)
            for node, rewrites in plan.label_rewrites.items()
            if node not in plan.node_labels
        ]
        labelled = asyncio.ensure_future(_gather(labelling, self.writers))
        upgrade = plan.upgrade
        first, rest = announcements(upgrade.actions) if upgrade is not None else ([], [])
        policy = {"name": plan.active.name, "uid": plan.active.uid} if plan.active is not None else {}
        subject = partial(
            event_subject,
            node_uids={name: node.uid for name, node in observed.nodes.items()},
            policy=policy,
            driver_uids={driver.name: driver.uid for driver in observed.drivers},
        )
        refused: list[str] = []
        failed: list[str] = []
        try:
            if policy and first:
                # Before any object: a driver pod started by this pass's DaemonSet finds the annotation.
                # One that fails holds back no other node's upgrade writes (its error is reported).
                await _gather(
                    [partial(self._upgrade_node, actions, subject, errors, refused, []) for actions in first],
                    self.writers,
                )
            if plan.dra is not None:
                # Before its objects: the finalizer that orders their teardown, the namespace label
                # their admin-access claims need.
                await self._prepare_gpucluster(plan.dra, observed, errors)
            leading = labelled_components(plan.node_labels) if verdict.writes else set()
            for wave in in_waves(verdict.writes, leading):
                await _gather([partial(self._apply, body, errors) for body in wave], self.appliers)
        finally:
            # However the objects went, the labels under way are waited for; their failure is raised
            # unless the objects' came first.
            await asyncio.wait([labelled])
            label_failure = labelled.exception()
        if label_failure is not None:
            raise label_failure
        deletes = deletes_after(verdict.deletes, errors)
        await _gather(
            [partial(self._delete, key, plan.propagation(key), errors) for key in deletes], self.writers
        )
        errors.update(label_errors)
        if plan.namespace_write is not None and observed.operand_namespace is not None:
            await self._write_namespace(observed.operand_namespace, plan.namespace_write, errors, stale)
        if policy:
            # A round only once every node of the one before went through (core/upgrade/writes.py).
            for round_ in rounds(rest):
                if not failed:
                    await _gather(
                        [
                            partial(self._upgrade_node, actions, subject, errors, refused, failed)
                            for actions in round_
                        ],
                        self.writers,
                    )
        if self.pod_watches is not None:
            self.pod_watches.follow(plan.pods_needed)
        conclusion = conclude(plan, observed.policies, errors, self.memory.reported, stamp, verdict.conflicts)
        self.memory.written(plan, errors)
        status_due = await self._write_statuses(conclusion)
        await self._write_driver_statuses(plan.driver_status_writes, plan.driver_events)
        if plan.dra is not None:
            await self._finish_gpucluster(plan.dra, errors)
        wake_at = next_pass_at(upgrade, status_due, bool(refused), clock)
        left = unsettled(plan, verdict.conflicts, errors)
        return Outcome(conclusion.plan, left, tuple(sorted(stale)), wake_at)

    async def _ensure_crds(self) -> None:
        for resource in RESOURCES.values():
            if self.store.get("crds", resource.name) is False:
                # The watch saw it go (or not established yet): create it again (operator.createCRD).
                # The informer of its objects lists them again as soon as the CRD's events arrive.
                self.crds_current.discard(resource.name)
            if resource.name not in self.crds_current and await ensure_crd(
                self.kube, self.settings.create_crd, resource
            ):
                self.crds_current.add(resource.name)
                self.store.put("crds", resource.name, True)

    async def _plan(self, stamp: str, clock: float) -> tuple[Observed, Plan, Verdict]:
        """The plan to carry out and its proven change (core/proof.py decides; this asks the API server
        what it wants to know)."""
        observed = self.memory.with_evictions(
            self.store.snapshot(self.settings.namespace, self.settings.environ)
        )
        proof = prove(observed, stamp, clock, self.memory, self.settings.namespace)
        try:
            question = next(proof)
            while True:
                question = proof.send(await self._answer(question))
        except StopIteration as done:
            proven: Proven = done.value
        for what, failure in proven.unchecked:
            log.warning("cannot check whether %s exists: %s", what, failure)
        return observed, proven.plan, proven.verdict

    async def _answer(self, question: Question) -> Answer:
        """What the API server says to the proof's question, by key."""
        if isinstance(question, LookUp):
            found = await _gather([partial(self._metadata, key) for key in question.keys], self.writers)
            return dict(zip(question.keys, found, strict=True))
        return dict(await _gather([partial(self._dry_run, body) for body in question.bodies], self.writers))

    async def _metadata(self, key: ObjectKey) -> Lookup:
        api_version, kind, namespace, name = key
        try:
            return await self.kube.metadata(api_version, kind, name, namespace)
        except ApiError as exc:
            return exc.failure

    async def _dry_run(self, body: dict[str, Any]) -> tuple[ObjectKey, Failure | None]:
        try:
            await self.kube.apply(body, dry_run=True)
        except NotLeader:
            raise
        except ApiError as exc:
            return object_key(body), exc.failure
        return object_key(body), None

    async def _apply(self, body: dict[str, Any], errors: dict[str, str]) -> None:
        key = object_key(body)
        desired_hash = body["metadata"]["annotations"][HASH_ANNOTATION]
        component = component_of(body["metadata"]) or key[1]
        async with _recorded(errors, component):
            result = await self.kube.apply(body)
            log.info("applied %s %s/%s", key[1], key[2], key[3])
            info = object_info(result)
            self.store.put("objects", key, info)
            self.memory.applied[key] = Applied(desired_hash, info.generation, info.resource_version)

    async def _delete(self, key: ObjectKey, propagation: str, errors: dict[str, str]) -> None:
        log.info("deleting %s %s/%s (no longer wanted; propagation %s)", key[1], key[2], key[3], propagation)
        async with _recorded(errors, key[1] + "/" + key[3]):
            await self.kube.delete(key, propagation)
            self.store.put("objects", key, None)
            self.memory.applied.pop(key, None)

    async def _label(
        self,
        node: NodeInfo,
        labels: Mapping[str, str],
        rewrites: LabelRewrites,
        errors: dict[str, str],
        stale: list[str],
    ) -> None:
        log.info("node %s: operator labels %s", node.name, sorted(labels))
        what = f"node/{node.name}"
        async with _recorded(errors, what):
            # On the node as the plan saw it: if k8s-driver-manager or mig-manager changed a label since,
            # the write conflicts (409) rather than undo their pause, and the next pass decides again.
            # Its uid too: a node deleted meanwhile is never created again by the write.
            async def apply(version: str) -> None:
                written = await self.kube.apply_node_labels(node.name, labels, node.uid, version)
                # The node as written, before its watch event: a pass in between must not write the
                # same labels again on the version this one replaced (a 409), and the event, equal to
                # it, wakes no pass.
                self.store.record_node(written, False)

            # A stage's label writes queue for seconds on a busy API server: the watch may have brought
            # a newer node meanwhile (writes.label_version decides whether the write still goes).
            version = label_version(node, self.store.get("nodes", node.name))
            if version is None:
                _left_to_next_pass(what, stale)
                return
            done = await _unless_changed(what, stale, partial(apply, version))
            if not done:
                again = version_after_conflict(node, await self._node_after_conflict(node.name, version))
                if again is not None:
                    stale.remove(what)
                    done = await _unless_changed(what, stale, partial(apply, again))
            if done and rewrites:
                await self._rewrite_node(node.name, rewrites)

    async def _rewrite(self, node: str, rewrites: LabelRewrites, errors: dict[str, str]) -> None:
        """Change labels the operator does not own, each only if it still has the value planned on (a
        change meanwhile leaves them all to the next pass, which the change's watch event wakes)."""
        async with _recorded(errors, f"node/{node}"):
            await self._rewrite_node(node, rewrites)

    async def _rewrite_node(self, node: str, rewrites: LabelRewrites) -> None:
        _log_rewrites(node, rewrites)
        written = await self.kube.rewrite_labels("Node", node, rewrites)
        if written is not None:
            # As after a label apply: a pass before its watch event must not write it again.
            self.store.record_node(written, False)

    async def _node_after_conflict(self, name: str, refused: str) -> NodeInfo | None:
        """The node as it is now, after a label write on its version `refused` was refused as stale.
        Its watch event brings the newer version within about `watch_batch_seconds` (the readers
        take a running pass's events together, which is also why the Store lags the node by that
        much): waited for, at most `stale_wait_seconds`, instead of reading the node (otherwise a large
        rollout reads back a good share of its nodes, one GET each; measured: bench/README.md); read
        only if it does not come."""
        arrived, found = await self.store.wait_node(name, refused, self.settings.stale_wait_seconds)
        return found if arrived else await self._refresh_node(name)

    async def _refresh_node(self, name: str) -> NodeInfo | None:
        """After a label write refused as stale: the node as it is now, into the Store, so that the next
        pass plans on it; the Store's node then (None when it could not be read). Waiting for its watch
        event instead, a node whose events lag (its watch reopened, say) stays at the refused version
        and every pass writes on it again, refused again each time (measured: bench/README.md). Only
        after a 409 on a write, so never at rest; the Store drops watch events older than what it
        holds."""
        try:
            self.store.record_node(await self.kube.get("v1", "Node", name), False)
        except ApiError as exc:
            log.info("node %s: not read again after the stale write (%s); its watch brings it", name, exc)
            return None
        found: NodeInfo | None = self.store.get("nodes", name)
        return found

    async def _upgrade_node(
        self,
        actions: NodeActions,
        subject: Callable[[UpgradeEvent], tuple[Mapping[str, str], tuple[str, str]]],
        errors: dict[str, str],
        refused: list[str],
        failed: list[str],
    ) -> None:
        """One node's driver-upgrade writes, in order, stopping at the first that fails (the node goes
        to `failed`); then its Events. Refused evictions go to `refused`.
        The node patch's result goes into the Store at once: the next pass must count this node as
        cordoned and in progress even before the watch brings it."""
        what = f"node/{actions.node}"
        for write in actions.writes:
            if isinstance(write, EvictPod):
                if not (await self._evict(write)).accepted:
                    refused.append(write.uid)
                continue
            done = False
            async with _recorded(errors, what):
                if isinstance(write, PatchNode):
                    log.info("node %s: driver upgrade %s", write.node, write.body())
                    self.store.record_node(await self.kube.patch_node(write.node, write.body()), False)
                else:
                    await self._delete_pod(write)
                done = True
            if not done:
                failed.append(actions.node)
                return
        stamp = now()
        for event in actions.events:
            target, kind = subject(event)
            try:
                await self.kube.post_event(target, event.type, event.reason, event.message, stamp, kind=kind)
            except ApiError as exc:
                log.warning(
                    "could not post Event %s on %s %s: %s", event.reason, kind[1], target["name"], exc
                )

    async def _evict(self, write: EvictPod) -> EvictionResult:
        """Whatever the answer, a fact for the next pass (answers.eviction_result)."""
        try:
            await self.kube.evict(write.namespace, write.name, write.body())
            result = eviction_result(None, time.time())
            log.info("evicted pod %s/%s (driver upgrade)", write.namespace, write.name)
        except ApiError as exc:
            result = eviction_result(exc.failure, time.time())
            log.info("eviction of pod %s/%s refused: %s", write.namespace, write.name, exc)
        self.memory.evictions[write.uid] = result
        return result

    async def _delete_pod(self, write: DeletePod) -> None:
        log.info("deleting pod %s/%s (%s)", write.namespace, write.name, write.why)
        try:
            await self.kube.delete_pod(write.namespace, write.name, write.body())
        except ApiError as exc:
            if not nothing_to_delete(exc.failure):
                raise

    async def _write_namespace(
        self, namespace: NamespaceInfo, write: NamespaceWrite, errors: dict[str, str], stale: list[str]
    ) -> None:
        log.info("namespace %s: pod-security labels %s", namespace.name, write.labels or "released")
        what = f"namespace/{namespace.name}"
        async with _recorded(errors, what):
            version = namespace.resource_version
            if write.restore:
                await self.kube.rewrite_labels("Namespace", namespace.name, write.restores())
                version = ""  # the restore moved it on; the uid still keeps the write from creating it
            body = preconditioned(
                "v1", "Namespace", namespace.name, write.labels, namespace.uid, version, write.annotations
            )
            await _unless_changed(what, stale, partial(self.kube.apply, body))

    async def _write_statuses(self, conclusion: Conclusion) -> float | None:
        """Write the statuses the pacing lets go now (writes.paced_statuses) and post their Events;
        when the first status held back is due (Unix seconds), or None."""
        paced = paced_statuses(
            conclusion, self.memory.status_written, self.settings.status_interval_seconds, time.monotonic()
        )
        due = None if paced.due_in is None else time.time() + paced.due_in
        for name, events in conclusion.events.items():
            body = paced.writes.get(name)
            if body is not None:
                try:
                    await self.kube.patch_status(name, body)
                except ApiError as exc:
                    if not gone(exc.failure):
                        raise
                    continue
                self.memory.status_written[name] = time.monotonic()
            self.memory.reported[name] = conclusion.reported[name]
            stamp = now()
            for event in events:
                # Events are a courtesy; the status already says it all, so a failure must not fail
                # the pass.
                try:
                    await self.kube.post_event(
                        {"name": event.policy, "uid": event.uid},
                        event.type,
                        event.reason,
                        event.message,
                        stamp,
                    )
                except ApiError as exc:
                    log.warning("could not post Event %s on ClusterPolicy %s: %s", event.reason, name, exc)
        return due

    async def _prepare_gpucluster(self, dra: DRAPlan, observed: Observed, errors: dict[str, str]) -> None:
        """The GPUCluster's finalizer (added), and the operand namespace's admin-access label."""
        for name, (version, finalizers) in dra.finalizers.items():
            if FINALIZER in finalizers:
                async with _recorded(errors, f"gpucluster/{name}"):
                    log.info("GPUCluster %s: adding finalizer %s", name, FINALIZER)
                    self.store.record_gpucluster(
                        await self.kube.set_finalizers(GPUCLUSTER, name, list(finalizers), version), False
                    )
        if dra.namespace_labels and observed.operand_namespace is not None:
            namespace = observed.operand_namespace.name
            async with _recorded(errors, f"namespace/{namespace}"):
                log.info("namespace %s: labels %s (DRA admin-access claims)", namespace, dra.namespace_labels)
                # Not put into the Store: the namespace's watch event, which carries the label, is what
                # wakes the pass that applies the objects withheld for it (DRAPlan.withheld). A pass
                # before that event adds the label again, a merge patch that changes nothing.
                await self.kube.add_labels(("v1", "Namespace"), namespace, dra.namespace_labels)

    async def _finish_gpucluster(self, dra: DRAPlan, errors: dict[str, str]) -> None:
        """The GPUClusters' statuses that differ and their Events; a finalizer whose teardown is done
        removed (the garbage collector then removes the rest of the stack)."""
        for name, (version, finalizers) in dra.finalizers.items():
            if FINALIZER not in finalizers:
                async with _recorded(errors, f"gpucluster/{name}"):
                    log.info(
                        "GPUCluster %s: its claim holders are gone; removing finalizer %s", name, FINALIZER
                    )
                    await self.kube.set_finalizers(GPUCLUSTER, name, list(finalizers), version)
        await self._write_statuses_of(
            GPUCLUSTER,
            dra.status_writes,
            dra.events,
            partial(self.kube.patch_status, kind=GPUCLUSTER),
            self.store.record_gpucluster_status,
        )

    async def _write_driver_statuses(
        self, writes: Mapping[str, Mapping[str, Any]], events: Mapping[str, Sequence[DriverEvent]]
    ) -> None:
        """The NVIDIADriver statuses that differ (the plan compared them with the cluster's, so nothing is
        written at rest), each followed by its Events. None waits for the status interval: a pool's
        upgrade status changes with its nodes' upgrade writes, not at every pass of a rollout.
        What the write returned goes into the Store: a pass before its watch event must not write the
        same status again."""
        await self._write_statuses_of(
            (nvidiadriver.API_VERSION, nvidiadriver.KIND),
            writes,
            events,
            self.kube.patch_driver_status,
            self.store.record_driver_status,
        )

    async def _write_statuses_of(
        self,
        kind: tuple[str, str],
        writes: Mapping[str, Mapping[str, Any]],
        events: Mapping[str, Sequence[DriverEvent]],
        patch: Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]],
        record: Callable[[str, Mapping[str, Any]], None],
    ) -> None:
        """Each status of `writes` (one of our custom resources, `kind`: apiVersion, kind) with `patch`,
        what it returned kept with `record`, then its Events; one deleted meanwhile is skipped."""
        for name, body in writes.items():
            log.info("%s %s: status %s", kind[1], name, body.get("state"))
            try:
                written = await patch(name, body)
            except ApiError as exc:
                if not gone(exc.failure):
                    raise
                continue
            record(name, written.get("status") or body)
            await self._post_events(kind, name, events.get(name, ()))

    async def _post_events(self, kind: tuple[str, str], name: str, events: Sequence[DriverEvent]) -> None:
        """The Events a status write comes with; one the API server refuses is logged, not retried (the
        status says the same)."""
        for event in events:
            try:
                await self.kube.post_event(
                    {"name": event.name, "uid": event.uid},
                    event.type,
                    event.reason,
                    event.message,
                    now(),
                    kind=kind,
                )
            except ApiError as exc:
                log.warning("could not post Event %s on %s %s: %s", event.reason, kind[1], name, exc)


GPUCLUSTER = (gpucluster.API_VERSION, gpucluster.KIND)


async def _gather(jobs: Sequence[Callable[[], Awaitable[T]]], limit: asyncio.Semaphore) -> list[T]:
    """Run the jobs, as many at once as `limit` lets; their results, in order. The first failure is
    raised once all have finished: a write that fails never leaves another half done."""
    results: list[T | None] = [None] * len(jobs)
    failures: dict[int, BaseException] = {}

    async def run(index: int) -> None:
        async with limit:
            try:
                results[index] = await jobs[index]()
            except Exception as exc:
                failures[index] = exc

    await asyncio.gather(*(run(index) for index in range(len(jobs))))
    if failures:
        raise failures[min(failures)]
    return results  # type: ignore[return-value]
