"""The pure core: (ClusterPolicies, observed cluster) → what to apply, delete and label, and the status.

Nothing here does I/O, so every decision is unit-tested without a cluster. The reconciler feeds it
the watch caches and carries out the result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpu_operator.api import GROUP, KIND, VERSION, FieldError, PolicyError, parse_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import (
    REASON_IGNORED,
    REASON_INVALID_SPEC,
    REASON_NO_GPU_NODES,
    REASON_OPERAND_NOT_READY,
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
)
from gpu_operator.components import BY_LABEL, COMPONENTS, Component
from gpu_operator.nodes import (
    Deploy,
    IsReady,
    NodeInfo,
    cluster_facts,
    dependencies_met,
    deploy_state,
    desired_labels,
    gpu_nodes,
    released_labels,
    runs_on,
    takes_operands,
)
from gpu_operator.observed import (
    HASH_ANNOTATION,
    DaemonSetInfo,
    ObjectInfo,
    ObjectKey,
    PodInfo,
    component_of,
    object_key,
)
from gpu_operator.psa import NamespaceInfo, NamespaceWrite, namespace_write
from gpu_operator.render import ClusterFacts, config_maps_read, missing_inputs, render

MAX_PROBLEMS = 5


@dataclass(frozen=True)
class PolicyRef:
    """One ClusterPolicy as the watch last saw it."""

    name: str
    uid: str
    generation: int
    created: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


def active_policy(policies: Iterable[PolicyRef]) -> PolicyRef | None:
    """NVIDIA's singleton rule: the oldest ClusterPolicy is active; ties go to the lowest name."""
    return min(policies, key=lambda p: (p.created, p.name), default=None)


@dataclass(frozen=True)
class Observed:
    policies: tuple[PolicyRef, ...]
    nodes: Mapping[str, NodeInfo]
    pods: Iterable[PodInfo]
    daemonsets: Mapping[str, DaemonSetInfo]
    """By DaemonSet name (a component may have several: one per runtime, one per kernel)."""
    objects: Mapping[ObjectKey, ObjectInfo]
    namespace: str
    environ: Mapping[str, str] = field(default_factory=dict)
    nvidia_driver_crd: bool = False
    config_maps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """ConfigMap name → keys, in the operand namespace."""
    service_monitor_crd: bool = False
    """Whether the Prometheus operator's ServiceMonitor CRD is installed and established."""
    operand_namespace: NamespaceInfo | None = None
    """The operand namespace as watched (None: not seen, e.g. not created yet)."""


class Note(str):
    """A remark about the active policy: appended to its condition message, posted once as an Event."""

    reason: str

    def __new__(cls, message: str, reason: str = "Unsupported") -> Note:
        note = super().__new__(cls, message)
        note.reason = reason
        return note


@dataclass(frozen=True)
class Event:
    policy: str
    type: str
    reason: str
    message: str


@dataclass
class Plan:
    active: PolicyRef | None
    spec: ClusterPolicySpec | None
    errors: list[FieldError]
    objects: list[dict[str, Any]]
    """Desired objects, in dependency order, owner-referenced and hash-annotated."""
    deletes: list[ObjectKey]
    node_labels: dict[str, dict[str, str]]
    """Nodes whose operator-owned labels must change → the complete set to own."""
    statuses: dict[str, dict[str, Any]]
    """Policy name → the status it should have (the caller writes only what differs)."""
    notes: list[Note]
    """Remarks about the active policy (unsupported sections, NVIDIADriver CRD, skipped objects)."""
    label_releases: dict[str, dict[str, str]] = field(default_factory=dict)
    """Nodes → shared deploy labels to remove explicitly, with the value each must still have."""
    namespace_write: NamespaceWrite | None = None
    """The operand namespace's pod-security labels to change (psa.enabled)."""


def content_hash(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]


def _owned(obj: dict[str, Any], policy: PolicyRef) -> dict[str, Any]:
    metadata = obj.setdefault("metadata", {})
    metadata["ownerReferences"] = [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": policy.name,
            "uid": policy.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    metadata.setdefault("annotations", {})[HASH_ANNOTATION] = content_hash(obj)
    return obj


def pods_by_node(pods: Iterable[PodInfo]) -> dict[tuple[str, str], PodInfo]:
    """The pod that speaks for (component, node): a live one over a terminating one, then the newest."""
    best: dict[tuple[str, str], PodInfo] = {}
    for pod in pods:
        key = (pod.component, pod.node)
        current = best.get(key)
        if current is None or (not pod.terminating, pod.created) > (not current.terminating, current.created):
            best[key] = pod
    return best


def _readiness(pods: Mapping[tuple[str, str], PodInfo]) -> IsReady:
    def is_ready(component: str, node: str) -> bool:
        pod = pods.get((component, node))
        return pod is not None and pod.ready

    return is_ready


def build(observed: Observed, now: str) -> Plan:
    policies = observed.policies
    active = active_policy(policies)
    statuses: dict[str, dict[str, Any]] = {}
    for other in policies:
        if active is not None and other.name != active.name:
            statuses[other.name] = _ignored_status(other, active, observed.namespace, now)
    pods = pods_by_node(observed.pods)
    is_ready = _readiness(pods)
    nodes = list(observed.nodes.values())
    if active is None:
        labels = _label_changes(nodes, None, is_ready)
        releases = _releases(observed.nodes, labels)
        psa = namespace_write(observed.operand_namespace, enabled=False)
        return Plan(None, None, [], [], sorted(observed.objects), labels, statuses, [], releases, psa)
    try:
        spec = parse_spec(active.spec)
    except PolicyError as exc:
        statuses[active.name] = _invalid_status(active, exc.errors, observed.namespace, now)
        return Plan(active, None, exc.errors, [], [], {}, statuses, [])

    facts = cluster_facts(nodes, observed.namespace, observed.environ, spec.operator.defaultRuntime)
    # Only the ConfigMaps the policy names, so that other ConfigMap changes do not re-render.
    named = {name for c in COMPONENTS for _, name in config_maps_read(c, spec)}
    facts = replace(
        facts,
        config_maps={n: k for n, k in observed.config_maps.items() if n in named},
        service_monitor_crd=observed.service_monitor_crd,
    )
    objects = _rendered(active, spec, facts)
    missing = {
        c.name: found for c in COMPONENTS if c.enabled(spec) and (found := missing_inputs(c, spec, facts))
    }
    notes = _notes(spec, observed.nvidia_driver_crd)
    if (
        not observed.service_monitor_crd
        and spec.dcgmExporter.is_enabled()
        and spec.dcgmExporter.service_monitor_enabled()
    ):
        # NVIDIA's rule (object_controls.go:5060): no Prometheus operator, no ServiceMonitor (the
        # renderer leaves it out), and the exporter is still ready. Created at the next pass once the
        # CRD is established.
        notes.append(Note(SERVICE_MONITOR_SKIPPED, "ServiceMonitorSkipped"))
    wanted = {object_key(o) for o in objects}
    # A DaemonSet withheld for a missing input stays as it is (NVIDIA's behaviour): deleting the
    # driver's would unload the driver under running GPU workloads.
    kept = {
        key for key, info in observed.objects.items() if key[1] == "DaemonSet" and info.component in missing
    }
    deletes = sorted(key for key in observed.objects if key not in wanted and key not in kept)
    labels = _label_changes(nodes, spec, is_ready)
    # Status reflects the labels as they will be once this plan is carried out.
    planned = {n.name: _with_labels(n, labels[n.name]) if n.name in labels else n for n in nodes}
    daemonsets: dict[str, list[str]] = {}
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            daemonsets.setdefault(component_of(obj["metadata"]), []).append(obj["metadata"]["name"])
    statuses[active.name] = _status(active, spec, planned, pods, observed, daemonsets, missing, notes, now)
    return Plan(
        active,
        spec,
        [],
        objects,
        deletes,
        labels,
        statuses,
        notes,
        _releases(observed.nodes, labels),
        namespace_write(observed.operand_namespace, spec.psa.enabled),
    )


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def _rendered(policy: PolicyRef, spec: ClusterPolicySpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The owned, hashed objects; rendered again only when the policy or the facts change (most passes
    are caused by pod and node events and change neither). Callers must not mutate the result."""
    key = json.dumps([policy.name, policy.uid, policy.spec, asdict(facts)], sort_keys=True)
    if key not in _RENDERED:
        _RENDERED.clear()
        _RENDERED[key] = [_owned(obj, policy) for obj in render(spec, facts)]
    return _RENDERED[key]


def _with_labels(node: NodeInfo, owned: Mapping[str, str]) -> NodeInfo:
    labels = {k: v for k, v in node.labels.items() if k not in node.own_labels}
    labels.update(owned)
    return replace(node, labels=labels, own_labels=frozenset(owned))


def _label_changes(
    nodes: Iterable[NodeInfo], spec: ClusterPolicySpec | None, is_ready: IsReady
) -> dict[str, dict[str, str]]:
    changes: dict[str, dict[str, str]] = {}
    for node in nodes:
        want = desired_labels(node, spec, is_ready)
        have = {key: node.labels[key] for key in node.own_labels if key in node.labels}
        if want != have:
            changes[node.name] = want
    return changes


def _releases(
    nodes: Mapping[str, NodeInfo], labels: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    found = {name: released_labels(nodes[name], want) for name, want in labels.items()}
    return {name: keys for name, keys in found.items() if keys}


SERVICE_MONITOR_SKIPPED = (
    "spec.dcgmExporter.serviceMonitor is enabled, but the Prometheus operator's ServiceMonitor CRD "
    "(servicemonitors.monitoring.coreos.com) is not installed: no ServiceMonitor was created; it will be "
    "once the CRD is"
)


def _notes(spec: ClusterPolicySpec, nvidia_driver_crd: bool) -> list[Note]:
    notes = [
        Note(f"spec.{name} is enabled but not supported by this operator; it is ignored")
        for name in spec.unsupported_enabled()
    ]
    notes += [Note(f"accepted but not acted on: {field}", "Ignored") for field in spec.ignored_fields()]
    if spec.driver.useNvidiaDriverCRD and not nvidia_driver_crd:
        notes.append(
            Note(
                "spec.driver.useNvidiaDriverCRD is set, but no NVIDIADriver CRD is installed; "
                "the driver is managed from this ClusterPolicy"
            )
        )
    return notes


def _component_status(
    component: Component,
    spec: ClusterPolicySpec,
    nodes: list[NodeInfo],
    pods: Mapping[tuple[str, str], PodInfo],
    daemonsets: list[DaemonSetInfo | None],
) -> dict[str, Any]:
    if not component.enabled(spec):
        return {"name": component.name, "enabled": False, "state": "disabled"}
    eligible = [n for n in nodes if runs_on(component, n)]
    labelled = [n for n in eligible if deploy_state(component, n) == Deploy.DEPLOYED]
    waiting = [n for n in eligible if deploy_state(component, n) != Deploy.DEPLOYED]
    ready = [n for n in labelled if (p := pods.get((component.name, n.name))) is not None and p.ready]
    problems: list[dict[str, str]] = []
    failing = 0
    for node in labelled:
        pod = pods.get((component.name, node.name))
        if pod is not None and pod.ready:
            continue
        if pod is not None and pod.failing:
            failing += 1
        reason = pod.reason if pod is not None else "PodNotCreated"
        problems.append({"node": node.name, "reason": reason, "message": pod.message if pod else ""})
    for node in waiting:
        problems.append(_waiting_problem(component, spec, node, pods))
    rolled_out = not labelled or (
        all(d is not None and d.rolled_out for d in daemonsets)
        and sum(d.desired for d in daemonsets if d is not None) == len(labelled)
    )
    is_ready = rolled_out and not waiting and len(ready) == len(labelled)
    reason = "" if is_ready else _summary(len(eligible), len(ready), problems)
    return {
        "name": component.name,
        "enabled": True,
        "state": "ready" if is_ready else "notReady",
        "nodesDesired": len(eligible),
        "nodesReady": len(ready),
        "nodesWaiting": len(waiting),
        "nodesFailing": failing,
        "reason": reason,
        "problems": problems[:MAX_PROBLEMS],
    }


def _waiting_problem(
    component: Component, spec: ClusterPolicySpec, node: NodeInfo, pods: Mapping[tuple[str, str], PodInfo]
) -> dict[str, str]:
    """Why a component that belongs on `node` has no `true` deploy label there."""
    key = component.deploy_label
    value, writer = node.labels.get(key, ""), node.writers.get(key, "another manager")
    state = deploy_state(component, node)
    if state == Deploy.PAUSED:
        # Operand managers pause and restore the label themselves; the component comes back then.
        return {"node": node.name, "reason": "Paused", "message": f"{value} by {writer}"}
    if state == Deploy.HELD:
        message = f"{key}={value!r} set by {writer}: not true, false or a pause; left as it is"
        return {"node": node.name, "reason": "DeployLabelHeld", "message": message}
    deps = dependencies_met(component, spec, node, _readiness(pods))
    message = f"waiting for {', '.join(deps)}" if deps else "waiting for its deploy label"
    return {"node": node.name, "reason": "WaitingForDependency", "message": message}


# Reasons whose message, not the reason itself, goes into the one-line summary.
_SUMMARY_BY_MESSAGE = ("WaitingForDependency", "Paused")


def _summary(desired: int, ready: int, problems: list[dict[str, str]]) -> str:
    if not problems:
        return f"{ready}/{desired} nodes ready; rollout in progress"
    by_reason: dict[str, list[str]] = {}
    for problem in problems:
        text = problem["message"] if problem["reason"] in _SUMMARY_BY_MESSAGE else problem["reason"]
        by_reason.setdefault(text, []).append(problem["node"])
    parts = []
    for text, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{text} on {shown}")
    return f"{ready}/{desired} nodes ready: " + "; ".join(parts)


def _status(
    policy: PolicyRef,
    spec: ClusterPolicySpec,
    nodes: Mapping[str, NodeInfo],
    pods: Mapping[tuple[str, str], PodInfo],
    observed: Observed,
    daemonsets: Mapping[str, list[str]],
    missing: Mapping[str, list[str]],
    notes: Sequence[str],
    now: str,
) -> dict[str, Any]:
    gpus = [n for n in gpu_nodes(nodes.values()) if takes_operands(n)]
    components = [
        _component_status(
            c, spec, gpus, pods, [observed.daemonsets.get(n) for n in daemonsets.get(c.name, [])]
        )
        for c in COMPONENTS
    ]
    for entry in components:
        if entry["name"] in missing:
            entry.update(state="notReady", reason="; ".join(missing[entry["name"]]))
    components += [
        {"name": name, "enabled": True, "state": "unsupported", "reason": "not supported by this operator"}
        for name in spec.unsupported_enabled()
    ]
    enabled = [c for c in components if c["state"] in ("ready", "notReady")]
    not_ready = [c for c in enabled if c["state"] != "ready"]
    extra = ("; " + "; ".join(notes)) if notes else ""
    if not_ready:
        message = "ClusterPolicy is not ready; components not ready: " + "; ".join(
            f"{c['name']} ({c['reason']})" for c in not_ready
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
    return {
        "state": "notReady" if not_ready else "ready",
        "namespace": observed.namespace,
        "observedGeneration": policy.generation,
        "gpuNodes": len(gpus),
        "componentsReady": f"{len(enabled) - len(not_ready)}/{len(enabled)}",
        "conditions": conditions,
        "components": components,
    }


Pairs = list[tuple[str, str, str, str]]


def _ready(reason: str, message: str) -> Pairs:
    """NVIDIA's SetConditionsReady: Ready=True(reason), Error=False(Ready)."""
    return [("Ready", "True", reason, message), ("Error", "False", "Ready", "")]


def _error(reason: str, message: str) -> Pairs:
    """NVIDIA's SetConditionsError: Ready=False(Error), Error=True(reason)."""
    return [("Ready", "False", "Error", message), ("Error", "True", reason, message)]


def _conditions(policy: PolicyRef, pairs: Pairs, now: str) -> list[dict[str, Any]]:
    """metav1.Conditions; lastTransitionTime moves only when a condition's status changes."""
    previous = {c.get("type"): c for c in policy.status.get("conditions") or []}
    conditions = []
    for kind, status, reason, message in pairs:
        before = previous.get(kind) or {}
        changed = before.get("status") != status
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),
                "observedGeneration": policy.generation,
            }
        )
    return conditions


def _invalid_status(policy: PolicyRef, errors: list[FieldError], namespace: str, now: str) -> dict[str, Any]:
    message = "invalid ClusterPolicy, nothing was changed: " + "; ".join(str(e) for e in errors)
    status = dict(policy.status)
    status.update(
        state="notReady",
        namespace=namespace,
        observedGeneration=policy.generation,
        conditions=_conditions(policy, _error(REASON_INVALID_SPEC, message), now),
    )
    return status


def _ignored_status(policy: PolicyRef, active: PolicyRef, namespace: str, now: str) -> dict[str, Any]:
    message = f"ClusterPolicy {active.name!r} is active (the oldest wins); this one is ignored"
    # Being ignored is not an error of this object: Error stays False.
    pairs = [("Ready", "False", REASON_IGNORED, message), ("Error", "False", REASON_IGNORED, "")]
    conditions = _conditions(policy, pairs, now)
    return {
        "state": "ignored",
        "namespace": namespace,
        "observedGeneration": policy.generation,
        "conditions": conditions,
    }


def with_apply_errors(
    policy: PolicyRef, status: dict[str, Any], errors: Mapping[str, str], now: str
) -> dict[str, Any]:
    """The status when some objects could not be written: those components are not ready, and Error
    says why (NVIDIA's ReconcileFailed), with the API server's own message. Errors are keyed by
    component name or by the `app.kubernetes.io/component` label of the object that failed."""
    by_component = {(BY_LABEL[k].name if k in BY_LABEL else k): text for k, text in errors.items()}
    components = []
    for entry in status.get("components", []):
        if entry["name"] in by_component:
            entry = {**entry, "state": "notReady", "reason": f"apply failed: {by_component[entry['name']]}"}
        components.append(entry)
    message = "failed to reconcile: " + "; ".join(f"{name}: {text}" for name, text in errors.items())
    return {
        **status,
        "state": "notReady",
        "components": components,
        "conditions": _conditions(policy, _error(REASON_RECONCILE_FAILED, message), now),
    }


def status_differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` would change anything (only the fields we write are compared)."""
    return any(current.get(key) != value for key, value in desired.items())
