"""Why kube-scheduler does not place a pod on a node: its filters, re-run on recorded objects (pure).

kube-scheduler's message only counts nodes per reason ("0/5 nodes are available: 2 node(s) had
untolerated taint(s), 3 Insufficient nvidia.com/gpu") and since v1.3x no longer names the taint, so
`gpu-operator doctor` runs the same filters, in kube-scheduler's order, on each node to say which
node fails which one and why. The first failing filter decides a node's reason, as in
`RunFilterPlugins` (k8s.io/kubernetes v1.36 pkg/scheduler/framework/runtime/framework.go:1105;
order from pkg/scheduler/apis/config/v1/default_plugins.go:36-41): NodeUnschedulable, NodeName,
TaintToleration, NodeAffinity, NodePorts (not modelled), NodeResourcesFit. Reason texts are the
plugins' own (tainttoleration/taint_toleration.go:131, nodeaffinity/node_affinity.go:64,
noderesources/fit.go:755, nodeunschedulable/node_unschedulable.go:51).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

GPU = "nvidia.com/gpu"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_TAINT = "node(s) had untolerated taint(s)"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"


@dataclass(frozen=True)
class Verdict:
    """Why a node does not fit: kube-scheduler's filter and reason, and the facts behind it."""

    filter: str
    """NodeUnschedulable, TaintToleration, NodeAffinity or NodeResourcesFit."""
    reason: str
    """The scheduler's reason text, e.g. "Insufficient nvidia.com/gpu"."""
    detail: str
    """What exactly: the taint, the unmatched selector term, the numbers."""
    resource: str = ""
    """For NodeResourcesFit: the first resource that does not fit."""
    label: str = ""
    """For NodeAffinity: the label key of the first requirement the node fails."""


# --- quantities ------------------------------------------------------------------------------------

_SUFFIXES: dict[str, int | Decimal] = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("500m", "1Gi", 2) as a number; 0 for anything unreadable."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return Decimal(0)
    try:
        return Decimal(match[1]) * Decimal(_SUFFIXES[match[2] or ""])
    except InvalidOperation:
        return Decimal(0)


def show(value: Decimal) -> str:
    """A number as people write it: 8, 0.5."""
    return format(value.normalize(), "f") if value != value.to_integral() else str(int(value))


# --- what a pod asks for -----------------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    # An extended resource given only as a limit is requested at the limit (API server defaulting).
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity(value) for name, value in merged.items()}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """The pod's effective requests: the larger of its containers' sum and any init container, plus
    overhead (the scheduler's computePodResourceRequest)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    for name, amount in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + quantity(amount)
    return {name: amount for name, amount in total.items() if amount}


def gpu_request(pod: Mapping[str, Any]) -> Decimal:
    return sum(
        (amount for name, amount in pod_requests(pod).items() if name.startswith(GPU)), start=Decimal(0)
    )


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished: its requests count against the node."""
    status = pod.get("status") or {}
    return bool((pod.get("spec") or {}).get("nodeName")) and status.get("phase") not in (
        "Succeeded",
        "Failed",
    )


def requested_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Node → resource → what the pods bound to it request (as quantity strings, for recording)."""
    totals: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        if not holds_resources(pod):
            continue
        node = totals.setdefault(pod["spec"]["nodeName"], {})
        node["pods"] = node.get("pods", Decimal(0)) + 1
        for name, amount in pod_requests(pod).items():
            node[name] = node.get(name, Decimal(0)) + amount
    return {node: {name: show(amount) for name, amount in used.items()} for node, used in totals.items()}


# --- the filters --------------------------------------------------------------------------------------


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """corev1 Toleration.ToleratesTaint."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if not key and operator == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def taint_text(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _requirement_matches(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def requirement_text(requirement: Mapping[str, Any]) -> str:
    values = ",".join(str(v) for v in requirement.get("values") or [])
    operator = requirement.get("operator", "")
    if operator in ("Exists", "DoesNotExist"):
        return f"{requirement.get('key')} {operator}"
    return f"{requirement.get('key')} {operator} ({values})"


def _term_mismatch(term: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first requirement of a node selector term the node fails (text, label key); None if it matches."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    for requirement in term.get("matchExpressions") or []:
        if not _requirement_matches(requirement, labels):
            return requirement_text(requirement), str(requirement.get("key", ""))
    for requirement in term.get("matchFields") or []:
        fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
        if not _requirement_matches(requirement, fields):
            return requirement_text(requirement), ""
    return None


def affinity_mismatch(pod: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[str, str] | None:
    """What of the pod's nodeSelector or required node affinity the node does not match (text, label
    key), or None."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}", key
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if not required:
        return None
    misses = [_term_mismatch(term, node) for term in required]
    if any(miss is None for miss in misses):
        return None
    found = [miss for miss in misses if miss is not None]
    return "node affinity " + " or ".join(f"[{text}]" for text, _ in found), found[0][1]


def free(node: Mapping[str, Any], used: Mapping[str, str], resource: str) -> Decimal:
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)
    return quantity(allocatable) - quantity(used.get(resource, 0))


def verdict(pod: Mapping[str, Any], node: Mapping[str, Any], used: Mapping[str, str]) -> Verdict | None:
    """Why the scheduler would not place `pod` on `node` now (`used`: what pods bound there request);
    None when it fits."""
    spec = pod.get("spec") or {}
    node_spec = node.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return Verdict("NodeUnschedulable", REASON_UNSCHEDULABLE, "cordoned (spec.unschedulable)")
    untolerated = [
        t
        for t in node_spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)
    ]
    if untolerated:
        return Verdict("TaintToleration", REASON_TAINT, ", ".join(taint_text(t) for t in untolerated))
    mismatch = affinity_mismatch(pod, node)
    if mismatch:
        return Verdict("NodeAffinity", REASON_AFFINITY, mismatch[0], label=mismatch[1])
    wanted = dict(pod_requests(pod))
    wanted["pods"] = Decimal(1)
    # GPUs first: the reason a GPU pod gets is about GPUs when they are short at all.
    for resource in sorted(wanted, key=lambda r: (not r.startswith(GPU), r)):
        available = free(node, used, resource)
        if wanted[resource] > available:
            allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
            detail = (
                f"requests {show(wanted[resource])}, allocatable {show(quantity(allocatable))}, "
                f"in use {show(quantity(used.get(resource, 0)))}"
            )
            reason = "Too many pods" if resource == "pods" else f"Insufficient {resource}"
            return Verdict("NodeResourcesFit", reason, detail, resource)
    return None


_HISTOGRAM = re.compile(r"nodes are available: (.*?)\.(?: |$)")


def scheduler_reasons(message: str) -> dict[str, int]:
    """kube-scheduler's "0/5 nodes are available: 2 node(s) had untolerated taint(s), 3 Insufficient
    nvidia.com/gpu. preemption: ..." → {reason: node count}."""
    match = _HISTOGRAM.search(message)
    if not match:
        return {}
    reasons: dict[str, int] = {}
    for part in match[1].split(", "):
        count, _, reason = part.partition(" ")
        if count.isdigit():
            reasons[reason] = reasons.get(reason, 0) + int(count)
    return reasons
