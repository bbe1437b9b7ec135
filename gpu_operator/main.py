"""Kopf wiring: the operator's lifecycle (login, startup, cleanup) through Kopf's public API; nothing else
lives here.

Kopf runs the operator: it logs in, runs the startup handler, which starts the informers
(gpu_operator/runtime/informer.py, one per watched kind, ClusterPolicies included) and the work
queue of reconcile passes (gpu_operator/runtime/workqueue.py), and the cleanup handler on exit. Every
watch event updates the Store and asks the queue for a pass. Kopf serves no resource itself: a
ClusterPolicy's content, however deeply nested, is decoded only by our own decoder
(gpu_operator/runtime/safe_json.py), and Kopf writes no annotation or finalizer to any object, so
deleting a policy never waits for the operator. Nothing is module state: `run` builds the Store, the
work queue and a Kopf registry whose handlers close over them, from the Settings the CLI made.
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
from gpu_operator.runtime import informer, metrics, server, watch_stream
from gpu_operator.runtime.client import RESOURCES, Kube, connect
from gpu_operator.runtime.drain_watches import NodePodWatches
from gpu_operator.runtime.leader import Elector, Leadership
from gpu_operator.runtime.probes import health, ready
from gpu_operator.runtime.reconciler import Reconciler
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store
from gpu_operator.runtime.workqueue import WorkQueue

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
    # Served only while the Prometheus operator's CRD exists; its informer lists it once it appears.
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    # The GPUCluster's DRA stack (not served: listed as empty).
    ("apps", "v1", "deployments"),
    ("resource.k8s.io", "v1", "deviceclasses"),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies"),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings"),
]
REVISIONS = ("apps", "v1", "controllerrevisions")
"""The driver DaemonSets' ControllerRevisions: an upgrade's target (they carry the pods' labels)."""
_KINDS = {plural: kind for (_, kind), (plural, _namespaced) in RESOURCES.items()}
_NAMESPACED = {plural: namespaced for plural, namespaced in RESOURCES.values()}
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")

Retainer = Callable[[informer.Names], bool]
"""A complete listing → whether the Store forgot anything missing from it."""


@dataclass(frozen=True)
class Watch:
    group: str
    version: str
    plural: str
    record: watch_stream.Record
    retain: Retainer
    labels: dict[str, str] | None = None
    """Server-side label selector."""

    def kind(self, namespace: str) -> informer.Kind:
        """What the informer lists and watches: namespaced kinds in the operand namespace only, the
        operand namespace itself by name (RBAC allows just that one)."""
        scoped = _NAMESPACED.get(self.plural, True)
        labels = ",".join(f"{k}={v}" for k, v in sorted((self.labels or {}).items()))
        fields = f"metadata.name={namespace}" if self.plural == NAMESPACES[1] else ""
        return informer.Kind(
            self.group, self.version, self.plural, namespace if scoped else None, labels, fields
        )


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

    found = [
        Watch("nvidia.com", "v1", "clusterpolicies", store.record_policy, names("policies")),
        # Absent CRD: listed as empty, and listed again as soon as it appears (runtime/informer.py).
        Watch("nvidia.com", "v1alpha1", "nvidiadrivers", store.record_driver, names("drivers")),
        Watch("nvidia.com", "v1alpha1", "gpuclusters", store.record_gpucluster, names("gpuclusters")),
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
        )
    )
    # Narrowed to the operand namespace by a field selector (Watch.kind).
    found.append(Watch(NAMESPACES[0], "v1", NAMESPACES[1], store.record_namespace, names("namespaces")))
    return found


def _of_kind(api_version: str, kind: str, key: ObjectKey) -> bool:
    return key[0] == api_version and key[1] == kind


def registry(
    settings: Settings, store: Store, queue: WorkQueue, leadership: Leadership
) -> kopf.OperatorRegistry:
    """Kopf's handlers for this operator (login, startup, cleanup), closed over its Store and work queue."""
    handlers = kopf.OperatorRegistry()

    async def on_startup(memo: kopf.Memo, **kwargs: Any) -> None:
        kopf_settings: kopf.OperatorSettings = kwargs["settings"]  # Kopf's own, not ours
        kopf_settings.posting.enabled = False  # we post our own Events, on the ClusterPolicy
        # Kopf serves no resource (the informers watch everything), so it needs no watch of CRDs or
        # namespaces to learn what is served.
        kopf_settings.scanning.disabled = True
        memo["informers"] = await start_informers(settings, store, queue)
        # As many connections as writes and applies may be in flight, plus one. Every write asks the
        # leader lease first.
        api = await connect(pool_size=settings.writers + settings.appliers + 1)
        memo["apis"] = [api]
        kube = Kube(api, timeout=settings.api_timeout_seconds, may_write=leadership.may_write)
        memo["warm"] = asyncio.get_running_loop().run_in_executor(None, render.warm)  # warm first pass
        # The pods of nodes a driver upgrade empties: watches of their own, started by the passes, on
        # connections of their own (each holds one, as many as nodes are emptied at once).
        watches_api = await connect(pool_size=None)
        memo["apis"].append(watches_api)
        timing = informer.Timing.of(settings)
        pod_watches = NodePodWatches(watches_api, store, queue.add, queue.settle, timing)
        memo["pod_watches"] = pod_watches
        reconciler = Reconciler(kube, store, settings, pod_watches=pod_watches)
        if settings.leader_election:

            def on_change(leading: bool) -> None:
                if leading:
                    reconciler.crds_current.clear()  # another leader may have run meanwhile
                    queue.add()

            # Its own connections and timeout: a lease call never waits behind a pass's requests.
            deadline = settings.lease.renew_deadline
            lease_api = await connect(pool_size=2)
            memo["apis"].append(lease_api)
            lease_kube = Kube(lease_api, timeout=(deadline, deadline))
            leadership.elector = Elector(
                lease_kube,
                settings.namespace,
                settings.lease_name,
                settings.identity,
                settings.lease,
                on_change,
            ).start()
        memo["task"] = asyncio.create_task(queue.run(reconciler.run_once))

    async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("task")
        if task is not None:
            task.cancel()
        informers = memo.get("informers")
        if informers is not None:
            await informers.stop()
        pod_watches = memo.get("pod_watches")
        if pod_watches is not None:
            await pod_watches.stop()
        if leadership.elector is not None:
            # Hand the lease back: a standby takes over within one retry period, not a lease duration.
            await leadership.elector.stop()
        for api in memo.get("apis", []):
            await api.close()

    # A registry of our own has none of the default one's login fallbacks: log in with what the
    # operator's own client loads (in-cluster credentials, else the kubeconfig).
    kopf.on.login(registry=handlers)(login)
    kopf.on.startup(registry=handlers)(on_startup)
    kopf.on.cleanup(registry=handlers)(on_cleanup)
    return handlers


async def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf's credentials, from the configuration client.connect loads (Kopf's own login_via_client
    reads the synchronous `kubernetes` package's, which the operator does not use)."""
    api = await connect()
    try:
        return connection_info(
            api.configuration, await api.configuration.get_api_key_with_prefix("BearerToken")
        )
    finally:
        await api.close()


def connection_info(configuration: Any, header: str | None) -> kopf.ConnectionInfo:
    """The ConnectionInfo of a kubernetes_asyncio Configuration and its Authorization header (as Kopf's
    login_via_client reads the synchronous client's: a scheme and a token, RFC 7235)."""
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else tuple(parts)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,  # the loader may have written it to a temporary file
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        proxy_url=configuration.proxy,
    )


@dataclass
class Informers:
    """The running informers of one operator run, and their client."""

    api: Any
    tasks: list[asyncio.Task[None]]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.api.close()


async def start_informers(settings: Settings, store: Store, queue: WorkQueue) -> Informers:
    """An informer for every watched kind. The first pass waits until each has listed its kind
    once (`queue.listed`), so that it never mistakes "not listed yet" for "deleted"."""
    every = watches(store)
    unlisted = {spec.plural for spec in every}
    timing = informer.Timing.of(settings)
    # A watch holds its connection; listings and resumed watches may overlap for a moment.
    api = await connect(pool_size=2 * len(every))
    running: list[informer.Informer] = []

    def listed(spec: Watch, present: informer.Names) -> None:
        if spec.retain(present):
            log.info("%s deleted while no watch was open: forgotten", spec.plural)
            queue.add()
        unlisted.discard(spec.plural)
        if not unlisted:
            queue.listed.set()

    def poked(record: watch_stream.Record) -> watch_stream.Record:
        """A CRD's change may make a kind served (or no longer): its informer tries again at once."""

        def record_crd(body: Any, deleted: bool) -> bool:
            for each in running:
                each.poke.set()
            return record(body, deleted)

        return record_crd

    for spec in every:
        record = poked(spec.record) if (spec.group, spec.plural) == CRDS else spec.record
        events = watch_stream.Events(record, spec.plural, queue.add, queue.settle)
        running.append(
            informer.Informer(api, spec.kind(settings.namespace), events, partial(listed, spec), timing)
        )
    tasks = [asyncio.create_task(each.run(), name=f"watch {each.kind.name}") for each in running]
    return Informers(api, tasks)


def run(settings: Settings) -> None:
    """Run the operator until interrupted: operands in `settings.namespace`, ClusterPolicies
    cluster-wide; `settings.listen` (HOST:PORT, empty for none) serves /metrics, /healthz and /readyz."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=settings.verbose, log_format=formats[settings.log_format])
    logging.getLogger("aiohttp.access").propagate = False
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
    queue = WorkQueue(settings, leading=leadership.leading, size=lambda: store.size("nodes"))
    store.shown = queue.add_soon
    # The HTTP server first, so a busy port fails at once (server.ServerError) and the probes answer
    # while Kopf starts: /healthz says "not started", /readyz 503.
    running = None
    if settings.listen:
        probes = partial(health, queue, store), partial(ready, queue)
        running = await server.start(settings.listen, *probes, metrics.REGISTRY)
    try:
        await kopf.operator(
            registry=registry(settings, store, queue, leadership),
            standalone=True,
            clusterwide=True,  # Kopf watches nothing: no namespace to follow
            memo=kopf.Memo(),
        )
    finally:
        if running is not None:
            await running.stop()
