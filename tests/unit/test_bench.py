"""The benchmark's pure parts: audit-log aggregation, medians and ratios, /proc parsing, the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import condition, node_body, operand_pod_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml

from bench import audit, procstat, report, stats

OPERATOR = "system:serviceaccount:gpu-operator:gpu-operator"
T0 = 1_800_000_000.0


def stamp(offset: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + offset, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(
    offset: float,
    verb: str,
    resource: str,
    *,
    name: str = "",
    user: str = OPERATOR,
    stage: str = "ResponseComplete",
    audit_id: str | None = None,
    subresource: str = "",
    namespace: str = "",
    agent: str = "kopf/1.45.2",
) -> str:
    ref: dict[str, Any] = {"resource": resource, "apiVersion": "v1"}
    if name:
        ref["name"] = name
    if subresource:
        ref["subresource"] = subresource
    if namespace:
        ref["namespace"] = namespace
    entry = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id or f"{verb}-{resource}-{name}-{offset}",
        "stage": stage,
        "verb": verb,
        "user": {"username": user, "groups": ["system:serviceaccounts"]},
        "userAgent": agent,
        "objectRef": ref,
        "responseStatus": {"metadata": {}, "code": 200},
        "requestReceivedTimestamp": stamp(offset),
        "stageTimestamp": stamp(offset + 0.01),
    }
    return json.dumps(entry, separators=(",", ":"))


# --- audit ---------------------------------------------------------------------------------------


def test_parse_time_is_utc_with_microseconds() -> None:
    assert audit.parse_time(stamp(1.25)) == pytest.approx(T0 + 1.25)


def test_parse_lines_keeps_one_user_and_counts_a_watch_once() -> None:
    lines = [
        line(0, "watch", "nodes", stage="ResponseStarted", audit_id="w1"),
        line(1, "patch", "nodes", name="gpu-node-0"),
        line(2, "patch", "nodes", name="gpu-node-0", user="kwok-admin"),
        line(300, "watch", "nodes", stage="ResponseComplete", audit_id="w1"),
        "",
    ]
    found = audit.parse_lines(lines, OPERATOR)
    assert [(r.verb, r.received - T0) for r in found] == [("watch", 0.0), ("patch", 1.0)]
    assert len(audit.parse_lines(lines)) == 3


def test_subresource_and_non_resource_requests() -> None:
    status = audit.parse_lines([line(0, "patch", "clusterpolicies", name="p", subresource="status")])[0]
    assert status.key == "patch clusterpolicies/status"
    entry = json.loads(line(0, "get", "x"))
    del entry["objectRef"]
    bare = audit.parse_entry(entry)
    assert bare is not None and bare.key == "get (non-resource)"
    entry["stage"] = "RequestReceived"
    assert audit.parse_entry(entry) is None


def test_windows_group_by_verb_and_resource() -> None:
    found = audit.parse_lines(
        [
            line(0.5, "patch", "daemonsets", name="a", namespace="gpu-operator"),
            line(1, "patch", "nodes", name="n1"),
            line(2, "patch", "nodes", name="n2"),
            line(3, "patch", "clusterpolicies", name="p", subresource="status"),
            line(10, "patch", "nodes", name="n3"),
        ]
    )
    window = audit.in_window(found, T0 + 1, T0 + 10)
    assert audit.by_verb_resource(window) == {"patch nodes": 2, "patch clusterpolicies/status": 1}
    assert len(audit.writes(found)) == 5


def test_writes_per_minute_and_repeated_reads() -> None:
    found = audit.parse_lines(
        [
            line(0, "watch", "pods", stage="ResponseStarted"),
            line(10, "list", "nodes"),
            line(70, "list", "nodes"),
            line(130, "list", "nodes"),
            line(50, "get", "customresourcedefinitions", name="clusterpolicies.nvidia.com"),
            line(100, "patch", "nodes", name="n1"),
        ]
    )
    assert audit.per_minute(len(audit.writes(found)), 300) == pytest.approx(0.2)
    reads = audit.repeated_reads(found)
    assert reads[0] == audit.RepeatedRead("list", "nodes", "", 3, 60.0)
    assert reads[1].count == 1 and reads[1].mean_interval_s is None
    with pytest.raises(ValueError):
        audit.per_minute(1, 0)


def test_timeline_collapses_consecutive_requests() -> None:
    found = audit.parse_lines(
        [line(0.1, "patch", "daemonsets", name="a")]
        + [line(1 + i / 10, "patch", "nodes", name=f"n{i}") for i in range(3)]
        + [line(2, "patch", "clusterpolicies", name="p", subresource="status")]
    )
    assert audit.timeline(found, T0) == [
        "+0.100s patch daemonsets x1",
        "+1.000..+1.200s patch nodes x3",
        "+2.000s patch clusterpolicies/status x1",
    ]
    assert audit.timeline(found, T0, limit=1)[-1] == "... 2 more"


def test_describe_names_the_object_and_offset() -> None:
    request = audit.parse_lines([line(12.3456, "create", "events", name="e", namespace="default")])[0]
    assert audit.describe(request, T0) == "+12.346s create events default/e (200)"


def test_reader_reads_only_new_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(line(0, "patch", "nodes", name="a") + "\n" + line(1, "patch", "nodes", name="b")[:40])
    reader = audit.AuditReader(log, OPERATOR)
    assert len(reader.update()) == 1
    log.write_text(
        line(0, "patch", "nodes", name="a")
        + "\n"
        + line(1, "patch", "nodes", name="b")
        + "\n"
        + line(2, "list", "nodes", user="admin", agent="kubectl/v1.36")
        + "\n"
    )
    assert [r.name for r in reader.update()] == ["a", "b"]
    admin = audit.AuditReader(log, "admin", exclude_agents=("kubectl",))
    assert admin.update() == []


# --- stats ---------------------------------------------------------------------------------------


def test_median_and_ratio() -> None:
    assert stats.median([]) is None
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert stats.ratio(3.0, 2.0) == 1.5
    assert stats.ratio(None, 2.0) is None
    assert stats.ratio(1.0, 0.0) is None


def test_paired_ratios_skip_missing_rounds() -> None:
    assert stats.paired_ratios([2.0, None, 6.0], [1.0, 1.0, 3.0]) == [2.0, 2.0]
    assert stats.median(stats.paired_ratios([5.0, 4.0, 9.0], [4.0, 4.0, 6.0])) == 1.25


def test_targets() -> None:
    assert stats.ratio_target(10) == 1.25 and stats.ratio_target(100) == 1.25
    assert stats.ratio_target(1000) == 1.0
    assert stats.ratio_verdict(100, 1.25).met is True
    assert stats.ratio_verdict(100, 1.26).met is False
    assert stats.ratio_verdict(1000, 0.99).met is True and stats.ratio_verdict(1000, 1.01).met is False
    assert stats.ratio_verdict(10, None).met is None
    assert stats.idle_verdict(0.0).met is True and stats.idle_verdict(0.2).met is False
    assert stats.rss_verdict(1000, 149.0).met is True
    assert stats.rss_verdict(1000, 150.0).met is False
    assert stats.rss_verdict(100, 400.0).met is None


# --- /proc parsing -------------------------------------------------------------------------------


def test_stat_cpu_survives_odd_command_names() -> None:
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "250", "50"] + ["0"] * 30
    text = "4242 (gpu op) (x)) " + " ".join(fields)
    assert procstat.parse_stat_cpu(text, ticks=100) == 3.0


def test_a_threads_cpu_is_read_from_its_task_entry() -> None:
    import os
    import time

    before = procstat.thread_cpu(os.getpid(), os.getpid())
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:  # this thread, the main one, burns 50 ms of CPU
        pass
    after = procstat.thread_cpu(os.getpid(), os.getpid())
    assert before is not None and after is not None and after - before >= 0.03
    assert procstat.thread_cpu(os.getpid(), 2**22 + 1) is None, "no such thread"


def test_status_and_machine_busy() -> None:
    status = "Name:\tpython\nVmHWM:\t  153600 kB\nVmRSS:\t  102400 kB\n"
    assert procstat.parse_status_kib(status, "VmHWM") == 153600
    assert procstat.parse_status_kib(status, "VmSwap") is None
    before = procstat.parse_machine_busy("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    after = procstat.parse_machine_busy("cpu  300 0 200 800 100 0 0 0 0 0\n")
    assert before == (200.0, 1000.0)
    assert procstat.busy_fraction(before, after) == pytest.approx(0.75)
    assert procstat.busy_fraction(after, after) is None
    assert procstat.cpu_delta({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 5.0, "c": 9.0}) == {"b": 3.0, "a": 0.5}


# --- the Markdown table --------------------------------------------------------------------------


def result(nodes: int, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nodes": nodes,
        "rounds": 3,
        "operator_s": 5.0,
        "limit_s": 4.0,
        "ratio": 1.25,
        "node_join_operator_s": 1.5,
        "node_join_limit_s": 0.5,
        "idle_writes_per_min": 0.0,
        "requests_per_node": 4.5,
        "peak_rss_mib": 90.0,
        "cpu_s": 12.34,
    }
    base.update(overrides)
    return base


def test_table_rows_sorted_by_size_with_verdicts() -> None:
    text = report.table(
        {
            "1000": result(1000, ratio=1.6, peak_rss_mib=149.4),
            "10": result(10),
            "100": result(100, ratio=None),
        }
    )
    lines = text.splitlines()
    assert lines[0].startswith("| GPU nodes | runs | operator s | limit s | ratio |")
    assert len(lines) == 5 and all(len(row.split("|")) == len(report.COLUMNS) + 2 for row in lines)
    assert lines[2].startswith(
        "| 10 | 3 | 5.00 | 4.00 | 1.25 (≤ 1.25) ✓ | 1.50 | 0.50 | 0.0 ✓ | 4.5 | 90 | 12.3 |"
    )
    assert "| n/a (≤ 1.25) |" in lines[3]
    assert "1.60 (≤ 1) ✗" in lines[4] and "| 149 ✓ |" in lines[4]


def test_markdown_has_header_table_and_details() -> None:
    document = {
        "date": "2026-11-29T14:00:00Z",
        "git_commit": "0123456789abcdef",
        "machine": {"nproc": 2, "cpu_model": "Test CPU", "memory_gib": 24.0},
        "load_average": {"min": 1.0, "max": 3.5},
        "results": {
            "10": result(
                10,
                convergence_requests={"patch nodes": 40},
                idle_window_s=300.0,
                idle_requests={},
                idle_writes=["+1.000s create events default/e (201)"],
                converge_cpu_s=2.04,
                planning_cpu_s=1.26,
                event_loop_cpu_s=0.52,
            )
        },
    }
    text = report.markdown(document)
    assert (
        "- operator CPU while converging (median): 2.0 s, of it while passes ran 1.3 s, "
        "on the event loop's thread (passes and watches) 0.5 s" in text
    )
    assert "`0123456789ab`" in text and "2 CPUs (Test CPU)" in text and "1.0 to 3.5" in text
    assert "| 10 | 3 |" in text
    assert "- requests during convergence (first run): patch nodes 40" in text
    assert "- requests during 300 s at rest: none" in text
    assert "- writes at rest: +1.000s create events default/e (201)" in text


def test_pod_pipeline_backlogs_and_lag() -> None:
    ns = "gpu-operator"
    lines = [
        line(0.0, "create", "pods", namespace=ns, user="kwok-admin", audit_id="c1"),
        line(0.1, "create", "pods", namespace=ns, user="kwok-admin", audit_id="c2"),
        line(0.2, "create", "pods", namespace=ns, user="kwok-admin", audit_id="c3"),
        line(0.3, "create", "pods", name="a", subresource="binding", namespace=ns, user="kwok-admin"),
        line(0.4, "create", "pods", name="b", subresource="binding", namespace=ns, user="kwok-admin"),
        line(0.6, "patch", "pods", name="a", subresource="status", namespace=ns, user="kwok-admin"),
        line(0.7, "patch", "pods", name="a", subresource="status", namespace=ns, user="kwok-admin"),
        line(1.4, "patch", "pods", name="b", subresource="status", namespace=ns, user="kwok-admin"),
    ]
    found = audit.pod_pipeline(audit.parse_lines(lines), T0)
    assert (found.created, found.bound, found.ready) == (3, 2, 2)
    assert found.max_waiting_for_scheduler == 3 and found.max_waiting_for_kubelet == 2
    assert found.last_ready_s == pytest.approx(1.4)
    assert found.bind_to_ready_median_s == pytest.approx(0.65)
    empty = audit.pod_pipeline([], T0)
    assert empty.created == 0 and empty.bind_to_ready_median_s is None


def test_profile_shares_of_wall_time() -> None:
    from bench import profile

    def at(*frames: str) -> str:
        return ";".join(frames)

    loop = at(
        "thread (0x7F3C4D2E1740): MainThread",
        "<module> (gpu-operator:8)",
        "main (gpu_operator/cli.py:41)",
        "run (gpu_operator/main.py:320)",
        "run (asyncio/runners.py:190)",
        "Runner.run (asyncio/runners.py:118)",
        "BaseEventLoop.run_until_complete (asyncio/base_events.py:640)",
        "BaseEventLoop.run_forever (asyncio/base_events.py:607)",
        "BaseEventLoop._run_once (asyncio/base_events.py:1922)",
    )
    task = at(loop, "Handle._run (asyncio/events.py:80)")
    queue = at(
        task,
        "WorkQueue.run (gpu_operator/runtime/workqueue.py:214)",
        "WorkQueue._pass (gpu_operator/runtime/workqueue.py:219)",
        "_timed (gpu_operator/runtime/workqueue.py:260)",
    )
    reconciler = "gpu_operator/runtime/reconciler.py"
    plan = at(queue, f"Reconciler.run_once ({reconciler}:236)", f"Reconciler._plan ({reconciler}:330)")
    prove = at(plan, f"Reconciler._prove ({reconciler}:338)")
    client = "gpu_operator/runtime/client.py"
    write = at(  # a write gathered by the pass: a task of its own, without run_once's frames
        task,
        f"_gather.<locals>.run ({reconciler}:623)",
        f"Reconciler._apply ({reconciler}:400)",
        f"Kube.apply ({client}:420)",
    )
    watch = at(
        task,
        "Informer.run (gpu_operator/runtime/informer.py:115)",
        "Informer.watch_once (gpu_operator/runtime/informer.py:180)",
        "read (gpu_operator/runtime/watch_stream.py:80)",
    )
    asyncio_0 = at("thread (0x7F3C3A7FE6C0): asyncio_0", "Thread._bootstrap (threading.py:995)")
    raw = "\n".join(
        [
            at(loop, "EpollSelector.select (selectors.py:468) 120"),
            at(
                queue,
                f"Reconciler.run_once ({reconciler}:236)",
                f"Reconciler._plan ({reconciler}:328)",
                "Store.snapshot (gpu_operator/runtime/store.py:180)",
                "Store._upgrade_facts (gpu_operator/runtime/store.py:200) 4",
            ),
            at(
                prove,
                "build (gpu_operator/core/plan.py:150)",
                "render_all (gpu_operator/core/render.py:88) 30",
            ),
            at(prove, f"Reconciler._vet ({reconciler}:361)", "judge (gpu_operator/core/vetting.py:200) 10"),
            at(
                queue, f"Reconciler.run_once ({reconciler}:320)", "conclude (gpu_operator/core/plan.py:900) 3"
            ),
            at(write, "dumps (json/__init__.py:231) 12"),
            at(
                write,
                f"Kube._call ({client}:280)",
                f"Kube._read ({client}:300)",
                "loads (gpu_operator/runtime/safe_json.py:40) 6",
            ),
            at(
                queue,
                f"Reconciler.run_once ({reconciler}:290)",
                "in_waves (gpu_operator/core/writes.py:50) 5",
            ),
            at(watch, "loads_event (gpu_operator/runtime/safe_json.py:60) 20"),
            at(
                watch,
                "Events.add (gpu_operator/runtime/watch_stream.py:54)",
                "Store.record_pod (gpu_operator/runtime/store.py:260) 8",
            ),
            at(task, "worker (kopf/_core/reactor/queueing.py:263) 4"),
            at(
                task,
                "RequestHandler._handle_request (aiohttp/web_protocol.py:452)",
                "health (gpu_operator/runtime/probes.py:15) 3",
            ),
            at(
                task,
                "_SelectorSocketTransport._read_ready (asyncio/selector_events.py:1009)",
                "ResponseHandler.data_received (aiohttp/client_proto.py:298) 2",
            ),
            at(
                asyncio_0,
                "_worker (concurrent/futures/thread.py:83)",
                "warm (gpu_operator/core/render.py:70) 50",
            ),
            at(asyncio_0, "_worker (concurrent/futures/thread.py:81)", "SimpleQueue.get (queue.py:1) 177"),
            "garbage",
        ]
    )
    # 227 ticks: 120 idle, 70 the pass's, 28 the watches', 9 the rest's (Kopf, a probe, aiohttp's callback).
    shares = profile.summarise(raw)
    assert shares == {
        "reconcile: planning": 0.132,  # 30 / 227
        "reconcile: client: requests and answers": 0.079,  # 18: a write's JSON, reading its answer
        "reconcile: vetting": 0.044,  # 10
        "reconcile: other": 0.022,  # 5
        "reconcile: store snapshot": 0.018,  # 4
        "reconcile: concluding": 0.013,  # 3
        "reconcile (total)": 0.308,  # 70
        "watches": 0.123,  # 28
        "event loop busy": 0.471,  # 107
    }
    steps = list(shares)[:6]
    assert steps == sorted(steps, key=lambda key: -shares[key])
    assert profile.summarise("") == {}
    assert profile.summarise(raw.replace("MainThread", "Thread-1")) == {}


def test_profile_step_is_the_outermost_match() -> None:
    from bench import profile

    def frames(*stack: str) -> list[tuple[str, str]]:
        return [profile.frame_of(frame) for frame in stack]

    prove = "Reconciler._prove (gpu_operator/runtime/reconciler.py:337)"
    build, judge = "build (gpu_operator/core/plan.py:150)", "judge (gpu_operator/core/vetting.py:9)"
    assert profile.reconcile_step(frames(prove, build, judge)) == "planning"
    # Other functions of the same files are no step: only plan.build is planning, store.snapshot the snapshot.
    record = "Store.record_node (gpu_operator/runtime/store.py:225)"
    assert profile.reconcile_step(frames(prove, "rebuild (gpu_operator/core/plan.py:1)", record)) == "other"
    assert profile.reconcile_step(frames(judge)) is None  # not the pass's
    assert profile.is_watch(frames(record))
    assert not profile.is_watch(frames("Store.snapshot (gpu_operator/runtime/store.py:180)"))
    assert profile.frame_of("_gather.<locals>.run (gpu_operator/runtime/reconciler.py:623)") == (
        "gpu_operator/runtime/reconciler.py",
        "run",
    )
    assert profile.frame_of("EpollSelector.select (selectors.py)") == ("selectors.py", "select")  # --nolineno
    assert profile.frame_of("MainThread") == ("", "MainThread")


def test_reader_follows_rotated_logs(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(line(0, "patch", "nodes", name="a") + "\n")
    reader = audit.AuditReader(log, OPERATOR)
    assert [r.name for r in reader.update()] == ["a"]
    with log.open("a") as out:
        out.write(line(1, "patch", "nodes", name="b") + "\n")
    log.rename(tmp_path / "audit-2026-11-29T14-41-21.435.log")
    (tmp_path / "audit-2026-11-29T14-47-33.495.log").write_text(line(2, "patch", "nodes", name="c") + "\n")
    log.write_text(line(3, "patch", "nodes", name="d") + "\n")
    assert [r.name for r in reader.update()] == ["a", "b", "c", "d"]
    assert [r.name for r in reader.update()] == ["a", "b", "c", "d"]


# --- the conditions the watches wait for -----------------------------------------------------------


def test_policy_ready_needs_current_generation_and_all_nodes() -> None:
    from bench import run

    check = run.policy_ready("p", 3)
    body: dict[str, Any] = {"metadata": {"name": "p", "generation": 2}, "status": {"state": "ready"}}
    body["status"].update(observedGeneration=2, gpuNodes=3)
    assert check({"/p": body})
    assert not check({})
    assert not check({"/p": {**body, "status": {**body["status"], "observedGeneration": 1}}})
    assert not check({"/p": {**body, "status": {**body["status"], "gpuNodes": 2}}})
    assert not check({"/p": {**body, "status": {**body["status"], "state": "notReady"}}})


def test_daemonsets_rolled_out_on_exactly_the_expected_nodes() -> None:
    from bench import run

    def ds(
        name: str, n: int, generation: int = 1, observed: int = 1, ready: int | None = None
    ) -> dict[str, Any]:
        status = {
            "observedGeneration": observed,
            "desiredNumberScheduled": n,
            "updatedNumberScheduled": n,
            "numberAvailable": n,
            "numberReady": n if ready is None else ready,
        }
        return {
            "metadata": {"name": name, "namespace": "gpu-operator", "generation": generation},
            "status": status,
        }

    check = run.daemonsets_rolled_out({"a": 3, "b": 1})
    assert check({"x/a": ds("a", 3), "x/b": ds("b", 1)})
    assert not check({"x/a": ds("a", 3)})
    assert not check({"x/a": ds("a", 2), "x/b": ds("b", 1)})
    assert not check({"x/a": ds("a", 3, generation=2), "x/b": ds("b", 1)})
    assert not check({"x/a": ds("a", 3, ready=2), "x/b": ds("b", 1)})


def test_final_labels_count_the_mig_manager_where_gfd_will_find_mig_capable_gpus() -> None:
    """gpu-node-0's simulated GPUs are MIG-capable: GFD labels it so, and the MIG manager runs there."""
    from bench import run
    from gpu_operator.api import parse_document
    from gpu_operator.core.node_labels import desired_labels
    from hack import gen_nodes

    spec = parse_document({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}})
    deploy = "nvidia.com/gpu.deploy.mig-manager"
    mig, plain = (gen_nodes.make_node("gpu", i, "v1.36.3") for i in (0, 1))
    assert desired_labels(run.final_info(mig), spec, run.always_ready).get(deploy) == "true"
    assert deploy not in desired_labels(run.final_info(plain), spec, run.always_ready)
    assert run.final_info(plain).labels["nvidia.com/mig.capable"] == "false"


def test_pods_ready_and_gpus_advertised() -> None:
    from bench import run

    def pod(component: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
        deleted = "2026-11-29T00:00:00Z" if deleting else None
        return operand_pod_body(component, component, deleted=deleted, conditions=[condition("Ready", ready)])

    check = run.pods_ready(frozenset({"driver", "dcgm"}))
    assert check({"1": pod("driver", True), "2": pod("dcgm", True), "3": pod("other", False)})
    assert not check({"1": pod("driver", True), "2": pod("dcgm", False)})
    assert not check({"1": pod("driver", True), "2": pod("dcgm", True, deleting=True)})

    def node(gpus: str | None) -> dict[str, Any]:
        return node_body(status={"allocatable": {"nvidia.com/gpu": gpus} if gpus is not None else {}})

    advertised = run.all_gpus_advertised(2)
    assert advertised({"a": node("8"), "b": node("8"), "c": node(None)})
    assert not advertised({"a": node("8"), "b": node("0")})


def test_rounds_option() -> None:
    from bench import run

    assert run.parse_rounds(["10=3", "1000=1"]) == {10: 3, 1000: 1}


def test_runs_alternate_limit_first_in_odd_rounds_and_only_the_last_keeps_its_objects() -> None:
    from bench import run

    calls: list[tuple[str, int, bool]] = []

    def limit(round_no: int, cleanup: bool) -> dict[str, Any]:
        calls.append(("limit", round_no, cleanup))
        return {}

    def operator(round_no: int, cleanup: bool) -> dict[str, Any]:
        calls.append(("operator", round_no, cleanup))
        return {}

    assert [len(runs) for runs in run.alternate(2, limit, operator)] == [2, 2]
    assert calls == [("limit", 1, True), ("operator", 1, True), ("operator", 2, True), ("limit", 2, False)]
    calls.clear()
    assert [len(runs) for runs in run.alternate(2, None, operator)] == [2, 0]
    assert calls == [("operator", 1, True), ("operator", 2, False)]


# --- the driver upgrade bench (bench/upgrade.py, bench/pod_memory.py) --------------------------------


def test_upgrade_conditions() -> None:
    from bench import upgrade

    done = upgrade.upgraded("p", 2, "580.95.05")
    upgraded = {"targetVersion": "580.95.05-ubuntu22.04", "nodesDone": 2, "summary": "up to date"}
    status: dict[str, Any] = {"observedGeneration": 3, "driverUpgrade": upgraded}
    body: dict[str, Any] = {"metadata": {"name": "p", "generation": 3}, "status": status}
    assert done({"/p": body})
    # A status of the previous generation, or still waiting for the new revision, is not done.
    assert not done({"/p": {**body, "metadata": {"name": "p", "generation": 4}}})
    waiting = {**upgraded, "summary": "waiting for the driver DaemonSet's new revision"}
    assert not done({"/p": {**body, "status": {**status, "driverUpgrade": waiting}}})
    rolled = upgrade.rolled_to("nvidia-driver-daemonset", "driver:b")
    ds: dict[str, Any] = {
        "metadata": {"name": "nvidia-driver-daemonset", "generation": 2},
        "spec": {"template": {"spec": {"containers": [{"image": "driver:b"}]}}},
        "status": {"observedGeneration": 2, **dict.fromkeys(upgrade.ROLLED, 5)},
    }
    key = "gpu-operator/nvidia-driver-daemonset"
    assert rolled({key: ds})
    assert not rolled({key: {**ds, "status": {**ds["status"], "numberReady": 4}}})
    assert not rolled({key: {**ds, "status": {**ds["status"], "observedGeneration": 1}}})


def test_concurrency_counts_nodes_in_progress_and_cordoned() -> None:
    from bench import upgrade

    def node(state: str, cordoned: bool) -> dict[str, Any]:
        labels = {"nvidia.com/gpu-driver-upgrade-state": state}
        return node_body(labels=labels, spec={"unschedulable": True} if cordoned else {})

    seen = upgrade.Concurrency()
    assert not seen({"/a": node("pod-restart-required", True), "/b": node("upgrade-required", False)})
    assert not seen({"/a": node("upgrade-done", False), "/b": node("upgrade-failed", True)})
    assert (seen.most_in_progress, seen.most_cordoned) == (1, 1)


def test_pod_memory_per_node_watches_hold_a_fraction() -> None:
    from bench import pod_memory

    found = pod_memory.measure(nodes=20, per_node=5, watched=2)
    assert found["pods"] == 100 and found["watched_pods"] == 10
    assert 0 < found["per_node_records_mib"] < found["cluster_wide_records_mib"] / 5
    assert found["pod_json_bytes"] > 1000  # a real pod, managedFields and all


def test_pass_cost_plans_a_settled_store_and_measures_each_pass() -> None:
    from bench import pass_cost
    from gpu_operator.core.caches import Caches
    from gpu_operator.core.plan import build

    store = pass_cost.filled_store(20, Caches())
    plan = build(store.snapshot(pass_cost.NAMESPACE, {}), pass_cost.NOW)
    assert plan.node_labels == {}, "every node carries the labels the plan wants"
    assert plan.gpu_nodes == 20
    result = pass_cost.measure(20, changes=3, passes=4)
    assert (result.nodes, result.changes, result.passes) == (20, 3, 4)
    assert 0 <= result.median_ms <= result.max_ms


def test_collection_names_the_kind_and_namespace_of_a_path() -> None:
    from bench import kubeapi, run

    assert kubeapi.collection(run.NODES) == ("v1", "Node", "")
    assert kubeapi.collection(run.PODS) == ("v1", "Pod", "gpu-operator")
    assert kubeapi.collection(run.DAEMONSETS) == ("apps/v1", "DaemonSet", "gpu-operator")
    assert kubeapi.collection(run.POLICIES) == ("nvidia.com/v1", "ClusterPolicy", "")
    assert kubeapi.collection("/api/v1/namespaces") == ("v1", "Namespace", "")
    with pytest.raises(ValueError):
        kubeapi.collection("/apis/example.com/v1/widgets")


def test_a_watcher_lists_its_path_and_watches_its_kind_in_its_namespace() -> None:
    from bench import kubeapi

    class FakeKube:
        """SyncKube's `request` and `watch`."""

        def __init__(self) -> None:
            self.listed: list[str] = []
            self.watched: list[tuple[str, str, dict[str, str], int]] = []

        def request(self, method: str, url: str, query: Any = None, **_: Any) -> dict[str, Any]:
            self.listed.append(f"{method} {url}")
            return {"metadata": {"resourceVersion": "5"}, "items": []}

        def watch(self, api_version: str, kind: str, query: dict[str, str], seconds: int) -> Any:
            self.watched.append((api_version, kind, query, seconds))
            pod = {"metadata": {"name": "p", "namespace": "gpu-operator", "resourceVersion": "6"}}
            yield {"type": "ADDED", "object": pod}

    fake = FakeKube()
    query = {"labelSelector": "a=b", "fieldSelector": "spec.nodeName=n"}
    watcher = kubeapi.Watcher(fake, "/api/v1/namespaces/gpu-operator/pods", bool, query)  # type: ignore[arg-type]
    watcher.start(5).wait(5)
    assert set(watcher.objects) == {"gpu-operator/p"}
    assert fake.listed == ["GET /api/v1/namespaces/gpu-operator/pods"]
    selector = "spec.nodeName=n,metadata.namespace=gpu-operator"
    assert fake.watched == [
        (
            "v1",
            "Pod",
            {
                "labelSelector": "a=b",
                "fieldSelector": selector,
                "resourceVersion": "5",
                "allowWatchBookmarks": "true",
            },
            kubeapi.WATCH_SECONDS,
        )
    ]


def test_the_bench_measures_the_seed_sample_with_its_own_driver() -> None:
    """Every round measured the ClusterPolicy's driver; the seed sample delegates it to NVIDIADrivers
    now that they run, so the bench keeps it on the ClusterPolicy."""
    from bench.run import POLICY, own_driver

    policy = own_driver(yaml.safe_load(POLICY.read_text()))
    assert policy["spec"]["driver"]["useNvidiaDriverCRD"] is False
    assert own_driver({})["spec"]["driver"] == {"useNvidiaDriverCRD": False}


def test_terminated_watchers_are_read_from_the_api_servers_metrics() -> None:
    text = "\n".join(
        [
            "# HELP apiserver_terminated_watchers_total [ALPHA] Counter of watchers closed",
            'apiserver_terminated_watchers_total{group="",resource="nodes"} 6',
            'apiserver_terminated_watchers_total{group="",resource="pods"} 94',
            'apiserver_watch_cache_events_dispatched_total{group="",resource="pods"} 54539',
        ]
    )
    assert procstat.terminated_watchers(text) == {"nodes": 6, "pods": 94}
    assert procstat.terminated_watchers("") == {}


def test_a_saturated_run_is_named_in_the_details() -> None:
    quiet = {"pod_watchers_closed_runs": [0], "limit_pod_watchers_closed_runs": [0]}
    assert report._saturation(quiet) == []
    line = report._saturation({"pod_watchers_closed_runs": [94, 0], "limit_pod_watchers_closed_runs": []})
    assert line and "per operator run: 94, 0; per limit run: -" in line[0]


def test_several_joins_are_listed_with_their_median() -> None:
    one = report.details({"10": {"node_join_operator_all_s": [1.5]}})
    assert "node joins" not in one
    more = report.details({"10": {"node_join_operator_all_s": [1.5, 3.0, 2.0]}})
    assert "- operator node joins (3): median 2.00 s, 1.50, 3.00, 2.00" in more
