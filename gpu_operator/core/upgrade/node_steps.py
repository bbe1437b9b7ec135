"""One node's way through the upgrade states (pure).

A `Draft` holds the node's labels, annotations and cordon as this pass leaves them. Each step either
moves the draft on (and the next step runs in the same pass, so a node that needs no waiting goes from
upgrade-required to pod-deletion-required in one node patch) or says what it waits for and until when.
Nothing here sleeps: a deadline is returned, and the caller plans again at that time.

NVIDIA's per-state logic (k8s-operator-libs pkg/upgrade/common_manager.go, upgrade_inplace.go,
pod_manager.go, validation_manager.go) is kept, with these changes, each for a reported problem:
- a node whose driver pod already runs the target revision (a rollback, a cancelled change) leaves
  the flow at once instead of being cordoned and emptied for nothing;
- pod-deletion and drain timeouts are measured from a node annotation, so an operator restart does
  not restart them; a refused eviction is retried, its reason shown;
- the validation gate also needs the driver pod Ready and a validator pod started after it, and
  restarts a validator pod that validated the previous driver once nothing else will (`_revalidate`);
  a done node whose driver pod is replaced after its validation goes through the gate again;
- every upgrade-failed node records the step, the target revision and the reason, and resumes by
  itself when the cause is gone or the target changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_operator.api.selector import parse_selector
from gpu_operator.api.upgrade_policy import DrainSpec, PodDeletionSpec, UpgradePolicySpec, ValidationSpec
from gpu_operator.core.upgrade.facts import (
    DriverDaemonSet,
    DriverPod,
    EvictionResult,
    UpgradeNode,
    ValidatorPod,
    WorkloadPod,
    format_time,
)
from gpu_operator.core.upgrade.states import (
    BEFORE_RESTART,
    DRAIN_SKIP_LABEL,
    FAILURE_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REQUESTED_ANNOTATION,
    SAFE_LOAD_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_START_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    WAIT_FOR_JOBS_START_ANNOTATION,
    State,
)
from gpu_operator.core.upgrade.writes import DeletePod, EvictPod, PatchNode, UpgradeEvent, Write

CRASH_LOOP_RESTARTS = 10
"""A driver pod that is not ready after more restarts than this has failed (NVIDIA's isDriverPodFailing)."""
EVICTION_RETRY_SECONDS = 10
"""How soon a refused eviction is asked again (kubectl drain retries every 5 s; we are gentler)."""
SHOWN = 3
"""Pods or nodes named in one status line."""


@dataclass(frozen=True)
class NodeView:
    """Everything observed about one node that takes part in driver upgrades."""

    node: UpgradeNode
    driver: DriverPod | None = None
    daemonset: DriverDaemonSet | None = None
    """The DaemonSet that owns `driver` (None: no driver pod, or an orphaned one)."""
    validator: ValidatorPod | None = None
    pods: tuple[WorkloadPod, ...] = ()
    pods_known: bool = True
    """`pods` is the node's complete list (the caller lists pods only on nodes being emptied)."""
    orphaned: bool = False
    """`driver` is an orphaned pod (its DaemonSet gone) that this upgrade replaces (Facts.orphans)."""
    replacement_digest: str = ""
    """For an orphaned pod, the DRIVER_CONFIG_DIGEST of the DaemonSet that replaces it."""

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def in_sync(self) -> bool:
        """The driver pod runs its DaemonSet's current revision (NVIDIA's podInSyncWithDS)."""
        return (
            self.driver is not None
            and self.daemonset is not None
            and self.driver.revision == self.daemonset.revision
        )

    @property
    def at_target(self) -> bool:
        """Runs the current revision and is ready: nothing left to do for the driver itself."""
        return self.in_sync and self.driver is not None and self.driver.ready

    @property
    def requested(self) -> bool:
        return self.node.annotations.get(REQUESTED_ANNOTATION) == "true"

    @property
    def waits_for_safe_load(self) -> bool:
        return bool(self.node.annotations.get(SAFE_LOAD_ANNOTATION))

    @property
    def needs_upgrade(self) -> bool:
        """NVIDIA's ProcessDoneOrUnknownNodes rule: an out-of-date (not orphaned) driver pod, an explicit
        request, or a new driver pod waiting for a safe load; and an orphaned driver pod this upgrade
        replaces (NVIDIA's labelNodesWithOrphanedDriverPods)."""
        outdated = self.driver is not None and self.daemonset is not None and not self.in_sync
        return outdated or self.orphaned or self.requested or self.waits_for_safe_load

    @property
    def skipped(self) -> bool:
        return self.node.labels.get(SKIP_LABEL) == "true"

    @property
    def target_revision(self) -> str:
        return self.daemonset.revision if self.daemonset is not None else ""

    @property
    def restart_only(self) -> bool:
        """NVIDIA's restart-only predicate: the pod template changed but DRIVER_CONFIG_DIGEST did not, so the
        driver stays as it is and only its pod restarts (no eviction, no drain). Here also for an
        orphaned pod whose replacement installs the same driver (a switch to a pool that keeps it)."""
        driver, daemonset = self.driver, self.daemonset
        if driver is None or self.requested or self.waits_for_safe_load:
            return False
        target = daemonset.config_digest if daemonset is not None else ""
        if daemonset is None and self.orphaned:
            target = self.replacement_digest
        return bool(driver.config_digest) and driver.config_digest == target


@dataclass(frozen=True)
class Context:
    """What every step of one pass shares."""

    policy: UpgradePolicySpec
    now: float
    evictions: Mapping[str, EvictionResult] = field(default_factory=dict)
    validate: bool = True
    """The operator-validator is enabled: the gate waits for it."""


@dataclass(frozen=True)
class Wait:
    """Why a node stays where it is, and when to look again (None: only a change in the cluster helps)."""

    reason: str
    until: float | None = None


@dataclass(frozen=True)
class Failure:
    """What an upgrade-failed node recorded in its FAILURE_ANNOTATION."""

    step: State
    revision: str
    reason: str

    @classmethod
    def read(cls, text: str | None) -> Failure | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(State.of(data.get("step")), str(data.get("revision", "")), str(data["reason"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(State.UNKNOWN, "", text)  # edited by hand: show it as it is

    def text(self) -> str:
        return json.dumps({"step": str(self.step), "revision": self.revision, "reason": self.reason})


@dataclass
class Draft:
    """The node as this pass leaves it: `patch()` is the difference to write, `node_event()` the Event
    that tells the states it went through."""

    view: NodeView
    now: float
    labels: dict[str, str] = field(init=False)
    annotations: dict[str, str] = field(init=False)
    unschedulable: bool = field(init=False)
    path: list[State] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pod_writes: list[Write] = field(default_factory=list)
    events: list[UpgradeEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = dict(self.view.node.labels)
        self.annotations = dict(self.view.node.annotations)
        self.unschedulable = self.view.node.unschedulable

    @property
    def state(self) -> State:
        return State.of(self.labels.get(STATE_LABEL))

    @property
    def since(self) -> float | None:
        return _seconds(self.annotations.get(STATE_START_ANNOTATION))

    def move(self, state: State, note: str = "") -> None:
        if not self.path:
            self.path.append(self.state)
        self.path.append(state)
        self.labels[STATE_LABEL] = str(state)
        self.annotations[STATE_START_ANNOTATION] = str(int(self.now))
        if note:
            self.notes.append(note)

    def annotate(self, key: str, value: str | None) -> None:
        if value is None:
            self.annotations.pop(key, None)
        else:
            self.annotations[key] = value

    def stamp(self, key: str) -> float:
        """The time an annotation records, set to now if it records none."""
        recorded = _seconds(self.annotations.get(key))
        if recorded is None:
            self.annotations[key] = str(int(self.now))
            return float(int(self.now))
        return recorded

    def fail(self, reason: str) -> Wait:
        failure = Failure(self.state, self.view.target_revision, reason)
        self.annotate(FAILURE_ANNOTATION, failure.text())
        self.move(State.FAILED, reason)
        self.events.append(
            UpgradeEvent(
                None,
                "Warning",
                f"driver upgrade paused: node {self.view.name} failed at {failure.step}: {reason}",
            )
        )
        return Wait(f"failed at {failure.step}: {reason}")

    def patch(self) -> PatchNode | None:
        node = self.view.node
        labels = _diff(node.labels, self.labels)
        annotations = _diff(node.annotations, self.annotations)
        cordon = self.unschedulable if self.unschedulable != node.unschedulable else None
        if not labels and not annotations and cordon is None:
            return None
        return PatchNode(node.name, labels, annotations, cordon)

    def node_event(self) -> UpgradeEvent | None:
        if not self.path:
            return None
        states = " → ".join(str(s) or "(none)" for s in self.path)
        message = f"{states}: {'; '.join(self.notes)}" if self.notes else states
        if self.state == State.FAILED:
            return UpgradeEvent(self.view.name, "Warning", message)
        return UpgradeEvent(self.view.name, "Normal", message)


def _diff(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str | None]:
    changed: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
    changed.update({k: None for k in before if k not in after})
    return changed


def _seconds(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def shorten(items: list[str], separator: str = ", ") -> str:
    """The first few items, and how many more there are."""
    shown = separator.join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# --- the steps ----------------------------------------------------------------------------------------

Step = Callable[[Draft, Context], Wait | None]


def _cordon(draft: Draft, ctx: Context) -> Wait | None:
    draft.unschedulable = True
    draft.move(State.WAIT_FOR_JOBS_REQUIRED, "cordoned")
    return None


def _wait_for_jobs(draft: Draft, ctx: Context) -> Wait | None:
    spec = ctx.policy.waitForCompletion
    selector = spec.podSelector if spec is not None else None
    running = []
    if spec is not None and selector:
        matches = parse_selector(selector).matches
        running = [p for p in draft.view.pods if p.active and matches(p.labels)]
    if not running:
        draft.annotate(WAIT_FOR_JOBS_START_ANNOTATION, None)
        draft.move(State.POD_DELETION_REQUIRED, "no jobs to wait for" if selector else "")
        return None
    assert spec is not None
    names = shorten([p.key for p in running])
    waiting = f"waiting for {_plural(len(running), 'pod')} matching {selector!r} to complete: {names}"
    if not spec.timeoutSeconds:
        return Wait(f"{waiting} (no timeout)")
    deadline = draft.stamp(WAIT_FOR_JOBS_START_ANNOTATION) + spec.timeoutSeconds
    if ctx.now < deadline:
        return Wait(f"{waiting} (until {format_time(deadline)})", deadline)
    draft.annotate(WAIT_FOR_JOBS_START_ANNOTATION, None)
    draft.move(State.POD_DELETION_REQUIRED, f"stopped waiting for jobs after {spec.timeoutSeconds}s")
    return None


def gpu_pods(view: NodeView) -> list[WorkloadPod]:
    """The pods pod-deletion-required removes: GPU pods, except DaemonSet and mirror pods."""
    return [p for p in view.pods if p.gpu and p.evictable]


def drained_pods(view: NodeView, policy: UpgradePolicySpec) -> list[WorkloadPod]:
    drain = policy.drain
    matches = parse_selector((drain.podSelector if drain is not None else None) or "").matches
    return [
        p for p in view.pods if p.evictable and matches(p.labels) and p.labels.get(DRAIN_SKIP_LABEL) != "true"
    ]


@dataclass(frozen=True)
class Removal:
    """The outcome of one pass of emptying a node."""

    done: bool = False
    failure: str = ""
    wait: Wait | None = None


def _refusal(pod: WorkloadPod, force: bool, delete_empty_dir: bool) -> str:
    if not pod.controller_kind and not force:
        return f"{pod.key} has no controller (force allows deleting it)"
    if pod.empty_dir and not delete_empty_dir:
        return f"{pod.key} uses emptyDir volumes (deleteEmptyDir allows deleting it)"
    return ""


def _remove(
    draft: Draft, ctx: Context, pods: list[WorkloadPod], spec: PodDeletionSpec | DrainSpec, what: str
) -> Removal:
    """Evict `pods` (kubectl drain's rules), retrying refused evictions until the timeout; then delete
    them with `force`, or fail. Pods already terminating are waited for."""
    force, timeout, delete_empty_dir = spec.force, spec.timeoutSeconds, spec.deleteEmptyDir
    if not pods:
        return Removal(done=True)
    refused = [r for p in pods if not p.terminating and (r := _refusal(p, force, delete_empty_dir))]
    if refused:
        return Removal(failure=f"cannot evict {'; '.join(refused)}")
    since = draft.stamp(STATE_START_ANNOTATION)
    deadline = since + timeout if timeout else None
    timed_out = deadline is not None and ctx.now >= deadline
    details = []
    wake = [] if timed_out or deadline is None else [deadline]
    for pod in pods:
        last = ctx.evictions.get(pod.uid)
        if pod.terminating:
            details.append(f"{pod.key} terminating")
        elif timed_out:
            if force:
                draft.pod_writes.append(DeletePod(pod.namespace, pod.name, pod.uid, "forced"))
            details.append(f"{pod.key} {'deleted after the timeout (force)' if force else _eviction(last)}")
        else:
            if last is None or ctx.now >= last.at + EVICTION_RETRY_SECONDS:
                draft.pod_writes.append(EvictPod(pod.namespace, pod.name, pod.uid))
                wake.append(ctx.now + EVICTION_RETRY_SECONDS)  # ask again if it is refused
            else:
                wake.append(last.at + EVICTION_RETRY_SECONDS)
            details.append(f"{pod.key} {_eviction(last)}")
    evicting = sum(isinstance(w, EvictPod) for w in draft.pod_writes)
    if evicting:
        draft.notes.append(f"evicting {_plural(evicting, what)}")
    summary = f"{_plural(len(pods), what)} on the node: {shorten(details, '; ')}"
    if timed_out and not force:
        return Removal(failure=f"{summary} (eviction timed out after {timeout}s)")
    if deadline is not None and not timed_out:
        summary += f" (times out at {format_time(deadline)})"
    return Removal(wait=Wait(f"evicting {summary}", min(wake, default=None)))


def _eviction(last: EvictionResult | None) -> str:
    if last is None:
        return "being evicted"
    if last.accepted:
        return "evicted"
    return (
        f"eviction refused ({last.status}: {last.message})"
        if last.message
        else f"eviction refused ({last.status})"
    )


def _pod_deletion(draft: Draft, ctx: Context) -> Wait | None:
    spec = ctx.policy.pod_deletion()
    removal = _remove(draft, ctx, gpu_pods(draft.view), spec, "GPU pod")
    if removal.wait is not None:
        return removal.wait
    if removal.failure:
        if not (ctx.policy.drain and ctx.policy.drain.enable):
            return draft.fail(removal.failure)
        draft.move(State.DRAIN_REQUIRED, f"{removal.failure}; draining instead (drain.enable)")
        return None
    draft.move(State.DRAIN_REQUIRED, "no GPU pods left")
    return None


def _drain(draft: Draft, ctx: Context) -> Wait | None:
    drain = ctx.policy.drain
    if drain is None or not drain.enable:
        draft.move(State.POD_RESTART_REQUIRED)
        return None
    removal = _remove(draft, ctx, drained_pods(draft.view, ctx.policy), drain, "pod")
    if removal.wait is not None:
        return removal.wait
    if removal.failure:
        return draft.fail(f"drain: {removal.failure}")
    draft.move(State.POD_RESTART_REQUIRED, "drained")
    return None


def _unblock_safe_load(draft: Draft) -> None:
    if draft.annotations.get(SAFE_LOAD_ANNOTATION):
        draft.annotate(SAFE_LOAD_ANNOTATION, None)
        draft.notes.append("let the new driver load (safe driver load)")


def _crash_loop(pod: DriverPod) -> str:
    if pod.ready or pod.restarts <= CRASH_LOOP_RESTARTS:
        return ""
    detail = f": {pod.message}" if pod.message else ""
    return f"driver pod {pod.name} is crash-looping ({pod.restarts} restarts, {pod.reason}{detail})"


def _pod_restart(draft: Draft, ctx: Context) -> Wait | None:
    view, pod = draft.view, draft.view.driver
    draft.annotate(REQUESTED_ANNOTATION, None)
    if pod is None:
        return Wait("waiting for the driver DaemonSet to create the new driver pod")
    if not view.in_sync:
        if pod.terminating:
            return Wait(f"waiting for the old driver pod {pod.name} to terminate")
        draft.pod_writes.append(DeletePod(pod.namespace, pod.name, pod.uid, "driver-restart"))
        target = f" for revision {view.target_revision}" if view.target_revision else ""
        draft.notes.append(f"deleted driver pod {pod.name} (revision {pod.revision or 'none'}){target}")
        return Wait(f"restarting the driver: deleted pod {pod.name}{target}")
    _unblock_safe_load(draft)
    if pod.ready:
        draft.move(State.VALIDATION_REQUIRED, f"driver pod {pod.name} is ready")
        return None
    if crash := _crash_loop(pod):
        return draft.fail(crash)
    return Wait(f"waiting for driver pod {pod.name} to become ready ({pod.reason or 'starting'})")


def _validation(draft: Draft, ctx: Context) -> Wait | None:
    view, pod = draft.view, draft.view.driver
    if pod is None or not view.in_sync:
        draft.annotate(VALIDATION_START_ANNOTATION, None)
        draft.move(State.POD_RESTART_REQUIRED, "the driver pod is not at the target revision")
        return None
    _unblock_safe_load(draft)
    if crash := _crash_loop(pod):
        draft.annotate(VALIDATION_START_ANNOTATION, None)
        return draft.fail(crash)
    missing = _not_validated(view, ctx)
    if not missing:
        draft.annotate(VALIDATION_START_ANNOTATION, None)
        draft.move(State.UNCORDON_REQUIRED, "validated")
        return None
    _revalidate(draft, ctx)
    timeout = (ctx.policy.validation or ValidationSpec()).timeoutSeconds
    start = draft.stamp(VALIDATION_START_ANNOTATION)
    if timeout and ctx.now >= start + timeout:
        draft.annotate(VALIDATION_START_ANNOTATION, None)
        return draft.fail(f"validation gate: not Ready within {timeout}s: {missing}")
    until = f" (until {format_time(start + timeout)})" if timeout else ""
    return Wait(f"validation gate: waiting for {missing}{until}", start + timeout if timeout else None)


def _revalidate(draft: Draft, ctx: Context) -> None:
    """Delete the node's operator-validator pod when it validated the previous driver and nothing else
    will replace it, so that its DaemonSet starts one whose init containers validate the new driver.

    k8s-driver-manager evicts the validator while it unloads the old driver, so in the usual flow a new
    validator pod follows the new driver pod. But when the driver pod is replaced by hand while it
    still installs (NVIDIA's update test deletes driver pods 10 s after a version change), the next
    k8s-driver-manager finds no driver loaded and evicts nothing: the old validator stays Ready and
    the gate would wait for a pod that never comes. The driver pod being Ready means its
    k8s-driver-manager (an init container) is done, so a validator older than it is not going away by
    itself. NVIDIA's upgrade library accepts that old pod as proof; restarting it proves the new
    driver instead, as k8s-driver-manager would have. The delete names the pod's uid, so a newer
    validator pod is never deleted."""
    view, driver, validator = draft.view, draft.view.driver, draft.view.validator
    if (
        not ctx.validate
        or not view.node.validator_expected
        or driver is None
        or not driver.ready
        or validator is None
        or validator.created >= driver.created
        or validator.terminating
        or not validator.uid
    ):
        return
    draft.pod_writes.append(
        DeletePod(validator.namespace, validator.name, validator.uid, "validator-restart")
    )
    draft.notes.append(f"deleted operator-validator pod {validator.name}: it validated the previous driver")


def _not_validated(view: NodeView, ctx: Context) -> str:
    """What the validation gate still waits for ('' when the node passes)."""
    pod = view.driver
    assert pod is not None
    missing = [] if pod.ready else [f"driver pod {pod.name} ({pod.reason or 'not ready'})"]
    if ctx.validate and view.node.validator_expected:
        validator = view.validator
        if validator is None:
            missing.append("an operator-validator pod on the node")
        elif validator.created < pod.created:
            missing.append(f"a new operator-validator pod ({validator.name} validated the previous driver)")
        elif not validator.ready:
            missing.append(f"operator-validator pod {validator.name} ({validator.reason or 'not ready'})")
    return "; ".join(missing)


def _validated_an_older_driver(view: NodeView, ctx: Context) -> bool:
    """The node's validator pod started before its driver pod (at the target revision): it validated
    a driver pod that is gone."""
    driver, validator = view.driver, view.validator
    return (
        ctx.validate
        and view.node.validator_expected
        and view.in_sync
        and driver is not None
        and validator is not None
        and not validator.terminating
        and validator.created < driver.created
    )


def _uncordon(draft: Draft, ctx: Context) -> Wait | None:
    if draft.annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) == "true":
        draft.annotate(INITIAL_UNSCHEDULABLE_ANNOTATION, None)
        draft.notes.append("left cordoned, as it was before the upgrade")
    else:
        draft.unschedulable = False
        draft.notes.append("uncordoned")
    draft.annotate(FAILURE_ANNOTATION, None)
    version = draft.view.daemonset.version if draft.view.daemonset else ""
    draft.move(State.DONE, f"driver {version} running" if version else "")
    return None


def _failed(draft: Draft, ctx: Context) -> Wait | None:
    view = draft.view
    failure = Failure.read(draft.annotations.get(FAILURE_ANNOTATION))
    resume: State | None = None
    why = ""
    if view.at_target and (
        failure is None or failure.step != State.VALIDATION_REQUIRED or not _not_validated(view, ctx)
    ):
        # A failed validation resumes only once the gate would pass, or it would fail again and again.
        resume, why = State.VALIDATION_REQUIRED, "the driver pod is ready at the target revision"
    elif failure is not None and failure.revision and view.target_revision not in ("", failure.revision):
        resume = failure.step if failure.step in BEFORE_RESTART else State.POD_RESTART_REQUIRED
        why = f"the target revision changed to {view.target_revision}"
    elif (
        failure is not None
        and view.pods_known
        and (
            (failure.step == State.POD_DELETION_REQUIRED and not gpu_pods(view))
            or (failure.step == State.DRAIN_REQUIRED and not drained_pods(view, ctx.policy))
        )
    ):
        resume, why = failure.step, "the pods that blocked it are gone"
    if resume is None:
        if failure is None:
            return Wait("upgrade-failed (no reason recorded; label the node upgrade-required to retry)")
        return Wait(f"failed at {failure.step}: {failure.reason}")
    draft.annotate(FAILURE_ANNOTATION, None)
    draft.move(resume, f"resuming: {why}")
    return None


NEEDS_PODS = frozenset({State.WAIT_FOR_JOBS_REQUIRED, State.POD_DELETION_REQUIRED, State.DRAIN_REQUIRED})
"""The steps that decide on the node's pods: they wait while the pods are not listed, since an unknown
list read as empty would restart the driver under running GPU workloads."""
WAITING_FOR_PODS = "listing the pods on the node"


STEPS: dict[State, Step] = {
    State.CORDON_REQUIRED: _cordon,
    State.WAIT_FOR_JOBS_REQUIRED: _wait_for_jobs,
    State.POD_DELETION_REQUIRED: _pod_deletion,
    State.DRAIN_REQUIRED: _drain,
    State.POD_RESTART_REQUIRED: _pod_restart,
    State.VALIDATION_REQUIRED: _validation,
    State.UNCORDON_REQUIRED: _uncordon,
    State.FAILED: _failed,
}


def advance(draft: Draft, ctx: Context) -> Wait | None:
    """Run steps until the node has to wait (its reason) or is done (None)."""
    for _ in range(2 * len(State)):
        state = draft.state
        if state in BEFORE_RESTART and draft.view.at_target and not draft.view.requested:
            # The target is what already runs (a rollback, or a change undone): nothing to make safe.
            draft.move(State.VALIDATION_REQUIRED, "the driver pod already runs the target revision")
            continue
        step = STEPS.get(state)
        if step is None:
            return None
        if state in NEEDS_PODS and not draft.view.pods_known:
            return Wait(WAITING_FOR_PODS)
        wait = step(draft, ctx)
        if wait is not None:
            return wait
    raise RuntimeError(f"node {draft.view.name}: upgrade states did not settle: {draft.path}")


def settle_idle(draft: Draft, ctx: Context) -> Wait | None:
    """Unknown, done and upgrade-required nodes: mark those whose driver is out of date, finish the rest.

    An upgrade-required node whose driver pod reached the target revision without the operator (its
    pod deleted by hand, as NVIDIA's update test does) is done only once the validation gate passes:
    until then the new driver is unproven, and the status must not say "up to date". A rollback to
    the revision the node still runs passes the gate at once."""
    view, state = draft.view, draft.state
    if view.needs_upgrade:
        if state != State.UPGRADE_REQUIRED:
            revision = f" (revision {view.target_revision})" if view.target_revision else ""
            why = f"a new driver{revision} is to be installed"
            if view.orphaned and view.driver is not None:
                orphan = f"driver pod {view.driver.name} is orphaned (its DaemonSet is gone)"
                why = f"{orphan}: a new driver replaces it"
            draft.annotate(INITIAL_UNSCHEDULABLE_ANNOTATION, "true" if draft.unschedulable else None)
            draft.move(State.UPGRADE_REQUIRED, why)
    elif state == State.UPGRADE_REQUIRED and view.driver is not None and _not_validated(view, ctx):
        draft.move(State.VALIDATION_REQUIRED, "the driver pod was replaced at the target revision")
        return advance(draft, ctx)
    elif state == State.DONE and _validated_an_older_driver(view, ctx):
        # A driver pod deleted by hand on a done node: its replacement's k8s-driver-manager evicts
        # nothing when no driver was loaded, so the validator that ran stays and proves nothing.
        draft.annotate(INITIAL_UNSCHEDULABLE_ANNOTATION, "true" if draft.unschedulable else None)
        draft.move(State.VALIDATION_REQUIRED, "the driver pod was replaced after its validation")
        return advance(draft, ctx)
    elif state != State.DONE:
        draft.move(State.DONE, "" if state == State.UNKNOWN else "the driver pod is already up to date")
    return None


def start(draft: Draft, ctx: Context) -> Wait | None:
    """Begin a pending node's upgrade (the caller has checked the limits), then go as far as possible.

    The node's own cordon, to restore at the end, is recorded when it is marked upgrade-required (as
    NVIDIA does) and again now, right before our cordon, unless a failure record says the cordon may be
    ours: a failed node relabelled upgrade-required by hand keeps what was recorded first."""
    if not draft.unschedulable:
        draft.annotate(INITIAL_UNSCHEDULABLE_ANNOTATION, None)
    elif FAILURE_ANNOTATION not in draft.annotations:
        draft.annotate(INITIAL_UNSCHEDULABLE_ANNOTATION, "true")
    if draft.view.restart_only:
        draft.unschedulable = True
        draft.move(State.POD_RESTART_REQUIRED, "cordoned; DRIVER_CONFIG_DIGEST unchanged, so only a restart")
    else:
        draft.move(State.CORDON_REQUIRED)
    return advance(draft, ctx)
