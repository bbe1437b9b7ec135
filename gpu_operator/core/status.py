"""What the ClusterPolicies' status says, and which Events tell the news (pure, no I/O).

The planner computes each policy's status from the observed cluster (`policy_status`); once the
writes of a pass are done, what they returned comes back here as facts (`with_apply_errors`), and
`events_for` decides which Events to post: on transitions only, so a converged cluster posts none.
Statuses are the typed models of gpu_operator/api/status.py; `status_body` is the JSON written,
with only the fields the operator sets (a merge patch leaves the rest as it is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpu_operator.api import FieldError
from gpu_operator.api.quoting import bounded
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import (
    REASON_CONFLICT,
    REASON_IGNORED,
    REASON_INVALID_SPEC,
    REASON_NO_GPU_NODES,
    REASON_OPERAND_NOT_READY,
    REASON_PREREQUISITE_NOT_MET,
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
    ClusterPolicyStatus,
    ComponentStatus,
    Condition,
    NodeProblem,
)
from gpu_operator.core.caches import Caches
from gpu_operator.core.components import BY_LABEL, COMPONENTS, Component
from gpu_operator.core.node_labels import (
    Deploy,
    IsReady,
    NodeInfo,
    awaited,
    deploy_state,
    gpu_nodes,
    leaving,
    runs_on,
    takes_operands,
    unmet_dependencies,
)
from gpu_operator.core.observed import DaemonSetInfo, PodInfo, PolicyRef, rollout
from gpu_operator.core.vetting import Problems
from gpu_operator.core.workloads import WORKLOADS, workload_type

MAX_PROBLEMS = 5
WAITING = "WaitingForDependency"
"""The reason of a node where a component waits for a dependency (message: for which)."""


class Note(str):
    """A remark about the active policy: appended to its condition message, posted once as an Event."""

    reason: str

    def __new__(cls, message: str, reason: str = "Unsupported") -> Note:
        note = super().__new__(cls, message)
        note.reason = reason
        return note


@dataclass(frozen=True)
class Event:
    """An Event to post on a ClusterPolicy."""

    policy: str
    uid: str
    type: str
    reason: str
    message: str


Signature = tuple[str, ...]
"""(state, Error reason, notes...) of a policy's last Events: new Events only when it changes."""


def status_body(status: ClusterPolicyStatus) -> dict[str, Any]:
    """The JSON written to the status subresource: exactly the fields the operator set."""
    return status.model_dump(mode="json", exclude_unset=True)


def status_differs(current: Mapping[str, Any], desired: ClusterPolicyStatus) -> bool:
    """Whether writing `desired` would change anything (only the fields we write are compared)."""
    return any(current.get(key) != value for key, value in status_body(desired).items())


def progress_only(current: Mapping[str, Any], desired: ClusterPolicyStatus) -> bool:
    """Whether writing `desired` over `current` would change only how far a rollout has got (node
    counts, the problems listed, messages, components becoming ready while the policy is not), not
    what the status says: its state, generation and GPU nodes, a component's state otherwise (one
    that stops being ready, is disabled, unsupported), each condition's type, status and reason. Such
    a write may wait a little (Settings.status_interval_seconds); any other goes out at once, and so
    does every write of a ready status (the last word of a rollout: nothing may trail it into the
    cluster's rest). The components of a small rollout become ready one after another within moments
    at its end: written each at once, a status write per component would hold up the passes that
    label the last nodes and the one that writes the ready status."""
    body = status_body(desired)
    if body.get("state") == "ready":
        return False
    said = ("state", "observedGeneration", "gpuNodes", "namespace", "workloads")
    if any(current.get(key) != body.get(key) for key in said):
        return False

    def states(value: Any) -> dict[Any, tuple[Any, Any]]:
        return {c.get("name"): (c.get("enabled"), c.get("state")) for c in value or []}

    def conditions(value: Any) -> list[tuple[Any, ...]]:
        return [(c.get("type"), c.get("status"), c.get("reason")) for c in value or []]

    def advanced(was: tuple[Any, Any], now: tuple[Any, Any]) -> bool:
        return was == now or (was[0] == now[0] and was[1] == "notReady" and now[1] == "ready")

    before, after = states(current.get("components")), states(body.get("components"))
    return (
        before.keys() == after.keys()
        and all(advanced(before[name], after[name]) for name in before)
        and conditions(current.get("conditions")) == conditions(body.get("conditions"))
    )


# --- pods and readiness --------------------------------------------------------------------------


def pods_by_node(pods: Iterable[PodInfo]) -> dict[tuple[str, str], PodInfo]:
    """The pod that speaks for (component, node): a live one over a terminating one, then the newest
    (then the last by name, so that the answer never depends on the order pods come in)."""
    best: dict[tuple[str, str], PodInfo] = {}
    for pod in pods:
        key = (pod.component, pod.node)
        current = best.get(key)
        if current is None or _precedence(pod) > _precedence(current):
            best[key] = pod
    return best


Operands = tuple[PodInfo | None, ...]
"""The pods that speak for each component (COMPONENTS order; None: none) on one node."""
NO_OPERANDS: Operands = (None,) * len(COMPONENTS)


def operands_of(pods: Mapping[tuple[str, str], PodInfo], node: str) -> Operands:
    return tuple(pods.get((c.name, node)) for c in COMPONENTS)


def operands_by_node(pods: Mapping[tuple[str, str], PodInfo]) -> dict[str, Operands]:
    """Node → its operands (`pods` as pods_by_node gives them)."""
    return {node: operands_of(pods, node) for node in {node for _, node in pods}}


def _precedence(pod: PodInfo) -> tuple[bool, str, str]:
    return (not pod.terminating, pod.created, pod.name)


def readiness(pods: Mapping[tuple[str, str], PodInfo]) -> IsReady:
    def is_ready(component: str, node: str) -> bool:
        pod = pods.get((component, node))
        return pod is not None and pod.ready

    return is_ready


def present(pods: Mapping[tuple[str, str], PodInfo]) -> IsReady:
    """Whether the component has a pod on the node at all, terminating or not."""

    def is_present(component: str, node: str) -> bool:
        return (component, node) in pods

    return is_present


def started(pods: Mapping[tuple[str, str], PodInfo]) -> IsReady:
    """Whether the component's pod on the node has started: its init containers are done (or it is
    ready), and it is not going away."""

    def is_started(component: str, node: str) -> bool:
        pod = pods.get((component, node))
        return pod is not None and not pod.terminating and (pod.initialized or pod.ready)

    return is_started


# --- the active policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """Where one enabled component stands on one GPU node, as its status counts it."""

    eligible: bool
    """It belongs on the node (runs_on)."""
    labelled: bool = False
    """Its deploy label there is `true`."""
    ready: bool = False
    failing: bool = False
    waiting: bool = False
    """It waits for a dependency there: for its deploy label, or in its pod (`Component.waits_for`)."""
    problem: NodeProblem | None = None
    """Why it is not ready there (None when it is, or does not belong)."""


_ELSEWHERE = Standing(eligible=False)


def standing(
    component: Component, spec: ClusterPolicySpec, node: NodeInfo, pods: Mapping[tuple[str, str], PodInfo]
) -> Standing:
    if not runs_on(component, node, spec):
        return _ELSEWHERE
    if deploy_state(component, node) != Deploy.DEPLOYED:
        return Standing(eligible=True, waiting=True, problem=_waiting_problem(component, spec, node, pods))
    pod = pods.get((component.name, node.name))
    if pod is not None and pod.ready:
        return Standing(eligible=True, labelled=True, ready=True)
    deps = awaited(component, spec, node, readiness(pods)) if pod is None or not pod.failing else []
    if deps:
        # Labelled with a dependency its pod waits for in Init (the toolkit for the driver): what it
        # waits for is the news, not its pod's PodInitializing.
        problem = NodeProblem(node=node.name, reason=WAITING, message=_waiting_for(deps))
        return Standing(eligible=True, labelled=True, waiting=True, problem=problem)
    problem = NodeProblem(
        node=node.name,
        reason=pod.reason if pod is not None else "PodNotCreated",
        message=pod.message if pod is not None else "",
    )
    return Standing(eligible=True, labelled=True, failing=pod is not None and pod.failing, problem=problem)


def standings(
    caches: Caches,
    spec: ClusterPolicySpec,
    node: NodeInfo,
    pods: Mapping[tuple[str, str], PodInfo],
    mine: Operands,
) -> tuple[Standing | None, ...]:
    """Where every component (COMPONENTS order; None: disabled) stands on `node`, whose operands in
    `pods` are `mine`; kept in `caches.standings` while those stay the same."""
    return caches.standings.get(
        node.name,
        (node, spec, mine),
        lambda: tuple(standing(c, spec, node, pods) if c.enabled(spec) else None for c in COMPONENTS),
    )


Said = dict[str, tuple[int, tuple[str, ...]]]
"""What the one-line summary says of a kind of problem → (how many nodes, the first three of them)."""


@dataclass(frozen=True)
class Tally:
    """Where one component stands on a run of GPU nodes, summed up: what its status is made of."""

    eligible: int = 0
    labelled: int = 0
    ready: int = 0
    waiting: int = 0
    failing: int = 0
    own: tuple[NodeProblem, ...] = ()
    """The first MAX_PROBLEMS nodes not ready for reasons of their own, in node order."""
    waits: tuple[NodeProblem, ...] = ()
    """The first MAX_PROBLEMS nodes waiting for a dependency."""
    own_said: Said = field(default_factory=dict)
    """The summary's text for each kind of problem of the nodes not ready for reasons of their own
    (all of them, not only the first few) → (how many, the first three)."""
    waits_said: Said = field(default_factory=dict)


BLOCK = 32
"""GPU nodes per tally block: a pass sums the blocks, and counts again only those with a changed node."""


def _tally(column: Iterable[Standing | None]) -> Tally:
    eligible = labelled = ready = waiting = failing = 0
    own: list[NodeProblem] = []
    waits: list[NodeProblem] = []
    for s in column:
        if s is None or not s.eligible:
            continue
        eligible += 1
        if s.labelled:
            labelled += 1
            ready += s.ready
            failing += s.failing
        waiting += s.waiting
        if s.problem is not None:
            (waits if s.waiting else own).append(s.problem)
    return Tally(
        eligible,
        labelled,
        ready,
        waiting,
        failing,
        tuple(own[:MAX_PROBLEMS]),
        tuple(waits[:MAX_PROBLEMS]),
        _said(own),
        _said(waits),
    )


def _said(problems: Iterable[NodeProblem]) -> Said:
    found: Said = {}
    for problem in problems:
        text = problem.message if problem.reason in _SUMMARY_BY_MESSAGE else problem.reason
        count, names = found.get(text, (0, ()))
        found[text] = (count + 1, names if len(names) == 3 else (*names, problem.node))
    return found


def _combined(tallies: Sequence[Tally]) -> Tally:
    """The tally of consecutive runs of nodes, in node order."""
    if len(tallies) == 1:
        return tallies[0]
    own_said: Said = {}
    waits_said: Said = {}
    for tally in tallies:
        _add_said(own_said, tally.own_said)
        _add_said(waits_said, tally.waits_said)
    return Tally(
        sum(t.eligible for t in tallies),
        sum(t.labelled for t in tallies),
        sum(t.ready for t in tallies),
        sum(t.waiting for t in tallies),
        sum(t.failing for t in tallies),
        tuple(p for t in tallies for p in t.own)[:MAX_PROBLEMS],
        tuple(p for t in tallies for p in t.waits)[:MAX_PROBLEMS],
        own_said,
        waits_said,
    )


def _add_said(into: Said, said: Said) -> None:
    """What the summary says of more nodes, after those of `into` (their order kept)."""
    for text, (count, names) in said.items():
        before, first = into.get(text, (0, ()))
        into[text] = (before + count, (*first, *names)[:3])


def _component_status(
    component: Component,
    spec: ClusterPolicySpec,
    tally: Tally,
    daemonsets: list[DaemonSetInfo | None],
) -> ComponentStatus:
    """One component's status from where it stands on the GPU nodes (`tally`)."""
    if not component.enabled(spec):
        return ComponentStatus(name=component.name, enabled=False, state="disabled")
    # Nodes not ready for reasons of their own first, then the nodes waiting for a dependency.
    problems = [*tally.own, *tally.waits]
    # Only through rollout(): what it reads is what wakes a pass (runtime/store.py).
    rollouts = [rollout(d) for d in daemonsets]
    rolled_out = not tally.labelled or (
        all(r is not None and r.done for r in rollouts)
        and sum(r.desired for r in rollouts if r is not None) == tally.labelled
    )
    is_ready = rolled_out and not tally.waiting and tally.ready == tally.labelled
    return ComponentStatus(
        name=component.name,
        enabled=True,
        state="ready" if is_ready else "notReady",
        nodesDesired=tally.eligible,
        nodesReady=tally.ready,
        nodesWaiting=tally.waiting,
        nodesFailing=tally.failing,
        reason="" if is_ready else _summary(tally),
        problems=problems[:MAX_PROBLEMS],
    )


_NOWHERE = Tally()


def _block_tallies(rows: tuple[tuple[Standing | None, ...], ...]) -> tuple[Tally, ...]:
    """Each component's tally on a block of nodes (`rows`: their standings, COMPONENTS order); a
    disabled component (None on every node: most of the sandbox stacks, usually) counts nothing."""
    return tuple(
        _tally(column) if any(s is not None for s in column) else _NOWHERE
        for column in zip(*rows, strict=True)
    )


def _waiting_problem(
    component: Component, spec: ClusterPolicySpec, node: NodeInfo, pods: Mapping[tuple[str, str], PodInfo]
) -> NodeProblem:
    """Why a component that belongs on `node` has no `true` deploy label there."""
    key = component.deploy_label
    value, writer = node.labels.get(key, ""), node.writers.get(key, "another manager")
    state = deploy_state(component, node)
    if state == Deploy.PAUSED:
        # Operand managers pause and restore the label themselves; the component comes back then.
        return NodeProblem(node=node.name, reason="Paused", message=f"{value} by {writer}")
    if state == Deploy.HELD:
        message = f"{key}={value!r} set by {writer}: not true, false or a pause; left as it is"
        return NodeProblem(node=node.name, reason="DeployLabelHeld", message=message)
    gone = leaving(node, spec, present(pods))
    if gone:
        workload = workload_type(node.labels, spec)
        message = f"waiting for {', '.join(gone)} to leave the node (its workload type is now {workload})"
        return NodeProblem(node=node.name, reason=WAITING, message=message)
    deps = unmet_dependencies(component, spec, node, readiness(pods))
    message = _waiting_for(deps) if deps else "waiting for its deploy label"
    return NodeProblem(node=node.name, reason=WAITING, message=message)


def _waiting_for(deps: list[str]) -> str:
    return f"waiting for {', '.join(deps)}"


# Reasons whose message, not the reason itself, goes into the one-line summary.
_SUMMARY_BY_MESSAGE = (WAITING, "Paused")


def _summary(tally: Tally) -> str:
    said = dict(tally.own_said)
    _add_said(said, tally.waits_said)
    if not said:
        return f"{tally.ready}/{tally.eligible} nodes ready; rollout in progress"
    parts = []
    for text, (count, names) in said.items():
        more = f" and {count - 3} more" if count > 3 else ""
        parts.append(f"{text} on {', '.join(names)}{more}")
    return f"{tally.ready}/{tally.eligible} nodes ready: " + "; ".join(parts)


def policy_status(
    policy: PolicyRef,
    spec: ClusterPolicySpec,
    nodes: Mapping[str, NodeInfo],
    pods: Mapping[tuple[str, str], PodInfo],
    operands: Mapping[str, Operands],
    namespace: str,
    daemonsets: Mapping[str, list[DaemonSetInfo | None]],
    missing: Mapping[str, list[FieldError]],
    notes: Sequence[str],
    now: str,
    caches: Caches,
) -> ClusterPolicyStatus:
    """The active policy's status: `nodes` with their labels as the plan leaves them, `daemonsets` the
    observed DaemonSets of each component (None: not there yet), `missing` the inputs a component
    lacks (its DaemonSet is withheld), `operands` the pods of each node (operands_by_node); `caches`
    keeps each node's standings and each block's tallies for the next pass."""
    gpus = [n for n in gpu_nodes(nodes.values()) if takes_operands(n)]
    table = [standings(caches, spec, n, pods, operands.get(n.name, NO_OPERANDS)) for n in gpus]
    caches.standings.keep(nodes.keys())
    blocks = [tuple(table[start : start + BLOCK]) for start in range(0, len(table), BLOCK)]
    tallies = [
        caches.blocks.get(number, (rows,), partial(_block_tallies, rows))
        for number, rows in enumerate(blocks)
    ]
    caches.blocks.keep(range(len(blocks)))
    components = [
        _component_status(c, spec, _combined([t[i] for t in tallies]), daemonsets.get(c.name, []))
        for i, c in enumerate(COMPONENTS)
    ]
    components = [
        c.model_copy(update={"state": "notReady", "reason": bounded("; ".join(map(str, missing[c.name])))})
        if c.name in missing
        else c
        for c in components
    ]
    components += [
        ComponentStatus(name=name, enabled=True, state="unsupported", reason=spec.UNSUPPORTED[name])
        for name in spec.unsupported_enabled()
    ]
    enabled = [c for c in components if c.state in ("ready", "notReady")]
    not_ready = [c for c in enabled if c.state != "ready"]
    extra = ("; " + "; ".join(notes)) if notes else ""
    if not_ready:
        message = "ClusterPolicy is not ready; components not ready: " + "; ".join(
            f"{c.name} ({c.reason})" for c in not_ready
        )
        conditions = _conditions(policy, _error(REASON_OPERAND_NOT_READY, message + extra), now)
    else:
        reason = REASON_RECONCILED if gpus else REASON_NO_GPU_NODES
        message = (
            "ClusterPolicy is ready as all resources have been successfully reconciled"
            if gpus
            else "ClusterPolicy is ready, but no node has a GPU"
        )
        conditions = _conditions(policy, _ready(reason, message + extra), now)
    status = ClusterPolicyStatus(
        state="notReady" if not_ready else "ready",
        namespace=namespace,
        observedGeneration=policy.generation,
        gpuNodes=len(gpus),
        componentsReady=f"{len(enabled) - len(not_ready)}/{len(enabled)}",
        conditions=conditions,
        components=components,
    )
    if not spec.sandboxWorkloads.enabled:
        return status  # NVIDIA's fields alone
    return status.model_copy(update={"workloads": workload_counts(gpus, spec)})


def workload_counts(gpus: Iterable[NodeInfo], spec: ClusterPolicySpec) -> dict[str, int]:
    """GPU nodes per workload type, every type named (0 too), so that a type's last node leaving shows."""
    counts = dict.fromkeys(WORKLOADS, 0)
    for node in gpus:
        counts[workload_type(node.labels, spec)] += 1
    return counts


Pairs = list[tuple[str, str, str, str]]


def _ready(reason: str, message: str) -> Pairs:
    """NVIDIA's SetConditionsReady: Ready=True(reason), Error=False(Ready)."""
    return [("Ready", "True", reason, message), ("Error", "False", "Ready", "")]


def _error(reason: str, message: str) -> Pairs:
    """NVIDIA's SetConditionsError: Ready=False(Error), Error=True(reason)."""
    return [("Ready", "False", "Error", message), ("Error", "True", reason, message)]


def _conditions(policy: PolicyRef, pairs: Pairs, now: str) -> list[Condition]:
    return conditions_from(pairs, policy.status, policy.generation, now)


def conditions_from(
    pairs: Iterable[tuple[str, str, str, str]], status: Mapping[str, Any], generation: int | None, now: str
) -> list[Condition]:
    """metav1.Conditions (meta.SetStatusCondition) from (type, status, reason, message) and the object's
    current `status`: lastTransitionTime moves only when a condition's status changes."""
    previous = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for kind, value, reason, message in pairs:
        before = previous.get(kind) or {}
        changed = before.get("status") != value
        conditions.append(
            Condition.model_validate(
                {
                    "type": kind,
                    "status": value,
                    "reason": reason,
                    "message": bounded(message),
                    "lastTransitionTime": now if changed else str(before.get("lastTransitionTime") or now),
                    "observedGeneration": generation,
                }
            )
        )
    return conditions


def _problem_reason(problems: Problems) -> str:
    if problems.invalid:
        return REASON_INVALID_SPEC
    return REASON_PREREQUISITE_NOT_MET if problems.missing else REASON_RECONCILE_FAILED


def _not_applied(policy: PolicyRef, problems: Problems, running: int | None) -> str:
    kept = f"the operands keep running generation {running}" if running is not None else "nothing was changed"
    return f"generation {policy.generation} is not applied, {kept}: " + "; ".join(problems.lines())


def invalid_status(policy: PolicyRef, problems: Problems, namespace: str, now: str) -> ClusterPolicyStatus:
    """A generation that cannot be applied while nothing is known to run: Error names every field;
    the rest of the status stays as it was (a merge patch of these fields only)."""
    reason = _problem_reason(problems)
    return ClusterPolicyStatus(
        state="notReady",
        namespace=namespace,
        observedGeneration=policy.generation,
        conditions=_conditions(policy, _error(reason, _not_applied(policy, problems, None)), now),
    )


def with_problems(
    policy: PolicyRef, status: ClusterPolicyStatus, problems: Problems, running: int | None, now: str
) -> ClusterPolicyStatus:
    """The status of a generation that is not applied: the components as they run (generation
    `running`, None: as they are), Error with what stopped the new one: InvalidSpec (the models or the
    API server refuse a field), PrerequisiteNotMet (what it names is not there), ReconcileFailed (the
    API server failed while the change was being proven; retried)."""
    message = _not_applied(policy, problems, running)
    return status.model_copy(
        update={
            "state": "notReady",
            "conditions": _conditions(policy, _error(_problem_reason(problems), message), now),
        }
    )


def ignored_status(policy: PolicyRef, active: PolicyRef, namespace: str, now: str) -> ClusterPolicyStatus:
    message = f"ClusterPolicy {active.name!r} is active (the oldest wins); this one is ignored"
    # Being ignored is not an error of this object: Error stays False.
    pairs = [("Ready", "False", REASON_IGNORED, message), ("Error", "False", REASON_IGNORED, "")]
    return ClusterPolicyStatus(
        state="ignored",
        namespace=namespace,
        observedGeneration=policy.generation,
        conditions=_conditions(policy, pairs, now),
    )


_RANKED = (REASON_INVALID_SPEC, REASON_PREREQUISITE_NOT_MET, REASON_RECONCILE_FAILED, REASON_CONFLICT)
"""Error reasons of problems, the one to fix first first: when several are found, Error gives the
first one's reason and every message."""


def with_errors(
    policy: PolicyRef,
    status: ClusterPolicyStatus,
    errors: Mapping[str, str],
    reason: str,
    label: str,
    now: str,
) -> ClusterPolicyStatus:
    """The status when some components could not be written: objects the API server refused or failed
    on (ReconcileFailed, NVIDIA's reason, with the server's own message), or objects of our names that
    are someone else's (ObjectConflict). Those components are not ready, with `label` and the message;
    the others keep their status. Errors are keyed by component name or by the
    `app.kubernetes.io/component` label of the object."""
    by_component = {(BY_LABEL[k].name if k in BY_LABEL else k): text for k, text in errors.items()}
    components = [
        c.model_copy(update={"state": "notReady", "reason": bounded(f"{label}: {by_component[c.name]}")})
        if c.name in by_component
        else c
        for c in status.components
    ]
    message = f"{label}: " + "; ".join(f"{name}: {text}" for name, text in errors.items())
    error = next((c for c in status.conditions if c.type == "Error" and c.status == "True"), None)
    if error is not None and error.reason in _RANKED:
        reason = min(reason, error.reason, key=_RANKED.index)
        message = f"{error.message}; {message}"
    return status.model_copy(
        update={
            "state": "notReady",
            "components": components,
            "conditions": _conditions(policy, _error(reason, message), now),
        }
    )


# --- Events --------------------------------------------------------------------------------------


def events_for(
    policy: PolicyRef, status: ClusterPolicyStatus, notes: Sequence[Note], previous: Signature | None
) -> tuple[list[Event], Signature]:
    """The Events that tell what changed since the Events of `previous` (None: none posted by this
    process yet), and the signature to remember. A restarted operator that finds the status it would
    write already there says nothing."""
    error = next((c for c in status.conditions if c.type == "Error"), None)
    error_reason = error.reason if error is not None else ""
    signature: Signature = (str(status.state), error_reason, *notes)
    if previous == signature or (previous is None and not status_differs(policy.status, status)):
        return [], signature

    def event(type_: str, reason: str, message: str) -> Event:
        return Event(policy.name, policy.uid, type_, reason, message)

    events: list[Event] = []
    if status.state == "ready":
        events.append(event("Normal", "Ready", "all GPU operands are ready"))
    elif status.state == "ignored":
        ready = next(c for c in status.conditions if c.type == "Ready")
        events.append(event("Normal", "Ignored", ready.message))
    elif error_reason == REASON_OPERAND_NOT_READY and not any(c.nodesFailing for c in status.components):
        # Rolling out, nothing failing: news, not a warning.
        events.append(event("Normal", "Progressing", error.message if error else ""))
    elif error is not None and error_reason:
        events.append(event("Warning", error_reason, error.message))
    events += [
        event("Warning", note.reason, note) for note in notes if previous is None or note not in previous
    ]
    return events, signature
