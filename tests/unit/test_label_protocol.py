"""The deploy-label protocol of NVIDIA's operand managers, played against the planner.

A small model of one node's labels with server-side-apply ownership stands in for the API server:
the operator's apply (field manager gpu-operator, force), the managers' patches (operation Update,
which take a field only when they change its value) and the operator's explicit removals. The
managers' writes are transcribed from their sources in hack/operand_managers.py (k8s-driver-manager
v0.12.0, mig-manager v0.15.0); the end-to-end tests play the same writes on a real API server.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from builders import PCI, label_owner, node_body, operand_daemonset, operand_pod

from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import GPU_PRESENT, MIG_CONFIG, NodeInfo, node_info
from gpu_operator.core.plan import Observed, PolicyRef, build
from gpu_operator.core.status import status_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hack import operand_managers
from hack.operand_managers import (
    driver_manager_paused,
    driver_manager_true,
    mig_manager_paused,
    mig_manager_true,
)

DRIVER_MANAGER = "driver-manager"
"""k8s-driver-manager's field manager: its binary's name (client-go's default User-Agent)."""
MIG_MANAGER = "nvidia-mig-manager"
OPERATOR_UPDATE = "gpu-operator:update"
NOW = "2026-12-01T00:00:00Z"


def deploy(name: str) -> str:
    return f"nvidia.com/gpu.deploy.{name}"


@pytest.mark.parametrize(
    ("rule", "before", "after"),
    [
        (driver_manager_paused, "true", "paused-for-driver-upgrade"),
        (driver_manager_paused, "", ""),
        (driver_manager_paused, "false", "false"),
        (driver_manager_paused, "paused-for-driver-upgrade", "paused-for-driver-upgrade"),
        (driver_manager_paused, "custom", "custom_paused-for-driver-upgrade"),
        (driver_manager_true, "paused-for-driver-upgrade", "true"),
        (driver_manager_true, "", ""),
        (driver_manager_true, "true", "true"),
        (driver_manager_true, "false", "false"),
        (driver_manager_true, "custom_paused-for-driver-upgrade", "custom"),
        (mig_manager_paused, "true", "paused-for-mig-change"),
        (mig_manager_paused, "", "paused-for-mig-change"),
        (mig_manager_paused, "false", "false"),
        (mig_manager_true, "paused-for-mig-change", "true"),
        (mig_manager_true, "", "true"),
        (mig_manager_true, "false", "false"),
    ],
)
def test_the_transcribed_rules(rule: Any, before: str, after: str) -> None:
    """The managers' own unit tables (reconfigure_test.go:31-63 for mig-manager)."""
    assert rule(before) == after


@dataclass
class Node:
    """One node's labels and, per label, who owns it, as server-side apply tracks it."""

    name: str = "gpu-0"
    labels: dict[str, str] = field(default_factory=lambda: {PCI: "true"})
    owners: dict[str, set[str]] = field(default_factory=dict)
    version: int = 1

    def apply(self, wanted: dict[str, str]) -> None:
        """The operator's server-side apply (force) of its complete set."""
        for key in [k for k, o in self.owners.items() if "gpu-operator" in o and k not in wanted]:
            self.owners[key].discard("gpu-operator")
            if not self.owners[key]:
                del self.owners[key], self.labels[key]
        for key, value in wanted.items():
            if self.labels.get(key) != value:
                self.owners[key] = set()
            self.labels[key] = value
            self.owners.setdefault(key, set()).add("gpu-operator")
        self.version += 1

    def patch(self, manager: str, labels: dict[str, str]) -> None:
        """A manager's patch (operation Update): it takes a label only where it changes the value."""
        for key, value in labels.items():
            if self.labels.get(key) != value:
                self.labels[key] = value
                self.owners[key] = {manager}
        self.version += 1

    def rewrite(self, changes: dict[str, tuple[str, str | None]]) -> None:
        """The operator's JSON patch (operation Update): all or nothing, each label tested first."""
        if all(self.labels.get(k) == expected for k, (expected, _) in changes.items()):
            for key, (_, new) in changes.items():
                if new is None:
                    del self.labels[key], self.owners[key]
                else:
                    self.patch(OPERATOR_UPDATE, {key: new})
        self.version += 1

    def info(self) -> NodeInfo:
        fields: dict[tuple[str, str], set[str]] = {}
        for key, managers in self.owners.items():
            for manager in managers:
                # OPERATOR_UPDATE: the operator's JSON patches, under its name but not its apply.
                operation = "Apply" if manager == "gpu-operator" else "Update"
                fields.setdefault((manager.removesuffix(":update"), operation), set()).add(key)
        managed = [
            label_owner(keys, manager, operation) for (manager, operation), keys in sorted(fields.items())
        ]
        return node_info(
            node_body(self.name, self.labels, resource_version=str(self.version), managed_fields=managed)
        )

    # The managers, acting on this node.
    def driver_manager_reschedules(self) -> None:
        self.patch(DRIVER_MANAGER, operand_managers.driver_manager_reschedule(self.labels))

    def driver_manager_evicts(self) -> None:
        self.patch(DRIVER_MANAGER, operand_managers.driver_manager_evict(self.labels))

    def mig_manager_pauses(self) -> None:
        self.patch(MIG_MANAGER, operand_managers.mig_manager_pause(self.labels))

    def mig_manager_restores(self) -> None:
        self.patch(MIG_MANAGER, operand_managers.mig_manager_restore(self.labels))


@dataclass
class Cluster:
    node: Node = field(default_factory=Node)
    spec: dict[str, Any] | None = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)
    """Components whose pod is ready on the node."""
    started: set[str] = field(default_factory=set)
    """Components whose pod is past its init containers on the node, not ready yet."""
    initializing: set[str] = field(default_factory=set)
    """Components whose pod is in its init containers on the node."""

    def observed(self) -> Observed:
        policies = () if self.spec is None else (PolicyRef("p", "uid", 1, NOW, self.spec, {}),)
        pods = [
            operand_pod(f"{c}-x", c, self.node.name, c in self.ready, created=NOW, initialized=True)
            for c in sorted(self.ready | self.started)
        ] + [operand_pod(f"{c}-y", c, self.node.name, False, created=NOW) for c in sorted(self.initializing)]
        # Each DaemonSet schedules on the node while its label says "true", and is ready with its pod.
        daemonsets = {
            ds: operand_daemonset(ds, c, 1, int(c in self.ready))
            for c in self.deployed()
            if c in BY_NAME
            for ds in [BY_NAME[c].daemonset]
        }
        return Observed(policies, {self.node.name: self.node.info()}, pods, daemonsets, {}, "gpu-operator")

    def reconcile(self) -> dict[str, Any]:
        """One operator pass; returns the component statuses."""
        plan = build(self.observed(), NOW)
        if self.node.name in plan.node_labels:
            self.node.apply(plan.node_labels[self.node.name])
        if self.node.name in plan.label_rewrites:
            self.node.rewrite(plan.label_rewrites[self.node.name])
        status = status_body(plan.statuses["p"]) if "p" in plan.statuses else {}
        return {c["name"]: c for c in status.get("components", [])}

    def deployed(self) -> set[str]:
        return {
            k.removeprefix(deploy(""))
            for k, v in self.node.labels.items()
            if k.startswith(deploy("")) and v == "true"
        }

    def bring_up(self, components: Iterable[str]) -> None:
        """Pods come up for what is labelled; the operator reacts, until nothing changes."""
        for _ in range(6):
            self.ready |= self.deployed() & set(components)
            self.reconcile()


STACK = {
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm",
    "dcgm-exporter",
}


def test_fresh_node_with_driver_manager_comes_up_in_order() -> None:
    cluster = Cluster()
    cluster.reconcile()
    assert cluster.deployed() == {"driver"}
    # The driver pod's init container: no driver loaded yet, so it "reschedules" the operands, which
    # writes "" for every label that was absent, the toolkit's too.
    cluster.node.driver_manager_reschedules()
    assert cluster.node.labels[deploy("container-toolkit")] == ""
    cluster.reconcile()
    assert cluster.deployed() == {"driver"}  # k8s-driver-manager may still be running
    # Past its init containers, the driver installs: the toolkit's pod may come and wait for it.
    cluster.started.add("driver")
    cluster.reconcile()
    assert cluster.deployed() == {"driver", "container-toolkit"}  # "" taken over
    assert "gpu-operator" in cluster.node.owners[deploy("container-toolkit")]
    cluster.ready.add("driver")
    cluster.reconcile()
    # "" is "not decided": the validator and the rest wait for the toolkit to be ready.
    assert cluster.deployed() == {"driver", "container-toolkit"}
    cluster.ready.add("container-toolkit")
    cluster.reconcile()
    # "" taken over once the toolkit is ready.
    assert "gpu-operator" in cluster.node.owners[deploy("operator-validator")]
    assert cluster.deployed() == STACK - {"dcgm-exporter"}  # it waits for DCGM to be ready
    cluster.bring_up(STACK)
    assert cluster.deployed() == STACK
    components = cluster.reconcile()
    assert all(components[c]["state"] == "ready" for c in STACK), components


def test_a_driver_pod_in_its_init_containers_never_brings_the_toolkit() -> None:
    """With a driver still loaded (a re-created driver pod or policy, a move from NVIDIA's operator),
    k8s-driver-manager pauses every operand label that is `true` and waits for its pods to go: a
    toolkit labelled while it runs would be evicted and re-created for nothing."""
    cluster = Cluster()
    for _ in range(3):
        cluster.reconcile()
        assert cluster.deployed() == {"driver"}
        # What it would pause now: nothing (it never touches the driver's own label).
        patch = operand_managers.driver_manager_evict(cluster.node.labels)
        assert not [key for key, value in patch.items() if "paused-for-" in value], patch
    toolkit = cluster.reconcile()["container-toolkit"]
    waiting = {"node": "gpu-0", "reason": "WaitingForDependency", "message": "waiting for driver"}
    assert toolkit["problems"] == [waiting]
    cluster.started.add("driver")
    cluster.reconcile()
    assert cluster.deployed() == {"driver", "container-toolkit"}


def test_driver_upgrade_pause_is_respected_reported_and_restored() -> None:
    cluster = Cluster()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    # A new driver pod: its driver manager evicts every operand but the driver.
    cluster.node.driver_manager_evicts()
    version = cluster.node.version
    # While the new driver installs, the paused toolkit is not labelled with it (it waits for the
    # driver, but a pause is its manager's to lift), nor once the driver is ready.
    for ready in (set(), {"driver"}):
        cluster.ready = ready
        components = cluster.reconcile()
        assert cluster.node.version == version, "the operator wrote over a pause"
        assert components["container-toolkit"]["problems"][0]["reason"] == "Paused"
    plugin = components["device-plugin"]
    assert plugin["state"] == "notReady"
    assert plugin["problems"] == [
        {"node": "gpu-0", "reason": "Paused", "message": f"paused-for-driver-upgrade by {DRIVER_MANAGER}"}
    ]
    assert f"paused-for-driver-upgrade by {DRIVER_MANAGER} on gpu-0" in plugin["reason"]
    assert components["driver"]["state"] == "ready"
    # The manager restores the labels: they come back, and the operator shares them again.
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    assert cluster.deployed() == STACK
    assert all("gpu-operator" in cluster.node.owners[deploy(c)] for c in STACK)
    assert all(c["state"] == "ready" for c in cluster.reconcile().values() if c["enabled"])


MIG_CLIENTS = {"device-plugin", "gpu-feature-discovery", "dcgm", "dcgm-exporter"}


def test_a_mig_manager_restore_during_a_driver_restart_is_paused_again() -> None:
    """mig-manager, starting while k8s-driver-manager waits for the paused operands to go, writes
    `true` back over four of its pauses: their pods would stay and the driver manager wait 5 minutes
    for them. While the driver pod is in its init containers the operator writes the pause again."""
    cluster = Cluster()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    cluster.ready.discard("driver")
    cluster.initializing.add("driver")  # the new driver pod: k8s-driver-manager runs
    cluster.node.driver_manager_evicts()
    cluster.node.mig_manager_restores()
    clobbered = {c for c in MIG_CLIENTS if cluster.node.labels[deploy(c)] == "true"}
    assert clobbered == MIG_CLIENTS
    cluster.reconcile()
    paused = {c for c in STACK - {"driver"} if cluster.node.labels[deploy(c)] == "paused-for-driver-upgrade"}
    assert paused == STACK - {"driver"}
    assert all("gpu-operator" not in cluster.node.owners[deploy(c)] for c in paused)
    version = cluster.node.version
    cluster.reconcile()
    assert cluster.node.version == version, "written again at rest"
    # k8s-driver-manager is done: it lifts every pause, the operator's too.
    cluster.node.driver_manager_reschedules()
    cluster.initializing.clear()
    cluster.ready.add("driver")
    cluster.bring_up(STACK)
    assert cluster.deployed() == STACK | {"nvsm"}  # mig-manager's `true` (it deploys no NVSM here)
    assert all("gpu-operator" in cluster.node.owners[deploy(c)] for c in STACK)
    assert not [key for key, owners in cluster.node.owners.items() if OPERATOR_UPDATE in owners]


@pytest.mark.parametrize("driver", ["started", "ready", "absent"])
def test_without_a_driver_manager_at_work_a_restored_label_stays(driver: str) -> None:
    """Past its init containers, gone or going: nobody would lift a pause written now."""
    cluster = Cluster()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    cluster.node.driver_manager_evicts()
    cluster.node.mig_manager_restores()
    cluster.ready.discard("driver")
    if driver == "started":
        cluster.started.add("driver")
    elif driver == "ready":
        cluster.ready.add("driver")
    cluster.reconcile()
    assert {c for c in MIG_CLIENTS if cluster.node.labels[deploy(c)] == "true"} == MIG_CLIENTS


def deploy_labels(node: Node) -> dict[str, str]:
    return {k: v for k, v in node.labels.items() if k.startswith(deploy(""))}


def test_cleanup_after_a_restore_removes_the_operators_and_the_managers_labels() -> None:
    cluster = Cluster()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    cluster.node.driver_manager_evicts()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    # The driver manager's "" marks for the operands nobody deploys here, and the `true`s it restored.
    assert cluster.node.owners[deploy("nvsm")] == {DRIVER_MANAGER}
    assert cluster.node.owners[deploy("device-plugin")] == {DRIVER_MANAGER, "gpu-operator"}
    cluster.spec = None  # the policy is deleted
    cluster.reconcile()
    assert deploy_labels(cluster.node) == {}
    assert GPU_PRESENT not in cluster.node.labels
    version = cluster.node.version
    cluster.reconcile()
    assert cluster.node.version == version, "a write with nothing left to remove"


def test_cleanup_during_a_pause_removes_it_and_keeps_a_persons_opt_out() -> None:
    cluster = Cluster()
    cluster.node.patch("kubectl-label", {deploy("dcgm-exporter"): "false"})
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    cluster.node.driver_manager_evicts()
    assert cluster.node.labels[deploy("device-plugin")] == "paused-for-driver-upgrade"
    # The manager carried the opt-out over unchanged: it is still the person's.
    assert cluster.node.owners[deploy("dcgm-exporter")] == {"kubectl-label"}
    cluster.spec = None
    cluster.reconcile()
    assert deploy_labels(cluster.node) == {deploy("dcgm-exporter"): "false"}


def test_cleanup_goes_on_after_a_restart_and_after_a_late_manager_write() -> None:
    """The operator keeps nothing about a cleanup but what the node says: killed between its apply
    and its removals, the next operator finishes; a manager writing again afterwards (its pod not yet
    gone) is cleaned up by the pass its write wakes."""
    cluster = Cluster()
    cluster.node.driver_manager_reschedules()
    cluster.bring_up(STACK)
    cluster.node.driver_manager_evicts()
    cluster.spec = None
    plan = build(cluster.observed(), NOW)
    cluster.node.apply(plan.node_labels[cluster.node.name])  # killed before the removals
    assert deploy_labels(cluster.node) and not any("gpu-operator" in o for o in cluster.node.owners.values())
    cluster.reconcile()
    assert deploy_labels(cluster.node) == {}
    cluster.node.driver_manager_reschedules()
    assert deploy_labels(cluster.node)
    cluster.reconcile()
    assert deploy_labels(cluster.node) == {}


def test_mig_reconfiguration_pauses_and_restores_even_absent_labels() -> None:
    cluster = Cluster(node=Node(labels={PCI: "true", "nvidia.com/mig.capable": "true"}))
    cluster.bring_up(STACK | {"mig-manager"})
    assert cluster.node.labels[MIG_CONFIG] == "all-disabled"
    cluster.node.mig_manager_pauses()
    cluster.ready -= {"device-plugin", "gpu-feature-discovery", "dcgm", "dcgm-exporter"}
    components = cluster.reconcile()
    assert components["dcgm"]["problems"][0]["message"] == f"paused-for-mig-change by {MIG_MANAGER}"
    assert components["mig-manager"]["state"] == "ready"
    cluster.node.mig_manager_restores()
    cluster.bring_up(STACK | {"mig-manager"})
    components = cluster.reconcile()
    assert all(components[c]["state"] == "ready" for c in STACK | {"mig-manager"})
    # nvsm was never ours: mig-manager's "true" for it stays its own, until the policy goes.
    assert cluster.node.owners[deploy("nvsm")] == {MIG_MANAGER}
    cluster.spec = None
    cluster.reconcile()
    assert deploy_labels(cluster.node) == {}


def test_pre_installed_driver_counts_as_satisfied() -> None:
    cluster = Cluster()
    cluster.reconcile()
    cluster.node.patch(DRIVER_MANAGER, {deploy("driver"): "pre-installed"})
    components = cluster.reconcile()
    assert cluster.deployed() == {"container-toolkit"}, "the toolkit did not start on a host driver"
    assert cluster.node.labels[deploy("driver")] == "pre-installed"
    assert components["driver"]["nodesDesired"] == 0
    cluster.bring_up(STACK - {"driver"})
    assert cluster.deployed() == STACK - {"driver"}


@pytest.mark.parametrize(
    ("value", "reason", "eligible"),
    [
        ("false", None, False),
        ("pre-installed", "DeployLabelHeld", True),  # only the driver's label means a host driver
        ("custom", "DeployLabelHeld", True),
        ("custom_paused-for-driver-upgrade", "Paused", True),
    ],
)
def test_other_values_on_a_component_label(value: str, reason: str | None, eligible: bool) -> None:
    cluster = Cluster()
    cluster.bring_up(STACK)
    cluster.node.patch("kubectl-label", {deploy("dcgm"): value})
    components = cluster.reconcile()
    assert cluster.node.labels[deploy("dcgm")] == value
    dcgm = components["dcgm"]
    assert dcgm["nodesDesired"] == (1 if eligible else 0)
    assert [p["reason"] for p in dcgm["problems"]] == ([reason] if reason else [])
    if reason == "DeployLabelHeld":
        assert "set by kubectl-label" in dcgm["problems"][0]["message"]


def test_writes_carry_the_node_version_they_were_planned_on() -> None:
    cluster = Cluster()
    observed = cluster.observed()
    assert observed.nodes["gpu-0"].resource_version == "1"
    # Changing only the version is not a change a pass needs to react to.
    assert Node(version=7).info() == Node(version=8).info()


def test_gpu_present_and_no_policy() -> None:
    cluster = Cluster(spec=None)
    cluster.reconcile()
    assert GPU_PRESENT not in cluster.node.labels
