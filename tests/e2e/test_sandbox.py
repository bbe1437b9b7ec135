"""GPU workload types per node end to end (issue 38): containers, VM passthrough and vGPU side by side.

With `sandboxWorkloads.enabled`, each GPU node runs the stack its `nvidia.com/gpu.workload.config` label
names. What a user of KubeVirt sees is what the tests check: a passthrough node advertises its GPUs under
their model's name (KubeVirt's resource, e.g. `nvidia.com/AD104GL_L4`), a vGPU node its vGPUs
(`nvidia.com/NVIDIA_L4-12Q`, the default vGPU configuration's type for an L4), a container node
`nvidia.com/gpu`. A node relabelled from one type to the other loses its stack before it gets the other:
a watch of every operand pod (`StackPods`) holds the operator to it, a terminating pod counting until it
is deleted, so that a driver container never loads nvidia.ko on GPUs the VFIO manager binds to vfio-pci.
They need the local kwok cluster and its emulators (hack/emulators: vfio_manager.py,
kubevirt_device_plugin.py, vgpu_device_manager.py, the vGPU manager in driver_container.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_operator.core.components import BY_LABEL, BY_NAME
from gpu_operator.core.workloads import CONTAINER, VM_PASSTHROUGH, VM_VGPU, WORKLOAD_LABEL

from .kube_helpers import (
    SIMULATED_NODE_LABEL,
    Cluster,
    client,
    emulated_host,
    follow_pods,
    gpu_nodes,
    list_pods,
    pod_is_ready,
    wait_for,
)
from .operator_process import OperatorProcess
from .test_nvidiadriver import killed_once
from .test_operator import COMPONENT, CONVERGE, MANAGED, NS, apply_policy, get_policy, node_labels, wait_state

pytestmark = pytest.mark.e2e

NAME = "cluster-policy"
# KubeVirt's names for the simulated GPUs (pci.ids, kubevirt-gpu-device-plugin getDeviceName) and the
# vGPU type NVIDIA's default vGPU configuration gives each (two per GPU).
PASSTHROUGH_RESOURCE = {"H100-80GB-HBM3": "nvidia.com/GH100_H100_SXM5_80GB", "L4": "nvidia.com/AD104GL_L4"}
VGPU_RESOURCE = {"H100-80GB-HBM3": "nvidia.com/NVIDIA_H100XM-40C", "L4": "nvidia.com/NVIDIA_L4-12Q"}
VGPUS_PER_GPU = 2


def policy() -> dict[str, Any]:
    """NVIDIA's defaults, sandbox workloads on (nodes run containers unless labelled), the VFIO stack,
    the vGPU stack (the vGPU manager's image is the user's: this one's name is what the emulators know
    as NVIDIA's vGPU host driver) and KubeVirt's device plugin."""
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "sandboxWorkloads": {"enabled": True, "defaultWorkload": CONTAINER, "mode": "kubevirt"},
            "vfioManager": {"enabled": True},
            "sandboxDevicePlugin": {"enabled": True},
            "vgpuManager": {
                "enabled": True,
                "repository": "nvcr.io/nvidia",
                "image": "vgpu-manager",
                "version": "595.91.07",
            },
            "vgpuDeviceManager": {"enabled": True},
        },
    }


@pytest.fixture(autouse=True)
def emulated(cluster: Cluster) -> None:
    nodes: Any = client.CoreV1Api(cluster.api).list_node(label_selector=f"{SIMULATED_NODE_LABEL}=true")
    if not nodes.items:
        pytest.skip("needs the local kwok cluster and its emulators (hack/cluster.sh)")
    if len(gpu_nodes(cluster.api)) < 4:
        pytest.skip("needs 4 simulated GPU nodes (make cluster-up's default)")


def set_workload(cluster: Cluster, node: str, workload: str | None) -> None:
    client.CoreV1Api(cluster.api).patch_node(node, {"metadata": {"labels": {WORKLOAD_LABEL: workload}}})


@pytest.fixture
def workload_labels(cluster: Cluster) -> Iterator[None]:
    """The nodes' workload labels (and the vGPU device manager's state label) removed after the test:
    requested before `clean`, so only once the policy is gone and its operands with it (a node changing
    type while the policy goes would only churn)."""
    try:
        yield
    finally:
        for node in gpu_nodes(cluster.api):
            patch = {WORKLOAD_LABEL: None, "nvidia.com/vgpu.config.state": None}
            client.CoreV1Api(cluster.api).patch_node(node, {"metadata": {"labels": patch}})


@dataclass
class StackPods:
    """Every operand pod from a watch, in etcd's order, per node and stack (containers, or a VM stack):
    the moments a node had pods of both (a terminating pod counts until it is deleted), the most driver
    and VFIO manager pods it had at once, and the UIDs that went."""

    api: Any
    present: dict[str, dict[str, str]] = field(default_factory=dict)
    """node → pod UID → its component's name."""
    mixed: dict[str, set[str]] = field(default_factory=dict)
    """node → the components present together with another stack's (any time)."""
    gone: set[str] = field(default_factory=set)
    seen: dict[str, set[str]] = field(default_factory=dict)
    """node → every component whose pod ever ran there while watching."""
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> StackPods:
        threading.Thread(target=self._watch, daemon=True).start()
        assert self.ready.wait(timeout=30), "the operand pod watch did not start"
        return self

    def _record(self, kind: str, pod: Any) -> None:
        node, uid = pod.spec.node_name or "", pod.metadata.uid
        component = BY_LABEL.get((pod.metadata.labels or {}).get(COMPONENT, ""))
        if not node or component is None:
            return
        here = self.present.setdefault(node, {})
        if kind == "DELETED":
            here.pop(uid, None)
            self.gone.add(uid)
            return
        here[uid] = component.name
        self.seen.setdefault(node, set()).add(component.name)
        stacks = {CONTAINER in BY_NAME[name].workloads for name in here.values()}
        if len(stacks) > 1:
            self.mixed.setdefault(node, set()).update(here.values())

    def _watch(self) -> None:
        follow_pods(self.api, NS, MANAGED, self._record, self.ready, self.stop)

    def uids(self, node: str, component: str) -> set[str]:
        return {uid for uid, name in self.present.get(node, {}).items() if name == component}

    def assert_one_stack_at_a_time(self) -> None:
        assert not self.mixed, f"nodes that ran pods of two stacks at once: {self.mixed}"


@pytest.fixture
def watched(cluster: Cluster) -> Iterator[StackPods]:
    """The watch, from a namespace without operand pods: an earlier test's, still terminating, would
    count as a stack of its own."""

    def no_operand_pods() -> None:
        left = list_pods(cluster.api, NS, labels=MANAGED)
        assert not left, f"operand pods left: {[p.metadata.name for p in left]}"

    wait_for(no_operand_pods, timeout=CONVERGE, what="no operand pods before the test")
    watching = StackPods(cluster.api).start()
    try:
        yield watching
    finally:
        watching.stop.set()


def resources(cluster: Cluster, node: str) -> dict[str, str]:
    """The node's allocatable nvidia.com/ resources, those at 0 left out."""
    found: Any = client.CoreV1Api(cluster.api).read_node(node)
    allocatable = found.status.allocatable or {}
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/") and v != "0"}


VM_RESOURCES = {*PASSTHROUGH_RESOURCE.values(), *VGPU_RESOURCE.values()}


def assert_advertised(cluster: Cluster, node: str, workload: str) -> None:
    """The node offers its simulated GPUs as a node of `workload` does once its stack is up: a VM node
    exactly its KubeVirt resource (nothing for containers), a container node nvidia.com/gpu and nothing
    for VMs (a MIG layout an earlier test left would show as nvidia.com/mig-* or more nvidia.com/gpu)."""
    host = emulated_host(cluster.api, node)
    model, count = host["gpu-model"], int(host["gpu-count"])
    found = resources(cluster, node)
    if workload == VM_PASSTHROUGH:
        assert found == {PASSTHROUGH_RESOURCE[model]: str(count)}, (node, workload, found)
    elif workload == VM_VGPU:
        assert found == {VGPU_RESOURCE[model]: str(count * VGPUS_PER_GPU)}, (node, workload, found)
    else:
        assert "nvidia.com/gpu" in found and not set(found) & VM_RESOURCES, (node, workload, found)


def wait_advertised(cluster: Cluster, workloads: dict[str, str]) -> None:
    def check() -> None:
        for node, workload in workloads.items():
            assert_advertised(cluster, node, workload)

    wait_for(check, timeout=CONVERGE, what=f"GPUs advertised as {workloads}")


def ready_components(cluster: Cluster, node: str) -> set[str]:
    pods = list_pods(cluster.api, NS, labels=MANAGED, node=node)
    return {BY_LABEL[p.metadata.labels[COMPONENT]].name for p in pods if pod_is_ready(p)}


PASSTHROUGH_STACK = {"vfio-manager", "sandbox-validator", "sandbox-device-plugin"}
VGPU_STACK = {"vgpu-manager", "vgpu-device-manager", "sandbox-validator", "sandbox-device-plugin"}
CONTAINER_STACK = {name for name, c in BY_NAME.items() if CONTAINER in c.workloads}


def wait_stack(cluster: Cluster, node: str, stack: set[str]) -> None:
    """The node's Ready operand pods are exactly `stack` (containers: the driver among them, and no VM
    stack's pod: the container stack's members depend on the policy and the node)."""

    def check() -> None:
        running = ready_components(cluster, node)
        if stack is CONTAINER_STACK:
            assert "driver" in running and running <= CONTAINER_STACK, (node, sorted(running))
        else:
            assert running == stack, (node, sorted(running))

    wait_for(check, timeout=CONVERGE, what=f"the operand pods of {node}")


def test_a_mixed_cluster_converges(
    cluster: Cluster, workload_labels: None, clean: OperatorProcess, watched: StackPods
) -> None:
    """Container, passthrough and vGPU nodes in one cluster: each runs its own stack only and offers
    its GPUs its own way; the status counts the nodes of each type."""
    passthrough, vgpu, *containers = gpu_nodes(cluster.api)
    set_workload(cluster, passthrough, VM_PASSTHROUGH)
    set_workload(cluster, vgpu, VM_VGPU)
    apply_policy(cluster, policy())
    workloads = {passthrough: VM_PASSTHROUGH, vgpu: VM_VGPU, **dict.fromkeys(containers, CONTAINER)}
    wait_advertised(cluster, workloads)
    found = wait_state(cluster, NAME, "ready")
    counts = {CONTAINER: len(containers), VM_PASSTHROUGH: 1, VM_VGPU: 1}
    assert found["status"].get("workloads") == counts, found["status"]
    wait_stack(cluster, passthrough, PASSTHROUGH_STACK)
    wait_stack(cluster, vgpu, VGPU_STACK)
    for node in containers:
        wait_stack(cluster, node, CONTAINER_STACK)
    # The vGPUs advertised are the configuration applied. The vGPU device manager's own report,
    # `nvidia.com/vgpu.config.state`, is a GET and an Update of the whole node whose error it ignores
    # (vgpu-device-manager v0.5.0 cmd/nvidia-k8s-vgpu-dm/main.go:295-297, 574-589): another client
    # writing the node in between (the kubelet, the operator) leaves it `pending`; only `failed` is
    # ruled out.
    assert node_labels(cluster, vgpu).get("nvidia.com/vgpu.config.state") != "failed"
    # The workload labels were there before the policy: a node never ran another type's pod.
    for node, kind in workloads.items():
        stack = CONTAINER_STACK if kind == CONTAINER else PASSTHROUGH_STACK | VGPU_STACK
        assert watched.seen.get(node, set()) <= stack, (node, kind, watched.seen.get(node))
    watched.assert_one_stack_at_a_time()


@pytest.mark.parametrize("kill", [False, True], ids=["", "operator-killed"])
def test_a_node_changing_type_loses_one_stack_before_it_gets_the_other(
    cluster: Cluster, workload_labels: None, clean: OperatorProcess, watched: StackPods, kill: bool
) -> None:
    """A container node relabelled `vm-passthrough` and back: its driver pod goes before the VFIO
    manager's comes, and the other way round; the other nodes keep their driver pods (same UID). With
    `kill`, the operator is killed once the node's driver pod is gone, and again once its VFIO manager
    pod is, each time started again."""
    nodes = gpu_nodes(cluster.api)
    node, others = nodes[2], [n for n in nodes if n != nodes[2]]
    apply_policy(cluster, policy())
    wait_advertised(cluster, dict.fromkeys(nodes, CONTAINER))
    wait_state(cluster, NAME, "ready")
    wait_stack(cluster, node, CONTAINER_STACK)
    drivers = {n: watched.uids(n, "driver") for n in others}
    (driver,) = watched.uids(node, "driver")

    set_workload(cluster, node, VM_PASSTHROUGH)
    if kill:
        killed_once(clean, lambda: driver in watched.gone, f"the driver pod of {node} gone")
    wait_advertised(cluster, {node: VM_PASSTHROUGH})
    wait_stack(cluster, node, PASSTHROUGH_STACK)
    wait_state(cluster, NAME, "ready")
    (vfio,) = watched.uids(node, "vfio-manager")

    set_workload(cluster, node, CONTAINER)
    if kill:
        killed_once(clean, lambda: vfio in watched.gone, f"the VFIO manager pod of {node} gone")
    wait_advertised(cluster, {node: CONTAINER})
    wait_stack(cluster, node, CONTAINER_STACK)
    found = wait_state(cluster, NAME, "ready")
    assert found["status"].get("workloads") == {CONTAINER: len(nodes), VM_PASSTHROUGH: 0, VM_VGPU: 0}, found[
        "status"
    ]
    assert {n: watched.uids(n, "driver") for n in others} == drivers, "another node's driver pod changed"
    assert driver in watched.gone and vfio in watched.gone
    watched.assert_one_stack_at_a_time()
    assert get_policy(cluster, NAME)["status"]["state"] == "ready"
