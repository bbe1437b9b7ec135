"""GPU-node detection and the node labels the operator owns (pure functions, no I/O).

The operator writes node labels with server-side apply under its own field manager, so
`managedFields` tells which labels are its own: those are the only ones it ever changes or removes.
A value another tool or a person set (`false`, `paused-for-driver-upgrade`, ...) is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.components import BY_NAME, COMPONENTS, Component, mig_capable
from gpu_operator.images import KERNEL_LABEL, os_tag
from gpu_operator.render import ClusterFacts

FIELD_MANAGER = "gpu-operator"
GPU_PRESENT = "nvidia.com/gpu.present"
DEPLOY_OPERANDS = "nvidia.com/gpu.deploy.operands"
MIG_CONFIG = "nvidia.com/mig.config"
GPU_RESOURCE = "nvidia.com/gpu"
NFD_PREFIX = "feature.node.kubernetes.io/"
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

    @property
    def is_gpu(self) -> bool:
        """NFD saw an NVIDIA PCI device, someone else marked it as a GPU node, or it advertises GPUs."""
        if any(self.labels.get(key) == "true" for key in PCI_LABELS):
            return True
        if self.labels.get(GPU_PRESENT) == "true" and GPU_PRESENT not in self.own_labels:
            return True
        return self.gpu_allocatable > 0

    @property
    def has_nfd(self) -> bool:
        return any(key.startswith(NFD_PREFIX) for key in self.labels)


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


def _quantity_int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_info(body: Mapping[str, Any]) -> NodeInfo:
    metadata = body.get("metadata") or {}
    allocatable = (body.get("status") or {}).get("allocatable") or {}
    return NodeInfo(
        name=metadata["name"],
        labels=dict(metadata.get("labels") or {}),
        gpu_allocatable=_quantity_int(allocatable.get(GPU_RESOURCE, 0)),
        own_labels=owned_label_keys(metadata.get("managedFields") or ()),
    )


def gpu_nodes(nodes: Iterable[NodeInfo]) -> list[NodeInfo]:
    return sorted((n for n in nodes if n.is_gpu), key=lambda n: n.name)


def cluster_facts(
    nodes: Iterable[Mapping[str, Any]] | Iterable[NodeInfo], namespace: str, environ: Mapping[str, str]
) -> ClusterFacts:
    """Rendering facts from the nodes: like NVIDIA, the OS and kernel of the first GPU node."""
    infos = [n if isinstance(n, NodeInfo) else node_info(n) for n in nodes]
    gpus = gpu_nodes(infos)
    first = gpus[0].labels if gpus else {}
    return ClusterFacts(
        namespace=namespace, os_tag=os_tag(first), kernel=first.get(KERNEL_LABEL), environ=dict(environ)
    )


def takes_operands(node: NodeInfo) -> bool:
    return node.is_gpu and node.labels.get(DEPLOY_OPERANDS) != "false"


def runs_on(component: Component, node: NodeInfo) -> bool:
    """Whether an (enabled) component belongs on this node, before dependency gating.

    A deploy label another tool or a person set to anything but "true" opts the node out.
    """
    if not takes_operands(node) or not component.node_filter(node.labels):
        return False
    value = node.labels.get(component.deploy_label)
    return value is None or value == "true" or component.deploy_label in node.own_labels


IsReady = Callable[[str, str], bool]
"""(component name, node name) → whether that component's pod on that node is ready."""


def dependencies_met(
    component: Component, policy: ClusterPolicySpec, node: NodeInfo, is_ready: IsReady
) -> list[str]:
    """The dependencies still to become ready on this node before `component` may start there.

    A dependency that does not run on the node (disabled in the policy, or opted out by a node label
    such as a pre-installed driver) counts as satisfied; its own dependencies then apply.
    """
    waiting: list[str] = []
    for name in component.depends_on:
        dep = BY_NAME[name]
        if dep.enabled(policy) and runs_on(dep, node):
            if not is_ready(name, node.name):
                waiting.append(name)
        else:
            waiting.extend(d for d in dependencies_met(dep, policy, node, is_ready) if d not in waiting)
    return waiting


def desired_labels(node: NodeInfo, policy: ClusterPolicySpec | None, is_ready: IsReady) -> dict[str, str]:
    """The complete set of labels the operator wants to own on `node` (server-side apply removes the rest).

    Deploy labels are added once a component's dependencies are ready on the node and then kept
    (a restarting driver pod does not tear down the stack above it). With no active policy the set is
    empty, which removes every label the operator added.
    """
    if policy is None or not node.is_gpu:
        return {}
    labels: dict[str, str] = {}
    if not _foreign(node, GPU_PRESENT):
        labels[GPU_PRESENT] = "true"
    if not takes_operands(node):
        return labels
    for component in COMPONENTS:
        key = component.deploy_label
        if not component.enabled(policy) or not runs_on(component, node) or _foreign(node, key):
            continue
        already = key in node.own_labels and node.labels.get(key) == "true"
        if already or not dependencies_met(component, policy, node, is_ready):
            labels[key] = "true"
    # NVIDIA's rule: MIG-capable nodes without a MIG layout get the default one, for mig-manager to apply.
    mig_default = policy.migManager.config.default if policy.migManager.config else "all-disabled"
    if (
        BY_NAME["mig-manager"].enabled(policy)
        and mig_capable(node.labels)
        and mig_default == "all-disabled"
        and not _foreign(node, MIG_CONFIG)
    ):
        labels[MIG_CONFIG] = "all-disabled"
    return labels


def _foreign(node: NodeInfo, key: str) -> bool:
    """The label exists and someone else owns it: never overwrite or remove it."""
    return key in node.labels and key not in node.own_labels
