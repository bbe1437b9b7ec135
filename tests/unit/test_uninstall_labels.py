"""Which node labels an uninstall removes (core/node_labels.py `uninstall_removals`), from a node's
labels and managedFields as the API server reports them, and how the planner carries it out once no
ClusterPolicy is active."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import PCI, label_owner, node_body

from gpu_operator.core.node_labels import (
    GPU_PRESENT,
    OPERAND_MANAGERS,
    left_on_uninstall,
    node_info,
    uninstall_removals,
)
from gpu_operator.core.plan import Observed, PolicyRef, build
from hack.emulators import images

NOW = "2026-12-01T00:00:00Z"
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "empty.yaml"
EVERYTHING = GOLDEN.with_name("everything.yaml")
"""What `spec: {}` renders (the mig-manager's objects included)."""
OPERATOR = ("gpu-operator", "Apply")
DRIVER_MANAGER = ("driver-manager", "Update")
MIG_MANAGER = ("nvidia-mig-manager", "Update")
VGPU_DEVICE_MANAGER = ("nvidia-k8s-vgpu-dm", "Update")
KUBECTL = ("kubectl-label", "Update")


def deploy(name: str) -> str:
    return f"nvidia.com/gpu.deploy.{name}"


def body(labels: dict[str, str], owners: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """A Node as the API server returns it: `owners` is label → the (manager, operation)s owning it."""
    entries: dict[tuple[str, str], list[str]] = {}
    for key, managers in owners.items():
        for manager in managers:
            entries.setdefault(manager, []).append(key)
    managed = [label_owner(keys, manager, operation) for (manager, operation), keys in entries.items()]
    return node_body("gpu-0", {PCI: "true", **labels}, uid="u0", resource_version="7", managed_fields=managed)


def removals(labels: dict[str, str], owners: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    return uninstall_removals(node_info(body(labels, owners)))


def test_the_operand_managers_are_the_binaries_the_operator_runs() -> None:
    """client-go's default User-Agent starts with the binary's name, which the API server takes as the
    field manager: the managers named are those of the programs the rendered operands run."""
    objects = list(yaml.safe_load_all(GOLDEN.read_text()))
    driver = next(
        o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvidia-driver-daemonset"
    )
    (manager,) = [
        c for c in driver["spec"]["template"]["spec"]["initContainers"] if c["name"] == "k8s-driver-manager"
    ]
    entrypoint = next(o for o in objects if o["metadata"]["name"] == "nvidia-mig-manager-entrypoint")
    (script,) = entrypoint["data"].values()
    programs = {Path(manager["command"][0]).name, *re.findall(r"^\s*exec (\S+)", script, re.MULTILINE)}
    # The vGPU device manager's container runs its image's entrypoint (vgpu-device-manager v0.5.0
    # deployments/container/Dockerfile.distroless:77), as the emulated image does.
    sandbox = list(yaml.safe_load_all(EVERYTHING.read_text()))
    (vgpu_dm,) = [
        o["spec"]["template"]["spec"]["containers"][0]
        for o in sandbox
        if o and o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvidia-vgpu-device-manager"
    ]
    assert "command" not in vgpu_dm and "vgpu-device-manager:" in vgpu_dm["image"]
    programs.add(images.entrypoint(vgpu_dm["image"])[0])
    assert programs == OPERAND_MANAGERS


@pytest.mark.parametrize(
    ("value", "writer"),
    [
        ("", DRIVER_MANAGER),  # rescheduling a fresh node: "" for every operand label it did not find
        ("paused-for-driver-upgrade", DRIVER_MANAGER),
        ("true", DRIVER_MANAGER),  # restored after a driver upgrade, no longer shared with us
        ("pre-installed", DRIVER_MANAGER),  # a driver found on the host
        ("custom_paused-for-driver-upgrade", DRIVER_MANAGER),
        ("paused-for-mig-change", MIG_MANAGER),
        ("true", MIG_MANAGER),  # nvsm: restored as `true` even where it was absent
        ("true", ("gpu-operator", "Update")),  # NVIDIA's operator (the same binary name), before a move
        ("", KUBECTL),  # the shell-script managers wrote through `kubectl label`
        ("paused-for-driver-upgrade", KUBECTL),
        ("paused-for-mig-change", ("some-tool", "Update")),
        ("paused-for-vgpu-change", VGPU_DEVICE_MANAGER),  # a vGPU configuration change under way
        ("true", VGPU_DEVICE_MANAGER),  # the sandbox device plugin or validator restored after one
        ("paused-for-vgpu-change", KUBECTL),
    ],
)
def test_what_the_protocol_wrote_goes(value: str, writer: tuple[str, str]) -> None:
    key = deploy("dcgm")
    assert removals({key: value}, {key: [writer]}) == {key: value}


@pytest.mark.parametrize(
    ("value", "writers"),
    [
        ("false", [KUBECTL]),  # a person's opt-out
        ("false", [DRIVER_MANAGER]),  # never written by a manager; an opt-out whoever appears as writer
        ("true", [KUBECTL]),  # a person's `true`
        ("custom", [KUBECTL]),
        ("custom_paused-for-driver-upgrade", [KUBECTL]),  # a person's value, paused by a script
        ("true", [DRIVER_MANAGER, ("kubectl", "Apply")]),  # someone else claims it too
        ("true", []),  # no owner known: not ours to say
    ],
)
def test_what_someone_else_wrote_stays(value: str, writers: list[tuple[str, str]]) -> None:
    key = deploy("dcgm")
    assert removals({key: value}, {key: writers}) == {}


def test_labels_only_the_operators_apply_owns_are_left_to_its_empty_apply() -> None:
    driver, plugin = deploy("driver"), deploy("device-plugin")
    labels = {GPU_PRESENT: "true", driver: "true", plugin: "true"}
    owners = {GPU_PRESENT: [OPERATOR], driver: [OPERATOR], plugin: [OPERATOR, DRIVER_MANAGER]}
    node = node_info(body(labels, owners))
    # The shared one needs an explicit removal: the apply only drops the operator's ownership.
    assert uninstall_removals(node) == {plugin: "true"}
    assert left_on_uninstall(node) == sorted([GPU_PRESENT, driver, plugin])


def test_gpu_present_goes_only_when_the_operator_alone_wrote_it() -> None:
    nvidia = ("gpu-operator", "Update")
    assert removals({GPU_PRESENT: "true"}, {GPU_PRESENT: [nvidia]}) == {GPU_PRESENT: "true"}
    assert removals({GPU_PRESENT: "true"}, {GPU_PRESENT: [KUBECTL]}) == {}
    # Only the operator writes it: a manager's (or anyone's) gpu.present stays.
    assert removals({GPU_PRESENT: "true"}, {GPU_PRESENT: [DRIVER_MANAGER]}) == {}


def test_other_labels_of_the_operands_stay() -> None:
    state, product = "nvidia.com/mig.config.state", "nvidia.com/gpu.product"
    labels = {state: "success", product: "NVIDIA-H100", "team": ""}
    owners = {state: [MIG_MANAGER], product: [("nfd-master", "Update")], "team": [KUBECTL]}
    node = node_info(body(labels, owners))
    assert uninstall_removals(node) == {} and left_on_uninstall(node) == []


def test_a_node_the_operator_never_labelled_is_cleaned_too() -> None:
    """No own label to change, so no apply: the removals are planned on their own, on every node."""
    stale, opt_out = deploy("nvsm"), deploy("dcgm")
    labels = {stale: "", opt_out: "false", deploy("toolkit"): "paused-for-driver-upgrade"}
    owners = {stale: [DRIVER_MANAGER], opt_out: [KUBECTL], deploy("toolkit"): [DRIVER_MANAGER]}
    node = node_info(body(labels, owners))
    cpu = node_info(node_body("cpu-0", {"team": "x"}))
    plan = build(Observed((), {"gpu-0": node, "cpu-0": cpu}, [], {}, {}, "gpu-operator"), NOW)
    assert plan.node_labels == {}
    removed = {stale: ("", None), deploy("toolkit"): ("paused-for-driver-upgrade", None)}
    assert plan.label_rewrites == {"gpu-0": removed}


def test_while_a_policy_is_active_the_managers_labels_are_theirs() -> None:
    stale = deploy("nvsm")
    node = node_info(body({stale: ""}, {stale: [DRIVER_MANAGER]}))
    policy = PolicyRef("p", "uid", 1, NOW, {}, {})
    plan = build(Observed((policy,), {"gpu-0": node}, [], {}, {}, "gpu-operator"), NOW)
    assert stale not in plan.label_rewrites.get("gpu-0", {})
