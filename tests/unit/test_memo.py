"""gpu_operator/core/memo.py: a result is reused exactly while its inputs stay equal, and a warm memo never
changes what a pass decides."""

from __future__ import annotations

import random
from dataclasses import fields, replace
from typing import Any

import pytest
from builders import gpu_node, operand_pod

from gpu_operator.api.status import NodeProblem
from gpu_operator.core import plan, status
from gpu_operator.core.caches import Caches
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
    warm_caches = Caches()
    for step_nodes, step_pods in steps:
        build(observed(step_nodes, step_pods), NOW, caches=warm_caches)
        warm = build(observed(step_nodes, step_pods), NOW, caches=warm_caches)  # everything reused
        cold = build(observed(step_nodes, step_pods), NOW, caches=Caches())
        assert (warm.node_labels, warm.statuses, warm.upgrade) == (
            cold.node_labels,
            cold.statuses,
            cold.upgrade,
        )


def memos(caches: Caches) -> dict[str, Memo[Any]]:
    return {name: value for name, value in vars(caches).items() if isinstance(value, Memo)}


def test_every_cache_of_the_core_is_a_memo_of_its_own_caches_object() -> None:
    """Two Caches share nothing: a pass with one leaves the other as it was."""
    first, second = Caches(), Caches()
    assert memos(first).keys() == {f.name for f in fields(Caches)}, "every field is a Memo"
    assert not {id(m) for m in memos(first).values()} & {id(m) for m in memos(second).values()}
    nodes = {"gpu-0": gpu_node("gpu-0", uid="u0")}
    build(observed(nodes, ()), NOW, caches=first)
    # The pools' memo fills only with NVIDIADrivers running the driver (tests/unit/test_driver_pool_plan.py).
    filled = {name for name, m in memos(first).items() if m.entries}
    assert filled == {f.name for f in fields(Caches)} - {"pools"}, "a pass with a policy and a node fills all"
    assert not any(m.entries for m in memos(second).values())


class Counted:
    """Wraps a module's function and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
        self.calls = 0
        wrapped = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return wrapped(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def test_a_pass_with_the_same_caches_reuses_what_did_not_change(monkeypatch: pytest.MonkeyPatch) -> None:
    renders = Counted(monkeypatch, plan, "render")
    labels = Counted(monkeypatch, plan, "desired_labels")
    parses = Counted(monkeypatch, plan, "parse_spec")
    nodes = {f"gpu-{i}": gpu_node(f"gpu-{i}", uid=f"u{i}") for i in range(3)}
    caches = Caches()
    first = build(observed(nodes, ()), NOW, caches=caches)
    assert (renders.calls, labels.calls, parses.calls) == (1, 3, 1)
    again = build(observed(dict(nodes), ()), NOW, caches=caches)
    assert (renders.calls, labels.calls, parses.calls) == (1, 3, 1), "nothing changed, nothing computed"
    assert again.objects is first.objects
    # One node changes: only its labels are decided again.
    nodes["gpu-1"] = replace(nodes["gpu-1"], labels={**nodes["gpu-1"].labels, "extra": "x"})
    build(observed(nodes, ()), NOW, caches=caches)
    assert (renders.calls, labels.calls, parses.calls) == (1, 4, 1)
    # Another policy: parsed, rendered and every node decided again.
    changed = PolicyRef("p", "uid-p", 2, NOW, {"dcgm": {"enabled": False}}, {})
    build(
        Observed((changed,), nodes, (), daemonsets={}, objects={}, namespace="gpu-operator"),
        NOW,
        caches=caches,
    )
    assert (renders.calls, labels.calls, parses.calls) == (2, 7, 2)
    # Without caches of its own a pass starts cold.
    build(observed(nodes, ()), NOW)
    assert (renders.calls, labels.calls, parses.calls) == (3, 10, 3)


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
