"""The pods on the nodes a driver upgrade is emptying: one watch per such node, narrowed by the field
selector `spec.nodeName=<node>` across all namespaces, started when the upgrade plan needs the node's
pods (UpgradePlan.pods_needed) and stopped when it no longer does.

Why per node: GPU workload pods live in any namespace and carry no label of ours. A cluster-wide pod
watch would hold every pod of the cluster in memory, and receive every change, all the time, for the
few nodes (maxParallelUpgrades, maxUnavailable) that are being emptied at any moment; a listing per node
at every pass would be polling. A per-node watch costs one connection and that node's pods, only while
the node is being emptied, and wakes the loop the moment a pod goes. The API server serves it from its
watch cache (pods are indexed by spec.nodeName).

Each watch runs in a thread of its own with its own connection (the kube client is synchronous): it
lists the node's pods (the Store then knows them: Facts.pods_known), watches from the list's
resourceVersion, lists again when the watch expires (410), and backs off on errors. A stopped watch
leaves the Store at once; its thread notices at its next event or when the server ends the watch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from gpu_operator.runtime.backoff import Backoff
from gpu_operator.runtime.client import ApiError, Kube
from gpu_operator.runtime.store import Store

log = logging.getLogger("gpu_operator")

WATCH_SECONDS = 60
"""Server-side timeout of one watch: how long a stopped watch's thread may linger, blocked in a read."""
MAX_BACKOFF_SECONDS = 30.0


class _NodeWatch:
    def __init__(self, node: str, kube: Kube, store: Store, wake: Callable[[], None]) -> None:
        self.node = node
        self.kube = kube
        self.store = store
        self.wake = wake
        self.stopped = threading.Event()
        self.listed = threading.Event()
        """Set once the node's pods are in the Store."""
        self.lock = threading.Lock()
        """Held while the Store is written, so that nothing lands after `stop` forgot the node."""
        self.thread = threading.Thread(target=self._run, name=f"gpu-operator-pods-{node}", daemon=True)

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()
            self.store.forget_node_pods(self.node)

    def _record(self, write: Callable[..., bool], *args: object, always: bool = False) -> None:
        with self.lock:
            if self.stopped.is_set():
                return
            changed = write(self.node, *args)
        if changed or always:
            self.wake()

    def _run(self) -> None:
        selector = f"spec.nodeName={self.node}"
        backoff = Backoff(1.0, MAX_BACKOFF_SECONDS)
        try:
            while not self.stopped.is_set():
                try:
                    items, version = self.kube.list_at("v1", "Pod", field_selector=selector)
                    # Always a wake-up: a pass waits for this list ("listing the pods on the node").
                    self._record(self.store.list_node_pods, items, always=True)
                    self.listed.set()
                    backoff.reset()
                    while version and not self.stopped.is_set():
                        version = self._watch(selector, version)
                except ApiError as exc:
                    delay = backoff.next()
                    log.warning("pods on node %s: %s; listing again in %.0fs", self.node, exc, delay)
                    self.stopped.wait(delay)
        finally:
            self.kube.close()

    def _watch(self, selector: str, version: str) -> str:
        """One watch from `version`; the version to go on from, '' to list again."""
        query = {"fieldSelector": selector, "resourceVersion": version, "allowWatchBookmarks": "true"}
        for event in self.kube.watch("v1", "Pod", query, WATCH_SECONDS):
            if self.stopped.is_set():
                return ""
            body = event.get("object") or {}
            if event.get("type") == "ERROR":
                return ""  # 410 Gone: the version is too old to watch from
            version = str((body.get("metadata") or {}).get("resourceVersion") or version)
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                self._record(self.store.record_node_pod, body, event["type"] == "DELETED")
        return version


class NodePodWatches:
    """The set of per-node pod watches; `follow` makes it the given nodes."""

    def __init__(self, kube: Kube, store: Store, wake: Callable[[], None]) -> None:
        self.kube = kube
        self.store = store
        self.wake = wake
        """Called from the watch threads: must be thread-safe."""
        self.watches: dict[str, _NodeWatch] = {}

    def follow(self, nodes: Iterable[str]) -> None:
        wanted = set(nodes)
        for node in sorted(self.watches.keys() - wanted):
            log.info("node %s: no longer watching its pods", node)
            self.watches.pop(node).stop()
        for node in sorted(wanted - self.watches.keys()):
            log.info("node %s: watching its pods (driver upgrade)", node)
            watch = _NodeWatch(node, self.kube.fork(), self.store, self.wake)
            self.watches[node] = watch
            watch.thread.start()

    def wait_listed(self, nodes: Iterable[str], timeout: float) -> bool:
        """Follow `nodes` too, and wait (at most `timeout` seconds in all) until the pods of those whose
        watch this call starts are listed; whether any of them is. A watch already running and still
        not listed is failing (it backs off): a pass does not wait for it again."""
        wanted = set(nodes)
        starting = sorted(wanted - self.watches.keys())
        self.follow(wanted | self.watches.keys())
        deadline = time.monotonic() + timeout
        listed = [self.watches[n].listed.wait(max(0.0, deadline - time.monotonic())) for n in starting]
        return any(listed)

    def stop(self) -> None:
        self.follow(())
