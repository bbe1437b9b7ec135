"""Each NVIDIADriver's status, with NVIDIA's meaning (pure, no I/O).

NVIDIA's NVIDIADriver controller (controllers/nvidiadriver_controller.go at v26.7.0) writes
`status.state` and a Ready/Error pair of conditions (internal/conditions/nvidiadriver.go):

- the ClusterPolicy does not delegate its driver: state `disabled`, Error=True reason `Reconciled`
  ("useNvidiaDriverCRD is not enabled in ClusterPolicy");
- no ClusterPolicy to take the settings from: `notReady`, `ReconcileFailed`;
- a conflict over nodes: `notReady`, `ConflictingNodeSelector` (or `ReconcileFailed` for two
  defaults), the message naming the drivers and nodes (core/driver_pools.py);
- what the controller refuses about the spec: `notReady`, `ReconcileFailed`;
- its DaemonSets not rolled out yet: `notReady`, `DriverNotReady` ("Waiting for driver pod to be
  ready"); here also while a node waits for another driver's pod to go before it joins the pool
  (core/driver_pool_plan.py), which the message says;
- otherwise `ready`, Ready=True reason `Reconciled` ("All resources have been successfully reconciled").

A driver being deleted gets no status write (NVIDIA returns at once).

Added to NVIDIA's: `status.driverUpgrade`, the upgrade of the driver's pool (core/driver_pool_upgrade.py),
and a Warning Event when the driver enters a conflict over nodes (`conflict_events`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from gpu_operator.api.nvidiadriver import REASON_DRIVER_NOT_READY, NVIDIADriverStatus
from gpu_operator.api.status import (
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
    Condition,
    DriverUpgradeStatus,
)
from gpu_operator.core.driver_pool_counts import pool_nodes
from gpu_operator.core.driver_pool_plan import Pools
from gpu_operator.core.driver_pools import NODES_NAMED
from gpu_operator.core.observed import DaemonSetInfo, DriverRef, rollout
from gpu_operator.core.status import conditions_from

State = Literal["ready", "notReady", "disabled"]
READY: State = "ready"
NOT_READY: State = "notReady"
DISABLED: State = "disabled"
NOT_DELEGATED = "useNvidiaDriverCRD is not enabled in ClusterPolicy"
ALL_RECONCILED = "All resources have been successfully reconciled"
WAITING_FOR_POD = "Waiting for driver pod to be ready"

Pair = tuple[str, str, str, str]


def _ready(message: str) -> tuple[Pair, ...]:
    return (("Ready", "True", REASON_RECONCILED, message), ("Error", "False", "Ready", ""))


def _error(reason: str, message: str) -> tuple[Pair, ...]:
    return (("Ready", "False", "Error", ""), ("Error", "True", reason, message))


def driver_statuses(
    drivers: Iterable[DriverRef],
    pools: Pools | None,
    policy: str | None,
    daemonsets: Mapping[str, DaemonSetInfo],
    namespace: str,
    now: str,
    upgrades: Mapping[str, DriverUpgradeStatus] | None,
) -> dict[str, NVIDIADriverStatus]:
    """NVIDIADriver name → the status it should have. `pools`: the pass's pools (None: the active
    ClusterPolicy's spec is not known, so nothing is said); `policy`: the active ClusterPolicy's name
    (None: there is none); `daemonsets`: the observed DaemonSets by name; `upgrades`: each pool's
    upgrade (a driver without one shows none), None when this pass plans no upgrade (the
    ClusterPolicy's generation cannot run): each status then keeps what it says of its upgrade."""
    found: dict[str, NVIDIADriverStatus] = {}
    for driver in drivers:
        if driver.deleting:
            continue
        if policy is None:
            state, pairs = NOT_READY, _error(REASON_RECONCILE_FAILED, "no ClusterPolicy is active")
        elif pools is None:
            continue
        elif not pools.on:
            state, pairs = DISABLED, _error(REASON_RECONCILED, f"{NOT_DELEGATED} {policy}")
        else:
            state, pairs = _delegated(driver, pools, daemonsets)
        counts = pool_nodes(driver.name, pools, daemonsets) if pools is not None else None
        found[driver.name] = NVIDIADriverStatus(
            state=state,
            namespace=namespace,
            conditions=_conditions(driver, pairs, now),
            nodesDesired=counts[0] if counts is not None else None,
            nodesReady=counts[1] if counts is not None else None,
            driverUpgrade=_said(driver) if upgrades is None else upgrades.get(driver.name),
        )
    return found


def _said(driver: DriverRef) -> DriverUpgradeStatus | None:
    """What the driver's status says of its upgrade (None: nothing, or nothing that reads)."""
    said = driver.status.get("driverUpgrade")
    try:
        return DriverUpgradeStatus.model_validate(said) if said else None
    except ValidationError:
        return None


def _delegated(
    driver: DriverRef, pools: Pools, daemonsets: Mapping[str, DaemonSetInfo]
) -> tuple[State, tuple[Pair, ...]]:
    if driver.spec is None:
        message = "; ".join(str(error) for error in driver.errors)
        return NOT_READY, _error(
            REASON_RECONCILE_FAILED, f"invalid spec, its nodes are left as they are: {message}"
        )
    pool = pools.assignment.drivers.get(driver.name)
    if pool is not None and pool.conflicts:
        return NOT_READY, pool.conditions()
    waiting = sorted(
        node
        for node in pools.waiting
        if (owner := pools.assignment.nodes.get(node)) is not None and owner.label == driver.name
    )
    mine = [
        obj["metadata"]["name"]
        for obj in pools.objects
        if obj["metadata"]["ownerReferences"][0]["uid"] == driver.uid
    ]
    rolled = all((found := rollout(daemonsets.get(name))) is not None and found.done for name in mine)
    if waiting:
        shown = ", ".join(waiting[:NODES_NAMED]) + (" and more" if len(waiting) > NODES_NAMED else "")
        detail = f"{len(waiting)} node(s) wait for another driver's pod to go before joining: {shown}"
        return NOT_READY, _error(REASON_DRIVER_NOT_READY, f"{WAITING_FOR_POD}; {detail}")
    if not rolled:
        return NOT_READY, _error(REASON_DRIVER_NOT_READY, WAITING_FOR_POD)
    return READY, _ready(ALL_RECONCILED)


def _conditions(driver: DriverRef, pairs: Iterable[Pair], now: str) -> list[Condition]:
    return conditions_from(pairs, driver.status, driver.generation, now)


WRITTEN = ("state", "namespace", "conditions", "nodesDesired", "nodesReady", "driverUpgrade")
"""The status fields the operator writes (NVIDIA's three, then ours: the node counts and the upgrade)."""


def driver_status_body(status: NVIDIADriverStatus) -> dict[str, Any]:
    """The JSON written (merge patch): the fields the operator sets. The node counts and the upgrade are
    written null when there are none, and the upgrade with its nulls, so that the merge patch removes
    what an earlier write said (the counts of a pool gone, a canary stage, the whole upgrade)."""
    body = status.model_dump(mode="json", exclude_none=True)
    body["nodesDesired"], body["nodesReady"] = status.nodesDesired, status.nodesReady
    upgrade = status.driverUpgrade
    body["driverUpgrade"] = upgrade.model_dump(mode="json") if upgrade is not None else None
    return body


def driver_status_differs(current: Mapping[str, Any], desired: NVIDIADriverStatus) -> bool:
    """Whether the status as last written differs from `desired`: nothing is written at rest. A null
    and an absent field are the same (the API server keeps no nulls a merge patch sends)."""
    body = driver_status_body(desired)
    return any(_pruned(current.get(key)) != _pruned(body.get(key)) for key in WRITTEN)


def _pruned(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


@dataclass(frozen=True)
class DriverEvent:
    """An Event to post on an NVIDIADriver once its status is written."""

    name: str
    uid: str
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def conflict_events(
    drivers: Iterable[DriverRef], pools: Pools | None, statuses: Mapping[str, NVIDIADriverStatus]
) -> dict[str, tuple[DriverEvent, ...]]:
    """NVIDIADriver name → a Warning per conflict it is in (ConflictingNodeSelector, or
    ReconcileFailed for several defaults), naming the other NVIDIADrivers and the nodes, when it
    enters the conflict or the conflict changes: when its Error condition (`statuses`, as it should
    be) says something its current status does not. That status is written with the Event, so the
    next pass, or an operator restarted, finds it said and posts nothing again."""
    if pools is None:
        return {}
    found: dict[str, tuple[DriverEvent, ...]] = {}
    for driver in drivers:
        pool = pools.assignment.drivers.get(driver.name)
        status = statuses.get(driver.name)
        if pool is None or not pool.conflicts or status is None:
            continue
        says = next(((c.reason, c.message) for c in status.conditions if c.type == "Error"), None)
        if says == _error_said(driver.status):
            continue
        found[driver.name] = tuple(
            DriverEvent(driver.name, driver.uid, "Warning", c.reason, c.told_to(driver.name))
            for c in pool.conflicts
        )
    return found


def _error_said(status: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(reason, message) of the Error condition of a status as written."""
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    return next(((c.get("reason"), c.get("message")) for c in conditions if c.get("type") == "Error"), None)
