"""Kopf wiring: watch handlers fill the Store and wake one reconcile loop; nothing else lives here.

Why one loop instead of Kopf's create/update handlers: every decision depends on the whole cluster
(nodes, pods, DaemonSets and every ClusterPolicy), so any change anywhere means "reconcile again".
A single-flight loop coalesces bursts of watch events into one pass and never runs two passes at
once. ClusterPolicy events (the initial listing at start-up, create, update, delete) wake it like
any other. Kopf's own per-object annotations and finalizers are not used, so the operator writes
nothing to a ClusterPolicy but its status, and deleting a policy never waits for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from gpu_operator import metrics, safe_json, server
from gpu_operator.api import MAX_DEPTH, too_deep
from gpu_operator.api.crd import crd
from gpu_operator.kube import ApiError, Kube, load_api_client
from gpu_operator.nodes import node_info
from gpu_operator.observed import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    config_map_keys,
    daemonset_info,
    object_info,
    object_key,
    pod_info,
)
from gpu_operator.plan import PolicyRef, content_hash
from gpu_operator.psa import namespace_info
from gpu_operator.reconciler import SERVICE_MONITOR_CRD, Outcome, Reconciler, Store

log = logging.getLogger("gpu_operator")

# Before any watch starts: no policy content, however deep, can make Kopf's decoding raise.
safe_json.install()

SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
RESYNC_SECONDS = 600.0
"""Safety net only: a pass with nothing changed reads caches and writes nothing."""
MAX_BACKOFF = 60.0
STALE_RETRY_SECONDS = 0.5

# Kinds the operator creates (watched with a server-side label selector, for drift repair; ConfigMaps
# without it, see _record_config_map).
CONFIG_MAPS = ("", "v1", "configmaps")
MANAGED = [
    ("", "v1", "serviceaccounts"),
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("apps", "v1", "daemonsets"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
    ("node.k8s.io", "v1", "runtimeclasses"),
    # Served only while the Prometheus operator's CRD exists; Kopf starts the watch when it appears.
    ("monitoring.coreos.com", "v1", "servicemonitors"),
]
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf builds an "essence" (a deep copy) of every watched body to detect changes for
    create/update handlers, and strips it again for its progress storage: most of its CPU time with
    9000 operand pods. This operator has only watch and index handlers, which never use it."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


class RejectedWrites(Exception):
    """Some writes were rejected (already reported in the status); retry with backoff."""


class Loop:
    """The single-flight reconcile loop."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.wakeup = asyncio.Event()
        self.listed = asyncio.Event()
        """Set once Kopf has listed every watched kind (see the watches below)."""
        self.completed = asyncio.Event()
        """Set once a pass has run to its end (some writes may have been rejected)."""
        self.passes = 0
        self.failures = 0
        self.last_error = ""

    def wake(self) -> None:
        self.wakeup.set()

    async def run(self) -> None:
        backoff = 1.0
        await self.listed.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=RESYNC_SECONDS)
            self.wakeup.clear()
            try:
                outcome = await asyncio.to_thread(self._timed_pass)
                self.completed.set()
                if outcome.stale:
                    # The watch may bring the node's new version without a change a pass would react
                    # to (a status update): look again shortly, without counting a failure.
                    asyncio.get_running_loop().call_later(STALE_RETRY_SECONDS, self.wake)
                if outcome.errors:
                    raise RejectedWrites("; ".join(f"{k}: {v}" for k, v in outcome.errors.items()))
            except (ApiError, OSError, RejectedWrites) as exc:
                # API trouble: retry later; watch events in between wake us sooner.
                self.failures += 1
                self.last_error = str(exc)
                log.warning("reconcile failed, retrying in %.0fs: %s", backoff, exc)
                asyncio.get_running_loop().call_later(backoff, self.wake)
                backoff = min(backoff * 2, MAX_BACKOFF)
            except Exception:
                self.failures += 1
                log.exception("reconcile failed with an unexpected error")
                asyncio.get_running_loop().call_later(backoff, self.wake)
                backoff = min(backoff * 2, MAX_BACKOFF)
            else:
                self.passes += 1
                backoff = 1.0

    def _timed_pass(self) -> Outcome:
        started = time.monotonic()
        try:
            outcome = self.reconciler.run_once()
        except Exception as exc:
            bug = not isinstance(exc, ApiError | OSError)
            metrics.observe_aborted_pass(time.monotonic() - started, operator_error=bug)
            raise
        metrics.observe_pass(outcome.plan, outcome.errors, outcome.gpu_nodes, time.monotonic() - started)
        return outcome


STORE = Store()
LOOP: Loop | None = None


def _policy_ref(body: Mapping[str, Any]) -> PolicyRef:
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


# --- watches ------------------------------------------------------------------------------------
#
# Each watched kind gets two handlers. An index handler records every listed or changed object in
# the Store: Kopf runs the index handlers for the initial listing of *every* indexed kind before it
# runs any event handler, so the Store is complete before the first pass, and a pass never mistakes
# "not listed yet" for "deleted". An event handler records deletions (index handlers do not see
# them) and, by running at all, tells the loop that the initial listings are done.

Recorder = Callable[[Mapping[str, Any], bool], bool]
"""(body, deleted) → whether the Store changed in a way that needs a pass."""


def _record_policy(body: Mapping[str, Any], deleted: bool) -> bool:
    name = body["metadata"]["name"]
    if deleted:
        return STORE.put("policies", name, None)
    ref = _policy_ref(body)
    before = STORE.policies.get(name)
    STORE.put("policies", name, ref)
    # Our own status writes come back as events too; only spec or identity changes need a pass.
    return before is None or (before.spec, before.generation, before.uid) != (
        ref.spec,
        ref.generation,
        ref.uid,
    )


def _record_node(body: Mapping[str, Any], deleted: bool) -> bool:
    return STORE.put("nodes", body["metadata"]["name"], None if deleted else node_info(body))


def _record_pod(body: Mapping[str, Any], deleted: bool) -> bool:
    key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
    return STORE.put("pods", key, None if deleted else pod_info(body))


def _record_managed(body: Mapping[str, Any], deleted: bool) -> bool:
    key = object_key(body)
    changed = STORE.put("objects", key, None if deleted else object_info(body))
    if body["kind"] == "DaemonSet":
        changed |= STORE.put("daemonsets", key, None if deleted else daemonset_info(body))
    return changed


def _record_config_map(body: Mapping[str, Any], deleted: bool) -> bool:
    """ConfigMaps are watched without the label selector: the driver mounts the files of users'
    ConfigMaps (repoConfig, certConfig, kernelModuleConfig) one by one, so it needs their keys."""
    ours = (body["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
    changed = _record_managed(body, deleted or not ours)
    keys = None if deleted else config_map_keys(body)
    return STORE.put("config_maps", body["metadata"]["name"], keys) or changed


def _record_crd(body: Mapping[str, Any], deleted: bool) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
    return STORE.put("crds", body["metadata"]["name"], None if deleted else established)


def _record_namespace(body: Mapping[str, Any], deleted: bool) -> bool:
    return STORE.put("namespaces", body["metadata"]["name"], None if deleted else namespace_info(body))


def _watch(group: str, version: str, plural: str, record: Recorder, labels: dict[str, str] | None) -> None:
    async def store(body: kopf.Body, **_: Any) -> None:
        if record(body, False) and LOOP is not None:
            LOOP.wake()

    async def event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        metrics.observe_watch_event(body.get("kind") or plural, event["type"])
        if LOOP is None:
            return
        LOOP.listed.set()
        if event["type"] == "DELETED" and record(body, True):
            LOOP.wake()

    kopf.index(group, version, plural, id=f"store-{plural}", labels=labels)(store)
    kopf.on.event(group, version, plural, id=f"events-{plural}", labels=labels)(event)


_OURS = {MANAGED_BY_LABEL: MANAGED_BY}
_watch("nvidia.com", "v1", "clusterpolicies", _record_policy, None)
_watch("", "v1", "nodes", _record_node, None)
_watch("", "v1", "pods", _record_pod, _OURS)
for _group, _version, _plural in MANAGED:
    if (_group, _version, _plural) == CONFIG_MAPS:
        _watch(_group, _version, _plural, _record_config_map, None)
    else:
        _watch(_group, _version, _plural, _record_managed, _OURS)
# Both narrowed to one object by field selectors (startup, below): the ServiceMonitor CRD and the
# operand namespace.
_watch(CRDS[0], "v1", CRDS[1], _record_crd, None)
_watch(NAMESPACES[0], "v1", NAMESPACES[1], _record_namespace, None)


CRD_HASH_ANNOTATION = "nvidia.com/gpu-operator.crd-hash"


def ensure_crd(kube: Kube) -> None:
    """Server-side apply our own CRD when the cluster's differs, so a `helm upgrade` (Helm never
    upgrades CRDs) or a new image never runs against a stale schema that prunes new fields."""
    body = crd()
    body["metadata"].setdefault("annotations", {})[CRD_HASH_ANNOTATION] = content_hash(body)
    try:
        current = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", body["metadata"]["name"])
    except ApiError as exc:
        if exc.status != 404:
            log.warning("cannot read the ClusterPolicy CRD (%s); leaving it as it is", exc)
            return
        current = {}
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if annotations.get(CRD_HASH_ANNOTATION) == body["metadata"]["annotations"][CRD_HASH_ANNOTATION]:
        return
    try:
        kube.apply(body)
        log.info("applied the ClusterPolicy CRD (schema changed)")
    except ApiError as exc:
        log.warning("cannot update the ClusterPolicy CRD (%s); it may be stale", exc)


def _has_crd(kube: Kube, name: str) -> bool:
    try:
        kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    except ApiError:
        return False
    return True


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    global LOOP
    settings.posting.enabled = (
        False  # we post our own Events, on the ClusterPolicy, where describe finds them
    )
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # Initial LISTs in pages: 9000 operand pods at 1000 nodes are never one response in memory.
    settings.watching.chunk_size = 500
    for group, version, plural in MANAGED:
        if (group, version, plural) != CONFIG_MAPS:
            settings.watching.label_selectors[group, plural] = SELECTOR
    settings.watching.label_selectors["", "pods"] = SELECTOR
    namespace: str = memo["namespace"]
    # Kopf's scanning (its own CRD and namespace watches) stays on, narrowed to the two objects that
    # matter: when the ServiceMonitor CRD appears, Kopf starts serving servicemonitors without a
    # restart; the namespace watch serves both Kopf and psa.enabled. RBAC allows just these names.
    settings.watching.field_selectors[CRDS] = f"metadata.name={SERVICE_MONITOR_CRD}"
    settings.watching.field_selectors[NAMESPACES] = f"metadata.name={namespace}"
    kube = Kube(load_api_client())
    await asyncio.to_thread(ensure_crd, kube)
    nvidia_driver = await asyncio.to_thread(_has_crd, kube, "nvidiadrivers.nvidia.com")
    reconciler = Reconciler(kube, STORE, namespace, dict(os.environ), nvidia_driver_crd=nvidia_driver)
    LOOP = Loop(reconciler)
    memo["task"] = asyncio.create_task(LOOP.run())


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("task")
    if task is not None:
        task.cancel()


# --- probes (served by gpu_operator/server.py) ---------------------------------------------------


def health() -> tuple[bool, dict[str, Any]]:
    """Liveness: the event loop answers. The body is what Kopf's probe endpoint used to show."""
    if LOOP is None:
        return True, {"reconcile": {"started": False}}
    return True, {
        "reconcile": {
            "passes": LOOP.passes,
            "failures": LOOP.failures,
            "lastError": LOOP.last_error,
            "nodes": len(STORE.nodes),
            "pods": len(STORE.pods),
        }
    }


def ready() -> tuple[bool, dict[str, Any]]:
    """Readiness: every watch has listed its kind, and a pass has run to its end since."""
    listed = LOOP is not None and LOOP.listed.is_set()
    completed = LOOP is not None and LOOP.completed.is_set()
    return listed and completed, {"watchesEstablished": listed, "firstPassDone": completed}


def run(namespace: str, log_format: str = "plain", listen: str = "", verbose: bool = False) -> None:
    """Run the operator until interrupted: operands in `namespace`, ClusterPolicies cluster-wide;
    `listen` (HOST:PORT, empty for none) serves /metrics, /healthz and /readyz."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])
    logging.getLogger("aiohttp.access").propagate = False
    if not verbose:
        # Kopf logs every watch event's handler at INFO; our own log says what was done.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    with contextlib.suppress(asyncio.CancelledError):  # as kopf.run
        asyncio.run(_serve(namespace, listen))


async def _serve(namespace: str, listen: str) -> None:
    # The HTTP server first, so a busy port fails at once (server.ServerError) and the probes answer
    # while Kopf starts: /healthz says "not started", /readyz 503.
    running = await server.start(listen, health, ready, metrics.REGISTRY) if listen else None
    try:
        await kopf.operator(standalone=True, namespaces=[namespace], memo=kopf.Memo(namespace=namespace))
    finally:
        if running is not None:
            await running.stop()
