"""One pass over the cluster (pure): which nodes move, which may start, and the status that says why.

The order of a pass: nodes already in progress (failed ones included) go as far as they can; idle
nodes are marked upgrade-required or done; then pending nodes start while the limits allow:
no new start while a node is failed (the pause), canary nodes first and alone, never more than
maxParallelUpgrades in progress, never more than maxUnavailable nodes cordoned or NotReady (a node that
is already cordoned costs nothing). A failed node that resumes needs no slot, so a rollback reaches
the failed nodes first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_operator.api.upgrade_policy import CanarySpec, UpgradePolicySpec
from gpu_operator.core.upgrade.facts import (
    DriverPod,
    Facts,
    UpgradeNode,
    ValidatorPod,
    WorkloadPod,
    format_time,
)
from gpu_operator.core.upgrade.node_steps import (
    NEEDS_PODS,
    Context,
    Draft,
    Failure,
    NodeView,
    Wait,
    advance,
    settle_idle,
    shorten,
    start,
)
from gpu_operator.core.upgrade.states import (
    AUTO_UPGRADE_ANNOTATION,
    FAILURE_ANNOTATION,
    IDLE,
    SKIP_LABEL,
    STATE_LABEL,
    State,
)
from gpu_operator.core.upgrade.writes import NodeActions, PatchNode, UpgradeEvent, Write

SHOWN_NODES = 10
"""Node names listed per pending group (the count says how many there are)."""
MANUAL = (
    "autoUpgrade is off: the driver DaemonSet is OnDelete, so the node keeps its driver until its "
    "driver pod is deleted by hand"
)
MANUAL_ORPHAN = (
    "autoUpgrade is off: the node keeps its orphaned driver pod (its DaemonSet is gone) until the pod is "
    "deleted by hand; the new driver's pod starts then"
)


_Pod = TypeVar("_Pod", DriverPod, ValidatorPod)


@dataclass(frozen=True)
class UpgradePlan:
    actions: tuple[NodeActions, ...]
    """Per node, in node-name order; only nodes with something to do."""
    status: dict[str, Any]
    """The content of `status.driverUpgrade` (gpu_operator.api.status.DriverUpgradeStatus)."""
    wake_at: float | None
    """Plan again at this time (Unix seconds) even if nothing changes: the earliest timeout, retry or
    soak end. None: only a change in the cluster can move anything."""
    pods_needed: frozenset[str] = frozenset()
    """Nodes whose pods the next pass needs (Facts.pods, pods_known): those being emptied, and failed
    ones that resume once the pods that blocked them are gone. No other node's pods are ever read."""
    available: int = 0
    """NVIDIA's "upgrades available", counted before this pass started any node: how many could start,
    within maxParallelUpgrades and maxUnavailable (0 while paused)."""

    @property
    def writes(self) -> list[Write]:
        return [w for a in self.actions for w in a.writes]

    @property
    def events(self) -> list[UpgradeEvent]:
        return [e for a in self.actions for e in a.events]


def _best(pods: Iterable[_Pod]) -> dict[str, _Pod]:
    """Per node, the pod that speaks for it: a live one over a terminating one, then the newest."""
    best: dict[str, _Pod] = {}
    for pod in pods:
        current = best.get(pod.node)
        if current is None or (not pod.terminating, pod.created) > (not current.terminating, current.created):
            best[pod.node] = pod
    return best


def build_views(facts: Facts) -> list[NodeView]:
    """The nodes that take part: those with a driver pod, and those whose label says they are mid-way."""
    daemonsets = {d.uid: d for d in facts.driver_daemonsets}
    drivers = _best(facts.driver_pods)
    validators = _best(facts.validator_pods)
    pods: dict[str, list[WorkloadPod]] = {}
    for pod in facts.pods:
        pods.setdefault(pod.node, []).append(pod)
    known = facts.pods_known
    views = []
    for node in sorted(facts.nodes, key=lambda n: n.name):
        driver = drivers.get(node.name)
        if driver is None and State.of(node.labels.get(STATE_LABEL)) in (State.UNKNOWN, State.DONE):
            continue
        daemonset = daemonsets.get(driver.daemonset_uid) if driver is not None else None
        views.append(
            NodeView(
                node=node,
                driver=driver,
                daemonset=daemonset,
                validator=validators.get(node.name),
                pods=tuple(pods.get(node.name, ())),
                pods_known=known is None or node.name in known,
                orphaned=driver is not None and daemonset is None and node.name in facts.orphans,
                replacement_digest=facts.orphans.get(node.name, ""),
            )
        )
    return views


@dataclass
class Limits:
    """maxParallelUpgrades, maxUnavailable and the pause, as this pass leaves the nodes."""

    policy: UpgradePolicySpec
    drafts: list[Draft]
    allowed: int = field(init=False)
    unavailable: set[str] = field(init=False)
    in_progress: set[str] = field(init=False)
    failed: list[Draft] = field(init=False)

    def __post_init__(self) -> None:
        self.allowed = self.policy.max_unavailable(len(self.drafts))
        self.unavailable = {d.view.name for d in self.drafts if d.unschedulable or not d.view.node.ready}
        self.failed = [d for d in self.drafts if d.state == State.FAILED and not d.view.skipped]
        # A failed node with the skip label has been let go by its owner: it no longer holds a slot.
        self.in_progress = {
            d.view.name
            for d in self.drafts
            if d.state not in IDLE and not (d.state == State.FAILED and d.view.skipped)
        }

    def pause(self) -> str:
        if self.failed:
            return f"paused: {shorten([d.view.name for d in self.failed])} failed (see failed)"
        return ""

    def refusal(self, draft: Draft) -> str:
        parallel = self.policy.maxParallelUpgrades
        if parallel and len(self.in_progress) >= parallel:
            return f"waiting for a free slot: maxParallelUpgrades is {parallel}"
        if not draft.view.node.ready:
            return "waiting for the node to be Ready"
        if not draft.unschedulable and len(self.unavailable) >= self.allowed:
            return (
                f"waiting: {len(self.unavailable)} of {len(self.drafts)} GPU nodes are cordoned or not "
                f"Ready, maxUnavailable {self.policy.maxUnavailable} allows {self.allowed}"
            )
        return ""

    def take(self, draft: Draft) -> None:
        self.in_progress.add(draft.view.name)
        self.unavailable.add(draft.view.name)

    def room(self, pending: int) -> int:
        """NVIDIA's GetUpgradesAvailable (k8s-operator-libs pkg/upgrade/common_manager.go): free slots
        (every pending node when maxParallelUpgrades is 0), at most what maxUnavailable leaves."""
        if self.failed:
            return 0
        parallel = self.policy.maxParallelUpgrades
        slots = parallel - len(self.in_progress) if parallel else pending
        return max(0, min(slots, self.allowed - len(self.unavailable)))


@dataclass
class Canary:
    """The canary stage: until it is complete only canary nodes start, and only with no other node in
    progress. Complete = enough canary nodes done at the target revision, soaked."""

    spec: CanarySpec | None
    drafts: list[Draft]
    now: float
    candidates: frozenset[str] = field(init=False)
    proven: list[str] = field(init=False)
    required: int = field(init=False)
    soak_until: float | None = field(init=False, default=None)
    complete: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        spec = self.spec
        self.candidates, self.proven, self.required = frozenset(), [], 0
        if spec is None:
            return
        wanted = spec.nodeSelector or {}
        self.candidates = frozenset(
            d.view.name
            for d in self.drafts
            if not d.view.skipped and all(d.view.node.labels.get(k) == v for k, v in wanted.items())
        )
        self.required = len(self.candidates) if spec.count is None else min(spec.count, len(self.candidates))
        done = sorted(
            (d.since or self.now, d.view.name)
            for d in self.drafts
            if d.view.name in self.candidates and d.state == State.DONE and d.view.at_target
        )
        self.proven = [name for _, name in done]
        if spec.nodeSelector and not self.candidates:
            self.complete = False
        elif len(done) >= self.required:
            soak_from = done[self.required - 1][0] if self.required else self.now
            self.soak_until = soak_from + spec.soakSeconds
            self.complete = self.now >= self.soak_until
        else:
            self.complete = False

    def refusal(self, draft: Draft, limits: Limits) -> str:
        if self.complete:
            return ""
        assert self.spec is not None
        if not self.candidates:
            selector = self.spec.nodeSelector
            return f"waiting for the canary stage: no GPU node matches canary.nodeSelector {selector}"
        busy = sorted(limits.in_progress & self.candidates)
        if draft.view.name not in self.candidates or len(self.proven) + len(busy) >= self.required:
            if len(self.proven) >= self.required and self.soak_until is not None:
                return f"waiting for the canary soak until {format_time(self.soak_until)}"
            where = f" ({', '.join(busy)} in progress)" if busy else ""
            upgraded = f"{len(self.proven)}/{self.required}"
            return f"waiting for the canary stage: {upgraded} canary nodes upgraded{where}"
        others = sorted(limits.in_progress - self.candidates)
        if others:
            return f"waiting for {shorten(others)} to finish: canary nodes are upgraded alone"
        return ""

    def status(self, limits: Limits) -> dict[str, Any] | None:
        if self.spec is None:
            return None
        busy = sorted(limits.in_progress & self.candidates)
        proven = self.proven[: max(self.required - len(busy), 0)]
        return {
            "nodes": sorted({*proven, *busy}),
            "required": self.required,
            "complete": self.complete,
            "soakUntil": format_time(self.soak_until) if self.soak_until is not None else None,
        }


def _auto_annotation(node: UpgradeNode, auto: bool) -> dict[str, str | None]:
    have = node.annotations.get(AUTO_UPGRADE_ANNOTATION)
    if auto and have != "true":
        return {AUTO_UPGRADE_ANNOTATION: "true"}
    if not auto and have is not None:
        return {AUTO_UPGRADE_ANNOTATION: None}
    return {}


def plan_upgrade(
    policy: UpgradePolicySpec | None,
    facts: Facts,
    *,
    target_version: str = "",
    validate: bool = True,
) -> UpgradePlan:
    """The next step of every GPU node's driver upgrade, the writes that make it, and the status.

    `policy` is `driver.upgradePolicy` (None: NVIDIA's defaults, autoUpgrade off); `validate` whether
    the operator-validator runs (the validation gate waits for it). Calling this again on the facts the
    writes produce moves on; calling it on unchanged facts asks for nothing new (no writes at rest).
    """
    policy = policy or UpgradePolicySpec()
    views = build_views(facts)
    managed = {v.name for v in views}
    others = [
        NodeActions(n.name, (PatchNode(n.name, annotations=note),))
        for n in sorted(facts.nodes, key=lambda n: n.name)
        if n.name not in managed and (note := _auto_annotation(n, policy.autoUpgrade))
    ]
    if not policy.autoUpgrade:
        return _manual(views, others, target_version)

    ctx = Context(policy, facts.now, facts.evictions, validate)
    drafts = [Draft(view, facts.now) for view in views]
    for draft in drafts:
        draft.annotate(AUTO_UPGRADE_ANNOTATION, "true")
    failed_before = {d.view.name for d in drafts if d.state == State.FAILED and not d.view.skipped}
    waits: dict[str, Wait | None] = {}
    for draft in drafts:
        if draft.state not in IDLE:
            waits[draft.view.name] = advance(draft, ctx)
    for draft in drafts:
        if draft.state in IDLE and (wait := settle_idle(draft, ctx)) is not None:
            waits[draft.view.name] = wait

    limits = Limits(policy, drafts)
    canary = Canary(policy.canary, drafts, facts.now)
    pending_reason: dict[str, str] = {}
    pending = [d for d in drafts if d.state == State.UPGRADE_REQUIRED]
    room = limits.room(sum(1 for d in pending if not d.view.skipped))
    pending.sort(key=lambda d: (d.view.name not in canary.candidates, not d.unschedulable, d.view.name))
    started: set[str] = set()
    for draft in pending:
        name = draft.view.name
        reason = (
            "skipped: label nvidia.com/gpu-driver-upgrade.skip=true"
            if draft.view.skipped
            else limits.pause() or canary.refusal(draft, limits) or limits.refusal(draft)
        )
        if reason:
            pending_reason[name] = reason
            continue
        waits[name] = start(draft, ctx)
        started.add(name)
        limits.take(draft)
        if draft.state == State.FAILED:
            limits.failed.append(draft)

    resumed = failed_before and not any(d.state == State.FAILED and not d.view.skipped for d in drafts)
    actions = [*others]
    for draft in drafts:
        events = [e for e in (draft.node_event(), *draft.events) if e is not None]
        if resumed and draft.view.name in failed_before:
            message = f"driver upgrade resumed: node {draft.view.name} left upgrade-failed"
            events.append(UpgradeEvent(None, "Normal", message))
            resumed = False
        patch = draft.patch()
        writes = ([patch] if patch is not None else []) + draft.pod_writes
        if writes or events:
            actions.append(
                NodeActions(draft.view.name, tuple(writes), tuple(events), draft.view.name in started)
            )
    actions.sort(key=lambda a: a.node)

    status = _status(drafts, waits, pending_reason, limits, target_version)
    status["canary"] = canary.status(limits)
    times = [w.until for w in waits.values() if w is not None and w.until is not None]
    if not canary.complete and canary.soak_until is not None and pending_reason:
        times.append(canary.soak_until)
    return UpgradePlan(tuple(actions), status, min(times, default=None), _pods_needed(drafts), room)


def _pods_needed(drafts: list[Draft]) -> frozenset[str]:
    def needs(draft: Draft) -> bool:
        if draft.state == State.FAILED:
            failure = Failure.read(draft.annotations.get(FAILURE_ANNOTATION))
            return failure is not None and failure.step in NEEDS_PODS
        return draft.state in NEEDS_PODS or draft.state == State.CORDON_REQUIRED

    return frozenset(d.view.name for d in drafts if needs(d))


def _entry(draft: Draft, reason: str) -> dict[str, Any]:
    since = draft.since
    return {
        "node": draft.view.name,
        "state": str(draft.state),
        "since": format_time(since) if since is not None else None,
        "reason": reason,
    }


def _groups(reasons: dict[str, str]) -> list[dict[str, Any]]:
    groups: dict[str, list[str]] = {}
    for name in sorted(reasons):
        groups.setdefault(reasons[name], []).append(name)
    return [{"reason": r, "count": len(n), "nodes": n[:SHOWN_NODES]} for r, n in groups.items()]


def _status(
    drafts: list[Draft],
    waits: dict[str, Wait | None],
    pending: dict[str, str],
    limits: Limits,
    target_version: str,
) -> dict[str, Any]:
    in_progress, failed = [], []
    done = 0
    for draft in drafts:
        wait = waits.get(draft.view.name)
        reason = wait.reason if wait is not None else ""
        if draft.state == State.DONE:
            done += 1
        elif draft.state == State.FAILED:
            failed.append(_entry(draft, reason))
        elif draft.state not in IDLE:
            in_progress.append(_entry(draft, reason or str(draft.state)))
    total = len(drafts)
    paused_reason = ""
    if limits.failed:
        first = limits.failed[0]
        failure = Failure.read(first.annotations.get(FAILURE_ANNOTATION))
        why = f" at {failure.step}: {failure.reason}" if failure is not None else ""
        more = f" (and {len(limits.failed) - 1} more failed nodes)" if len(limits.failed) > 1 else ""
        paused_reason = (
            f"node {first.view.name} failed{why}{more}. It resumes by itself once the cause is gone; "
            f"or set another driver version, or label it {SKIP_LABEL}=true to go on without it"
        )
    if limits.failed:
        summary = f"paused: {len(failed)} failed, {done}/{total} upgraded"
    elif done == total:
        summary = "up to date"
    else:
        summary = f"{done}/{total} upgraded"
    return {
        "autoUpgrade": True,
        "targetVersion": target_version,
        "summary": summary,
        "paused": bool(limits.failed),
        "pausedReason": paused_reason,
        "nodes": total,
        "nodesDone": done,
        "nodesInProgress": len(in_progress),
        "nodesFailed": len(failed),
        "nodesPending": len(pending),
        "inProgress": in_progress,
        "failed": failed,
        "pending": _groups(pending),
    }


def manual_inputs(facts: Facts) -> tuple[Any, ...]:
    """All that a plan with autoUpgrade off reads of the facts (`_manual`, through `build_views`): each
    node's upgrade state label and upgrade annotations, and the DaemonSet and revision of the driver
    pod that speaks for it; then each driver DaemonSet's revision, and the nodes whose orphaned driver
    pod the upgrade replaces. Not the time, the validator pods, the workload pods, the driver pods'
    readiness or any other label: in a rollout those change at every pass, and this does not."""
    drivers = _best(facts.driver_pods)
    nodes = tuple(
        (
            node.name,
            node.labels.get(STATE_LABEL),
            node.annotations,
            (driver.daemonset_uid, driver.revision) if (driver := drivers.get(node.name)) else None,
        )
        for node in facts.nodes
    )
    daemonsets = tuple(sorted((d.uid, d.revision) for d in facts.driver_daemonsets))
    return nodes, daemonsets, tuple(sorted(facts.orphans.items()))


def _manual(views: list[NodeView], others: list[NodeActions], target_version: str) -> UpgradePlan:
    """autoUpgrade off: nothing is cordoned, evicted or restarted; only NVIDIA's auto-upgrade annotation
    goes, so that k8s-driver-manager evicts GPU pods itself when someone restarts a driver pod."""
    actions = list(others)
    waiting: dict[str, str] = {}
    in_progress = []
    for view in views:
        note = _auto_annotation(view.node, False)
        if note:
            actions.append(NodeActions(view.name, (PatchNode(view.name, annotations=note),)))
        state = State.of(view.node.labels.get(STATE_LABEL))
        if view.needs_upgrade:
            waiting[view.name] = MANUAL_ORPHAN if view.orphaned else MANUAL
        elif state not in IDLE:
            draft = Draft(view, 0.0)
            in_progress.append(
                _entry(draft, f"autoUpgrade is off: the operator takes no further step from {state}")
            )
    actions.sort(key=lambda a: a.node)
    done = len(views) - len(waiting) - len(in_progress)
    summary = f"manual: {len(waiting)} nodes wait for a driver pod restart" if waiting else "up to date"
    status = {
        "autoUpgrade": False,
        "targetVersion": target_version,
        "summary": summary,
        "paused": False,
        "pausedReason": "",
        "nodes": len(views),
        "nodesDone": done,
        "nodesInProgress": len(in_progress),
        "nodesFailed": 0,
        "nodesPending": len(waiting),
        "inProgress": in_progress,
        "failed": [],
        "pending": _groups(waiting),
        "canary": None,
    }
    return UpgradePlan(tuple(actions), status, None)
