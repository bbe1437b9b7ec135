"""gpu_operator/core/memo.py: a result is reused exactly while its inputs stay equal, and a warm memo never
changes what a pass decides."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from builders import gpu_node, operand_pod

from gpu_operator.api.status import NodeProblem
from gpu_operator.core import driver_upgrade as upgrades
from gpu_operator.core import plan, status
from gpu_operator.core.memo import Memo
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import PodInfo
from gpu_operator.core.plan import Observed, PolicyRef, build

NOW = "2026-12-01T00:00:00Z"


def test_reused_while_inputs_are_equal_recomputed_when_not_and_pruned() -> None:
    memo: Memo[list[str]] = Memo()
    calls: list[str] = []

    def compute(tag: str) -> Any:
        def run() -> list[str]:
            calls.append(tag)
            return [tag]

        return run

    first = memo.get("n1", ({"a": 1},), compute("a"))
    assert memo.get("n1", ({"a": 1},), compute("again")) is first, "equal, not identical, inputs reuse"
    assert memo.get("n1", ({"a": 2},), compute("b")) == ["b"]
    memo.get("n2", (1,), compute("c"))
    memo.keep({"n2"})
    assert set(memo.entries) == {"n2"}
    assert calls == ["a", "b", "c"]


def observed(nodes: dict[str, NodeInfo], pods: tuple[PodInfo, ...]) -> Observed:
    policy = PolicyRef("p", "uid-p", 1, NOW, {}, {})
    return Observed((policy,), nodes, pods, daemonsets={}, objects={}, namespace="gpu-operator")


def test_a_warm_memo_decides_what_a_cold_one_does() -> None:
    nodes = {f"gpu-{i}": gpu_node(f"gpu-{i}", uid=f"u{i}") for i in range(3)}
    driver = {**nodes["gpu-0"].labels, "nvidia.com/gpu.deploy.driver": "true"}
    key = "nvidia.com/gpu.deploy.driver"
    nodes["gpu-0"] = replace(nodes["gpu-0"], labels=driver, own_labels=frozenset({key}))
    pods = (operand_pod("d0", "driver", "gpu-0", False, "ContainerCreating", created=NOW),)
    steps = [
        (nodes, pods),
        (nodes, (replace(pods[0], initialized=True),)),  # past k8s-driver-manager: the toolkit next
        (nodes, (replace(pods[0], initialized=True, ready=True, reason=""),)),  # the driver came up
        ({**nodes, "gpu-1": replace(nodes["gpu-1"], labels={"a": "b"})}, ()),  # no longer a GPU node
    ]
    for step_nodes, step_pods in steps:
        build(observed(step_nodes, step_pods), NOW)
        warm = build(observed(step_nodes, step_pods), NOW)  # everything reused
        for memo in (
            plan._LABELS,
            plan._PARSED,
            status._STANDINGS,
            status._BLOCKS,
            upgrades._NODES,
            upgrades._MANUAL,
        ):
            memo.entries.clear()
        cold = build(observed(step_nodes, step_pods), NOW)
        assert (warm.node_labels, warm.statuses, warm.upgrade) == (
            cold.node_labels,
            cold.statuses,
            cold.upgrade,
        )


def _original_summary(ready: int, column: list[status.Standing | None]) -> str:
    """The summary as it was computed from a whole column before blocks (the reference)."""
    eligible = [s for s in column if s is not None and s.eligible]
    problems = [s.problem for s in eligible if not s.waiting and s.problem is not None]
    problems += [s.problem for s in eligible if s.waiting and s.problem is not None]
    if not problems:
        return f"{ready}/{len(eligible)} nodes ready; rollout in progress"
    by_reason: dict[str, list[str]] = {}
    for problem in problems:
        text = problem.message if problem.reason in ("WaitingForDependency", "Paused") else problem.reason
        by_reason.setdefault(text, []).append(problem.node)
    parts = []
    for text, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{text} on {shown}")
    return f"{ready}/{len(eligible)} nodes ready: " + "; ".join(parts)


def test_blocks_of_nodes_add_up_to_what_the_whole_column_says() -> None:
    """status._combined over any split of the nodes into runs gives the tally of all of them: counts,
    the first problems in node order (own first, then waits) and the one-line summary."""
    rng = random.Random(5)
    reasons = [("CrashLoopBackOff", ""), ("WaitingForDependency", "waiting for driver"), ("Paused", "x by y")]
    for _ in range(200):
        column: list[status.Standing | None] = []
        for i in range(rng.randrange(0, 80)):
            if rng.random() < 0.1:
                column.append(None)
                continue
            waiting, ready = rng.random() < 0.4, rng.random() < 0.3
            reason, message = rng.choice(reasons)
            problem = None if ready else NodeProblem(node=f"n{i}", reason=reason, message=message)
            column.append(
                status.Standing(
                    rng.random() < 0.9, rng.random() < 0.8, ready, rng.random() < 0.2, waiting, problem
                )
            )
        whole = status._tally(column)
        cuts = (
            sorted(rng.sample(range(1, len(column)), min(len(column) - 1, rng.randrange(0, 6))))
            if column
            else []
        )
        parts = [column[a:b] for a, b in zip([0, *cuts], [*cuts, len(column)], strict=True)]
        joined = status._combined([status._tally(p) for p in parts])
        assert joined == whole
        assert list(joined.own_said.items()) == list(whole.own_said.items())
        assert status._summary(joined) == _original_summary(whole.ready, column)


def test_a_hit_keeps_the_latest_equal_inputs_so_the_next_compares_by_identity() -> None:
    memo: Memo[str] = Memo()
    first, copy = {"a": "1"}, {"a": "1"}
    memo.get("n", (first,), lambda: "value")
    assert memo.get("n", (copy,), lambda: "again") == "value"
    assert memo.entries["n"][0][0] is copy
