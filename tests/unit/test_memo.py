"""gpu_operator/memo.py: a result is reused exactly while its inputs stay equal, and a warm memo never
changes what a pass decides."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpu_operator import plan, status, upgrades
from gpu_operator.memo import Memo
from gpu_operator.nodes import NodeInfo
from gpu_operator.observed import PodInfo
from gpu_operator.plan import Observed, PolicyRef, build

PCI = "feature.node.kubernetes.io/pci-10de.present"
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
    nodes = {f"gpu-{i}": NodeInfo(f"gpu-{i}", {PCI: "true"}, uid=f"u{i}") for i in range(3)}
    driver = {**nodes["gpu-0"].labels, "nvidia.com/gpu.deploy.driver": "true"}
    key = "nvidia.com/gpu.deploy.driver"
    nodes["gpu-0"] = replace(nodes["gpu-0"], labels=driver, own_labels=frozenset({key}))
    pods = (PodInfo("d0", "driver", "gpu-0", False, "ContainerCreating", "", False, NOW),)
    steps = [
        (nodes, pods),
        (nodes, (replace(pods[0], initialized=True),)),  # past k8s-driver-manager: the toolkit next
        (nodes, (replace(pods[0], initialized=True, ready=True, reason=""),)),  # the driver came up
        ({**nodes, "gpu-1": replace(nodes["gpu-1"], labels={"a": "b"})}, ()),  # no longer a GPU node
    ]
    for step_nodes, step_pods in steps:
        build(observed(step_nodes, step_pods), NOW)
        warm = build(observed(step_nodes, step_pods), NOW)  # everything reused
        for memo in (plan._LABELS, plan._PARSED, status._STANDINGS, upgrades._NODES):
            memo.entries.clear()
        cold = build(observed(step_nodes, step_pods), NOW)
        assert (warm.node_labels, warm.statuses, warm.upgrade) == (
            cold.node_labels,
            cold.statuses,
            cold.upgrade,
        )
