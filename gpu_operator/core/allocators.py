"""Which allocator hands out each GPU node's GPUs: the ClusterPolicy's device plugin or the GPUCluster's
DRA driver (pure: no I/O, no module-level state).

NVIDIA's operator v26.7 runs one or the other for the whole cluster: a GPUCluster is refused while a
ClusterPolicy exists (controllers/gpucluster_controller.go validatePrerequisites), and its node
labelling puts every GPU node on the stack of whichever CR is active (controllers/
nodelabeling_controller.go updateGPUStateLabels). Here both run side by side, per node pool:

- A GPU node belongs to the DRA stack when the GPUCluster selects it: its `spec.nodeSelector` (ours;
  absent or {}: every GPU node, as NVIDIA's) matches the node's labels. Every other GPU node keeps the
  ClusterPolicy's stack; without a ClusterPolicy it has no allocator.
- Only the GPUCluster named `gpu-cluster` counts (NVIDIA's CRD refuses any other name); any other is
  ignored, with NVIDIA's message, so two GPUClusters never compete for a node. One whose spec does not
  parse keeps its DRA nodes and takes no other until it is fixed; one being deleted takes none, so its
  nodes go back to the ClusterPolicy as their GPU pods go.
- A node the ClusterPolicy must keep is a conflict, reported, never fought over: with
  `sandboxWorkloads.enabled`, a node whose workload (`nvidia.com/gpu.workload.config`, else
  `sandboxWorkloads.defaultWorkload`) is a VM (vm-passthrough, vm-vgpu) stays the ClusterPolicy's
  sandbox node, whatever the GPUCluster selects.
- `nvidia.com/gpu.deploy.operands=false` on a node: no operand at all, so no allocator (NVIDIA's).
- A node moves between allocators only without GPU pods: while pods that use its GPUs through the
  allocator it has now run there (device-plugin resources, or claims allocated by gpu.nvidia.com), it
  stays where it is and the reason says why. The move is never forced: unlike a driver upgrade,
  nothing on the node is broken, so the operator evicts nobody; `kubectl drain` moves it at the moment
  the user picks. NVIDIA keeps the DRA kubelet plugin on a node for the same reason (its plugin must
  unprepare the claims of the pods still there, nodelabeling_controller.go nodeHasDRAClaimPods).

What each side runs on a node (`withheld`, `deploy_labels`): a DRA node gets the DRA stack's deploy
labels (NVIDIA's gpuClusterStateLabels: the driver, dra-driver, dra-validator, dcgm-dra,
dcgm-exporter-dra) and of the ClusterPolicy's components only the driver and the container toolkit.
NVIDIA sweeps every other ClusterPolicy label from a DRA node (devicePluginOnlyStateLabelKeys), so a
DRA node never gets the device plugin (nor its MPS daemon), GPU Feature Discovery's device-plugin
labels, the MIG manager's handshake with the device plugin, a second DCGM or exporter, or the
operator-validator (whose plugin validation requests `nvidia.com/gpu`, which a DRA node never
advertises). Unlike NVIDIA's, the toolkit stays: it turns on CDI in containerd 1.7 and CRI-O, which the
DRA driver's CDI devices need, and removing it from a running node would revert that configuration.

The other stack's deploy labels that someone else wrote go too (`other_stack_labels`), as NVIDIA's
labeller sweeps them (nodelabeling_controller.go updateGPUStateLabels, state_manager.go
removeGPUStateLabels): k8s-driver-manager v0.12.0 writes `""` for every deploy label it knows and finds
absent, both stacks' (cmd/driver-manager/main.go:1037-1086), on every GPU node its driver pod starts on.

The interface, for the pass that wires it (core/plan.py, core/node_labels.py):

    split = split_allocators(nodes, policy, gpuclusters, gpu_pods)
    split.nodes["gpu-3"].allocator        # Allocator.DRA, Allocator.DEVICE_PLUGIN or None
    split.nodes["gpu-3"].reason           # why it is held, has none, or is in conflict ("" if not)
    split.withheld("gpu-3")               # ClusterPolicy component names not to deploy there
    split.deploy_labels("gpu-3")          # the DRA stack's deploy labels for the node ({} if not DRA)
    split.other_stack_labels("gpu-3")     # deploy label keys of the stack the node does not run
    split.conflicts, split.ignored        # for the GPUCluster's status and Events

`nodes`: every node the pass sees (non-GPU nodes are skipped: `NodeInfo.is_gpu`). `policy`: the active
ClusterPolicy's spec, None without one. `gpuclusters`: every GPUCluster. `gpu_pods`: per node name, the
workload pods using its GPUs through the allocator it has now (the DRA stack's own admin-access claims
excluded: they leave with it): `core.gpu_pods.gpu_pod_counts(nodes, pods, claims)` counts them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpu_operator.api.gpucluster import SINGLETON_MESSAGE, SINGLETON_NAME, GPUClusterSpec
from gpu_operator.api.nvidiadriver import REASON_CONFLICTING_NODE_SELECTOR
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.node_labels import DEPLOY_OPERANDS, DEPLOY_PREFIX, NodeInfo

WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
VM_WORKLOADS = frozenset({"vm-passthrough", "vm-vgpu"})
DRA_DRIVER_LABEL = DEPLOY_PREFIX + "dra-driver"
DEVICE_PLUGIN_LABEL = DEPLOY_PREFIX + "device-plugin"
DRA_DEPLOY_LABELS = MappingProxyType(
    {
        DEPLOY_PREFIX + "driver": "true",
        DRA_DRIVER_LABEL: "true",
        DEPLOY_PREFIX + "dra-validator": "true",
        DEPLOY_PREFIX + "dcgm-dra": "true",
        DEPLOY_PREFIX + "dcgm-exporter-dra": "true",
    }
)
"""NVIDIA's gpuClusterStateLabels (controllers/state_manager.go): what every DRA node carries. DCGM's and
the exporter's are set whether or not they are enabled, as NVIDIA's: their DaemonSets then do not exist."""
DRA_KEEPS = frozenset({"driver", "container-toolkit"})
"""The ClusterPolicy's components a DRA node still runs (see the module's docstring)."""
WITHHELD_ON_DRA = frozenset(c.name for c in COMPONENTS if c.name not in DRA_KEEPS)
DRA_ONLY_LABELS = frozenset(DRA_DEPLOY_LABELS) - {c.deploy_label for c in COMPONENTS}
"""The DRA stack's deploy labels that no ClusterPolicy component uses (all but the driver's)."""
DEVICE_PLUGIN_ONLY_LABELS = frozenset(
    c.deploy_label for c in COMPONENTS if c.name in WITHHELD_ON_DRA and c.name != "vgpu-manager"
)
"""The deploy labels of the components a DRA node does not run. Less the vGPU manager's, as NVIDIA's
devicePluginOnlyStateLabelKeys: it gates an NVIDIADriver's DaemonSet, which may serve either stack."""
UNSET = ("", "false")
"""Deploy label values that mean the component is not on the node (`""`: not decided yet)."""
NODES_NAMED = 5


class Allocator(StrEnum):
    DEVICE_PLUGIN = "device-plugin"
    """The ClusterPolicy's stack: the device plugin advertises `nvidia.com/gpu`."""
    DRA = "dra"
    """The GPUCluster's stack: the DRA driver publishes ResourceSlices, claims are allocated by the
    scheduler."""


@dataclass(frozen=True)
class GPUClusterObject:
    """One GPUCluster as the split needs it."""

    name: str
    spec: GPUClusterSpec | None
    """The parsed spec; None when it does not parse (its nodes are held)."""
    deleting: bool = False
    """metadata.deletionTimestamp is set: it takes no new node, and lets its nodes go as they empty."""

    def selects(self, labels: Mapping[str, str]) -> bool:
        selector = (self.spec.nodeSelector if self.spec is not None else None) or {}
        return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True)
class NodeAllocation:
    """Who hands out one GPU node's GPUs."""

    node: str
    allocator: Allocator | None
    """The allocator the node has from now on (None: none)."""
    wanted: Allocator | None
    """Where the CRs put it; differs from `allocator` while the node is held."""
    current: Allocator | None
    """The allocator its deploy labels give it now (None: neither yet)."""
    reason: str = ""
    """Why it is held, has no allocator, or is in conflict; "" otherwise."""

    @property
    def held(self) -> bool:
        return self.allocator != self.wanted

    @property
    def moving(self) -> bool:
        """The node changes allocator in this pass (its GPU pods are gone)."""
        return self.current is not None and self.allocator != self.current


@dataclass(frozen=True)
class AllocatorConflict:
    """GPU nodes a GPUCluster selects that the ClusterPolicy keeps."""

    gpucluster: str
    nodes: tuple[str, ...]
    reason: str = REASON_CONFLICTING_NODE_SELECTOR

    def message(self) -> str:
        shown = ", ".join(self.nodes[:NODES_NAMED])
        more = len(self.nodes) - NODES_NAMED
        count = f"{len(self.nodes)} node" + ("" if len(self.nodes) == 1 else "s")
        return (
            f"its nodeSelector selects {count} the ClusterPolicy keeps for VM workloads "
            f"(sandboxWorkloads): {shown}" + (f" and {more} more" if more > 0 else "") + "; they stay the "
            "ClusterPolicy's until the nodeSelector or their nvidia.com/gpu.workload.config changes"
        )


@dataclass(frozen=True)
class AllocatorSplit:
    """Every GPU node's allocator, and what the GPUClusters should be told."""

    nodes: Mapping[str, NodeAllocation]
    gpucluster: str | None = None
    """The GPUCluster in charge of the DRA stack (parsed, named gpu-cluster), None if none."""
    conflicts: tuple[AllocatorConflict, ...] = ()
    ignored: Mapping[str, str] = field(default_factory=dict)
    """GPUCluster name → why it is ignored."""

    def on(self, allocator: Allocator) -> frozenset[str]:
        return frozenset(name for name, a in self.nodes.items() if a.allocator is allocator)

    def withheld(self, node: str) -> frozenset[str]:
        """The ClusterPolicy's components (by name) not to deploy on `node`: on a DRA node all but the
        driver and the toolkit, and so on a node waiting to move to DRA (its device plugin goes first, so
        that no new `nvidia.com/gpu` pod lands there while its GPU pods go); none on others (their own
        rules decide)."""
        allocation = self.nodes.get(node)
        if allocation is None or Allocator.DRA not in (allocation.allocator, allocation.wanted):
            return frozenset()
        return WITHHELD_ON_DRA

    def other_stack_labels(self, node: str) -> frozenset[str]:
        """The deploy label keys of the stack `node` does not run, which it carries only as leftovers:
        the DRA stack's own unless the node is on DRA; the device plugin stack's where `withheld` keeps
        its components off (a DRA node, or one moving there). Empty for a node that is not a GPU node."""
        allocation = self.nodes.get(node)
        if allocation is None:
            return frozenset()
        keys = frozenset() if allocation.allocator is Allocator.DRA else DRA_ONLY_LABELS
        if self.withheld(node):
            keys |= DEVICE_PLUGIN_ONLY_LABELS
        return keys

    def deploy_labels(self, node: str) -> dict[str, str]:
        """The DRA stack's deploy labels `node` should carry ({} when it is not a DRA node)."""
        allocation = self.nodes.get(node)
        if allocation is None or allocation.allocator is not Allocator.DRA:
            return {}
        return dict(DRA_DEPLOY_LABELS)


def current_allocator(labels: Mapping[str, str]) -> Allocator | None:
    """The allocator a node's deploy labels give it now: the DRA kubelet plugin's label wins (it stays
    until its claims are unprepared, so it is the last to go); a pause (`paused-for-...`) still counts."""
    if labels.get(DRA_DRIVER_LABEL, "") not in UNSET:
        return Allocator.DRA
    if labels.get(DEVICE_PLUGIN_LABEL, "") not in UNSET:
        return Allocator.DEVICE_PLUGIN
    return None


def keeps_for_vms(labels: Mapping[str, str], policy: ClusterPolicySpec | None) -> bool:
    """The ClusterPolicy keeps the node for VM workloads (NVIDIA's getWorkloadConfig)."""
    if policy is None or not policy.sandboxWorkloads.enabled:
        return False
    workload = labels.get(WORKLOAD_CONFIG_LABEL) or policy.sandboxWorkloads.defaultWorkload
    return workload in VM_WORKLOADS


def _in_charge(
    gpuclusters: Iterable[GPUClusterObject],
) -> tuple[GPUClusterObject | None, dict[str, str]]:
    chosen, ignored = None, {}
    for gc in sorted(gpuclusters, key=lambda g: g.name):
        if gc.name == SINGLETON_NAME:
            chosen = gc
        else:
            ignored[gc.name] = f"ignored: {SINGLETON_MESSAGE}"
    return chosen, ignored


def _held(current: Allocator | None, wanted: Allocator | None, pods: int) -> str:
    if current is None or current is wanted or pods <= 0:
        return ""
    new = "no allocator" if wanted is None else f"the {wanted.value} allocator"
    return (
        f"moving to {new} waits until its {pods} GPU pod{'' if pods == 1 else 's'} of the "
        f"{current.value} allocator are gone (drain the node to move it now)"
    )


def _holding(
    current: Allocator | None, wanted: Allocator | None, found: int | Mapping[Allocator, int]
) -> tuple[Allocator | None, int]:
    """The allocator the node's GPU pods hold it on and how many of them there are: an int counts the
    pods of `current`; per allocator, the pods of any allocator but `wanted` (the node's device plugin
    label may be gone already: its pods still hold it)."""
    if isinstance(found, int):
        return current, found
    old = {a: n for a, n in found.items() if a is not wanted and n > 0}
    if not old:
        return current, 0
    holder = current if current in old else sorted(old)[0]
    return holder, sum(old.values())


def split_allocators(
    nodes: Iterable[NodeInfo],
    policy: ClusterPolicySpec | None,
    gpuclusters: Iterable[GPUClusterObject],
    gpu_pods: Mapping[str, int | Mapping[Allocator, int]] | None = None,
    unlisted: Collection[str] = (),
) -> AllocatorSplit:
    """Each GPU node's allocator (see the module's docstring). `gpu_pods`: per node, the count of the
    pods holding its GPUs through its current allocator, or those counts per allocator; `unlisted`: the
    nodes whose pods are not known yet (a node that would move waits for them)."""
    gc, ignored = _in_charge(gpuclusters)
    pods = gpu_pods or {}
    allocations: dict[str, NodeAllocation] = {}
    conflicted: list[str] = []
    for node in sorted((n for n in nodes if n.is_gpu), key=lambda n: n.name):
        labels = node.labels
        current = current_allocator(labels)
        if labels.get(DEPLOY_OPERANDS) == "false":
            allocations[node.name] = NodeAllocation(
                node.name, None, None, current, f"{DEPLOY_OPERANDS}=false: no operand runs on it"
            )
            continue
        reason = ""
        if gc is None or gc.deleting:
            selected = False
        elif gc.spec is None:
            # Its nodeSelector is unknown: its nodes stay, no new node joins it.
            selected = current is Allocator.DRA
            reason = f"GPUCluster {gc.name} does not parse: the node stays as it is" if selected else ""
        else:
            selected = gc.selects(labels)
        if selected and keeps_for_vms(labels, policy):
            conflicted.append(node.name)
            selected = False
            reason = (
                "the ClusterPolicy keeps it for VM workloads (sandboxWorkloads); the GPUCluster selects it"
            )
        wanted = Allocator.DRA if selected else (Allocator.DEVICE_PLUGIN if policy is not None else None)
        holder, count = _holding(current, wanted, pods.get(node.name, 0))
        held = _held(holder, wanted, count)
        if (
            not held
            and node.name in unlisted
            and current is not wanted
            and Allocator.DRA in (current, wanted)
        ):
            held = "moving allocator waits until its pods are listed"
            holder = current
        allocator = holder if held else wanted
        if not reason and wanted is None and not held:
            reason = "no ClusterPolicy, and no GPUCluster selects it"
        allocations[node.name] = NodeAllocation(node.name, allocator, wanted, current, held or reason)
    conflicts = (AllocatorConflict(gc.name, tuple(conflicted)),) if gc is not None and conflicted else ()
    return AllocatorSplit(
        MappingProxyType(allocations),
        gc.name if gc is not None and gc.spec is not None else None,
        conflicts,
        MappingProxyType(ignored),
    )
