"""The API server's audit log (JSON lines, level Metadata) → the operator's requests, counted.

Pure functions over parsed records, plus `AuditReader`, which reads a growing log incrementally so a
1000-node run (hundreds of MB of log) is read once, not once per question.

A request is counted once: the audit policy omits RequestReceived, so a short request logs one
ResponseComplete line, while a watch logs ResponseStarted when it opens and ResponseComplete when it
ends, minutes later. Records are keyed by auditID, and a request belongs to the time window in which
the API server received it.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list"})
RESPONSE_STAGES = ("ResponseStarted", "ResponseComplete", "Panic")


@dataclass(frozen=True)
class Request:
    audit_id: str
    user: str
    user_agent: str
    verb: str
    resource: str
    """Plural resource, subresource after a slash (`clusterpolicies/status`); '' for non-resource URLs."""
    namespace: str
    name: str
    received: float
    """Unix time the API server received the request."""
    code: int

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def is_read(self) -> bool:
        return self.verb in READ_VERBS

    @property
    def key(self) -> str:
        """`verb resource`, the grouping of the reports."""
        return f"{self.verb} {self.resource or '(non-resource)'}"


def parse_time(stamp: str) -> float:
    """RFC 3339 with microseconds and a Z (`2026-11-29T14:15:58.748581Z`) → unix time."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def parse_entry(entry: dict[str, Any]) -> Request | None:
    """One audit event → a Request; None for events that are not a request's response."""
    if entry.get("kind") != "Event" or entry.get("stage") not in RESPONSE_STAGES:
        return None
    ref = entry.get("objectRef") or {}
    resource = ref.get("resource") or ""
    if resource and ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return Request(
        audit_id=str(entry.get("auditID", "")),
        user=str((entry.get("user") or {}).get("username", "")),
        user_agent=str(entry.get("userAgent", "")),
        verb=str(entry.get("verb", "")),
        resource=resource,
        namespace=str(ref.get("namespace") or ""),
        name=str(ref.get("name") or ""),
        received=parse_time(str(entry["requestReceivedTimestamp"])),
        code=int((entry.get("responseStatus") or {}).get("code") or 0),
    )


def log_files(path: Path) -> list[Path]:
    """The log's rotated files (audit-<time>.log), oldest first (their names sort by time), then it."""
    return [*sorted(path.parent.glob(f"{path.stem}-*{path.suffix}")), path]


def user_marker(user: str) -> str:
    """The exact text a log line of `user` contains (a cheap test before parsing the JSON)."""
    return '"username":' + json.dumps(user)


def parse_lines(lines: Iterable[str], user: str | None = None) -> list[Request]:
    """Requests in `lines`, one per auditID (first line wins), optionally only those of `user`."""
    marker = user_marker(user) if user is not None else None
    seen: set[str] = set()
    found: list[Request] = []
    for line in lines:
        if not line.strip() or (marker is not None and marker not in line):
            continue
        request = parse_entry(json.loads(line))
        if request is None or request.audit_id in seen:
            continue
        if user is not None and request.user != user:
            continue
        seen.add(request.audit_id)
        found.append(request)
    return found


def in_window(requests: Iterable[Request], start: float, end: float) -> list[Request]:
    """Requests received in [start, end)."""
    return [r for r in requests if start <= r.received < end]


def by_verb_resource(requests: Iterable[Request]) -> dict[str, int]:
    """`verb resource` → count, most frequent first (ties by name), for stable reports."""
    counts = Counter(r.key for r in requests)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def writes(requests: Iterable[Request]) -> list[Request]:
    return [r for r in requests if r.is_write]


def writes_at_rest(requests: Iterable[Request]) -> list[Request]:
    """Writes, less the leader election's Lease renewals (one every retry period,
    gpu_operator/runtime/leader.py):
    the cost of having a standby, reported apart (`lease_renewals_per_min`)."""
    return [r for r in writes(requests) if r.resource != "leases"]


def per_minute(count: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("a window must last longer than 0 s")
    return count * 60.0 / seconds


def first_run_traffic(first: Mapping[str, Any]) -> dict[str, Any]:
    """An operator's requests in its first run (bench/run.py `_operator_round`, the one that rests), as the
    results and reports show them: by kind while converging, at its node join and at rest, and its writes
    and reads at rest."""
    rest_s = float(first.get("rest_s") or 0.0)
    rest_writes = first.get("rest_writes") or []
    return {
        "idle_window_s": rest_s,
        "idle_writes_per_min": per_minute(len(rest_writes), rest_s) if rest_s else None,
        "convergence_requests": first["requests_by_kind"],
        "node_join_requests": first["join_requests_by_kind"],
        "idle_requests": first.get("rest_requests_by_kind", {}),
        "idle_writes": rest_writes,
        "idle_reads": first.get("rest_reads", []),
    }


@dataclass(frozen=True)
class RepeatedRead:
    """GETs/LISTs of one `verb resource name` inside a window: what a watch-driven operator never does."""

    verb: str
    resource: str
    name: str
    count: int
    mean_interval_s: float | None
    """Mean time between them (None for a single one)."""


def repeated_reads(requests: Iterable[Request]) -> list[RepeatedRead]:
    """Every GET/LIST in `requests`, grouped by verb, resource and name, most frequent first.

    At rest an event-driven operator reads nothing (its watches deliver changes), so any entry here is
    a finding; a mean interval says whether it is a polling loop.
    """
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in requests:
        if r.is_read:
            groups.setdefault((r.verb, r.resource, r.name), []).append(r.received)
    found = []
    for (verb, resource, name), times in groups.items():
        times.sort()
        interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        found.append(RepeatedRead(verb, resource, name, len(times), interval))
    return sorted(found, key=lambda r: (-r.count, r.verb, r.resource, r.name))


def describe(request: Request, since: float) -> str:
    """One line for a report: `+12.345s patch nodes gpu-node-3 (200)`."""
    where = f"{request.namespace}/{request.name}" if request.namespace else request.name
    return f"+{request.received - since:.3f}s {request.key} {where} ({request.code})".replace("  ", " ")


def timeline(requests: Iterable[Request], since: float, limit: int = 200) -> list[str]:
    """Consecutive requests of the same `verb resource` collapsed into one line each:
    `+0.557..+0.961s patch nodes x10`, so the waves of a run are readable at a glance."""
    spans: list[list[Any]] = []
    for r in sorted(requests, key=lambda r: r.received):
        if spans and spans[-1][0] == r.key:
            spans[-1][2] = r.received
            spans[-1][3] += 1
        else:
            spans.append([r.key, r.received, r.received, 1])
    lines = []
    for key, first, last, count in spans[:limit]:
        when = f"+{first - since:.3f}s" if count == 1 else f"+{first - since:.3f}..+{last - since:.3f}s"
        lines.append(f"{when} {key} x{count}")
    if len(spans) > limit:
        lines.append(f"... {len(spans) - limit} more")
    return lines


@dataclass(frozen=True)
class Pipeline:
    """How operand pods went through the control plane in a window: the DaemonSet controller creates
    them, the scheduler binds them, kwok (the simulated kubelets) marks them Ready. Times are seconds
    from the window's start; a backlog is the most pods that waited for the next stage at one moment."""

    created: int
    bound: int
    ready: int
    last_create_s: float | None
    last_bind_s: float | None
    last_ready_s: float | None
    max_waiting_for_scheduler: int
    max_waiting_for_kubelet: int
    bind_to_ready_median_s: float | None


def pod_pipeline(requests: Iterable[Request], since: float) -> Pipeline:
    """Pod creates, bindings and first status patches (by name) of `requests`, in time order."""
    steps: list[tuple[float, str, str]] = []
    seen_ready: set[str] = set()
    for r in sorted(requests, key=lambda r: r.received):
        if r.verb == "create" and r.resource == "pods":
            steps.append((r.received, "create", r.name))
        elif r.verb == "create" and r.resource == "pods/binding":
            steps.append((r.received, "bind", r.name))
        elif r.verb == "patch" and r.resource == "pods/status" and r.name not in seen_ready:
            seen_ready.add(r.name)
            steps.append((r.received, "ready", r.name))
    counts = {"create": 0, "bind": 0, "ready": 0}
    last: dict[str, float | None] = {"create": None, "bind": None, "ready": None}
    bound_at: dict[str, float] = {}
    lags: list[float] = []
    max_unbound = max_unready = 0
    for when, step, name in steps:
        counts[step] += 1
        last[step] = when - since
        if step == "bind":
            bound_at[name] = when
        elif step == "ready" and name in bound_at:
            lags.append(when - bound_at[name])
        max_unbound = max(max_unbound, counts["create"] - counts["bind"])
        max_unready = max(max_unready, counts["bind"] - counts["ready"])
    return Pipeline(
        created=counts["create"],
        bound=counts["bind"],
        ready=counts["ready"],
        last_create_s=last["create"],
        last_bind_s=last["bind"],
        last_ready_s=last["ready"],
        max_waiting_for_scheduler=max_unbound,
        max_waiting_for_kubelet=max_unready,
        bind_to_ready_median_s=statistics.median(lags) if lags else None,
    )


class AuditReader:
    """Reads a growing audit log incrementally, keeping the requests of one user (or, with user None,
    every request that `keep` accepts; `marker`, if given, is text such lines must contain).

    `exclude_agents`: user-agent prefixes to drop; used when the operator runs with the admin
    credentials (no chart yet), where the bench's own and kubectl's requests share its user.
    """

    def __init__(
        self,
        path: Path,
        user: str | None,
        exclude_agents: tuple[str, ...] = (),
        keep: Callable[[Request], bool] | None = None,
        marker: str | None = None,
    ) -> None:
        self.path = path
        self.user = user
        self.exclude_agents = exclude_agents
        self.keep = keep
        self.marker = marker
        self.offsets: dict[int, int] = {}
        """Inode → bytes read. The API server rotates its log at 100 MB (audit-<time>.log, same inode),
        so a file is followed by inode, not by name."""
        self.finished: set[int] = set()
        self.requests: dict[str, Request] = {}

    def files(self) -> list[Path]:
        return log_files(self.path)

    def update(self) -> list[Request]:
        """Read what was appended since the last call (whole lines only); return all requests so far."""
        for file in self.files():
            try:
                inode = file.stat().st_ino
            except FileNotFoundError:
                continue
            if inode in self.finished:
                continue
            start = self.offsets.get(inode, 0)
            with file.open("rb") as log:
                log.seek(start)
                data = log.read()
            end = data.rfind(b"\n") + 1
            self.offsets[inode] = start + end
            if file != self.path:
                self.finished.add(inode)  # a rotated log never grows again
            self._add(data[:end].decode(errors="replace").splitlines())
        return sorted(self.requests.values(), key=lambda r: r.received)

    def _add(self, lines: list[str]) -> None:
        if self.marker is not None:
            lines = [line for line in lines if self.marker in line]
        for request in parse_lines(lines, self.user):
            if request.user_agent.startswith(self.exclude_agents):
                continue
            if self.keep is not None and not self.keep(request):
                continue
            self.requests.setdefault(request.audit_id, request)
