"""GPU workload types per node: which stack each node gets, in which order a node changes stack, and
what the status says (gpu_operator/core/workloads.py, node_labels.py, status.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import gpu_node, operand_pod

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS, RUNTIME_LABEL
from gpu_operator.core.node_labels import (
    DEPLOY_PREFIX,
    GPU_PRESENT,
    IsReady,
    NodeInfo,
    desired_labels,
    leaving,
    node_info,
)
from gpu_operator.core.plan import Observed, PolicyRef, build
from gpu_operator.core.status import status_body
from gpu_operator.core.workloads import WORKLOAD_LABEL, workload_type

NOW = "2026-03-01T00:00:00Z"
CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "nvidia-conformance"
VGPU_IMAGE = {"repository": "registry.example.com/nvidia", "image": "vgpu-manager", "version": "595.91.07"}
EVERY_SANDBOX_SECTION: dict[str, Any] = {
    "vfioManager": {"enabled": True},
    "vgpuManager": {"enabled": True, **VGPU_IMAGE},
    "vgpuDeviceManager": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "kataSandboxDevicePlugin": {"enabled": True},
    "ccManager": {"enabled": True},
}
CONTAINER_STACK = {
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "gpu-feature-discovery",
}
"""The container stack a default policy deploys on a GPU that is not MIG-capable."""
# What each VM node type runs in each sandbox mode, by NVIDIA's labeller (state_manager.go
# gpuStateLabels, getEffectiveStateLabels) and NVIDIA's enabled states (isStateEnabled): the Kata device
# plugin and the CC manager only in Kata mode, the KubeVirt device plugin only in KubeVirt mode.
VM_STACKS = {
    ("vm-passthrough", "kubevirt"): {"vfio-manager", "sandbox-validator", "sandbox-device-plugin"},
    ("vm-passthrough", "kata"): {
        "vfio-manager",
        "sandbox-validator",
        "kata-sandbox-device-plugin",
        "cc-manager",
    },
    ("vm-vgpu", "kubevirt"): {
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "sandbox-device-plugin",
    },
    ("vm-vgpu", "kata"): {"vgpu-manager", "vgpu-device-manager", "sandbox-validator", "cc-manager"},
}


def ready_all(component: str, node: str) -> bool:
    return True


def none(component: str, node: str) -> bool:
    return False


def only(*names: str) -> IsReady:
    return lambda component, node: component in names


def deploy(name: str) -> str:
    return f"{DEPLOY_PREFIX}{name}"


def sandbox(default: str = "container", mode: str = "kubevirt", **spec: Any) -> ClusterPolicySpec:
    return parse_spec(
        {
            "sandboxWorkloads": {"enabled": True, "defaultWorkload": default, "mode": mode},
            **EVERY_SANDBOX_SECTION,
            **spec,
        }
    )


def deployed(labels: dict[str, str]) -> set[str]:
    return {key.removeprefix(DEPLOY_PREFIX) for key, value in labels.items() if key.startswith(DEPLOY_PREFIX)}


def test_the_workload_type_is_the_nodes_label_else_the_default_and_containers_without_sandboxes() -> None:
    off = parse_spec({"sandboxWorkloads": {"enabled": False, "defaultWorkload": "vm-vgpu"}})
    assert workload_type({WORKLOAD_LABEL: "vm-passthrough"}, off) == "container"
    on = sandbox("vm-vgpu")
    assert workload_type({}, on) == "vm-vgpu"
    assert workload_type({WORKLOAD_LABEL: "vm-passthrough"}, on) == "vm-passthrough"
    assert workload_type({WORKLOAD_LABEL: "container"}, on) == "container"
    # NVIDIA's labeller takes an unknown value for the default (with a warning; the status names it).
    assert workload_type({WORKLOAD_LABEL: "vm"}, on) == "vm-vgpu"


@pytest.mark.parametrize(
    ("mode", "default", "label"),
    list(
        itertools.product(
            ("kubevirt", "kata"),
            ("container", "vm-passthrough", "vm-vgpu"),
            (None, "container", "vm-passthrough", "vm-vgpu", "bogus"),
        )
    ),
)
def test_each_workload_type_gets_its_stack_in_each_mode(mode: str, default: str, label: str | None) -> None:
    spec = sandbox(default, mode)
    node = gpu_node(labels={WORKLOAD_LABEL: label} if label else {})
    workload = label if label in ("container", "vm-passthrough", "vm-vgpu") else default
    expected = CONTAINER_STACK if workload == "container" else VM_STACKS[(workload, mode)]
    assert deployed(desired_labels(node, spec, ready_all, ready_all)) == expected


def test_without_sandbox_workloads_every_node_runs_containers_whatever_its_label() -> None:
    spec = parse_spec({"sandboxWorkloads": {"enabled": False}, **EVERY_SANDBOX_SECTION})
    for label in ("vm-passthrough", "vm-vgpu"):
        node = gpu_node(labels={WORKLOAD_LABEL: label})
        assert deployed(desired_labels(node, spec, ready_all, ready_all)) == CONTAINER_STACK


def test_a_node_never_gets_the_container_driver_with_the_vfio_manager() -> None:
    """Whatever the policy, the node's labels and which pods are where."""
    labels = [{}, *({WORKLOAD_LABEL: w} for w in ("container", "vm-passthrough", "vm-vgpu", "x"))]
    states = [{}, {deploy("driver"): "true"}, {deploy("vfio-manager"): "true"}]
    specs = [sandbox(d, m) for d in ("container", "vm-passthrough", "vm-vgpu") for m in ("kubevirt", "kata")]
    for spec, label, state in itertools.product(specs, labels, states):
        node = gpu_node(labels={**label, **state}, own_labels=frozenset(state))
        for present in (none, ready_all):
            found = desired_labels(node, spec, ready_all, ready_all, is_present=present)
            assert not (deploy("driver") in found and deploy("vfio-manager") in found), (label, state)


def test_a_disabled_sandbox_component_is_not_labelled_and_the_rest_of_its_stack_comes() -> None:
    spec = sandbox("vm-passthrough", vfioManager={"enabled": False})
    # Without a VFIO manager, the validator waits for nothing of it (the GPUs may be bound by hand).
    assert deployed(desired_labels(gpu_node(), spec, none, none)) == {"sandbox-validator"}


def test_the_sandbox_stack_comes_in_dependency_order() -> None:
    passthrough = sandbox("vm-passthrough")
    node = gpu_node()
    assert deployed(desired_labels(node, passthrough, none, none)) == {"vfio-manager"}
    # The validator's pods wait for the VFIO manager by themselves: labelled once it started.
    labelled = gpu_node(labels={deploy("vfio-manager"): "true"})
    assert deployed(desired_labels(labelled, passthrough, none, only("vfio-manager"))) == {
        "vfio-manager",
        "sandbox-validator",
    }
    # The device plugin only once the validator is ready (it found the GPUs bound to vfio-pci).
    both = gpu_node(labels={deploy("vfio-manager"): "true", deploy("sandbox-validator"): "true"})
    assert "sandbox-device-plugin" not in deployed(
        desired_labels(both, passthrough, only("vfio-manager"), ready_all)
    )
    assert "sandbox-device-plugin" in deployed(desired_labels(both, passthrough, only("sandbox-validator")))

    vgpu = sandbox("vm-vgpu")
    assert deployed(desired_labels(node, vgpu, none, none)) == {"vgpu-manager"}
    # The device manager and the validator wait for each other's files: both come once the vGPU
    # manager's pod started, neither waits for the other's readiness.
    started = gpu_node(labels={deploy("vgpu-manager"): "true"})
    assert deployed(desired_labels(started, vgpu, none, only("vgpu-manager"))) == {
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
    }


def test_a_node_changing_type_loses_the_old_stack_before_it_gets_the_new_one() -> None:
    spec = sandbox()
    stack = {deploy(name): "true" for name in CONTAINER_STACK}
    owned = frozenset({GPU_PRESENT, RUNTIME_LABEL, *stack})
    before = {GPU_PRESENT: "true", RUNTIME_LABEL: "containerd", **stack}
    node = gpu_node(labels={**before, WORKLOAD_LABEL: "container"}, own_labels=owned)
    assert desired_labels(node, spec, ready_all, ready_all, is_present=ready_all) == before

    relabelled = gpu_node(labels={**before, WORKLOAD_LABEL: "vm-passthrough"}, own_labels=owned)
    # The container stack's labels go at once; the VFIO manager waits while a pod of it is left.
    for left in (ready_all, only("driver")):
        found = desired_labels(relabelled, spec, ready_all, ready_all, is_present=left)
        assert deployed(found) == set(), left
        containers = [c.name for c in COMPONENTS if "vm-passthrough" not in c.workloads]
        assert leaving(relabelled, spec, left) == (containers if left is ready_all else ["driver"])
    gone = gpu_node(
        labels={GPU_PRESENT: "true", WORKLOAD_LABEL: "vm-passthrough"}, own_labels=frozenset({GPU_PRESENT})
    )
    assert deployed(desired_labels(gone, spec, none, none, is_present=none)) == {"vfio-manager"}

    # And back: the driver waits for the VFIO manager's pod to go (its preStop unbinds the GPUs).
    vm = {deploy("vfio-manager"): "true", deploy("sandbox-validator"): "true"}
    back = gpu_node(
        labels={GPU_PRESENT: "true", **vm, WORKLOAD_LABEL: "container"},
        own_labels=frozenset({GPU_PRESENT, *vm}),
    )
    assert deployed(desired_labels(back, spec, none, none, is_present=only("vfio-manager"))) == set()
    assert deployed(desired_labels(back, spec, none, none, is_present=none)) == {"driver"}


def test_a_node_between_vm_types_keeps_what_both_run() -> None:
    spec = sandbox()
    vm = {deploy(n): "true" for n in ("vfio-manager", "sandbox-validator", "sandbox-device-plugin")}
    node = gpu_node(labels={**vm, WORKLOAD_LABEL: "vm-vgpu"}, own_labels=frozenset(vm))
    found = deployed(desired_labels(node, spec, ready_all, ready_all, is_present=only("vfio-manager")))
    # The validator and the device plugin serve both types and stay; the vGPU manager waits for the
    # VFIO manager's pod to go.
    assert found == {"sandbox-validator", "sandbox-device-plugin"}


# --- NVIDIA's own labeller, run on nodes of each type (tests/data/nvidia-conformance/labels) ---------


LABEL_CASES = sorted((CONFORMANCE / "labels").glob("*.yaml"))


@pytest.mark.parametrize("path", LABEL_CASES, ids=[p.name.removesuffix(".yaml") for p in LABEL_CASES])
def test_deploy_labels_are_nvidias_for_the_components_deployed(path: Path) -> None:
    """NVIDIA's labeller sets every label of a workload type's stack, whether its component is
    deployed or not (the node-status exporter's, the deprecated Kata manager's, the Kata device
    plugin's in KubeVirt mode...) and `gpu.deploy.client`, which nothing selects on. Ours sets those
    of the components the policy deploys: NVIDIA's labels, less those, once every dependency is
    ready."""
    case, variant = path.name.removesuffix(".yaml").split(".")
    spec = parse_spec(yaml.safe_load((CONFORMANCE / "policies" / f"{case}.yaml").read_text())["spec"])
    nodes = yaml.safe_load((CONFORMANCE / "nodes" / f"{variant}.yaml").read_text())["items"]
    theirs = yaml.safe_load(path.read_text())
    enabled = {c.deploy_label for c in COMPONENTS if c.enabled(spec)}
    for body in nodes:
        node = node_info(body)
        ours = {k for k in desired_labels(node, spec, ready_all, ready_all) if k.startswith(DEPLOY_PREFIX)}
        nvidia = {k for k in theirs[node.name] if k.startswith(DEPLOY_PREFIX)}
        assert ours == nvidia & enabled, node.name


# --- the status -----------------------------------------------------------------------------------


def observed(spec: dict[str, Any], nodes: list[NodeInfo], pods: tuple[Any, ...] = ()) -> Observed:
    return Observed(
        policies=(PolicyRef("cluster-policy", "uid", 1, "2026-01-01T00:00:00Z", spec, {}),),
        nodes={n.name: n for n in nodes},
        pods=pods,
        daemonsets={},
        objects={},
        namespace="gpu-operator",
    )


def test_the_status_counts_the_nodes_of_each_workload_type_and_names_invalid_labels() -> None:
    spec = {
        "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"},
        "vfioManager": {"enabled": True},
    }
    nodes = [
        gpu_node("a", {WORKLOAD_LABEL: "container"}),
        gpu_node("b"),
        gpu_node("c", {WORKLOAD_LABEL: "vm-vgpu"}),
        gpu_node("d", {WORKLOAD_LABEL: "vm"}),
    ]
    plan = build(observed(spec, nodes), NOW)
    status = status_body(plan.statuses["cluster-policy"])
    assert status["workloads"] == {"container": 1, "vm-passthrough": 2, "vm-vgpu": 1}
    note = next(n for n in plan.notes if n.reason == "InvalidWorkloadConfig")
    assert "d (nvidia.com/gpu.workload.config='vm')" in note and "vm-passthrough" in note
    # Without sandbox workloads the status has NVIDIA's fields only.
    plain = status_body(build(observed({}, nodes), NOW).statuses["cluster-policy"])
    assert "workloads" not in plain
    assert not any(n.reason == "InvalidWorkloadConfig" for n in build(observed({}, nodes), NOW).notes)


def test_the_status_says_a_new_stack_waits_for_the_old_ones_pods() -> None:
    spec = {"sandboxWorkloads": {"enabled": True}, "vfioManager": {"enabled": True}}
    node = gpu_node("gpu-0", {WORKLOAD_LABEL: "vm-passthrough"})
    driver = operand_pod("d", "driver", "gpu-0", terminating=True)
    plan = build(observed(spec, [node], (driver,)), NOW)
    assert "nvidia.com/gpu.deploy.vfio-manager" not in plan.node_labels["gpu-0"]
    status = status_body(plan.statuses["cluster-policy"])
    vfio = next(c for c in status["components"] if c["name"] == "vfio-manager")
    assert vfio["problems"] == [
        {
            "node": "gpu-0",
            "reason": "WaitingForDependency",
            "message": "waiting for driver to leave the node (its workload type is now vm-passthrough)",
        }
    ]
    # Once it is gone, the VFIO manager is labelled.
    plan = build(observed(spec, [node]), NOW)
    assert plan.node_labels["gpu-0"]["nvidia.com/gpu.deploy.vfio-manager"] == "true"


def test_sandbox_sections_are_deployed_and_the_kata_manager_is_reported() -> None:
    spec = {
        "sandboxWorkloads": {"enabled": True, "mode": "kata"},
        "kataManager": {"enabled": True},
        **EVERY_SANDBOX_SECTION,
    }
    plan = build(observed(spec, [gpu_node()]), NOW)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in plan.objects}
    for name in (
        "nvidia-vfio-manager",
        "nvidia-sandbox-validator",
        "nvidia-cc-manager",
        "nvidia-vgpu-manager-daemonset",
    ):
        assert ("DaemonSet", name) in kinds
    assert not any("kata-manager" in name for _, name in kinds)
    assert [n for n in plan.notes if "spec.kataManager" in n] == [
        "spec.kataManager is enabled but NVIDIA deprecated the Kata manager and its operator never deploys "
        "it (isStateEnabled, controllers/state_manager.go:1033-1036); neither does this one; it is ignored"
    ]
    components = {c["name"]: c for c in status_body(plan.statuses["cluster-policy"])["components"]}
    assert components["kataManager"]["state"] == "unsupported"
    assert components["cc-manager"]["enabled"] and components["sandbox-device-plugin"]["state"] == "disabled"


def test_a_vgpu_manager_without_an_image_is_withheld_naming_the_field() -> None:
    spec = {"sandboxWorkloads": {"enabled": True}, "vgpuManager": {"enabled": True}}
    plan = build(observed(spec, [gpu_node()]), NOW)
    assert [str(e) for e in plan.missing_inputs] == [
        "spec.vgpuManager.image: no image: NVIDIA publishes none for vgpu-manager; name yours (repository, "
        "image and version), or set VGPU_MANAGER_IMAGE in the operator's environment"
    ]
    assert not any(o["metadata"]["name"] == "nvidia-vgpu-manager-daemonset" for o in plan.objects)


def test_invalid_sandbox_fields_are_refused_naming_the_field() -> None:
    for spec, path in (
        ({"sandboxWorkloads": {"enabled": True, "mode": "vm"}}, "spec.sandboxWorkloads.mode"),
        ({"sandboxWorkloads": {"defaultWorkload": "passthrough"}}, "spec.sandboxWorkloads.defaultWorkload"),
        ({"ccManager": {"defaultMode": "maybe"}}, "spec.ccManager.defaultMode"),
        ({"vgpuDeviceManager": {"config": {"name": "Not A Name"}}}, "spec.vgpuDeviceManager.config.name"),
    ):
        with pytest.raises(PolicyError) as info:
            parse_spec(spec)
        assert [e.path for e in info.value.errors] == [path], spec
