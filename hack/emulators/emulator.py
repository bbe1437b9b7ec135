"""The emulator process: watches, per-node state, pod runners and the writes they cause.

One asyncio loop watches nodes, operand pods (ours, ``app.kubernetes.io/managed-by=gpu-operator``, and
NVIDIA's operator's, by their ``app``: podspec.emulated),
ConfigMaps, RuntimeClasses, injected failures (kwok Stages labelled ``gpu-operator.sim/failure``)
and NFD NodeFeatures, and runs a :class:`~.kubelet.PodRunner` for every operand pod bound to a
node. Writes are coalesced: a pod's status is patched once per burst of changes (and only if it
differs from what was written), a node's host mirror and extended resources once per
:data:`~.node.FLUSH_DELAY`. Nothing polls: work happens on watch events, on timers the emulated
images set themselves, and on the kubelet's back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp

from . import nfd
from .api import STRATEGIC_MERGE_PATCH, Api, ApiError
from .cluster import IpPool, Tokens, informer, list_all
from .kubelet import Failure, PodRunner, now
from .node import FLUSH_DELAY, HOST_LABEL, HOSTS_NAMESPACE, NodeState, SavedHost, mirror_config_map
from .podspec import OPERAND_PODS_SELECTOR, Pod, emulated, parse
from .profile import Profile

log = logging.getLogger("emulators")

JSON = dict[str, Any]
STATUS_FLUSH_S = 0.05
CONCURRENT_WRITES = 64
"""Pod status writes at once. On a real cluster every node's kubelet writes its own pods' statuses with
its own client; here one process writes them all, so this bounds only how hard it presses the API
server. Too low, and a pod's readiness waits behind the status writes of the whole cluster's other
pods: the kubelets, not the operator, would then set the pace of a large rollout (bench/README.md)."""
FAILURE_LABEL = "gpu-operator.sim/failure"
FAILURE_COMPONENT_LABEL = "gpu-operator.sim/component"
FAILURE_NODE_LABEL = "gpu-operator.sim/node"
FAILURE_REASON_LABEL = "gpu-operator.sim/reason"
FAILURE_CONTAINER_ANNOTATION = "gpu-operator.sim/container"
FAILURE_RESTARTS_ANNOTATION = "gpu-operator.sim/restarts"
FIELD_MANAGER = "gpu-operator-emulators"
APPLY_PATCH = "application/apply-patch+yaml"


class Emulator:
    def __init__(self, api: Api, profile: Profile, ready_file: pathlib.Path | None = None) -> None:
        self.api = api
        self.profile = profile
        self.ready_file = ready_file
        self.tokens = Tokens(api)
        self.ips = IpPool()
        self.nodes: dict[str, NodeState] = {}
        self.saved_hosts: dict[str, SavedHost] = {}
        """Node name → the mirror an earlier emulator process left, until the node is first seen."""
        self.runners: dict[str, PodRunner] = {}
        self._by_node: dict[str, dict[str, PodRunner]] = {}
        self.waiting_for_node: dict[str, dict[str, JSON]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, str]] = {}
        self.runtime_classes: dict[str, str] = {}
        self.failures: list[tuple[str, str, Failure]] = []
        self.nfd = nfd.NfdMaster(self)
        self._dirty_pods: dict[str, PodRunner] = {}
        self._written: dict[str, JSON] = {}
        self._dirty_nodes: set[str] = set()
        # One write in flight per pod and per node: a later write must not overtake an earlier one.
        self._writing: set[str] = set()
        self._rewrite: set[str] = set()
        self._pod_flush: asyncio.TimerHandle | None = None
        self._node_flush: asyncio.TimerHandle | None = None
        self._writes = asyncio.Semaphore(CONCURRENT_WRITES)
        self._background: set[asyncio.Task[Any]] = set()
        self._synced: dict[str, asyncio.Event] = {}
        self.stopping = False

    # --- lookups the runners and programs use ----------------------------------------------------

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.config_maps.get((namespace, name))

    def runtime_handler(self, runtime_class: str) -> str | None:
        return self.runtime_classes.get(runtime_class)

    def failures_for(self, pod: Pod) -> list[Failure]:
        return [
            f
            for component, node, f in self.failures
            if component == pod.component and node in ("all-nodes", pod.node)
        ]

    def pods_on(self, node: str) -> list[PodRunner]:
        return [r for r in self._by_node.get(node, {}).values() if not r.terminating]

    def _add_runner(self, runner: PodRunner) -> None:
        self.runners[runner.pod.uid] = runner
        self._by_node.setdefault(runner.pod.node, {})[runner.pod.uid] = runner

    def _drop_runner(self, uid: str) -> PodRunner | None:
        runner = self.runners.pop(uid, None)
        if runner is not None:
            self._by_node.get(runner.pod.node, {}).pop(uid, None)
        return runner

    def spawn(self, work: Awaitable[Any], name: str = "") -> None:
        task = asyncio.ensure_future(work)
        if name:
            task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    # --- nodes ----------------------------------------------------------------------------------

    def on_node(self, kind: str, body: JSON) -> None:
        if kind == "SYNC":
            listed = {n["metadata"]["name"] for n in body["items"]}
            for name in [n for n in self.nodes if n not in listed]:
                self._drop_node(name)
            for item in body["items"]:
                self.on_node("ADDED", item)
            return
        name = body["metadata"]["name"]
        if kind == "DELETED":
            self._drop_node(name)
            return
        node = self.nodes.get(name)
        new = node is None
        if node is None:
            node = self.nodes[name] = NodeState(name, self.node_dirty, self.saved_hosts.pop(name, None))
        node.observe(body)
        if new:
            # A restored host may differ from its mirror (a crash between a change and its flush).
            self.node_dirty(node)
        for pod in list(self.waiting_for_node.pop(name, {}).values()):
            self.on_pod("ADDED", pod)
        self.nfd.node_changed(node)

    def _drop_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            node.deleted = True
            node.notify()
        for runner in list(self._by_node.pop(name, {}).values()):
            self.runners.pop(runner.pod.uid, None)
            runner.stop()

    def node_dirty(self, node: NodeState) -> None:
        self._dirty_nodes.add(node.name)
        if self._node_flush is None:
            self._node_flush = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush_nodes)

    def _flush_nodes(self) -> None:
        self._node_flush = None
        names, self._dirty_nodes = self._dirty_nodes, set()
        for name in names:
            node = self.nodes.get(name)
            if node is None:
                continue
            if f"node/{name}" in self._writing:
                self._rewrite.add(f"node/{name}")
                continue
            self._writing.add(f"node/{name}")
            self.spawn(self._write_node(node))

    async def _write_node(self, node: NodeState) -> None:
        mirror = node.mirror()
        capacity = {r: str(node.resources.get(r, 0)) for r in sorted(node.known_resources)}
        resources_changed = any(node.capacity.get(r) != v for r, v in capacity.items())
        try:
            async with self._writes:
                if mirror != node.mirrored:
                    await self.api.request(
                        "PATCH",
                        f"/api/v1/namespaces/{HOSTS_NAMESPACE}/configmaps/{node.name}",
                        mirror_config_map(node, mirror),
                        params={"fieldManager": FIELD_MANAGER, "force": "true"},
                        content_type=APPLY_PATCH,
                    )
                    node.mirrored = mirror
                if resources_changed:
                    body = {"status": {"capacity": capacity, "allocatable": capacity}}
                    await self.api.patch(f"/api/v1/nodes/{node.name}/status", body)
                    node.capacity.update(capacity)
                    log.info("node %s: %s", node.name, ", ".join(f"{k}={v}" for k, v in capacity.items()))
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            if not (isinstance(exc, ApiError) and exc.not_found):
                log.warning("node %s: %s; retrying", node.name, exc)
                await asyncio.sleep(1.0)
                self._rewrite.add(f"node/{node.name}")
        finally:
            self._writing.discard(f"node/{node.name}")
            if f"node/{node.name}" in self._rewrite:
                self._rewrite.discard(f"node/{node.name}")
                self.node_dirty(node)

    # --- pods -----------------------------------------------------------------------------------

    def on_pod(self, kind: str, body: JSON) -> None:
        if kind == "SYNC":
            listed = {p["metadata"]["uid"] for p in body["items"]}
            for uid in [u for u in self.runners if u not in listed]:
                gone = self._drop_runner(uid)
                if gone is not None:
                    gone.stop()
            # Pods keep the IP their status has: reserve those before any new pod gets one.
            for item in body["items"]:
                address = (item.get("status") or {}).get("podIP")
                if address and emulated(item):
                    self.ips.allocate(item["metadata"]["uid"], address)
            for item in body["items"]:
                self.on_pod("ADDED", item)
            return
        if not emulated(body):
            return
        metadata = body["metadata"]
        uid = metadata["uid"]
        node_name = (body.get("spec") or {}).get("nodeName") or ""
        if kind == "DELETED":
            runner = self._drop_runner(uid)
            if runner is not None:
                runner.stop()
                self.tokens.forget(uid)
                self._written.pop(uid, None)
                runner.node.notify()
            return
        if not node_name:
            return
        node = self.nodes.get(node_name)
        if node is None:
            self.waiting_for_node.setdefault(node_name, {})[uid] = body
            return
        runner = self.runners.get(uid)
        if runner is None:
            pod = parse(body)
            runner = PodRunner(self, pod, node, body)
            self._add_runner(runner)
            if metadata.get("deletionTimestamp"):
                self.spawn(runner.terminate(), f"terminate {pod.key}")
                return
            runner.start()
        elif metadata.get("deletionTimestamp") and not runner.terminating:
            self.spawn(runner.terminate(), f"terminate {runner.pod.key}")
        node.notify()

    def status_changed(self, runner: PodRunner) -> None:
        self._dirty_pods[runner.pod.uid] = runner
        if self._pod_flush is None:
            self._pod_flush = asyncio.get_running_loop().call_later(STATUS_FLUSH_S, self._flush_pods)

    def _flush_pods(self) -> None:
        self._pod_flush = None
        runners, self._dirty_pods = self._dirty_pods, {}
        for runner in runners.values():
            if runner.terminating or runner.pod.uid not in self.runners:
                continue
            uid = runner.pod.uid
            if uid in self._writing:
                self._rewrite.add(uid)
                continue
            status = runner.status()
            if self._written.get(uid) == status:
                continue
            self._writing.add(uid)
            self.spawn(self._write_status(runner, status))

    async def _write_status(self, runner: PodRunner, status: JSON) -> None:
        pod = runner.pod
        try:
            async with self._writes:
                await self.api.patch(
                    f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
                    {"metadata": {"uid": pod.uid}, "status": status},
                    STRATEGIC_MERGE_PATCH,
                )
            self._written[pod.uid] = status
        except ApiError as exc:
            if exc.not_found or exc.conflict:
                return
            log.warning("pod %s status: %s; retrying", pod.key, exc)
            await asyncio.sleep(1.0)
            self._rewrite.add(pod.uid)
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("pod %s status: %s; retrying", pod.key, exc)
            await asyncio.sleep(1.0)
            self._rewrite.add(pod.uid)
        finally:
            self._writing.discard(pod.uid)
            if pod.uid in self._rewrite:
                self._rewrite.discard(pod.uid)
                if pod.uid in self.runners:
                    self.status_changed(runner)

    async def delete_pod(self, pod: Pod) -> None:
        """What the kubelet does once a deleted pod's containers have stopped."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}}
        async with self._writes:
            with contextlib.suppress(ApiError):
                await self.api.delete(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", body)

    def post_event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        stamp = now()
        body = {
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                "name": pod.name, "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": pod.node},
            "reportingComponent": "kubelet",
            "reportingInstance": pod.node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }  # fmt: skip

        async def post() -> None:
            async with self._writes:
                with contextlib.suppress(ApiError):
                    await self.api.create(f"/api/v1/namespaces/{pod.namespace}/events", body)

        self.spawn(post())

    # --- other watched kinds --------------------------------------------------------------------

    def on_config_map(self, kind: str, body: JSON) -> None:
        if kind == "SYNC":
            self.config_maps = {
                (c["metadata"]["namespace"], c["metadata"]["name"]): dict(c.get("data") or {})
                for c in body["items"]
            }
        else:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            if kind == "DELETED":
                self.config_maps.pop(key, None)
            else:
                self.config_maps[key] = dict(body.get("data") or {})
        # Pods waiting to mount it, programs reading it: wake the nodes running pods of that namespace.
        namespaces = {k[0] for k in self.config_maps} if kind == "SYNC" else {body["metadata"]["namespace"]}
        for name, runners in self._by_node.items():
            if name in self.nodes and any(r.pod.namespace in namespaces for r in runners.values()):
                self.nodes[name].notify()

    def on_runtime_class(self, kind: str, body: JSON) -> None:
        if kind == "SYNC":
            self.runtime_classes = {r["metadata"]["name"]: r.get("handler", "") for r in body["items"]}
        elif kind == "DELETED":
            self.runtime_classes.pop(body["metadata"]["name"], None)
        else:
            self.runtime_classes[body["metadata"]["name"]] = body.get("handler", "")
        for node in self.nodes.values():
            node.notify()

    def on_stage(self, kind: str, body: JSON) -> None:
        stages = body["items"] if kind == "SYNC" else [body]
        if kind == "SYNC":
            self.failures = []
        for stage in stages:
            component, node, failure = failure_of(stage)
            self.failures = [f for f in self.failures if (f[0], f[1]) != (component, node)]
            if kind != "DELETED":
                self.failures.append((component, node, failure))

    # --- running --------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop emulating; the containers "keep running" on their nodes (nothing is undone)."""
        self.stopping = True
        tasks = [t for r in self.runners.values() for t in r.tasks()] + list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self) -> None:
        watches: list[tuple[str, str, Any, dict[str, str]]] = [
            ("nodes", "/api/v1/nodes", self.on_node, {}),
            ("pods", "/api/v1/pods", self.on_pod, {"labelSelector": OPERAND_PODS_SELECTOR}),
            ("configmaps", "/api/v1/configmaps", self.on_config_map, {"labelSelector": f"!{HOST_LABEL}"}),
            ("runtimeclasses", "/apis/node.k8s.io/v1/runtimeclasses", self.on_runtime_class, {}),
            ("stages", "/apis/kwok.x-k8s.io/v1alpha1/stages", self.on_stage,
             {"labelSelector": f"{FAILURE_LABEL}=true"}),
            ("nodefeatures", nfd.NODEFEATURES, self.nfd.on_node_feature, {}),
        ]  # fmt: skip
        await self._load_hosts()
        tasks = []
        for name, path, handler, params in watches:
            synced = self._synced[name] = asyncio.Event()
            tasks.append(asyncio.create_task(informer(self.api, path, handler, synced, **params), name=name))
        # Nodes first, so the first pods find their node; everything else before we say "ready".
        await self._synced["nodes"].wait()
        await asyncio.gather(*(e.wait() for e in self._synced.values()))
        self.nfd.resync()
        log.info(
            "synced: %d nodes, %d operand pods, profile %s (scale %g)",
            len(self.nodes), len(self.runners), self.profile.name, self.profile.scale,
        )  # fmt: skip
        if self.ready_file is not None:
            self.ready_file.touch()
        await asyncio.gather(*tasks)

    async def _load_hosts(self) -> None:
        """The host mirrors an earlier emulator process left (none on a new cluster), before any node
        is seen; and their namespace, for the writes to come."""
        try:
            await self.api.create("/api/v1/namespaces", {"metadata": {"name": HOSTS_NAMESPACE}})
        except ApiError as exc:
            if not exc.conflict:  # there already
                raise
        found, _ = await list_all(
            self.api, f"/api/v1/namespaces/{HOSTS_NAMESPACE}/configmaps", labelSelector=HOST_LABEL
        )
        self.saved_hosts = {item["metadata"]["name"]: SavedHost.of(item) for item in found}


def failure_of(stage: Mapping[str, Any]) -> tuple[str, str, Failure]:
    """The component, node ('all-nodes': any) and failure of a Stage that inject_failure created."""
    metadata = stage["metadata"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    failure = Failure(
        labels.get(FAILURE_REASON_LABEL, "CrashLoopBackOff"),
        annotations.get(FAILURE_CONTAINER_ANNOTATION, ""),
        int(annotations.get(FAILURE_RESTARTS_ANNOTATION) or 0),
    )
    return labels.get(FAILURE_COMPONENT_LABEL, ""), labels.get(FAILURE_NODE_LABEL, ""), failure
