"""ClusterPolicy status: NVIDIA's `state` and `Ready`/`Error` conditions, plus a per-component summary
that says which component is not ready, on which nodes, and why."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpu_operator.api.common import Model

State = Literal["ready", "notReady", "ignored"]
ComponentState = Literal["ready", "notReady", "disabled", "unsupported"]

# Condition reasons, as NVIDIA writes them (internal/conditions/consts.go), plus ours.
REASON_RECONCILED = "Reconciled"
REASON_NO_GPU_NODES = "NoGPUNodes"
REASON_OPERAND_NOT_READY = "OperandNotReady"
REASON_RECONCILE_FAILED = "ReconcileFailed"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_IGNORED = "NotActivePolicy"


class Condition(Model):
    """A metav1.Condition."""

    type: str
    """Ready or Error."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str
    """One-word CamelCase reason."""
    message: str = ""
    """Human-readable explanation."""
    lastTransitionTime: str
    """When the status last changed (RFC 3339)."""
    observedGeneration: int | None = None
    """The spec generation the condition was computed from."""


class NodeProblem(Model):
    """Why a component is not ready on one node."""

    node: str
    """Node name."""
    reason: str
    """Short reason: a waiting reason (CrashLoopBackOff, ImagePullBackOff), Unschedulable, NotReady, ..."""
    message: str = ""
    """Details, e.g. the container's last message."""


class ComponentStatus(Model):
    """Readiness of one operand across the GPU nodes."""

    name: str
    """Component name (driver, container-toolkit, device-plugin, ...)."""
    enabled: bool
    """Whether the policy enables it."""
    state: ComponentState
    """ready, notReady, disabled or unsupported."""
    nodesDesired: int = 0
    """GPU nodes that should run it."""
    nodesReady: int = 0
    """Nodes where its pod is ready."""
    nodesWaiting: int = 0
    """Nodes where it waits for a dependency to become ready first."""
    nodesFailing: int = 0
    """Nodes where its pod exists but is not ready."""
    reason: str = ""
    """One-line summary of what is wrong."""
    problems: list[NodeProblem] = Field(default_factory=list)
    """Per-node problems (at most a few, the rest counted in reason)."""


class ClusterPolicyStatus(Model):
    """Observed state of the GPU stack."""

    state: State | None = None
    """ready, notReady or ignored (another ClusterPolicy is active)."""
    namespace: str | None = None
    """Namespace of the operands."""
    observedGeneration: int | None = None
    """The spec generation this status describes."""
    gpuNodes: int | None = None
    """Nodes with nvidia.com/gpu.present=true that take operands."""
    componentsReady: str | None = None
    """Ready components out of enabled ones, e.g. 7/7."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready and Error, as NVIDIA's operator writes them."""
    components: list[ComponentStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Per-component readiness, in dependency order."""
