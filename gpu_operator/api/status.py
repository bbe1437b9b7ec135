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
REASON_PREREQUISITE_NOT_MET = "PrerequisiteNotMet"
REASON_CONFLICT = "ObjectConflict"
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


class NodeUpgrade(Model):
    """One node's driver upgrade: where it is, since when, and why it is there."""

    node: str
    """Node name."""
    state: str
    """Its nvidia.com/gpu-driver-upgrade-state label (NVIDIA's values)."""
    since: str | None = None
    """When it entered that state (RFC 3339)."""
    reason: str = ""
    """What it waits for, or why it failed."""


class PendingNodes(Model):
    """Nodes that wait to start their upgrade, for the same reason."""

    reason: str
    """Why they wait: a limit, the canary stage, a pause, the skip label, a manual restart."""
    count: int
    """How many nodes wait for this reason."""
    nodes: list[str] = Field(default_factory=list)
    """Their names (the first few)."""


class CanaryStatus(Model):
    """The canary stage of the current upgrade."""

    nodes: list[str] = Field(default_factory=list)
    """The canary nodes (upgraded or in progress)."""
    required: int = 0
    """How many canary nodes must be upgraded before the others start."""
    complete: bool = False
    """The canary nodes are upgraded, validated and soaked: the other nodes may start."""
    soakUntil: str | None = None
    """When the soak time ends (RFC 3339)."""


class DriverUpgradeStatus(Model):
    """Where the driver upgrade stands: every node that is not done says why."""

    autoUpgrade: bool
    """driver.upgradePolicy.autoUpgrade: false means each node waits for a manual driver pod restart."""
    targetVersion: str = ""
    """The driver version being rolled out."""
    summary: str = ""
    """One line: up to date, N/M upgraded, canary, paused, or manual."""
    paused: bool = False
    """A node failed, so no further node starts."""
    pausedReason: str = ""
    """Which node failed, at which step, why, and how to go on."""
    nodes: int = 0
    """GPU nodes running the driver."""
    nodesDone: int = 0
    """Nodes at the target driver."""
    nodesInProgress: int = 0
    """Nodes being upgraded."""
    nodesFailed: int = 0
    """Nodes in upgrade-failed."""
    nodesPending: int = 0
    """Nodes waiting to start."""
    inProgress: list[NodeUpgrade] = Field(default_factory=list)
    """Nodes being upgraded: step, since when, and what each waits for."""
    failed: list[NodeUpgrade] = Field(default_factory=list)
    """Failed nodes: the step that failed and why."""
    pending: list[PendingNodes] = Field(default_factory=list)
    """Nodes waiting to start, grouped by reason."""
    canary: CanaryStatus | None = None
    """The canary stage (driver.upgradePolicy.canary)."""


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
    workloads: dict[str, int] | None = None
    """GPU nodes per workload type (container, vm-passthrough, vm-vgpu), while sandboxWorkloads is
    enabled: nvidia.com/gpu.workload.config, else sandboxWorkloads.defaultWorkload."""
    driverUpgrade: DriverUpgradeStatus | None = None
    """Driver upgrades (driver.upgradePolicy): per node step, since when and why. While NVIDIADrivers
    run the driver (driver.useNvidiaDriverCRD), their upgrades added up: each upgrades its own nodes,
    and its status says how."""
