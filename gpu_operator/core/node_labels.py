"""GPU-node detection and the node labels the operator owns (pure functions, no I/O).

The operator writes node labels with server-side apply under its own field manager, so
`managedFields` tells which labels are its own. Deploy labels follow the protocol NVIDIA's operand
managers speak (k8s-driver-manager v0.12.0 `cmd/driver-manager/main.go`, mig-manager v0.15.0
`pkg/mig/reconfigure/reconfigure.go`), who rewrite them with strategic-merge or merge patches:

* absent or `""`: not decided yet. k8s-driver-manager writes `""` for every operand label that was
  absent when it reschedules a fresh node (`maybeSetTrue("")`, main.go:1075). The operator sets `true`
  once the component's dependencies are ready on the node (or, for those its pods wait for by
  themselves, `Component.waits_for`, started there: the toolkit comes once the driver pod is past its
  init containers, k8s-driver-manager among them, so that no manager ever finds it `true` and pauses
  it), taking the label over.
* `true`: deployed, whoever wrote it. After a pause the manager writes `true` back and owns it; the
  operator applies the same value too (shared ownership), so that it stays the operator's label.
* containing `paused-for-` (`paused-for-driver-upgrade`, `paused-for-mig-change`): a manager stopped
  the component on this node for a while. Never overwritten; reported, with who paused it.
* `pre-installed` on the driver label: k8s-driver-manager found a driver on the host
  (`disableContainerizedDriver`, main.go:549). The driver counts as satisfied for its dependents.
* `false`: opted out (NVIDIA's meaning). Any other value is someone else's and is left alone, reported.

When no ClusterPolicy is active (deleted, or `helm uninstall`, whose pre-delete hook deletes it), the
operator removes the deploy labels of this protocol, not only the ones it owns (`uninstall_removals`),
so that an uninstall leaves no `nvidia.com/gpu.deploy.*` marks behind (NVIDIA/gpu-operator#1391): a
leftover `""` or pause would keep an operand off the node after a reinstall. Which writer is whose is
told by the node's managedFields: a field manager is named after the writing binary (client-go's
default User-Agent, up to its first "/", when the writer names none), so `gpu-operator` is this
operator (and NVIDIA's, the same binary name), `driver-manager` and `nvidia-mig-manager` are the
operand managers it deploys (`OPERAND_MANAGERS`). A deploy label goes when every manager that owns it
is one of those, or when its value is `""` or a bare pause, which only the protocol writes (the
shell-script versions of both managers wrote through `kubectl label`, whose manager `kubectl-label`
is also a person's). `false` always stays, and so does any other value someone else wrote.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import BY_NAME, COMPONENTS, MIG_CONFIG_LABEL, RUNTIME_LABEL, Component
from gpu_operator.core.images import KERNEL_LABEL, os_name, os_tag
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.render import ClusterFacts, runtimes_in_order
from gpu_operator.core.upgrade.facts import node_ready
from gpu_operator.core.upgrade.states import ANNOTATION_PREFIX
from gpu_operator.core.workloads import WORKLOADS, workload_type

GPU_PRESENT = "nvidia.com/gpu.present"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DEPLOY_OPERANDS = "nvidia.com/gpu.deploy.operands"
PAUSED_MARK = "paused-for-"
DRIVER_PAUSE = "paused-for-driver-upgrade"
PAUSES = (DRIVER_PAUSE, "paused-for-mig-change", "paused-for-vgpu-change")
"""The pauses k8s-driver-manager, mig-manager and vgpu-device-manager write over a `true` (or an empty
label)."""
DRIVER_MANAGER_WAITS = tuple(
    DEPLOY_PREFIX + name
    for name in (
        "operator-validator", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter",
        "dcgm", "dcgm-exporter-dra", "dcgm-dra", "mig-manager",
    )
)  # fmt: skip
"""The deploy labels whose pods k8s-driver-manager waits for, up to 5 minutes each, once it paused every
operand label that was `true` (k8s-driver-manager v0.12.0 main.go:742-792, the MIG manager's when its
label is set)."""
PRE_INSTALLED = "pre-installed"
MIG_CONFIG = MIG_CONFIG_LABEL
GPU_RESOURCE = "nvidia.com/gpu"
NFD_PREFIX = "feature.node.kubernetes.io/"
OPERAND_MANAGERS = frozenset({"driver-manager", "nvidia-mig-manager", "nvidia-k8s-vgpu-dm"})
"""The field managers of the operand managers the operator deploys, which rewrite deploy labels on the
operator's behalf: k8s-driver-manager (`/usr/bin/driver-manager`, the init container of the driver, VFIO
manager and vGPU manager pods), mig-manager (`nvidia-mig-manager`) and vgpu-device-manager (its image's
entrypoint `nvidia-k8s-vgpu-dm`, which pauses and restores the sandbox device plugin and validator with
an Update of the node: cmd/nvidia-k8s-vgpu-dm/main.go:436-478 at v0.5.0). All are client-go programs
that name no field manager, so the API server names theirs after the binary (the User-Agent up to its
first "/"). GFD writes no node label itself (NFD's nfd-master copies its NodeFeature); the CC manager
(Kata mode) writes through the Python client, whose field manager (`OpenAPI-Generator`) names no
program; the other operands write none at all."""
PCI_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)


@dataclass(frozen=True)
class NodeInfo:
    """The few facts about a node the operator decides on; kept small (1000s of nodes in memory)."""

    name: str
    labels: Mapping[str, str]
    gpu_allocatable: int = 0
    own_labels: frozenset[str] = frozenset()
    """Label keys the operator's field manager owns (set by server-side apply)."""
    shared_labels: frozenset[str] = frozenset()
    """Those of `own_labels` another manager owns too (it wrote the same value)."""
    writers: Mapping[str, str] = field(default_factory=dict)
    """Deploy label → the manager that set it, for values other than "" and "true" (pauses, opt-outs)."""
    protocol_labels: frozenset[str] = frozenset()
    """The deploy labels every owner of which is the operator (`gpu-operator`, whatever the operation:
    its apply, its patches, NVIDIA's operator's updates) or an operand manager (`OPERAND_MANAGERS`),
    and `nvidia.com/gpu.present` when only the operator owns it: what an uninstall removes whatever
    their value but `false` (`uninstall_removals`)."""
    resource_version: str = field(default="", compare=False)
    """The node as last seen: label writes carry it, so a stale view conflicts instead of overwriting."""
    uid: str = ""
    """Label writes carry it too, so that a write never re-creates a Node deleted meanwhile; Events
    about the node name it."""
    runtime: str | None = None
    """Container runtime the kubelet reports (containerd, crio, docker); None if unknown."""
    os_image: str = ""
    """The kubelet's `status.nodeInfo.osImage`: the OS when NFD has not labelled the node."""
    upgrade_annotations: Mapping[str, str] = field(default_factory=dict)
    """The driver-upgrade annotations (`nvidia.com/gpu-driver-upgrade*`), the state machine's memory;
    other annotations are not kept, so their changes cost nothing."""
    unschedulable: bool = False
    ready: bool = True
    """The NodeReady condition (True when the node reports none)."""

    @cached_property
    def is_gpu(self) -> bool:
        """NFD saw an NVIDIA PCI device, someone else marked it as a GPU node, or it advertises GPUs.
        Kept once asked (a pass asks it of every node several times; a NodeInfo never changes)."""
        if any(self.labels.get(key) == "true" for key in PCI_LABELS):
            return True
        if self.labels.get(GPU_PRESENT) == "true" and GPU_PRESENT not in self.own_labels:
            return True
        return self.gpu_allocatable > 0


def owned_label_keys(
    managed_fields: Iterable[Mapping[str, Any]], manager: str = FIELD_MANAGER
) -> frozenset[str]:
    """The label keys `manager` owns by server-side apply, from a node's `metadata.managedFields`."""
    keys: set[str] = set()
    for entry in managed_fields:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        labels = (entry.get("fieldsV1") or {}).get("f:metadata", {}).get("f:labels", {})
        keys.update(key.removeprefix("f:") for key in labels if key.startswith("f:"))
    return frozenset(keys)


def _label_owners(
    managed_fields: Iterable[Mapping[str, Any]], labels: Mapping[str, str]
) -> tuple[frozenset[str], frozenset[str], dict[str, str], frozenset[str]]:
    """(keys we own, of those the ones someone else owns too, unusual deploy labels → their manager,
    the protocol's labels: see NodeInfo.protocol_labels)."""
    ours: set[str] = set()
    others: dict[str, str] = {}
    managers: dict[str, set[str]] = {}
    for entry in managed_fields:
        fields = (entry.get("fieldsV1") or {}).get("f:metadata", {}).get("f:labels", {})
        keys = [key.removeprefix("f:") for key in fields if key.startswith("f:")]
        manager = str(entry.get("manager") or "")
        for key in keys:
            managers.setdefault(key, set()).add(manager)
        if manager == FIELD_MANAGER and entry.get("operation") == "Apply":
            ours.update(keys)
        else:
            others.update(dict.fromkeys(keys, manager or "an unnamed manager"))
    writers = {
        key: manager
        for key, manager in others.items()
        if key.startswith(DEPLOY_PREFIX) and labels.get(key) not in (None, "", "true")
    }
    # The labels' own key strings, not the managedFields' copies: thousands of nodes stay in memory.
    protocol = frozenset(
        key
        for key in labels
        if (key.startswith(DEPLOY_PREFIX) or key == GPU_PRESENT)
        and (owners := managers.get(key))
        and owners <= (_OPERATOR if key == GPU_PRESENT else _PROTOCOL)
    )
    return frozenset(ours), frozenset(ours & others.keys()), writers, protocol


_OPERATOR = frozenset({FIELD_MANAGER})
_PROTOCOL = _OPERATOR | OPERAND_MANAGERS


def _quantity_int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


# `status.nodeInfo.containerRuntimeVersion` is `<runtime>://<version>` (NVIDIA's getRuntimeString,
# controllers/state_manager.go:562-577).
_RUNTIME_PREFIXES = (("containerd", "containerd"), ("cri-o", "crio"), ("docker", "docker"))


def _runtime(version: str) -> str | None:
    return next((name for prefix, name in _RUNTIME_PREFIXES if version.startswith(prefix)), None)


def node_info(body: Mapping[str, Any]) -> NodeInfo:
    metadata = body.get("metadata") or {}
    status = body.get("status") or {}
    allocatable = status.get("allocatable") or {}
    node_status = status.get("nodeInfo") or {}
    # Most label values, and keys the JSON decoder did not share, repeat on every node: one copy of
    # each for thousands of nodes in memory.
    labels = {sys.intern(key): sys.intern(value) for key, value in (metadata.get("labels") or {}).items()}
    own, shared, writers, protocol = _label_owners(metadata.get("managedFields") or (), labels)
    return NodeInfo(
        name=metadata["name"],
        labels=labels,
        gpu_allocatable=_quantity_int(allocatable.get(GPU_RESOURCE, 0)),
        own_labels=own,
        shared_labels=shared,
        writers=writers,
        protocol_labels=protocol,
        resource_version=str(metadata.get("resourceVersion") or ""),
        uid=str(metadata.get("uid") or ""),
        runtime=_runtime(str(node_status.get("containerRuntimeVersion") or "")),
        os_image=str(node_status.get("osImage") or ""),
        upgrade_annotations={
            k: v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)
        },
        unschedulable=bool((body.get("spec") or {}).get("unschedulable")),
        ready=node_ready(body),
    )


def gpu_nodes(nodes: Iterable[NodeInfo]) -> list[NodeInfo]:
    return sorted((n for n in nodes if n.is_gpu), key=lambda n: n.name)


def node_runtime(node: NodeInfo, default_runtime: str | None) -> str:
    """The runtime the kubelet reports, else `operator.defaultRuntime`, else containerd (NVIDIA's default)."""
    return node.runtime or default_runtime or "containerd"


def cluster_facts(
    nodes: Iterable[Mapping[str, Any]] | Iterable[NodeInfo],
    namespace: str,
    environ: Mapping[str, str],
    default_runtime: str | None = None,
) -> ClusterFacts:
    """Rendering facts from the GPU nodes: the OS of the first one (the driver image's suffix, as NVIDIA
    does), the kernels (one precompiled driver DaemonSet each) and the container runtimes (one toolkit
    DaemonSet each). Nodes opted out of operands still count: their labels may change any time."""
    infos = [n if isinstance(n, NodeInfo) else node_info(n) for n in nodes]
    gpus = gpu_nodes(infos)
    kernels = {
        (n.labels[KERNEL_LABEL], os_name(n.labels, n.os_image)) for n in gpus if n.labels.get(KERNEL_LABEL)
    }
    return ClusterFacts(
        namespace=namespace,
        os_tag=os_tag(gpus[0].labels, gpus[0].os_image) if gpus else None,
        kernels=tuple(sorted(kernels, key=lambda k: (k[0], k[1] or ""))),
        runtimes=runtimes_in_order({node_runtime(n, default_runtime) for n in gpus}),
        environ=dict(environ),
    )


def runtime_labels(node: NodeInfo, policy: ClusterPolicySpec) -> dict[str, str]:
    """The runtime label the toolkit DaemonSets select on; part of desired_labels, so it is written in
    the same apply as the deploy labels."""
    split = any(c.split == "runtime" and c.enabled(policy) for c in COMPONENTS)
    if not split or _foreign(node, RUNTIME_LABEL):
        return {}
    return {RUNTIME_LABEL: node_runtime(node, policy.operator.defaultRuntime)}


def takes_operands(node: NodeInfo) -> bool:
    return node.is_gpu and node.labels.get(DEPLOY_OPERANDS) != "false"


class Deploy(Enum):
    """What a component's deploy label on a node says (see the module docstring)."""

    UNDECIDED = "undecided"
    DEPLOYED = "deployed"
    PAUSED = "paused"
    HOST = "host"
    OPTED_OUT = "opted out"
    HELD = "held"


def deploy_state(component: Component, node: NodeInfo) -> Deploy:
    value = node.labels.get(component.deploy_label)
    if not value:
        return Deploy.UNDECIDED
    if value == "true":
        return Deploy.DEPLOYED
    if value == "false":
        return Deploy.OPTED_OUT
    if PAUSED_MARK in value:
        return Deploy.PAUSED
    if value == PRE_INSTALLED and component.host_installed:
        return Deploy.HOST
    return Deploy.HELD


def runs_on(component: Component, node: NodeInfo, policy: ClusterPolicySpec) -> bool:
    """Whether an (enabled) component belongs on this node, before dependency gating: part of the stack
    of the node's workload type (gpu_operator/core/workloads.py), not opted out, and not a driver found
    pre-installed on the host. A paused component still belongs there."""
    if not takes_operands(node) or not component.node_filter(node.labels):
        return False
    if workload_type(node.labels, policy) not in component.workloads:
        return False
    return deploy_state(component, node) not in (Deploy.OPTED_OUT, Deploy.HOST)


IsReady = Callable[[str, str], bool]
"""(component name, node name) → whether that component's pod on that node is ready (or, for
`is_started`, has started: its init containers are done; for `is_present`, exists at all, terminating
or not)."""


def leaving(node: NodeInfo, policy: ClusterPolicySpec, is_present: IsReady) -> list[str]:
    """The components of another workload type whose pods are still on the node: a node that changed
    type (nvidia.com/gpu.workload.config, or sandboxWorkloads) lost their deploy labels, and its new
    stack gets none until they are gone, so that a driver container never loads nvidia.ko on GPUs
    the VFIO manager binds to vfio-pci, nor the other way round. NVIDIA's labeller swaps the labels
    at once (controllers/state_manager.go updateGPUStateLabels) and leaves the order to chance."""
    foreign = _FOREIGN[workload_type(node.labels, policy)]
    return [name for name in foreign if is_present(name, node.name)]


_FOREIGN = {w: tuple(c.name for c in COMPONENTS if w not in c.workloads) for w in WORKLOADS}
"""Workload type → the components of the other types' stacks (a pass asks for every node)."""


def unmet_dependencies(
    component: Component,
    policy: ClusterPolicySpec,
    node: NodeInfo,
    is_ready: IsReady,
    is_started: IsReady | None = None,
) -> list[str]:
    """The dependencies still to be met on this node before `component` may be labelled there.

    A dependency is met once it is ready there; one the component's own pods wait for by themselves
    (`Component.waits_for`) already once its pod has started there (`is_started`; None: only when
    ready) while its deploy label is `true`. For the driver that is once k8s-driver-manager, its init
    container, is done with the node's labels: a toolkit labelled earlier, with a driver still loaded,
    would be paused, evicted and restored by it (k8s-driver-manager v0.12.0 main.go:358-366). A
    dependency that does not run on the node (disabled in the policy, or opted out by a node label
    such as a pre-installed driver) counts as satisfied; its own dependencies then apply, and must be
    ready (the component's pods do not wait for those).
    """

    def started(dep: Component) -> bool:
        return (
            is_started is not None
            and is_started(dep.name, node.name)
            and deploy_state(dep, node) == Deploy.DEPLOYED
        )

    waiting: list[str] = []
    for name in component.depends_on:
        dep = BY_NAME[name]
        if dep.enabled(policy) and runs_on(dep, node, policy):
            if not is_ready(name, node.name) and not (name in component.waits_for and started(dep)):
                waiting.append(name)
        else:
            # Without `is_started`: the component's pods do not wait for a dependency's dependencies.
            waiting.extend(d for d in unmet_dependencies(dep, policy, node, is_ready) if d not in waiting)
    return waiting


def awaited(component: Component, policy: ClusterPolicySpec, node: NodeInfo, is_ready: IsReady) -> list[str]:
    """The dependencies the component's pods on this node are waiting for by themselves (in Init):
    those of `Component.waits_for` that run there and are not ready yet."""
    return [
        name
        for name in component.waits_for
        if BY_NAME[name].enabled(policy)
        and runs_on(BY_NAME[name], node, policy)
        and not is_ready(name, node.name)
    ]


def desired_labels(
    node: NodeInfo,
    policy: ClusterPolicySpec | None,
    is_ready: IsReady,
    is_started: IsReady | None = None,
    driver_initializing: bool = False,
    is_present: IsReady | None = None,
    withheld: frozenset[str] = frozenset(),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete set of labels the operator wants to own on `node` (server-side apply removes the rest).

    `withheld`: components not to deploy there, `extra`: deploy labels of another stack to set there
    (the GPUCluster's on a DRA node: core/allocators.py), each set to `true` unless the node has another
    value someone wrote (a pause, an opt-out) or it is to be paused again for k8s-driver-manager.

    Deploy labels are added once a component's dependencies are met on the node (see
    `unmet_dependencies`) and no pod of another workload type's stack is left there (`leaving`, with
    `is_present`; None: no pod is known), and then kept (a restarting driver pod does not tear down
    the stack above it); `true` written by an operand manager is kept the same way, unless it is to be
    paused again for k8s-driver-manager (`driver_manager_repauses`). With no active policy the set is
    empty, which removes every label the operator added (see `released_labels` for the ones it shares).
    """
    if policy is None or not node.is_gpu:
        return {}
    labels: dict[str, str] = {}
    if not _foreign(node, GPU_PRESENT):
        labels[GPU_PRESENT] = "true"
    if not takes_operands(node):
        return labels
    labels.update(runtime_labels(node, policy))
    repaused = driver_manager_repauses(node, driver_initializing)
    blocked = is_present is not None and bool(leaving(node, policy, is_present))
    for component in COMPONENTS:
        if (
            component.deploy_label in repaused
            or component.name in withheld
            or not component.enabled(policy)
            or not runs_on(component, node, policy)
        ):
            continue
        state = deploy_state(component, node)
        if state == Deploy.DEPLOYED or (
            state == Deploy.UNDECIDED
            and not blocked
            and not unmet_dependencies(component, policy, node, is_ready, is_started)
        ):
            labels[component.deploy_label] = "true"
    for component in COMPONENTS:
        if (
            component.name not in withheld
            and component.enabled(policy)
            and component.node_filter(node.labels)
        ):
            more = component.node_labels(policy)
            labels.update((key, value) for key, value in more.items() if not _foreign(node, key))
    for key, value in (extra or {}).items():
        if key not in labels and key not in repaused and node.labels.get(key) in (None, "", "true"):
            labels[key] = value
    return labels


def driver_manager_repauses(node: NodeInfo, driver_initializing: bool) -> dict[str, str]:
    """The deploy labels to pause again for k8s-driver-manager, each with the value it must still have.

    k8s-driver-manager pauses, in one patch, every operand label that is `true` when it starts in a
    driver pod (with a driver still loaded), then waits for their pods to go. mig-manager, when its
    own pod starts meanwhile (a rollout of every operand, as a change of `daemonsets.labels` makes),
    writes `true` back over four of those pauses (`restartKubernetesGPUClients`, on its way out even
    when the MIG layout is already applied: mig-parted v0.15.0 reconfigure.go:142-145, 550-568). Their
    pods then never go, and k8s-driver-manager waits its 5 minutes, fails, restores every label and
    starts again. So while the node's driver pod is in its init containers and one of its labels
    carries the driver pause, a `true` among the labels it waits for is written back to the pause
    (what k8s-driver-manager would have written had it read the label later); it lifts them all
    when it is done (`maybeSetTrue`). Nothing when the driver pod is past its init containers, gone or
    going away: no k8s-driver-manager is waiting then, and a pause nobody lifts is not written.
    """
    if not driver_initializing or not any(
        key.startswith(DEPLOY_PREFIX) and DRIVER_PAUSE in value for key, value in node.labels.items()
    ):
        return {}
    return {key: "true" for key in DRIVER_MANAGER_WAITS if node.labels.get(key) == "true"}


def released_labels(node: NodeInfo, wanted: Mapping[str, str]) -> dict[str, str]:
    """Deploy labels the operator stops owning that another manager co-owns (a `true` restored by
    k8s-driver-manager or mig-manager): leaving them out of the apply would leave them on the node, so
    they are removed explicitly, each only if it still has this value."""
    return {
        key: node.labels[key]
        for key in sorted(node.shared_labels - wanted.keys())
        if key.startswith(DEPLOY_PREFIX) and node.labels.get(key) == "true"
    }


def uninstall_removals(node: NodeInfo) -> dict[str, str]:
    """With no active ClusterPolicy: the labels to remove from `node` explicitly, each with the value it
    must still have, besides the ones the operator's empty apply drops (those only it owns).

    Every deploy label the operator or the operand managers it deploys wrote (`protocol_labels`:
    their `true`, `""` and pauses, k8s-driver-manager's `pre-installed`), and any `""` or bare pause,
    whoever wrote it: only the protocol writes those (k8s-driver-manager's `""` for every operand it
    does not find labelled, mig-manager's `true` for nvsm), and left behind they would keep an operand
    off the node after a reinstall. Never `false` (an opt-out is a person's decision, which the
    managers carry over unchanged), nor another value someone else wrote. `nvidia.com/gpu.present`
    too when the operator alone owns it under another operation (NVIDIA's operator wrote it).
    """
    return {key: value for key, value in sorted(node.labels.items()) if _protocol_leftover(node, key, value)}


def _protocol_leftover(node: NodeInfo, key: str, value: str) -> bool:
    """A label that the operator's own apply does not drop and the protocol wrote (see
    `uninstall_removals`): never `false`, nor another value someone else wrote."""
    applied_only = key in node.own_labels and key not in node.shared_labels
    return (
        not applied_only
        and value != "false"
        and (key in node.protocol_labels or (key.startswith(DEPLOY_PREFIX) and value in ("", *PAUSES)))
    )


def other_stack_removals(node: NodeInfo, keys: Iterable[str]) -> dict[str, str]:
    """Of `keys`, the deploy labels of the stack `node` does not run (core/allocators.py
    `other_stack_labels`), those to remove explicitly, each with the value it must still have: what the
    protocol wrote there, as on an uninstall (k8s-driver-manager's `""` for every label it knows, a
    manager's `true` or pause). The operator's own go with its apply; an opt-out or another value
    someone else wrote stays."""
    return {
        key: value
        for key in sorted(keys)
        if (value := node.labels.get(key)) is not None and _protocol_leftover(node, key, value)
    }


def left_on_uninstall(node: NodeInfo) -> list[str]:
    """The labels the operator still has to remove from `node` once no ClusterPolicy is active: the ones
    it owns (its empty apply drops them) and `uninstall_removals`. Empty: nothing of ours is left."""
    return sorted({key for key in node.own_labels if key in node.labels} | uninstall_removals(node).keys())


def _foreign(node: NodeInfo, key: str) -> bool:
    """The label exists and someone else owns it: never overwrite or remove it."""
    return key in node.labels and key not in node.own_labels
