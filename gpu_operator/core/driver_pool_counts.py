"""Each NVIDIADriver's numbers for the metrics (pure): its state, the nodes its pool should cover and
those where its driver is ready, from what the pass already computed (the statuses, the pools and the
observed DaemonSets), so that the metrics say what `kubectl get nvidiadrivers` says."""

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


def pool_counts(
    statuses: Mapping[str, NVIDIADriverStatus], pools: Pools | None, daemonsets: Mapping[str, DaemonSetInfo]
) -> dict[str, PoolCounts]:
    """NVIDIADriver name → its numbers, for the drivers that get a status this pass (a driver being
    deleted gets none, so its series go)."""
    found: dict[str, PoolCounts] = {}
    running = pools if pools is not None and pools.on else None
    for name, status in statuses.items():
        pool = running.assignment.drivers.get(name) if running is not None else None
        if running is None or pool is None:
            found[name] = PoolCounts(str(status.state or ""), 0, 0)
            continue
        mine = [
            obj["metadata"]["name"]
            for obj in running.objects
            if obj["metadata"]["ownerReferences"][0]["uid"] == pool.uid
        ]
        ready = sum(info.ready for daemonset in mine if (info := daemonsets.get(daemonset)) is not None)
        found[name] = PoolCounts(str(status.state or ""), len(pool.nodes), ready)
    return found
