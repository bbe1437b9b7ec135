#!/usr/bin/env python3
"""Simulated kubelet device manager for the kwok nodes of the local e2e cluster.

A real kubelet advertises ``nvidia.com/gpu`` in the node's capacity and allocatable once the
NVIDIA device plugin on that node has registered; kwok has no kubelet, so this process does it:

* while a pod labelled ``app.kubernetes.io/component=device-plugin`` is Running and Ready on a
  node, that node's ``status.capacity`` and ``status.allocatable`` carry ``nvidia.com/gpu: <n>``,
  where n is the node's ``gpu-operator.sim/gpu-count`` annotation;
* when no such pod is Ready there any more, both go back to ``"0"`` (what a kubelet reports for
  a device plugin that went away), and nodes that never had one are left alone.

It is event-driven: one watch on device-plugin pods, one on nodes, a work queue of node names and
one worker that patches the node status subresource only when the value differs. Started and
stopped by hack/cluster.sh (pid file), logs to the cluster's logs/device-sim.log.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config, watch

COMPONENT_LABEL = "app.kubernetes.io/component"
DEVICE_PLUGIN = "device-plugin"
GPU_COUNT_ANNOTATION = "gpu-operator.sim/gpu-count"
RESOURCE = "nvidia.com/gpu"
# A server-side watch ends after this long; the client then resumes from its resourceVersion.
WATCH_TIMEOUT_S = 300
RETRY_DELAY_S = 1.0

log = logging.getLogger("device-sim")


@dataclass
class NodeInfo:
    gpu_count: str | None  # from the annotation; None: not a GPU node
    advertised: str | None  # current status.capacity[nvidia.com/gpu]


@dataclass
class State:
    """What the watches have seen; guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # pod key (namespace/name) -> node name, only for Ready device-plugin pods
    ready_pods: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods_synced: threading.Event = field(default_factory=threading.Event)
    nodes_synced: threading.Event = field(default_factory=threading.Event)

    def desired(self, node: str) -> str | None:
        """The value to advertise, or None to leave the node as it is."""
        with self.lock:
            info = self.nodes.get(node)
            if info is None or info.gpu_count is None:
                return None
            if any(n == node for n in self.ready_pods.values()):
                return info.gpu_count
            # Only take back what was advertised; never add a 0 to nodes that had nothing.
            return "0" if info.advertised not in (None, "0") else None


def pod_is_ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or not pod.spec.node_name:
        return False
    if pod.status is None or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def node_info(node: Any) -> NodeInfo:
    annotations = node.metadata.annotations or {}
    capacity = (node.status.capacity if node.status else None) or {}
    return NodeInfo(gpu_count=annotations.get(GPU_COUNT_ANNOTATION), advertised=capacity.get(RESOURCE))


class Simulator:
    def __init__(self, api: client.CoreV1Api, stop: threading.Event, ready_file: pathlib.Path | None) -> None:
        self.api = api
        self.stop = stop
        self.ready_file = ready_file
        self.state = State()
        self.work: queue.Queue[str] = queue.Queue()
        self._ready_lock = threading.Lock()

    # --- watches -------------------------------------------------------------------------
    def _list_and_watch(
        self,
        name: str,
        list_fn: Callable[..., Any],
        replace: Callable[[list[Any]], set[str]],
        apply: Callable[[str, Any], str | None],
        synced: threading.Event,
        **kwargs: Any,
    ) -> None:
        """List, then watch from the list's resourceVersion; relist on any error (e.g. 410 Gone)."""
        while not self.stop.is_set():
            try:
                listing = list_fn(**kwargs)
                for node in replace(listing.items):
                    self.work.put(node)
                synced.set()
                self._maybe_ready()
                rv: str = listing.metadata.resource_version
                while not self.stop.is_set():
                    w = watch.Watch()  # type: ignore[no-untyped-call]
                    for event in w.stream(  # type: ignore[no-untyped-call]
                        list_fn, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_S, **kwargs
                    ):
                        obj: Any = event["object"]
                        rv = obj.metadata.resource_version
                        changed = apply(event["type"], obj)
                        if changed:
                            self.work.put(changed)
                        if self.stop.is_set():
                            w.stop()  # type: ignore[no-untyped-call]
                            return
            except Exception as exc:  # the API server may restart; start over from a fresh list
                if self.stop.is_set():
                    return
                log.warning("%s watch: %s; relisting", name, exc)
                self.stop.wait(RETRY_DELAY_S)

    def _replace_pods(self, pods: list[Any]) -> set[str]:
        fresh = {
            f"{p.metadata.namespace}/{p.metadata.name}": p.spec.node_name for p in pods if pod_is_ready(p)
        }
        with self.state.lock:
            touched = set(self.state.ready_pods.values()) | set(fresh.values())
            self.state.ready_pods = fresh
        return touched

    def _apply_pod(self, kind: str, pod: Any) -> str | None:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        with self.state.lock:
            before = self.state.ready_pods.get(key)
            if kind != "DELETED" and pod_is_ready(pod):
                self.state.ready_pods[key] = pod.spec.node_name
            else:
                self.state.ready_pods.pop(key, None)
            after = self.state.ready_pods.get(key)
        return (after or before) if after != before else None

    def _replace_nodes(self, nodes: list[Any]) -> set[str]:
        with self.state.lock:
            self.state.nodes = {n.metadata.name: node_info(n) for n in nodes}
            return set(self.state.nodes)

    def _apply_node(self, kind: str, node: Any) -> str | None:
        name: str = node.metadata.name
        with self.state.lock:
            before = self.state.nodes.get(name)
            if kind == "DELETED":
                self.state.nodes.pop(name, None)
                return None
            after = node_info(node)
            self.state.nodes[name] = after
        # Heartbeats change nothing we care about: no work for them.
        return name if after != before else None

    def _maybe_ready(self) -> None:
        with self._ready_lock:
            if not (self.ready_file and self.state.pods_synced.is_set() and self.state.nodes_synced.is_set()):
                return
            # Reconcile what the initial lists showed before telling cluster.sh we are ready.
            while True:
                try:
                    node = self.work.get_nowait()
                except queue.Empty:
                    break
                self._reconcile(node)
            self.ready_file.touch()
            self.ready_file = None
        log.info(
            "synced: %d nodes, %d ready device-plugin pods", len(self.state.nodes), len(self.state.ready_pods)
        )

    # --- worker --------------------------------------------------------------------------
    def _reconcile(self, node: str) -> None:
        want = self.state.desired(node)
        with self.state.lock:
            info = self.state.nodes.get(node)
            have = info.advertised if info else None
        if want is None or want == have:
            return
        body = {"status": {"capacity": {RESOURCE: want}, "allocatable": {RESOURCE: want}}}
        try:
            self.api.patch_node_status(node, body)
        except client.ApiException as exc:
            if exc.status != 404:  # a node deleted meanwhile needs nothing
                log.warning("patch %s: %s; retrying", node, exc.reason)
                self.stop.wait(RETRY_DELAY_S)
                self.work.put(node)
            return
        with self.state.lock:
            if node in self.state.nodes:
                self.state.nodes[node].advertised = want
        log.info("node %s: %s=%s", node, RESOURCE, want)

    def _worker(self) -> None:
        while not self.stop.is_set():
            try:
                node = self.work.get(timeout=1.0)
            except queue.Empty:
                continue
            self._reconcile(node)

    def run(self) -> None:
        threads = [
            threading.Thread(
                target=self._list_and_watch,
                name="pods",
                args=("pods", self.api.list_pod_for_all_namespaces, self._replace_pods, self._apply_pod),
                kwargs={
                    "synced": self.state.pods_synced,
                    "label_selector": f"{COMPONENT_LABEL}={DEVICE_PLUGIN}",
                },
                daemon=True,
            ),
            threading.Thread(
                target=self._list_and_watch,
                name="nodes",
                args=("nodes", self.api.list_node, self._replace_nodes, self._apply_node),
                kwargs={"synced": self.state.nodes_synced},
                daemon=True,
            ),
            threading.Thread(target=self._worker, name="worker", daemon=True),
        ]
        for t in threads:
            t.start()
        self.stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="Simulated kubelet device manager (nvidia.com/gpu).")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument(
        "--ready-file", type=pathlib.Path, help="touched once the initial state is reconciled"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.ready_file:
        args.ready_file.unlink(missing_ok=True)

    config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("starting")
    Simulator(client.CoreV1Api(), stop, args.ready_file).run()


if __name__ == "__main__":
    main()
