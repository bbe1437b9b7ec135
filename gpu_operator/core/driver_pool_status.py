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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from gpu_operator.api.nvidiadriver import REASON_DRIVER_NOT_READY, NVIDIADriverStatus
from gpu_operator.api.quoting import bounded
from gpu_operator.api.status import REASON_RECONCILE_FAILED, REASON_RECONCILED, Condition
from gpu_operator.core.driver_pool_plan import Pools
from gpu_operator.core.driver_pools import NODES_NAMED
from gpu_operator.core.observed import DaemonSetInfo, DriverRef, rollout

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
) -> dict[str, NVIDIADriverStatus]:
    """NVIDIADriver name → the status it should have. `pools`: the pass's pools (None: the active
    ClusterPolicy's spec is not known, so nothing is said); `policy`: the active ClusterPolicy's name
    (None: there is none); `daemonsets`: the observed DaemonSets by name."""
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
        found[driver.name] = NVIDIADriverStatus(
            state=state, namespace=namespace, conditions=_conditions(driver, pairs, now)
        )
    return found


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
    """metav1.Conditions (meta.SetStatusCondition): lastTransitionTime moves only with the status."""
    previous = {c.get("type"): c for c in driver.status.get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for kind, status, reason, message in pairs:
        before = previous.get(kind) or {}
        changed = before.get("status") != status
        conditions.append(
            Condition(
                type=kind,
                status=status,  # type: ignore[arg-type]
                reason=reason,
                message=bounded(message),
                lastTransitionTime=now if changed else str(before.get("lastTransitionTime") or now),
                observedGeneration=driver.generation,
            )
        )
    return conditions


def driver_status_body(status: NVIDIADriverStatus) -> dict[str, Any]:
    """The JSON written (merge patch): the fields the operator sets."""
    return status.model_dump(mode="json", exclude_none=True)


def driver_status_differs(current: Mapping[str, Any], desired: NVIDIADriverStatus) -> bool:
    """Whether the status as last written differs from `desired`: nothing is written at rest."""
    return {k: current.get(k) for k in ("state", "namespace", "conditions")} != {
        k: driver_status_body(desired).get(k) for k in ("state", "namespace", "conditions")
    }
