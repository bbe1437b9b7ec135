"""GPU workload types per node: containers, VM passthrough or vGPU (pure, no I/O).

With `sandboxWorkloads.enabled`, each GPU node runs one of three stacks, chosen by its label
`nvidia.com/gpu.workload.config` (else `sandboxWorkloads.defaultWorkload`), as NVIDIA's node labeller
does (controllers/state_manager.go getWorkloadConfig, gpuStateLabels, getEffectiveStateLabels): the
driver, toolkit and device-plugin stack for containers; the VFIO manager, sandbox validator and a
sandbox device plugin for VM passthrough; the vGPU manager, vGPU device manager, sandbox validator and
sandbox device plugin for vGPU. Without sandbox workloads every node runs containers, whatever its
label says. A label with another value counts as the default, as NVIDIA's does (it logs a warning; the
status here names the node).

Which stack a component belongs to is `Component.workloads` (gpu_operator/core/components.py), so that
the node labeller decides by record, not by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gpu_operator.api.spec import ClusterPolicySpec

WORKLOAD_LABEL: Final = "nvidia.com/gpu.workload.config"
CONTAINER: Final = "container"
VM_PASSTHROUGH: Final = "vm-passthrough"
VM_VGPU: Final = "vm-vgpu"
WORKLOADS: Final = (CONTAINER, VM_PASSTHROUGH, VM_VGPU)
SANDBOXED: Final = frozenset({VM_PASSTHROUGH, VM_VGPU})
ALL: Final = frozenset(WORKLOADS)
CONTAINERS: Final = frozenset({CONTAINER})


def workload_type(labels: Mapping[str, str], policy: ClusterPolicySpec) -> str:
    """The node's workload type under this policy (see the module docstring)."""
    sandbox = policy.sandboxWorkloads
    if not sandbox.enabled:
        return CONTAINER
    value = labels.get(WORKLOAD_LABEL)
    return value if value in WORKLOADS else sandbox.defaultWorkload


def invalid_label(labels: Mapping[str, str], policy: ClusterPolicySpec) -> str | None:
    """The node's workload label when sandbox workloads are on and it names no workload type (the node
    then runs the default one); None when it is absent or valid."""
    value = labels.get(WORKLOAD_LABEL)
    if not policy.sandboxWorkloads.enabled or value is None or value in WORKLOADS:
        return None
    return value
