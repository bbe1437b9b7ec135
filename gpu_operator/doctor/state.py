"""What doctor records of a cluster and what it reports: `ClusterState`, `Finding`, `Scope`, and
which objects are worth recording (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator.core.ownership import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.scheduling import (
    GPU,
    gpu_request,
)

Severity = Literal["error", "warning"]
Obj = Mapping[str, Any]

UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_STARTED = (
    "nvidia.com/gpu-driver-upgrade-validation-start-time",
    "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time",
    # This operator's: when the node entered its current state (gpu_operator/core/upgrade/states.py).
    "nvidia.com/gpu-driver-upgrade-state-start-time",
)
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
STARTUP_GRACE_SECONDS = 300
"""A pod still coming up (ContainerCreating, PodInitializing) is a problem only after this long."""
UPGRADE_STUCK_SECONDS = 3600
LOG_LINES = 10


@dataclass(frozen=True)
class ClusterState:
    """What doctor records of a cluster (JSON-serialisable; `gpu-operator doctor --save-state`)."""

    namespace: str
    """The operands' namespace."""
    now: str
    """When it was recorded (RFC 3339)."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    """GPU pods (requesting nvidia.com/gpu*, setting NVIDIA_VISIBLE_DEVICES or a runtimeClassName)
    and the operand pods."""
    requested: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node → resource → what all pods bound to it request (scheduling.requested_by_node)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    runtime_classes: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] | None = field(default_factory=list)
    """ClusterPolicies; None when the CRD is not installed."""
    nvidia_drivers: list[dict[str, Any]] | None = None
    """NVIDIADrivers; None when not read: no ClusterPolicy delegates its driver to them
    (driver.useNvidiaDriverCRD), or their CRD is not installed."""
    logs: dict[str, str] = field(default_factory=dict)
    """"namespace/pod/container" → its last log lines (or why they could not be read)."""
    resource_claims: list[dict[str, Any]] | None = None
    """ResourceClaims, ResourceSlices, DeviceClasses and GPUClusters (doctor/dra.py); None when not read:
    no recorded pod names a ResourceClaim, or resource.k8s.io is not served."""
    resource_slices: list[dict[str, Any]] | None = None
    device_classes: list[dict[str, Any]] | None = None
    gpuclusters: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    object: str
    """What it is about: "pod NS/NAME", "node NAME", "clusterpolicy NAME", "replicaset NS/NAME", ..."""
    cause: str
    """One line a person can act on."""
    node: str = ""
    pod: str = ""
    """NAMESPACE/NAME of the pod it is about, if any."""
    details: tuple[str, ...] = ()
    commands: tuple[Command, ...] = ()


@dataclass(frozen=True)
class Scope:
    """The whole cluster, one node or one pod (NAMESPACE/NAME)."""

    node: str = ""
    pod: str = ""


# --- what is recorded ------------------------------------------------------------------------------


def is_operand(pod: Obj, namespace: str) -> bool:
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return metadata.get("namespace") == namespace and labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER


def _env_names(pod: Obj) -> set[str]:
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return {env.get("name", "") for c in containers for env in c.get("env") or []}


def is_gpu_pod(pod: Obj) -> bool:
    """Asks for GPUs one way or another: nvidia.com/gpu*, NVIDIA_VISIBLE_DEVICES, a runtimeClassName."""
    return (
        gpu_request(pod) > 0
        or VISIBLE_DEVICES in _env_names(pod)
        or bool((pod.get("spec") or {}).get("runtimeClassName"))
    )


def rejected_by_kubelet(pod: Obj) -> bool:
    """Failed at admission on the node: the device plugin had fewer GPUs than the scheduler thought."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    return status.get("phase") == "Failed" and (
        reason == "UnexpectedAdmissionError" or reason.startswith("OutOf")
    )


def worth_recording(pod: Obj, namespace: str) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    if is_operand(pod, namespace):
        return True
    if (pod.get("spec") or {}).get("resourceClaims") and phase in (None, "Pending"):
        return True  # DRA: its claims may be for NVIDIA GPUs (doctor/dra.py)
    return is_gpu_pod(pod) and (phase not in ("Succeeded", "Failed") or rejected_by_kubelet(pod))


# Messages of the API server about GPU requests it refuses (k8s.io/kubernetes v1.36
# pkg/apis/core/validation/validation.go:7977,7982,77; apiserver admission/plugin/resourcequota/
# controller.go:622; plugin/pkg/admission/runtimeclass/admission.go:158).
QUOTA_MESSAGE = re.compile(r"exceeded quota: ([^,]+), requested: (\S+), used: (\S+), limited: (\S+)")
RUNTIME_CLASS_MESSAGE = re.compile(r'RuntimeClass "([^"]+)" not found')
NOT_EQUAL_MESSAGE = "must be equal to nvidia.com/gpu"
NOT_INTEGER_MESSAGE = "must be an integer"
NO_LIMIT_MESSAGE = "Limit must be set for non overcommitable resources"


def rejection(message: str) -> str | None:
    """The code of a create the API server refused for a GPU reason, or None."""
    quota = QUOTA_MESSAGE.search(message)
    if quota and GPU in quota[2]:
        return "GPUQuotaExceeded"
    if (
        NOT_EQUAL_MESSAGE in message
        or (NOT_INTEGER_MESSAGE in message and GPU in message)
        or NO_LIMIT_MESSAGE in message
    ):
        return "GPURequestRejected"
    if RUNTIME_CLASS_MESSAGE.search(message):
        return "RuntimeClassNotFound"
    return None


def event_worth_recording(event: Obj, pod_uids: set[str]) -> bool:
    """Warnings about recorded pods, and refused creates of GPU pods."""
    if event.get("type") != "Warning":
        return False
    involved = event.get("involvedObject") or {}
    return involved.get("uid") in pod_uids or rejection(str(event.get("message") or "")) is not None


def quota_worth_recording(quota: Obj) -> bool:
    return any(GPU in key for key in ((quota.get("spec") or {}).get("hard") or {}))
