"""The order of a pass's writes, which of them go now and which must wait, and what the pass leaves
to the next (pure).

The planner says what to write; this says in what order and when, from the plan and from what the
writes done so far returned, so that the runtime (runtime/reconciler.py) only carries them out and
every such rule is unit-tested without an API server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import inf
from typing import Any

from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import ObjectKey, component_of
from gpu_operator.core.plan import Conclusion, Plan
from gpu_operator.core.render import PREREQUISITES
from gpu_operator.core.upgrade import UpgradePlan


def in_waves(
    objects: Iterable[dict[str, Any]], leading: set[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The objects to write in three waves, each after the one before: the shared ones (RuntimeClasses)
    and the ServiceAccounts, RBAC, ConfigMaps and the rest of the `leading` components (those whose
    pods this pass's labels make due); their DaemonSets, with everything but the DaemonSets of the
    others; the others' DaemonSets.

    A DaemonSet comes after its component's other objects and the RuntimeClasses (its pods need their
    ServiceAccount, RBAC and ConfigMaps, and the API server refuses a pod whose RuntimeClass is not
    there); nothing else orders them: a binding may name a role that is not there yet. Written one
    after another per component, the first stage's DaemonSet waits for its whole chain of applies and
    goes out last of every DaemonSet; in waves it goes out two rounds of the appliers after its first
    object (measured: bench/README.md)."""
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    third: list[dict[str, Any]] = []
    for body in objects:
        component = component_of(body["metadata"])
        leads = component in leading or component == PREREQUISITES
        if body["kind"] == "DaemonSet":
            (second if leads else third).append(body)
        else:
            (first if leads else second).append(body)
    return first, second, third


def labelled_components(node_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The components whose deploy label a pass sets (to "true") on some node."""
    return {
        component.name
        for component in COMPONENTS
        if any(labels.get(component.deploy_label) == "true" for labels in node_labels.values())
    }


def deletes_after(deletes: Sequence[ObjectKey], failed: Mapping[str, str]) -> tuple[ObjectKey, ...]:
    """The deletes to carry out once the pass's objects are written (`failed`: the object writes, and
    the driver upgrade's announcements before them, that did not go through). Never delete what runs
    before its replacement is in place: an object the new generation no longer wants may be what its
    operands run on until the new objects are written, so a single failed write keeps every delete
    for a later pass."""
    return () if failed else tuple(deletes)


def label_version(planned: NodeInfo, latest: NodeInfo | None) -> str | None:
    """The resourceVersion to write a node's operator labels on, the plan having read `planned` and the
    watch showing `latest` now (None: nothing newer known); None: leave them to the next pass.

    A write carries the node's version, so that a label k8s-driver-manager or mig-manager changed since
    the plan read it (their pause) is never undone: such a change arriving while the write waited its
    turn leaves it to the next pass, which plans on it. A newer version alone (a status update, another
    manager's annotation) changes nothing the plan read: the decision stands, on that version."""
    if latest is None:
        return planned.resource_version
    return latest.resource_version if latest == planned else None


def version_after_conflict(planned: NodeInfo, fresh: NodeInfo | None) -> str | None:
    """After a label write was refused as stale (409): the version to write again on at once, when the
    node as it is now (`fresh`; None: not known) differs from what the plan read only in its version,
    common while a rollout's pods start on the node; None: the next pass decides again."""
    return fresh.resource_version if fresh is not None and fresh == planned else None


@dataclass(frozen=True)
class PacedStatuses:
    writes: Mapping[str, dict[str, Any]]
    """Policy name → the status body to write now."""
    due_in: float | None = None
    """Seconds until the first status held back is due (None: none is held back)."""


def paced_statuses(
    conclusion: Conclusion, written: Mapping[str, float], interval: float, now: float
) -> PacedStatuses:
    """The status writes of a pass that go now. One that only tells a rollout's progress
    (status.progress_only) waits while the policy's last status write (`written`: policy name → when,
    on the clock of `now`) is less than `interval` seconds old: during a rollout every pass would
    otherwise write the status again. A new state, generation or error is never held back."""
    writes: dict[str, dict[str, Any]] = {}
    due_in = inf
    for name, body in conclusion.status_writes.items():
        if name in conclusion.progress:
            wait = written.get(name, -inf) + interval - now
            if wait > 0:
                due_in = min(due_in, wait)
                continue
        writes[name] = body
    return PacedStatuses(writes, None if due_in == inf else due_in)


def next_pass_at(
    upgrade: UpgradePlan | None, status_due: float | None, evictions_refused: bool, clock: float
) -> float | None:
    """When (Unix seconds) to run a pass even if no watch event comes (None: no such time): the
    driver upgrade's next timeout or eviction retry, or a status held back by the pacing, whichever
    comes first. After a refused eviction, at once (`clock`, the pass's own time): the status the
    pass wrote predates the refusal and must say what the eviction waits for."""
    if evictions_refused:
        return clock
    due = [at for at in (upgrade.wake_at if upgrade is not None else None, status_due) if at is not None]
    return min(due, default=None)


def unsettled(plan: Plan, conflicts: Mapping[str, str], errors: Mapping[str, str]) -> dict[str, str]:
    """What a pass leaves unsettled, for a retry (component, object or generation → why): the objects
    of our names that are someone else's, the writes that failed, and what keeps the active policy's
    generation from being written."""
    found = {**conflicts, **errors}
    if plan.problems and plan.active is not None:
        found[f"generation {plan.active.generation}"] = "; ".join(plan.problems.lines())
    return found
