"""Kopf wiring: watch handlers fill the Store and wake the reconcile loop; nothing else lives here.

ClusterPolicy events (the initial listing at start-up, create, update, delete) wake the loop
(gpu_operator/loop.py) like any other. Kopf's own per-object annotations and finalizers are not used,
so the operator writes nothing to a ClusterPolicy but its status, and deleting a policy never waits for
the operator. Nothing is module state: `run` builds the Store, the loop and a Kopf registry whose
handlers close over them, from the Settings the CLI made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import kopf

from gpu_operator import metrics, safe_json, server
from gpu_operator.api.crd import crd
from gpu_operator.kube import ApiError, Kube, load_api_client
from gpu_operator.labels import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.loop import Loop, health, ready
from gpu_operator.plan import SERVICE_MONITOR_CRD, content_hash
from gpu_operator.reconciler import Reconciler
from gpu_operator.settings import Settings
from gpu_operator.store import Store

log = logging.getLogger("gpu_operator")

SELECTOR = f"{MANAGED_BY_LABEL}={FIELD_MANAGER}"
_OURS = {MANAGED_BY_LABEL: FIELD_MANAGER}

# Kinds the operator creates (watched with a server-side label selector, for drift repair; ConfigMaps
# without it, see Store.record_config_map).
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

Recorder = Callable[[Mapping[str, Any], bool], bool]
"""(body, deleted) → whether the Store changed in a way that needs a pass."""


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


def watches(store: Store) -> list[tuple[str, str, str, Recorder, dict[str, str] | None]]:
    """(group, version, plural, recorder, label selector) of every watched kind."""
    found: list[tuple[str, str, str, Recorder, dict[str, str] | None]] = [
        ("nvidia.com", "v1", "clusterpolicies", store.record_policy, None),
        ("", "v1", "nodes", store.record_node, None),
        ("", "v1", "pods", store.record_pod, _OURS),
    ]
    for group, version, plural in MANAGED:
        if (group, version, plural) == CONFIG_MAPS:
            found.append((group, version, plural, store.record_config_map, None))
        else:
            found.append((group, version, plural, store.record_managed, _OURS))
    # Both narrowed to one object by field selectors (startup, below): the ServiceMonitor CRD and the
    # operand namespace.
    found.append((CRDS[0], "v1", CRDS[1], store.record_crd, None))
    found.append((NAMESPACES[0], "v1", NAMESPACES[1], store.record_namespace, None))
    return found


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


def registry(settings: Settings, store: Store, loop: Loop) -> kopf.OperatorRegistry:
    """Kopf's handlers for this operator, closed over its Store and loop.

    Each watched kind gets two handlers. An index handler records every listed or changed object in
    the Store: Kopf runs the index handlers for the initial listing of *every* indexed kind before it
    runs any event handler, so the Store is complete before the first pass, and a pass never mistakes
    "not listed yet" for "deleted". An event handler records deletions (index handlers do not see
    them) and, by running at all, tells the loop that the initial listings are done.
    """
    handlers = kopf.OperatorRegistry()

    def watch(group: str, version: str, plural: str, record: Recorder, labels: dict[str, str] | None) -> None:
        async def index(body: kopf.Body, **_: Any) -> None:
            if record(body, False):
                loop.wake()

        async def event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
            metrics.observe_watch_event(body.get("kind") or plural, event["type"])
            loop.listed.set()
            if event["type"] == "DELETED" and record(body, True):
                loop.wake()

        kopf.index(group, version, plural, id=f"store-{plural}", labels=labels, registry=handlers)(index)
        kopf.on.event(group, version, plural, id=f"events-{plural}", labels=labels, registry=handlers)(event)

    for group, version, plural, record, labels in watches(store):
        watch(group, version, plural, record, labels)

    async def on_startup(memo: kopf.Memo, **kwargs: Any) -> None:
        kopf_settings: kopf.OperatorSettings = kwargs["settings"]  # Kopf's own, not ours
        kopf_settings.posting.enabled = False  # we post our own Events, on the ClusterPolicy
        kopf_settings.persistence.diffbase_storage = NoDiffBase()
        kopf_settings.watching.server_timeout = settings.watch_server_timeout_seconds
        kopf_settings.networking.request_timeout = settings.request_timeout_seconds
        kopf_settings.watching.chunk_size = settings.list_chunk_size
        for group, _version, plural in MANAGED:
            if (group, _version, plural) != CONFIG_MAPS:
                kopf_settings.watching.label_selectors[group, plural] = SELECTOR
        kopf_settings.watching.label_selectors["", "pods"] = SELECTOR
        # Kopf's scanning (its own CRD and namespace watches) stays on, narrowed to the two objects
        # that matter: when the ServiceMonitor CRD appears, Kopf starts serving servicemonitors without
        # a restart; the namespace watch serves both Kopf and psa.enabled. RBAC allows just these names.
        kopf_settings.watching.field_selectors[CRDS] = f"metadata.name={SERVICE_MONITOR_CRD}"
        kopf_settings.watching.field_selectors[NAMESPACES] = f"metadata.name={settings.namespace}"
        kube = Kube(load_api_client())
        await asyncio.to_thread(ensure_crd, kube)
        nvidia_driver = await asyncio.to_thread(_has_crd, kube, "nvidiadrivers.nvidia.com")
        reconciler = Reconciler(kube, store, settings, nvidia_driver_crd=nvidia_driver)
        memo["task"] = asyncio.create_task(loop.run(reconciler.run_once))

    async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("task")
        if task is not None:
            task.cancel()

    # A registry of our own has none of the default one's login fallbacks: log in as the API client does
    # (in-cluster credentials, else the kubeconfig), the same credentials as kube.load_api_client.
    kopf.on.login(registry=handlers)(kopf.login_via_client)
    kopf.on.startup(registry=handlers)(on_startup)
    kopf.on.cleanup(registry=handlers)(on_cleanup)
    return handlers


def run(settings: Settings) -> None:
    """Run the operator until interrupted: operands in `settings.namespace`, ClusterPolicies
    cluster-wide; `settings.listen` (HOST:PORT, empty for none) serves /metrics, /healthz and /readyz."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=settings.verbose, log_format=formats[settings.log_format])
    logging.getLogger("aiohttp.access").propagate = False
    if not settings.verbose:
        # Kopf logs every watch event's handler at INFO; our own log says what was done.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Before any watch starts: no policy content, however deep, can make Kopf's decoding raise.
    safe_json.install()
    with contextlib.suppress(asyncio.CancelledError):  # as kopf.run
        asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> None:
    store = Store()
    loop = Loop(settings)
    # The HTTP server first, so a busy port fails at once (server.ServerError) and the probes answer
    # while Kopf starts: /healthz says "not started", /readyz 503.
    running = None
    if settings.listen:
        probes = partial(health, loop, store), partial(ready, loop)
        running = await server.start(settings.listen, *probes, metrics.REGISTRY)
    try:
        await kopf.operator(
            registry=registry(settings, store, loop),
            standalone=True,
            namespaces=[settings.namespace],
            memo=kopf.Memo(),
        )
    finally:
        if running is not None:
            await running.stop()
