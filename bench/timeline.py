"""Where a rollout's time goes, node by node: for every operand pod, the label write that let its
DaemonSet select the node, the pod's binding, its init containers done, its readiness, the status
write that told the API server so, and the next label write on that node.

Sources, both from the run's cluster: the API server's audit log (level Metadata: who wrote which
node when, each pod's binding and status writes, to the microsecond) and the pods themselves at the
end of the run (their node, their DaemonSet, and the times their conditions record, to the second).
The label writer is the operator's user in an operator run and the bench's in the limit's run, so
both read the same.

    python -m bench.timeline --audit AUDIT.log --pods PODS.json --writer USER [--since UNIX_TIME]

prints, per DaemonSet, the median and 90th percentile of each step, and the nodes' critical paths
(`make bench BENCH_ARGS=--timeline` writes it for every run).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import audit as audit_log

APP_LABEL = "app"
STEPS = (
    "label → scheduled",
    "scheduled → initialized",
    "initialized → ready",
    "ready → written",
    "written → next label",
)
"""The steps of one pod's life on the critical path, in order (the column headers of the report):
"written" is when the API server received the status that made it ready (its kubelet's write), so
that what the kubelet took and what the operator took to react come apart."""


@dataclass(frozen=True)
class PodTimes:
    """One operand pod's milestones in unix seconds; None where it never got there."""

    daemonset: str
    node: str
    labelled: float | None
    """The last label write on the node before the pod was bound: what made the DaemonSet want it."""
    created: float
    scheduled: float | None
    initialized: float | None
    ready: float | None
    ready_written: float | None
    """The status write that carried the readiness: the last of the pod's received from `ready` (whole
    seconds) up to the next label write on the node, since a kubelet writes a ready pod's status again
    only when something changes, and a write it sent just before readiness can arrive after that second
    began (while its status writes queue); else the first received from `ready` on."""
    next_label: float | None
    """The first label write on the node after that (None if none came)."""

    def steps(self) -> tuple[float | None, ...]:
        """The durations of STEPS (None where an end is missing)."""
        points = (
            self.labelled,
            self.scheduled,
            self.initialized,
            self.ready,
            self.ready_written,
            self.next_label,
        )
        return tuple(
            b - a if a is not None and b is not None else None for a, b in itertools.pairwise(points)
        )


def writer_marker(user: str | None = None, agent: str | None = None) -> str:
    """The text an audit line of the label writer contains: its user, or its user agent (the limit's
    labels come from the bench's client, whose user the control plane's components share)."""
    if user is not None:
        return audit_log.user_marker(user)
    if agent is not None:
        return '"userAgent":' + json.dumps(agent)
    raise ValueError("the label writer needs a user or a user agent")


def label_writes(audit_lines: Iterable[str], marker: str, since: float = 0.0) -> dict[str, list[float]]:
    """Node → the times the writer whose audit lines contain `marker` patched or updated it (sorted),
    from `since` on."""
    found: dict[str, list[float]] = {}
    for line in audit_lines:
        if marker not in line or '"resource":"nodes"' not in line:
            continue
        request = audit_log.parse_entry(json.loads(line))
        if (
            request is not None
            and request.resource == "nodes"
            and request.verb in ("patch", "update")
            and request.code < 300
            and request.received >= since
        ):
            found.setdefault(request.name, []).append(request.received)
    for times in found.values():
        times.sort()
    return found


@dataclass
class PodRequests:
    """What the audit log says of each pod by name: its binding, and its status writes (sorted)."""

    bound: dict[str, float]
    status: dict[str, list[float]]


def pod_requests(audit_lines: Iterable[str], namespace: str) -> PodRequests:
    """The successful bindings and status writes of the pods in `namespace`."""
    found = PodRequests({}, {})
    for line in audit_lines:
        if '"subresource":"binding"' not in line and '"subresource":"status"' not in line:
            continue
        request = audit_log.parse_entry(json.loads(line))
        if request is None or request.namespace != namespace or request.code >= 300:
            continue
        if request.resource == "pods/binding":
            found.bound.setdefault(request.name, request.received)
        elif request.resource == "pods/status" and request.verb in ("patch", "update"):
            found.status.setdefault(request.name, []).append(request.received)
    for times in found.status.values():
        times.sort()
    return found


def _condition_time(pod: Mapping[str, Any], kind: str) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            return audit_log.parse_time(stamp) if stamp else None
    return None


def pod_times(
    pods: Iterable[Mapping[str, Any]], labels: Mapping[str, Sequence[float]], requests: PodRequests
) -> list[PodTimes]:
    """Every DaemonSet pod with a node, its milestones matched to the label writes on its node."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        daemonset = next(
            (o["name"] for o in meta.get("ownerReferences") or () if o.get("kind") == "DaemonSet"), None
        )
        if not node or daemonset is None:
            continue
        created = audit_log.parse_time(meta["creationTimestamp"])
        scheduled = requests.bound.get(meta.get("name", ""))
        writes = labels.get(node, ())
        # Creation times have whole seconds; the binding, microseconds: match on it when there is one.
        anchor = scheduled if scheduled is not None else created + 1.0
        before = bisect.bisect_right(writes, anchor)
        ready = _condition_time(pod, "Ready")
        status = requests.status.get(meta.get("name", ""), [])
        written = _ready_written(status, writes, ready)
        after = bisect.bisect_right(writes, written if written is not None else ready or float("inf"))
        found.append(
            PodTimes(
                daemonset=daemonset,
                node=node,
                labelled=writes[before - 1] if before else None,
                created=created,
                scheduled=scheduled,
                initialized=_condition_time(pod, "Initialized"),
                ready=ready,
                ready_written=written,
                next_label=writes[after] if after < len(writes) else None,
            )
        )
    return found


def _ready_written(status: Sequence[float], labels: Sequence[float], ready: float | None) -> float | None:
    """PodTimes.ready_written, from the pod's status writes and its node's label writes (both sorted)."""
    if ready is None:
        return None
    seen = bisect.bisect_left(status, ready)
    label = bisect.bisect_right(labels, ready)
    if label < len(labels):
        before_label = bisect.bisect_right(status, labels[label])
        if before_label > seen:
            return status[before_label - 1]
    return status[seen] if seen < len(status) else None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank; `values` not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def step_table(times: Iterable[PodTimes]) -> list[str]:
    """A markdown table: per DaemonSet, its pods and the median / p90 seconds of each step."""
    by_ds: dict[str, list[PodTimes]] = {}
    for t in times:
        by_ds.setdefault(t.daemonset, []).append(t)
    header = "| DaemonSet | pods | " + " | ".join(f"{s} s (median / p90)" for s in STEPS) + " |"
    lines = [header, "|---|---:|" + "---:|" * len(STEPS)]

    # In the order the rollout reaches them: by the median time their pods became ready.
    def first_ready(item: tuple[str, list[PodTimes]]) -> float:
        ready = [t.ready for t in item[1] if t.ready is not None]
        return statistics.median(ready) if ready else float("inf")

    for name, pods in sorted(by_ds.items(), key=first_ready):
        cells = []
        for i in range(len(STEPS)):
            values = [d for t in pods if (d := t.steps()[i]) is not None]
            cells.append(f"{percentile(values, 0.5):.2f} / {percentile(values, 0.9):.2f}" if values else "-")
        lines.append(f"| {name} | {len(pods)} | " + " | ".join(cells) + " |")
    return lines


def critical_paths(times: Iterable[PodTimes], since: float) -> list[str]:
    """Per node, from `since` (the policy's creation) to its last pod ready: median and p90 over the
    nodes, and how much of it the label writes waited for (first write after `since`)."""
    first_label: dict[str, float] = {}
    last_ready: dict[str, float] = {}
    for t in times:
        if t.labelled is not None:
            first_label[t.node] = min(first_label.get(t.node, t.labelled), t.labelled)
        if t.ready is not None:
            last_ready[t.node] = max(last_ready.get(t.node, t.ready), t.ready)
    if not last_ready:
        return ["no pod became ready"]
    done = [v - since for v in last_ready.values()]
    start = [v - since for v in first_label.values()] or [0.0]
    return [
        f"nodes: {len(last_ready)}; first label write after the policy: "
        f"median {percentile(start, 0.5):.2f} s, p90 {percentile(start, 0.9):.2f} s; "
        f"last pod ready: median {percentile(done, 0.5):.2f} s, "
        f"p90 {percentile(done, 0.9):.2f} s, last {max(done):.2f} s",
    ]


def audit_lines(audit: Path) -> list[str]:
    """The log's lines, with those of its rotated files (audit-<time>.log, written before it)."""
    return [line for path in audit_log.log_files(audit) for line in path.read_text().splitlines()]


def report(audit: Path, pods: Sequence[Mapping[str, Any]], marker: str, since: float, namespace: str) -> str:
    """The step table and the nodes' paths of the run that started at `since`."""
    lines = audit_lines(audit)
    times = pod_times(pods, label_writes(lines, marker, since), pod_requests(lines, namespace))
    return "\n".join([*step_table(times), "", *critical_paths(times, since)]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--audit", type=Path, required=True, help="the API server's audit log")
    parser.add_argument(
        "--pods", type=Path, required=True, help="the pods at the run's end (kubectl get -o json)"
    )
    writer = parser.add_mutually_exclusive_group(required=True)
    writer.add_argument("--writer", help="the user whose node writes are the label writes")
    writer.add_argument("--writer-agent", help="or the user agent that wrote them")
    parser.add_argument("--since", type=float, default=0.0, help="unix time the rollout started (the policy)")
    parser.add_argument("--namespace", default="gpu-operator")
    args = parser.parse_args(argv)
    try:
        document = json.loads(args.pods.read_text())
        marker = writer_marker(args.writer, args.writer_agent)
        text = report(args.audit, document.get("items", []), marker, args.since, args.namespace)
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench.timeline: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
