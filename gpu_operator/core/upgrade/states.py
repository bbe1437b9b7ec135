"""NVIDIA's upgrade states, node labels and node annotations (k8s-operator-libs pkg/upgrade/consts.go,
driver name `gpu` as gpu-operator's cmd/gpu-operator/main.go sets it), plus the two annotations this
operator adds so that every timeout and every failure survives an operator restart."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Values of the node label nvidia.com/gpu-driver-upgrade-state, in NVIDIA's processing order."""

    UNKNOWN = ""
    UPGRADE_REQUIRED = "upgrade-required"
    CORDON_REQUIRED = "cordon-required"
    WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
    POD_DELETION_REQUIRED = "pod-deletion-required"
    DRAIN_REQUIRED = "drain-required"
    POD_RESTART_REQUIRED = "pod-restart-required"
    VALIDATION_REQUIRED = "validation-required"
    UNCORDON_REQUIRED = "uncordon-required"
    DONE = "upgrade-done"
    FAILED = "upgrade-failed"

    @classmethod
    def of(cls, value: str | None) -> State:
        """The state a label value names; anything else (including NVIDIA's maintenance-operator states,
        which this operator does not implement) reads as unknown and is decided afresh."""
        try:
            return cls(value or "")
        except ValueError:
            return cls.UNKNOWN


IDLE = frozenset({State.UNKNOWN, State.DONE, State.UPGRADE_REQUIRED})
"""Not in progress: NVIDIA's GetUpgradesInProgress counts every other state, upgrade-failed included."""
BEFORE_RESTART = (
    State.CORDON_REQUIRED,
    State.WAIT_FOR_JOBS_REQUIRED,
    State.POD_DELETION_REQUIRED,
    State.DRAIN_REQUIRED,
)
"""The steps that make the node safe for a driver restart, in order."""

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
DRAIN_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade-drain.skip"
"""Pods with this label set to true are never drained (NVIDIA appends `!= true` to drain.podSelector)."""

# NVIDIA's node annotations. Times are Unix seconds as decimal strings, as NVIDIA writes them.
SAFE_LOAD_ANNOTATION = "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load"
INITIAL_UNSCHEDULABLE_ANNOTATION = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
WAIT_FOR_JOBS_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
VALIDATION_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-validation-start-time"
REQUESTED_ANNOTATION = "nvidia.com/gpu-driver-upgrade-requested"
AUTO_UPGRADE_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
"""Set to true on GPU nodes while autoUpgrade is on (gpu-operator controllers/nodelabeling_controller.go
setDriverAutoUpgradeAnnotation): k8s-driver-manager reads it (cmd/driver-manager/main.go
fetchAutoUpgradeAnnotation) and leaves eviction and drain to the upgrade controller."""

# This operator's own annotations.
STATE_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-state-start-time"
"""When the node entered its current state: the clock of pod-deletion and drain timeouts, the canary
soak and the status' `since`."""
FAILURE_ANNOTATION = "nvidia.com/gpu-driver-upgrade-failure"
"""JSON {step, revision, reason} of an upgrade-failed node: what failed, at which target, and why."""

ANNOTATION_PREFIX = "nvidia.com/gpu-driver-upgrade"
"""Every annotation above starts with it: the node annotations the caller keeps for the machine."""

EVENT_REASON = "GPUDriverUpgrade"
"""NVIDIA's Event reason for every upgrade step on a node (k8s-operator-libs pkg/upgrade/util.go)."""
