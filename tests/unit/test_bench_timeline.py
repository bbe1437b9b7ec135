"""bench.timeline: a rollout's per-node steps from the audit log and the pods at the end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import timeline

OPERATOR = "system:serviceaccount:gpu-operator:gpu-operator"
T0 = 1_800_000_000.0


def stamp(offset: float, precise: bool = True) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(T0 + offset, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if precise else "%Y-%m-%dT%H:%M:%SZ")


def audit(
    offset: float, verb: str, name: str, user: str = OPERATOR, subresource: str = "", code: int = 200
) -> str:
    ref: dict[str, Any] = {
        "resource": "pods" if subresource in ("binding", "status") else "nodes",
        "name": name,
    }
    if subresource:
        ref.update(subresource=subresource, namespace="gpu-operator")
    return json.dumps(
        {
            "kind": "Event",
            "auditID": f"{verb}-{name}-{offset}",
            "stage": "ResponseComplete",
            "verb": verb,
            "user": {"username": user},
            "objectRef": ref,
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": stamp(offset),
        },
        separators=(",", ":"),
    )


def pod(
    name: str, node: str, ds: str, created: int, initialized: int | None, ready: int | None
) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(created, False)}]
    if initialized is not None:
        conditions.append(
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp(initialized, False)}
        )
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": stamp(ready, False)})
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": stamp(created, False),
            "ownerReferences": [{"kind": "DaemonSet", "name": ds}],
        },
        "spec": {"nodeName": node},
        "status": {"conditions": conditions},
    }


LINES = [
    audit(1.0, "patch", "n1"),  # driver label
    audit(1.5, "patch", "n1", user="someone-else"),  # not the writer's
    audit(1.6, "patch", "n1", code=409),  # refused: not a label write
    audit(2.2, "create", "driver-a", user="scheduler", subresource="binding"),
    audit(12.4, "patch", "driver-a", user="kubelet", subresource="status"),  # initialized
    audit(19.3, "patch", "driver-a", user="kubelet", subresource="status"),  # ready (condition: 19 s)
    audit(19.8, "patch", "driver-a", user="kubelet", subresource="status", code=409),  # refused
    audit(20.5, "patch", "n1"),  # toolkit label, after the driver is ready
    audit(21.4, "create", "toolkit-a", user="scheduler", subresource="binding"),
]
PODS = [
    pod("driver-a", "n1", "nvidia-driver-daemonset", 2, 12, 19),
    pod("toolkit-a", "n1", "nvidia-container-toolkit-daemonset", 21, 22, 24),
    # Not a DaemonSet's: left out.
    {"metadata": {"name": "standalone", "creationTimestamp": stamp(3, False)}, "spec": {"nodeName": "n1"}},
]


def test_a_pods_steps_run_from_the_label_before_its_binding_to_the_label_after_its_readiness() -> None:
    labels = timeline.label_writes(LINES, timeline.writer_marker(OPERATOR))
    assert labels == {"n1": [T0 + 1.0, T0 + 20.5]}
    times = timeline.pod_times(PODS, labels, timeline.pod_requests(LINES, "gpu-operator"))
    assert [t.daemonset for t in times] == ["nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"]
    driver, toolkit = times
    assert [round(s, 3) for s in driver.steps() if s is not None] == [1.2, 9.8, 7.0, 0.3, 1.2]
    assert toolkit.labelled == T0 + 20.5
    assert toolkit.ready_written is None and toolkit.steps()[3:] == (None, None), "no status write seen"


def test_the_report_orders_daemonsets_as_they_became_ready_and_gives_the_nodes_paths(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text("\n".join(LINES) + "\n")
    text = timeline.report(log, PODS, timeline.writer_marker(OPERATOR), T0, "gpu-operator")
    rows = [line for line in text.splitlines() if line.startswith("| nvidia")]
    assert rows[0].startswith(
        "| nvidia-driver-daemonset | 1 | 1.20 / 1.20 | 9.80 / 9.80 | 7.00 / 7.00 | 0.30 / 0.30 | 1.20 / 1.20"
    )
    assert rows[1].endswith("| - | - |")
    assert "last pod ready: median 24.00 s" in text
    assert "first label write after the policy: median 1.00 s" in text


def test_percentile_is_nearest_rank() -> None:
    assert timeline.percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert timeline.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9) == 9.0


def test_the_cli_names_a_missing_file_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    code = timeline.main(["--audit", str(tmp_path / "a"), "--pods", str(tmp_path / "p"), "--writer", "u"])
    assert code == 2
    assert "bench.timeline:" in capsys.readouterr().err


def test_the_limits_label_writes_are_found_by_its_user_agent() -> None:
    line = audit(1.0, "patch", "n1", user="kwok-admin").replace(
        '"user":', '"userAgent":"gpu-operator-bench","user":'
    )
    marker = timeline.writer_marker(agent="gpu-operator-bench")
    assert timeline.label_writes([line, audit(2.0, "patch", "n1", user="kwok-admin")], marker) == {
        "n1": [T0 + 1.0]
    }


def test_the_write_that_carried_readiness_is_the_last_before_the_next_label() -> None:
    """A status write sent just before readiness arrives in its second (the emulators' writes queue);
    the one that carried it came later, and the operator's label followed that one."""
    status = [T0 + 19.2, T0 + 24.6]  # sent before readiness; the ready one, queued for 5 s
    labels = [T0 + 1.0, T0 + 25.0]
    assert timeline._ready_written(status, labels, T0 + 19.0) == T0 + 24.6
    assert timeline._ready_written(status, [T0 + 1.0], T0 + 19.0) == T0 + 19.2, "no label after it"
    assert timeline._ready_written([T0 + 26.0], labels, T0 + 19.0) == T0 + 26.0, "none before the label"
    assert timeline._ready_written(status, labels, None) is None
