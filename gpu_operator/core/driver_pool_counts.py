"""Each NVIDIADriver's numbers (pure): the nodes its pool should cover and those where its driver is
ready, for its status (from the pass's pools and the observed DaemonSets), and the metrics, read from
the status, so that they say what `kubectl get nvidiadrivers` says."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_operator.api.nvidiadriver import NVIDIADriverStatus
from gpu_operator.core.driver_pool_plan import Pools
from gpu_operator.core.observed import DaemonSetInfo


@dataclass(frozen=True)
class PoolCounts:
    state: str
    """The status's state: ready, notReady or disabled."""
    nodes_desired: int
    """GPU nodes the NVIDIADriver owns (core/driver_pools.py); 0 while the pools do not run the driver."""
    nodes_ready: int
    """Nodes where one of its driver pods is ready (its DaemonSets' numberReady)."""


def pool_nodes(name: str, pools: Pools, daemonsets: Mapping[str, DaemonSetInfo]) -> tuple[int, int] | None:
    """(GPU nodes `name` owns, nodes where one of its driver pods is ready); None while the pools do not
    run the driver or `name` has no pool."""
    pool = pools.assignment.drivers.get(name) if pools.on else None
    if pool is None:
        return None
    mine = [
        obj["metadata"]["name"]
        for obj in pools.objects
        if obj["metadata"]["ownerReferences"][0]["uid"] == pool.uid
    ]
    ready = sum(info.ready for daemonset in mine if (info := daemonsets.get(daemonset)) is not None)
    return len(pool.nodes), ready


def pool_counts(statuses: Mapping[str, NVIDIADriverStatus]) -> dict[str, PoolCounts]:
    """NVIDIADriver name → its numbers, as its status says them, for the drivers that get a status this
    pass (a driver being deleted gets none, so its series go)."""
    return {
        name: PoolCounts(str(status.state or ""), status.nodesDesired or 0, status.nodesReady or 0)
        for name, status in statuses.items()
    }
