"""The operator's Prometheus metrics, computed from what the loop already has: no API call, no timer.

NVIDIA's names and meanings where NVIDIA has the metric (controllers/operator_metrics.go), so
dashboards and the `GPUOperatorReconciliationFailed` alert (`gpu_operator_reconciliation_status
!= 1`) work unchanged; the rest is ours, under the same `gpu_operator_` prefix. The reconcile loop
calls `observe_pass` / `observe_aborted_pass` once per pass, kube.py calls `observe_write` per API
write and `observe_dry_run` per dry run, the watch handlers call `observe_watch_event`; the HTTP
server serves `REGISTRY`.

Per NVIDIADriver (`gpu_operator_nvidiadriver_*{nvidiadriver="..."}`, ours): the nodes its pool should
cover, those where its driver is ready, and its status.state; a deleted NVIDIADriver's series go.

NVIDIA's driver-upgrade gauges (`gpu_operator_driver_auto_upgrade_enabled`,
`gpu_operator_nodes_upgrades_*`) are created once a pass knows their value and removed when it no
longer does (no valid ClusterPolicy; the node counts also while autoUpgrade is off, when no upgrade
runs): a gauge stuck at 0 would tell dashboards "no upgrade failed" without anyone looking.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from gpu_operator.api.status import ComponentStatus

if TYPE_CHECKING:
    from gpu_operator.core.driver_pool_counts import PoolCounts
    from gpu_operator.core.plan import Plan
    from gpu_operator.core.upgrade import UpgradePlan

# `_created` series double every counter for a timestamp nobody graphs (controller-runtime has none).
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry()
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)  # process_resident_memory_bytes, process_cpu_seconds_total, ...

# NVIDIA's values of gpu_operator_reconciliation_status.
STATUS_SUCCESS = 1
STATUS_NOT_READY = 0
STATUS_POLICY_UNAVAILABLE = -1
STATUS_OPERATOR_ERROR = -2

RECONCILIATION_STATUS = Gauge(
    "gpu_operator_reconciliation_status",
    "1 if the last pass left every operand ready, 0 if operands are not ready or the pass failed on the "
    "API, -1 if there is no valid ClusterPolicy, -2 if the pass failed with an error of the operator",
    registry=REGISTRY,
)
RECONCILIATION_TOTAL = Counter(
    "gpu_operator_reconciliation_total",
    "Reconcile passes of the active ClusterPolicy",
    registry=REGISTRY,
)
RECONCILIATION_FAILED = Counter(
    "gpu_operator_reconciliation_failed_total",
    "Reconcile passes that ended with operands not ready, rejected writes or an error",
    registry=REGISTRY,
)
LAST_SUCCESS = Gauge(
    "gpu_operator_reconciliation_last_success_ts_seconds",
    "Unix time of the last pass that left every operand ready",
    registry=REGISTRY,
)
GPU_NODES = Gauge(
    "gpu_operator_gpu_nodes_total",
    "Nodes with NVIDIA GPUs (the nodes that get nvidia.com/gpu.present=true)",
    registry=REGISTRY,
)
PASS_SECONDS = Histogram(
    "gpu_operator_reconciliation_duration_seconds",
    "Wall time of one reconcile pass (plan, writes and status)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)

# Per component, from the status the pass computed (status.components). Disabled components have no
# series, so `count(gpu_operator_component_ready)` is the number of enabled components.
_COMPONENT_GAUGES: dict[str, Gauge] = {
    "nodesDesired": Gauge(
        "gpu_operator_component_nodes_desired",
        "GPU nodes that should run the component",
        ["component"],
        registry=REGISTRY,
    ),
    "nodesReady": Gauge(
        "gpu_operator_component_nodes_ready",
        "Nodes where the component's pod is ready",
        ["component"],
        registry=REGISTRY,
    ),
    "nodesWaiting": Gauge(
        "gpu_operator_component_nodes_waiting",
        "Nodes where the component waits for its dependencies (driver, toolkit) to become ready first",
        ["component"],
        registry=REGISTRY,
    ),
    "nodesFailing": Gauge(
        "gpu_operator_component_nodes_failing",
        "Nodes where the component's pod exists and fails (CrashLoopBackOff, ImagePullBackOff, ...)",
        ["component"],
        registry=REGISTRY,
    ),
}
COMPONENT_READY = Gauge(
    "gpu_operator_component_ready",
    "1 if the component is ready on every node that should run it, else 0",
    ["component"],
    registry=REGISTRY,
)

# Per NVIDIADriver, from the statuses the pass computed (core/driver_pool_counts.py); a deleted
# NVIDIADriver's series go with it.
POOL_NODES_DESIRED = Gauge(
    "gpu_operator_nvidiadriver_nodes_desired",
    "GPU nodes the NVIDIADriver's pool should run its driver on (0 while the ClusterPolicy does not "
    "delegate its driver)",
    ["nvidiadriver"],
    registry=REGISTRY,
)
POOL_NODES_READY = Gauge(
    "gpu_operator_nvidiadriver_nodes_ready",
    "Nodes where a driver pod of the NVIDIADriver is ready",
    ["nvidiadriver"],
    registry=REGISTRY,
)
POOL_STATES = ("ready", "notReady", "disabled")
POOL_STATE = Gauge(
    "gpu_operator_nvidiadriver_state",
    "1 for the NVIDIADriver's status.state (ready, notReady, disabled), 0 for the others",
    ["nvidiadriver", "state"],
    registry=REGISTRY,
)
_pools_seen: set[str] = set()

# Per allocator (core/allocators.py): which GPU nodes the device plugin serves and which the GPUCluster's
# DRA driver, and how many wait to change allocator until their GPU pods are gone.
ALLOCATORS = ("device-plugin", "dra")
ALLOCATOR_NODES = Gauge(
    "gpu_operator_gpu_nodes_by_allocator",
    "GPU nodes whose GPUs the allocator hands out: device-plugin (nvidia.com/gpu) or dra (the GPUCluster's "
    "DRA driver, ResourceClaims)",
    ["allocator"],
    registry=REGISTRY,
)
ALLOCATOR_HELD = Gauge(
    "gpu_operator_gpu_nodes_waiting_for_allocator",
    "GPU nodes that are to change allocator and wait until the GPU pods of the old one are gone",
    registry=REGISTRY,
)
GPUCLUSTER_STATES = ("ready", "notReady")
GPUCLUSTER_STATE = Gauge(
    "gpu_operator_gpucluster_state",
    "1 for the GPUCluster's status.state (ready, notReady), 0 for the other; no series without one",
    ["state"],
    registry=REGISTRY,
)

LEADER = Gauge(
    "gpu_operator_leader",
    "1 while this replica holds the leader lease (it reconciles and writes), else 0 (standby)",
    registry=REGISTRY,
)
API_WRITES = Counter(
    "gpu_operator_api_writes_total",
    "Writes to the API server by verb (apply, patch, create, delete), kind and HTTP status "
    "('<error>': no response)",
    ["verb", "kind", "code"],
    registry=REGISTRY,
)
API_DRY_RUNS = Counter(
    "gpu_operator_api_dry_runs_total",
    "Server-side dry runs (dryRun=All) of objects about to be written, by kind and HTTP status: a change "
    "is proven before anything of it is written, so these come only with changes, never at rest",
    ["kind", "code"],
    registry=REGISTRY,
)
WATCH_EVENTS = Counter(
    "gpu_operator_watch_events_total",
    "Watch events received, by kind and type (LISTED: an object of an initial or repeated listing)",
    ["kind", "type"],
    registry=REGISTRY,
)

_components_seen: set[str] = set()

AUTO_UPGRADE = "gpu_operator_driver_auto_upgrade_enabled"
# NVIDIA's meanings (controllers/upgrade_controller.go, k8s-operator-libs pkg/upgrade/common_manager.go
# GetUpgradesInProgress/Done/Failed/Pending/Available): in progress counts upgrade-failed nodes too;
# available is taken before the pass starts any node.
_UPGRADE_HELP = {
    AUTO_UPGRADE: "1 if driver auto upgrade is enabled 0 if not",
    "gpu_operator_nodes_upgrades_in_progress": "Nodes whose driver upgrade has started and not finished "
    "(upgrade-failed ones included)",
    "gpu_operator_nodes_upgrades_done": "Nodes whose driver is upgraded (upgrade-done)",
    "gpu_operator_nodes_upgrades_failed": "Nodes whose driver upgrade failed (upgrade-failed)",
    "gpu_operator_nodes_upgrades_available": "Nodes that may start their driver upgrade now, within "
    "maxParallelUpgrades and maxUnavailable (0 while the upgrade is paused)",
    "gpu_operator_nodes_upgrades_pending": "Nodes waiting to start their driver upgrade (upgrade-required)",
}
_upgrade_gauges: dict[str, Gauge] = {}


def _set_upgrade(upgrade: UpgradePlan | None) -> None:
    """NVIDIA's upgrade gauges from this pass's upgrade plan; None: unknown, so none is exported."""
    values: dict[str, float] = {}
    if upgrade is not None:
        status = upgrade.status
        values[AUTO_UPGRADE] = 1 if status["autoUpgrade"] else 0
        if status["autoUpgrade"]:
            values.update(
                {
                    "gpu_operator_nodes_upgrades_in_progress": status["nodesInProgress"]
                    + status["nodesFailed"],
                    "gpu_operator_nodes_upgrades_done": status["nodesDone"],
                    "gpu_operator_nodes_upgrades_failed": status["nodesFailed"],
                    "gpu_operator_nodes_upgrades_available": upgrade.available,
                    "gpu_operator_nodes_upgrades_pending": status["nodesPending"],
                }
            )
    for name in _upgrade_gauges.keys() - values.keys():
        REGISTRY.unregister(_upgrade_gauges.pop(name))
    for name, value in values.items():
        if name not in _upgrade_gauges:
            _upgrade_gauges[name] = Gauge(name, _UPGRADE_HELP[name], registry=REGISTRY)
        _upgrade_gauges[name].set(value)


def observe_pass(plan: Plan, errors: Mapping[str, str], gpu_nodes: int, seconds: float) -> None:
    """A pass that ran to its end (some writes may have been rejected: `errors`)."""
    PASS_SECONDS.observe(seconds)
    GPU_NODES.set(gpu_nodes)
    _set_pools(plan.driver_pools)
    _set_allocators(plan, gpu_nodes)
    status = plan.statuses.get(plan.active.name) if plan.active else None
    if status is None or plan.spec is None:
        # NVIDIA: no ClusterPolicy, or one it cannot initialise from; not counted as a reconciliation.
        RECONCILIATION_STATUS.set(STATUS_POLICY_UNAVAILABLE)
        _set_components([])
        _set_upgrade(None)
        return
    RECONCILIATION_TOTAL.inc()
    _set_components(status.components)
    _set_upgrade(plan.upgrade)
    if errors or status.state != "ready":
        RECONCILIATION_STATUS.set(STATUS_NOT_READY)
        RECONCILIATION_FAILED.inc()
    else:
        RECONCILIATION_STATUS.set(STATUS_SUCCESS)
        LAST_SUCCESS.set(time.time())


def observe_aborted_pass(seconds: float, *, operator_error: bool) -> None:
    """A pass that stopped on an API failure (server down, 5xx) or, `operator_error`, on a bug."""
    PASS_SECONDS.observe(seconds)
    RECONCILIATION_TOTAL.inc()
    RECONCILIATION_FAILED.inc()
    RECONCILIATION_STATUS.set(STATUS_OPERATOR_ERROR if operator_error else STATUS_NOT_READY)


def _set_components(components: list[ComponentStatus]) -> None:
    enabled = {c.name: c for c in components if c.state in ("ready", "notReady")}
    for name in _components_seen - enabled.keys():
        for gauge in (*_COMPONENT_GAUGES.values(), COMPONENT_READY):
            gauge.remove(name)
    for name, entry in enabled.items():
        for field, gauge in _COMPONENT_GAUGES.items():
            gauge.labels(name).set(getattr(entry, field))
        COMPONENT_READY.labels(name).set(1 if entry.state == "ready" else 0)
    _components_seen.clear()
    _components_seen.update(enabled)


def _set_allocators(plan: Plan, gpu_nodes: int) -> None:
    """Without a GPUCluster every GPU node of an active policy is the device plugin's (no per-node count:
    a pass without one costs what it did)."""
    dra = plan.dra
    if dra is None:
        counts = {"device-plugin": gpu_nodes if plan.spec is not None else 0, "dra": 0}
        held = 0
        GPUCLUSTER_STATE.clear()
    else:
        counts = dict(dra.nodes)
        held = dra.held
        state = dra.state
        for name in GPUCLUSTER_STATES:
            if state is None:
                GPUCLUSTER_STATE.clear()
                break
            GPUCLUSTER_STATE.labels(name).set(1 if state == name else 0)
    for allocator in ALLOCATORS:
        ALLOCATOR_NODES.labels(allocator).set(counts.get(allocator, 0))
    ALLOCATOR_HELD.set(held)


def _set_pools(pools: Mapping[str, PoolCounts]) -> None:
    for name in _pools_seen - pools.keys():
        for gauge in (POOL_NODES_DESIRED, POOL_NODES_READY):
            gauge.remove(name)
        for state in POOL_STATES:
            POOL_STATE.remove(name, state)
    for name, counts in pools.items():
        POOL_NODES_DESIRED.labels(name).set(counts.nodes_desired)
        POOL_NODES_READY.labels(name).set(counts.nodes_ready)
        for state in POOL_STATES:
            POOL_STATE.labels(name, state).set(1 if counts.state == state else 0)
    _pools_seen.clear()
    _pools_seen.update(pools)


def observe_write(verb: str, kind: str, status: int) -> None:
    API_WRITES.labels(verb, kind, str(status) if status else "<error>").inc()


def observe_dry_run(kind: str, status: int) -> None:
    API_DRY_RUNS.labels(kind, str(status) if status else "<error>").inc()


def observe_watch_event(kind: str, event_type: str | None) -> None:
    WATCH_EVENTS.labels(kind, event_type or "LISTED").inc()
