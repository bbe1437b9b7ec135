"""Kopf wiring: watch handlers fill the Store and wake the reconcile loop; nothing else lives here.

ClusterPolicy events (the initial listing at start-up, create, update, delete) wake the loop
(gpu_operator/runtime/loop.py) like any other. Kopf's own per-object annotations and finalizers are not used,
so the operator writes nothing to a ClusterPolicy but its status, and deleting a policy never waits for
the operator. Nothing is module state: `run` builds the Store, the loop and a Kopf registry whose
handlers close over them, from the Settings the CLI made.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import kopf

from gpu_operator.core import render
from gpu_operator.core.observed import ObjectKey
from gpu_operator.core.ownership import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.runtime import metrics, safe_json, server, watch_guard
from gpu_operator.runtime.client import RESOURCES, Kube, load_api_client
from gpu_operator.runtime.drain_watches import NodePodWatches
from gpu_operator.runtime.leader import Elector, Leadership
from gpu_operator.runtime.loop import Loop, health, ready
from gpu_operator.runtime.reconciler import Reconciler
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

log = logging.getLogger("gpu_operator")

GC_YOUNG_THRESHOLD = 10_000
"""Allocations (net) between two collections of the youngest generation; CPython's default is 700."""

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
REVISIONS = ("apps", "v1", "controllerrevisions")
"""The driver DaemonSets' ControllerRevisions: an upgrade's target (they carry the pods' labels)."""
_KINDS = {plural: kind for (_, kind), (plural, _namespaced) in RESOURCES.items()}
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")

Retainer = Callable[[set[tuple[str, str]]], bool]
"""{(namespace or "", name)} of a complete listing → whether the Store forgot anything missing from it."""


@dataclass(frozen=True)
class Watch:
    group: str
    version: str
    plural: str
    record: watch_guard.Record
    retain: Retainer
    labels: dict[str, str] | None = None
    """Server-side label selector (also set in Kopf's settings, at startup)."""
    direct: bool = True
    """Recorded by the watch guard itself, without Kopf's per-event handling
    (gpu_operator/runtime/watch_guard.py).
    False only for the kinds whose event handlers tell the loop that the listings are done."""


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf builds an "essence" (a deep copy) of every watched body to detect changes for
    create/update handlers, and strips it again for its progress storage: most of its CPU time when
    thousands of operand pods are watched. This operator has only watch and index handlers, which
    never use it."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


def watches(store: Store) -> list[Watch]:
    """Every watched kind: how its objects enter the Store, and how a fresh listing prunes it."""

    def names(table: str) -> Retainer:
        return lambda present: store.retain(table, {name for _, name in present})

    def objects(api_version: str, kind: str) -> Retainer:
        def retain(present: set[tuple[str, str]]) -> bool:
            keys = {(api_version, kind, namespace, name) for namespace, name in present}
            mine = partial(_of_kind, api_version, kind)
            forgot = store.retain("objects", keys, mine) | store.retain("daemonsets", keys, mine)
            if kind == "DaemonSet":
                forgot |= store.retain_driver_daemonsets({name for _, name in present})
            return forgot

        return retain

    def pods(present: set[tuple[str, str]]) -> bool:
        keys = {f"{ns}/{name}" for ns, name in present}
        # The driver's and the validator's pods are kept twice: as operands and as upgrade facts.
        return (
            store.retain("pods", keys)
            | store.retain("driver_pods", keys)
            | store.retain("validator_pods", keys)
        )

    def config_maps(present: set[tuple[str, str]]) -> bool:
        return objects("v1", "ConfigMap")(present) | names("config_maps")(present)

    # Every kind but the ClusterPolicy, the CRDs and the namespace goes into the Store straight from the
    # watch stream (`Watch.direct`): Kopf's per-object workers (a task and a queue for each object, a
    # handler call per event) cost far more per event than recording it straight away, and the busy
    # kinds (pods, nodes, the DaemonSets' status updates) are nearly all of the events.
    found = [
        Watch("nvidia.com", "v1", "clusterpolicies", store.record_policy, names("policies"), direct=False),
        Watch("", "v1", "nodes", store.record_node, names("nodes")),
        Watch("", "v1", "pods", store.record_pod, pods, _OURS),
        Watch(*REVISIONS, store.record_revision, names("revisions"), _OURS),
    ]
    for group, version, plural in MANAGED:
        api_version = f"{group}/{version}" if group else version
        if (group, version, plural) == CONFIG_MAPS:
            found.append(Watch(group, version, plural, store.record_config_map, config_maps))
        else:
            retain = objects(api_version, _KINDS[plural])
            found.append(Watch(group, version, plural, store.record_managed, retain, _OURS))
    found.append(
        Watch(
            CRDS[0],
            "v1",
            CRDS[1],
            store.record_crd,
            lambda present: store.crds_listed({n for _, n in present}),
            direct=False,
        )
    )
    # Narrowed to the operand namespace by a field selector (startup, below).
    found.append(
        Watch(NAMESPACES[0], "v1", NAMESPACES[1], store.record_namespace, names("namespaces"), direct=False)
    )
    return found


def _of_kind(api_version: str, kind: str, key: ObjectKey) -> bool:
    return key[0] == api_version and key[1] == kind


def registry(settings: Settings, store: Store, loop: Loop, leadership: Leadership) -> kopf.OperatorRegistry:
    """Kopf's handlers for this operator, closed over its Store and loop.

    Each watched kind gets two handlers. An index handler records every listed or changed object in
    the Store: Kopf runs the index handlers for the initial listing of *every* indexed kind before it
    runs any event handler, so the Store is complete before the first pass, and a pass never mistakes
    "not listed yet" for "deleted". An event handler records deletions (index handlers do not see
    them) and, by running at all, tells the loop that the initial listings are done.

    The kinds the watch guard records itself (`Watch.direct`) keep both handlers, which Kopf never
    calls for them: they make Kopf watch the kind and wait for its listing before any event handler.
    """
    handlers = kopf.OperatorRegistry()
    every = watches(store)

    def watch(spec: Watch) -> None:
        async def index(body: kopf.Body, **_: Any) -> None:
            if spec.record(body, False):
                loop.wake()

        async def event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
            metrics.observe_watch_event(body.get("kind") or spec.plural, event["type"])
            loop.listed.set()
            if event["type"] == "DELETED" and spec.record(body, True):
                loop.wake()

        resource = (spec.group, spec.version, spec.plural)
        options: dict[str, Any] = {"labels": spec.labels, "registry": handlers}
        kopf.index(*resource, id=f"store-{spec.plural}", **options)(index)
        kopf.on.event(*resource, id=f"events-{spec.plural}", **options)(event)

    for spec in every:
        watch(spec)
    retainers = {(spec.group, spec.plural): spec.retain for spec in every}

    def listed(group: str, plural: str, present: set[tuple[str, str]]) -> None:
        retain = retainers.get((group, plural))
        if retain is not None and retain(present):
            log.info("%s deleted while no watch was open: forgotten", plural)
            loop.wake()

    async def on_startup(memo: kopf.Memo, **kwargs: Any) -> None:
        kopf_settings: kopf.OperatorSettings = kwargs["settings"]  # Kopf's own, not ours
        kopf_settings.posting.enabled = False  # we post our own Events, on the ClusterPolicy
        kopf_settings.persistence.diffbase_storage = NoDiffBase()
        # Every Kopf request has a connect timeout and a total one; a watch ends on the server after
        # server_timeout, on the client a little later, and after inactivity_timeout without any event
        # (the API server sends bookmarks every minute): a silent connection is dropped and reopened.
        kopf_settings.watching.server_timeout = settings.watch_server_timeout_seconds
        kopf_settings.watching.client_timeout = settings.watch_server_timeout_seconds + 30
        kopf_settings.watching.connect_timeout = settings.api_timeout_seconds[0]
        kopf_settings.networking.connect_timeout = settings.api_timeout_seconds[0]
        kopf_settings.networking.request_timeout = settings.request_timeout_seconds
        kopf_settings.watching.chunk_size = settings.list_chunk_size
        for spec in every:
            if spec.labels:
                kopf_settings.watching.label_selectors[spec.group, spec.plural] = SELECTOR
        # Kopf's scanning (its own CRD and namespace watches) stays on: when a CRD appears or goes
        # (the Prometheus operator's, our own), Kopf starts or stops serving its kind without a restart.
        # The namespace watch is narrowed to the operand namespace (RBAC allows just that name).
        kopf_settings.watching.field_selectors[NAMESPACES] = f"metadata.name={settings.namespace}"
        direct = {(spec.group, spec.plural): spec.record for spec in every if spec.direct}
        hooks = watch_guard.Hooks(listed, settings.watch_retry_seconds, direct, loop.wake, loop.settle)
        watch_guard.attach(kopf_settings, hooks)
        # One connection per writer and applier thread, plus one: no "connection pool is full". Every
        # write asks the leader lease first.
        api = load_api_client(pool_size=settings.writers + settings.appliers + 1)
        kube = Kube(api, timeout=settings.api_timeout_seconds, may_write=leadership.may_write)
        event_loop = asyncio.get_running_loop()
        memo["warm"] = event_loop.run_in_executor(None, render.warm)  # the first pass renders warm
        # The pods of nodes a driver upgrade empties: watches of their own, started by the passes.
        pod_watches = NodePodWatches(kube, store, partial(loop.wake_from, event_loop))
        memo["pod_watches"] = pod_watches
        reconciler = Reconciler(kube, store, settings, pod_watches=pod_watches)
        if settings.leader_election:

            def on_change(leading: bool) -> None:
                if leading:
                    reconciler.crd_current = False  # another leader may have run meanwhile
                    loop.wake_from(event_loop)

            # Its own connections and timeout: a lease call never waits behind a pass's requests.
            deadline = settings.lease.renew_deadline
            lease_kube = Kube(load_api_client(pool_size=2), timeout=(deadline, deadline))
            leadership.elector = Elector(
                lease_kube,
                settings.namespace,
                settings.lease_name,
                settings.identity,
                settings.lease,
                on_change,
            ).start()
        memo["task"] = asyncio.create_task(loop.run(reconciler.run_once))

    async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("task")
        if task is not None:
            task.cancel()
        pod_watches = memo.get("pod_watches")
        if pod_watches is not None:
            pod_watches.stop()
        if leadership.elector is not None:
            # Hand the lease back: a standby takes over within one retry period, not a lease duration.
            await asyncio.to_thread(leadership.elector.stop)

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
    # Before any watch starts: no policy content, however deep, can make Kopf's decoding raise, and no
    # API failure or vanished CRD can make a watch stop the operator.
    safe_json.install()
    watch_guard.install()
    tune_gc()
    with contextlib.suppress(asyncio.CancelledError):  # as kopf.run
        asyncio.run(_serve(settings))


def tune_gc(young_threshold: int = GC_YOUNG_THRESHOLD) -> None:
    """Make the cyclic garbage collector cheap for a long-running process with a large, stable heap.

    What is imported by now (Kopf, the kubernetes client's models, pydantic, Jinja: tens of thousands
    of objects) lives as long as the process: frozen, no full collection scans it again. And a pass or
    a batch of watch events holds thousands of new objects until it ends (a pod event decodes into a
    few hundred, a pass's tables have one entry per node or pod); with CPython's default of 700 the
    youngest generation is collected again and again during a large rollout, each time traversing
    those tables and promoting them to older generations that are then scanned too: seconds of CPU
    spent finding no garbage (measured: bench/README.md). The operator's records are acyclic, freed
    by reference counting; the collector is only for the odd cycle (an exception and its traceback)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


async def _serve(settings: Settings) -> None:
    store = Store()
    leadership = Leadership(settings.leader_election)
    loop = Loop(settings, leading=leadership.leading)
    store.shown = loop.wake_soon
    # The HTTP server first, so a busy port fails at once (server.ServerError) and the probes answer
    # while Kopf starts: /healthz says "not started", /readyz 503.
    running = None
    if settings.listen:
        probes = partial(health, loop, store), partial(ready, loop)
        running = await server.start(settings.listen, *probes, metrics.REGISTRY)
    try:
        await kopf.operator(
            registry=registry(settings, store, loop, leadership),
            standalone=True,
            namespaces=[settings.namespace],
            memo=kopf.Memo(),
        )
    finally:
        if running is not None:
            await running.stop()
