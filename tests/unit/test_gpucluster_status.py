"""The GPUCluster's status (core/gpucluster_status.py): NVIDIA's states, condition types and reasons, and
the messages that say which workload or node it waits for."""

from __future__ import annotations

from typing import Any

from builders import gpu_node

from gpu_operator.api import parse_spec
from gpu_operator.api.gpucluster import SINGLETON_MESSAGE, parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import REASON_CONFLICTING_NODE_SELECTOR
from gpu_operator.core.allocators import GPUClusterObject, split_allocators
from gpu_operator.core.gpucluster_status import (
    ALL_RECONCILED,
    DRA_NOT_SERVED,
    gpucluster_status,
    workloads,
)

POLICY = parse_spec({})
NOW, LATER = "2026-12-06T08:00:00Z", "2026-12-06T09:00:00Z"
NODES = [gpu_node("a", {"pool": "dra"}), gpu_node("b", {"pool": "dra"}), gpu_node("c")]


def gc(name: str = "gpu-cluster", **spec: Any) -> GPUClusterObject:
    return GPUClusterObject(name, parse_gpucluster_spec({"nodeSelector": {"pool": "dra"}, **spec}))


def all_ready(cluster: GPUClusterObject) -> dict[str, bool]:
    assert cluster.spec is not None
    return dict.fromkeys(workloads(cluster.spec), True)


def status_of(cluster: GPUClusterObject, ready: dict[str, bool] | None = None, **kwargs: Any) -> Any:
    split = split_allocators(
        kwargs.pop("nodes", NODES), kwargs.pop("policy", POLICY), [cluster], kwargs.pop("pods", None)
    )
    found = gpucluster_status(
        cluster,
        split,
        all_ready(cluster) if ready is None else ready,
        namespace="gpu-operator",
        now=NOW,
        **kwargs,
    )
    assert found is not None
    return found


def conditions(status: Any) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in status.conditions}


def test_workloads_follow_the_spec() -> None:
    spec = parse_gpucluster_spec({})
    assert workloads(spec) == ["nvidia-dra-driver-kubelet-plugin", "nvidia-dra-validator"]
    spec = parse_gpucluster_spec(
        {"draDriver": {"computeDomains": {}}, "dcgm": {"enabled": True}, "dcgmExporter": {}}
    )
    assert workloads(spec) == [
        "nvidia-dra-driver-kubelet-plugin",
        "nvidia-dra-driver-controller",
        "nvidia-dcgm-dra",
        "nvidia-dcgm-exporter-dra",
        "nvidia-dra-validator",
    ]


def test_ready_when_every_workload_rolled_out() -> None:
    status = status_of(gc())
    assert (status.state, status.namespace) == ("ready", "gpu-operator")
    assert conditions(status) == {
        "Ready": ("True", "Reconciled", ALL_RECONCILED),
        "Error": ("False", "Ready", ""),
    }


def test_not_ready_names_the_workloads_it_waits_for() -> None:
    cluster = gc()
    status = status_of(cluster, {"nvidia-dra-driver-kubelet-plugin": True})
    assert status.state == "notReady"
    ready, error = conditions(status)["Ready"], conditions(status)["Error"]
    assert ready == ("False", "Error", "")
    assert error[:2] == ("True", "OperandNotReady")
    assert error[2] == "Waiting for operand pods to be ready: nvidia-dra-validator"


def test_nodes_waiting_to_move_keep_it_not_ready() -> None:
    nodes = [
        gpu_node("a", {"pool": "dra", "nvidia.com/gpu.deploy.device-plugin": "true"}),
        gpu_node("b", {"pool": "dra"}),
    ]
    status = status_of(gc(), nodes=nodes, pods={"a": 3})
    assert status.state == "notReady"
    assert conditions(status)["Error"][1:] == (
        "OperandNotReady",
        "1 node waits for its GPU pods to go before changing allocator: a",
    )


def test_selecting_no_gpu_node_is_ready_with_nvidias_no_gpu_nodes_reason() -> None:
    status = status_of(gc(nodeSelector={"pool": "none"}))
    assert status.state == "ready" and conditions(status)["Ready"][1] == "NoGPUNodes"


def test_dra_not_served_is_a_failed_reconcile() -> None:
    status = status_of(gc(), dra_served=False)
    assert status.state == "notReady"
    assert conditions(status)["Error"] == ("True", "ReconcileFailed", DRA_NOT_SERVED)


def test_an_invalid_spec_says_why() -> None:
    broken = GPUClusterObject("gpu-cluster", None)
    split = split_allocators(NODES, POLICY, [broken])
    status = gpucluster_status(
        broken, split, {}, namespace="n", now=NOW, errors=["spec.draDriver.image: bad"]
    )
    assert status is not None and status.state == "notReady"
    assert conditions(status)["Error"][1:] == (
        "ReconcileFailed",
        "invalid spec, its nodes are left as they are: spec.draDriver.image: bad",
    )


def test_another_name_is_ignored_with_nvidias_message() -> None:
    status = status_of(gc("mine"))
    assert conditions(status)["Error"] == ("True", "ReconcileFailed", f"ignored: {SINGLETON_MESSAGE}")


def test_a_conflict_with_the_clusterpolicy_is_reported() -> None:
    policy = parse_spec({"sandboxWorkloads": {"enabled": True}})
    nodes = [*NODES, gpu_node("vm", {"pool": "dra", "nvidia.com/gpu.workload.config": "vm-passthrough"})]
    status = status_of(gc(), nodes=nodes, policy=policy)
    assert status.state == "notReady"
    error = conditions(status)["Error"]
    assert error[1] == REASON_CONFLICTING_NODE_SELECTOR and "vm" in error[2]


def test_a_deleted_gpucluster_gets_no_status() -> None:
    cluster = GPUClusterObject("gpu-cluster", parse_gpucluster_spec({}), deleting=True)
    split = split_allocators(NODES, POLICY, [cluster])
    assert gpucluster_status(cluster, split, {}, namespace="n", now=NOW) is None


def test_transition_time_moves_only_with_the_status() -> None:
    cluster = gc()
    first = status_of(cluster)
    previous = first.model_dump(mode="json")
    split = split_allocators(NODES, POLICY, [cluster])
    same = gpucluster_status(
        cluster, split, all_ready(cluster), namespace="n", now=LATER, previous=previous, generation=2
    )
    assert same is not None
    assert {c.lastTransitionTime for c in same.conditions} == {NOW}
    assert {c.observedGeneration for c in same.conditions} == {2}
    flipped = gpucluster_status(cluster, split, {}, namespace="n", now=LATER, previous=previous)
    assert flipped is not None and {c.lastTransitionTime for c in flipped.conditions} == {LATER}
