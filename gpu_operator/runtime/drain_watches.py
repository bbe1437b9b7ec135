"""The pods on the nodes a driver upgrade is emptying: one informer per such node, narrowed by the field
selector `spec.nodeName=<node>` across all namespaces, started when the upgrade plan needs the node's
pods (UpgradePlan.pods_needed) and stopped when it no longer does.

Why per node: GPU workload pods live in any namespace and carry no label of ours. A cluster-wide pod
watch would hold every pod of the cluster in memory, and receive every change, all the time, for the
few nodes (maxParallelUpgrades, maxUnavailable) that are being emptied at any moment; a listing per node
at every pass would be polling. A per-node watch costs one connection and that node's pods, only while
the node is being emptied, and wakes the work queue the moment a pod goes. The API server serves it
from its watch cache (pods are indexed by spec.nodeName).

Each is an informer (gpu_operator/runtime/informer.py: list, watch from the listing's version, list
again on 410, back off on errors) whose events go to the Store's per-node table; its pods are decoded
whole (their volumes and containers say whether they use a GPU or local data). A stopped watch is
cancelled and leaves the Store at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from gpu_operator.runtime import informer, safe_json, watch_stream
from gpu_operator.runtime.store import Store

log = logging.getLogger("gpu_operator")


class _NodeWatch:
    def __init__(self, node: str, watches: NodePodWatches) -> None:
        self.node = node
        self.store = watches.store
        self.wake = watches.wake
        self.listed = asyncio.Event()
        """Set once the node's pods are in the Store."""
        events = watch_stream.Events(self._record, "pods", self.wake, watches.settle, decode=safe_json.loads)
        kind = informer.Kind("", "v1", "pods", field_selector=f"spec.nodeName={node}")
        self.task = asyncio.create_task(
            informer.Informer(watches.api, kind, events, self._listed, watches.timing).run(),
            name=f"pods on {node}",
        )

    def _record(self, body: Mapping[str, Any], deleted: bool) -> bool:
        return self.store.record_node_pod(self.node, body, deleted)

    def _listed(self, present: informer.Names) -> None:
        self.store.node_pods_listed(self.node, present)
        self.listed.set()
        # Always a wake-up: a pass waits for this listing ("listing the pods on the node").
        self.wake()

    def stop(self) -> None:
        """Nothing of the node lands in the Store after this: the task records only between awaits."""
        self.task.cancel()
        self.store.forget_node_pods(self.node)


@dataclass
class NodePodWatches:
    """The set of per-node pod watches; `follow` makes it the given nodes. Runs on the event loop."""

    api: client.ApiClient
    """Their own connections: each watch holds one, as many as nodes are emptied at once."""
    store: Store
    wake: Callable[[], None]
    settle: watch_stream.Settle
    timing: informer.Timing
    watches: dict[str, _NodeWatch] = field(default_factory=dict)

    def follow(self, nodes: Iterable[str]) -> None:
        wanted = set(nodes)
        for node in sorted(self.watches.keys() - wanted):
            log.info("node %s: no longer watching its pods", node)
            self.watches.pop(node).stop()
        for node in sorted(wanted - self.watches.keys()):
            log.info("node %s: watching its pods (driver upgrade)", node)
            self.watches[node] = _NodeWatch(node, self)

    async def wait_listed(self, nodes: Iterable[str], timeout: float) -> bool:
        """Follow `nodes` too, and wait (at most `timeout` seconds in all) until the pods of those whose
        watch this call starts are listed; whether any of them is. A watch already running and still
        not listed is failing (it backs off): a pass does not wait for it again."""
        wanted = set(nodes)
        starting = sorted(wanted - self.watches.keys())
        self.follow(wanted | self.watches.keys())
        if not starting:
            return False
        waits = [asyncio.ensure_future(self.watches[node].listed.wait()) for node in starting]
        done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.ALL_COMPLETED)
        for each in pending:
            each.cancel()
        return bool(done)

    async def stop(self) -> None:
        tasks = [watch.task for watch in self.watches.values()]
        self.follow(())
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
