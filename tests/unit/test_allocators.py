"""The split between allocators (core/allocators.py): which GPU node gets the device plugin and which the
DRA driver, what each side runs there, when a node may move, and the conflicts it reports."""

from __future__ import annotations

from typing import Any

import pytest
from builders import PCI, gpu_node

from gpu_operator.api import parse_spec
from gpu_operator.api.gpucluster import SINGLETON_MESSAGE, parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import REASON_CONFLICTING_NODE_SELECTOR
from gpu_operator.core.allocators import (
    DRA_DEPLOY_LABELS,
    Allocator,
    AllocatorSplit,
    GPUClusterObject,
    current_allocator,
    split_allocators,
)
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.gpucluster_render import FOLDERS
from gpu_operator.core.node_labels import NodeInfo

DP, DRA = Allocator.DEVICE_PLUGIN, Allocator.DRA
POLICY = parse_spec({})
ON_DRA = {"nvidia.com/gpu.deploy.dra-driver": "true"}
ON_DP = {"nvidia.com/gpu.deploy.device-plugin": "true"}


def gpucluster(name: str = "gpu-cluster", deleting: bool = False, **spec: Any) -> GPUClusterObject:
    return GPUClusterObject(name, parse_gpucluster_spec(spec), deleting)


def pool(name: str, pool_name: str, **labels: str) -> NodeInfo:
    return gpu_node(name, {"pool": pool_name, **labels})


def allocators(split: AllocatorSplit) -> dict[str, Allocator | None]:
    return {name: a.allocator for name, a in split.nodes.items()}


NODES = [pool("a", "dra"), pool("b", "dra"), pool("c", "classic")]


def test_without_gpucluster_every_gpu_node_keeps_the_device_plugin() -> None:
    split = split_allocators([*NODES, NodeInfo("cpu-0", {})], POLICY, [])
    assert allocators(split) == {"a": DP, "b": DP, "c": DP}  # cpu-0 is no GPU node
    assert split.gpucluster is None and not split.conflicts


def test_a_gpucluster_without_node_selector_takes_every_gpu_node_as_nvidias() -> None:
    split = split_allocators(NODES, POLICY, [gpucluster()])
    assert allocators(split) == {"a": DRA, "b": DRA, "c": DRA}
    assert split.gpucluster == "gpu-cluster"


def test_node_selector_hands_a_pool_to_dra_and_the_rest_keep_the_device_plugin() -> None:
    split = split_allocators(NODES, POLICY, [gpucluster(nodeSelector={"pool": "dra"})])
    assert allocators(split) == {"a": DRA, "b": DRA, "c": DP}
    assert split.on(DRA) == {"a", "b"} and split.on(DP) == {"c"}
    assert all(not a.held and a.reason == "" for a in split.nodes.values())


def test_without_clusterpolicy_unselected_nodes_have_no_allocator() -> None:
    split = split_allocators(NODES, None, [gpucluster(nodeSelector={"pool": "dra"})])
    assert allocators(split) == {"a": DRA, "b": DRA, "c": None}
    assert "no ClusterPolicy" in split.nodes["c"].reason


def test_dra_nodes_keep_only_the_driver_and_toolkit_of_the_clusterpolicy() -> None:
    split = split_allocators(NODES, POLICY, [gpucluster(nodeSelector={"pool": "dra"})])
    withheld = split.withheld("a")
    # Never the device plugin (nor its MPS daemon), GFD's labels, the MIG manager's handshake with it,
    # a second DCGM stack, or a validator that would wait for nvidia.com/gpu forever.
    assert {"device-plugin", "mps-control-daemon", "gpu-feature-discovery", "mig-manager"} <= withheld
    assert {"dcgm", "dcgm-exporter", "operator-validator"} <= withheld
    assert {c.name for c in COMPONENTS} - withheld == {"driver", "container-toolkit"}
    assert split.deploy_labels("a") == dict(DRA_DEPLOY_LABELS)
    assert split.withheld("c") == frozenset() and split.deploy_labels("c") == {}
    assert split.withheld("unknown") == frozenset()


def test_dra_deploy_labels_are_those_its_daemonsets_select() -> None:
    keys = {f"nvidia.com/gpu.deploy.{folder}" for folder in FOLDERS}
    assert keys | {"nvidia.com/gpu.deploy.driver"} == set(DRA_DEPLOY_LABELS)


@pytest.mark.parametrize(
    ("labels", "current"),
    [
        ({}, None),
        (ON_DP, DP),
        (ON_DRA, DRA),
        ({**ON_DP, **ON_DRA}, DRA),  # the kubelet plugin goes last
        ({"nvidia.com/gpu.deploy.dra-driver": "paused-for-driver-upgrade"}, DRA),
        ({"nvidia.com/gpu.deploy.device-plugin": ""}, None),
        ({"nvidia.com/gpu.deploy.device-plugin": "false"}, None),
    ],
)
def test_current_allocator_from_the_deploy_labels(labels: dict[str, str], current: Allocator | None) -> None:
    assert current_allocator(labels) is current


def test_a_node_with_gpu_pods_stays_until_they_are_gone() -> None:
    node = pool("a", "dra", **ON_DP)
    gc = [gpucluster(nodeSelector={"pool": "dra"})]
    held = split_allocators([node], POLICY, gc, {"a": 2}).nodes["a"]
    assert (held.allocator, held.wanted, held.current) == (DP, DRA, DP)
    assert held.held and not held.moving
    assert "2 GPU pods of the device-plugin allocator" in held.reason and "drain" in held.reason
    moved = split_allocators([node], POLICY, gc, {"a": 0}).nodes["a"]
    assert (moved.allocator, moved.held, moved.moving, moved.reason) == (DRA, False, True, "")


def test_leaving_dra_waits_for_the_claims_too() -> None:
    node = pool("a", "classic", **ON_DRA)
    held = split_allocators([node], POLICY, [gpucluster(nodeSelector={"pool": "dra"})], {"a": 1}).nodes["a"]
    assert (held.allocator, held.wanted) == (DRA, DP)
    assert "1 GPU pod of the dra allocator" in held.reason
    assert (
        split_allocators([node], POLICY, [gpucluster(nodeSelector={"pool": "dra"})]).nodes["a"].allocator
        is DP
    )


def test_a_fresh_node_is_never_held() -> None:
    split = split_allocators([pool("a", "dra")], POLICY, [gpucluster(nodeSelector={"pool": "dra"})], {"a": 3})
    assert split.nodes["a"].allocator is DRA and not split.nodes["a"].held


def test_only_gpu_cluster_counts_others_are_ignored_with_nvidias_message() -> None:
    split = split_allocators(
        NODES,
        POLICY,
        [gpucluster("second", nodeSelector={"pool": "classic"}), gpucluster(nodeSelector={"pool": "dra"})],
    )
    assert allocators(split) == {"a": DRA, "b": DRA, "c": DP}
    assert dict(split.ignored) == {"second": f"ignored: {SINGLETON_MESSAGE}"}
    alone = split_allocators(NODES, POLICY, [gpucluster("mine")])
    assert allocators(alone) == {"a": DP, "b": DP, "c": DP} and alone.gpucluster is None


def test_vm_nodes_the_clusterpolicy_keeps_are_a_conflict_not_a_fight() -> None:
    policy = parse_spec({"sandboxWorkloads": {"enabled": True}})
    nodes = [
        pool("a", "dra"),
        pool("b", "dra", **{"nvidia.com/gpu.workload.config": "vm-passthrough"}),
        pool("c", "dra", **{"nvidia.com/gpu.workload.config": "vm-vgpu"}),
    ]
    split = split_allocators(nodes, policy, [gpucluster(nodeSelector={"pool": "dra"})])
    assert allocators(split) == {"a": DRA, "b": DP, "c": DP}
    [conflict] = split.conflicts
    assert (conflict.gpucluster, conflict.nodes, conflict.reason) == (
        "gpu-cluster",
        ("b", "c"),
        REASON_CONFLICTING_NODE_SELECTOR,
    )
    assert "2 nodes" in conflict.message() and "b, c" in conflict.message()
    assert "VM workloads" in split.nodes["b"].reason
    # With VMs the default workload, a node without the label is a VM node too.
    vms = parse_spec({"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}})
    assert split_allocators([pool("a", "dra")], vms, [gpucluster()]).nodes["a"].allocator is DP
    # Without sandboxWorkloads the label means nothing.
    assert allocators(split_allocators(nodes, POLICY, [gpucluster()])) == {"a": DRA, "b": DRA, "c": DRA}


def test_operands_disabled_means_no_allocator() -> None:
    node = pool("a", "dra", **{"nvidia.com/gpu.deploy.operands": "false", **ON_DRA})
    allocation = split_allocators([node], POLICY, [gpucluster()], {"a": 4}).nodes["a"]
    assert allocation.allocator is None and "operands=false" in allocation.reason


def test_an_unparsable_gpucluster_keeps_its_nodes_and_takes_no_other() -> None:
    broken = GPUClusterObject("gpu-cluster", None)
    nodes = [pool("a", "dra", **ON_DRA), pool("b", "dra", **ON_DP), pool("c", "dra")]
    split = split_allocators(nodes, POLICY, [broken])
    assert allocators(split) == {"a": DRA, "b": DP, "c": DP}
    assert "does not parse" in split.nodes["a"].reason and split.gpucluster is None


def test_a_deleted_gpucluster_gives_its_nodes_back_as_they_empty() -> None:
    nodes = [pool("a", "dra", **ON_DRA), pool("b", "dra", **ON_DRA)]
    split = split_allocators(nodes, POLICY, [gpucluster(deleting=True)], {"a": 1})
    assert allocators(split) == {"a": DRA, "b": DP}
    assert split.nodes["a"].held


def test_the_split_is_a_function_of_its_inputs_only() -> None:
    args = (NODES, POLICY, [gpucluster(nodeSelector={"pool": "dra"})], {"a": 1})
    assert split_allocators(*args) == split_allocators(*args)
    assert split_allocators(list(reversed(NODES)), *args[1:]) == split_allocators(*args)
    assert PCI in NODES[0].labels
