"""`driver.upgradePolicy`: NVIDIA's DriverUpgradePolicySpec (k8s-operator-libs
api/upgrade/v1alpha1/upgrade_spec.go) with its names, defaults and meanings, plus two extensions of
this operator (`canary`, `validation`) that NVIDIA's operator ignores.

The state machine that acts on it is gpu_operator/core/upgrade/.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from gpu_operator.api.common import IntOrPercent, Labels, Model, NonNegativeInt, PositiveInt
from gpu_operator.api.quoting import quoted
from gpu_operator.api.selector import LABEL_VALUE, valid_selector

SELECTOR_MAX = 4096
"""The longest label selector: dozens of requirements."""
LabelSelector = Annotated[str, Field(max_length=SELECTOR_MAX), AfterValidator(valid_selector)]


def _label_values(value: dict[str, str]) -> dict[str, str]:
    for key, text in value.items():
        if len(text) > 63 or not LABEL_VALUE.fullmatch(text):
            raise ValueError(f"{quoted(text)} (for {quoted(key)}) is not a valid label value")
    return value


NodeSelector = Annotated[Labels, AfterValidator(_label_values)]


class WaitForCompletionSpec(Model):
    """Wait for jobs on the node to finish before its GPU pods are deleted."""

    podSelector: LabelSelector | None = None
    """Label selector of the pods to wait for (Running or Pending ones on the node); empty: no wait."""
    timeoutSeconds: NonNegativeInt = 0
    """How long to wait before deleting them anyway; 0 waits forever."""


class PodDeletionSpec(Model):
    """Eviction of the node's GPU pods (those requesting nvidia.com/gpu* or nvidia.com/mig-*), through the
    Eviction API so that PodDisruptionBudgets hold."""

    force: bool = False
    """Also delete GPU pods that no controller manages; and, extension of this operator, once
    timeoutSeconds has passed delete the pods whose eviction is still refused (bypassing their
    PodDisruptionBudget) instead of failing the node."""
    timeoutSeconds: NonNegativeInt = 300
    """How long evictions may take (a PodDisruptionBudget may refuse them meanwhile); 0 waits forever."""
    deleteEmptyDir: bool = False
    """Also delete GPU pods that use emptyDir volumes (their data is lost)."""


class DrainSpec(Model):
    """Drain of the node (as `kubectl drain`) before the driver restarts; DaemonSet and mirror pods stay."""

    enable: bool = False
    """Drain the node. Also the fallback when GPU pods cannot be deleted (NVIDIA's rule)."""
    force: bool = False
    """Also drain pods that no controller manages; and, extension of this operator, once timeoutSeconds
    has passed delete the pods whose eviction is still refused instead of failing the node."""
    podSelector: LabelSelector | None = None
    """Only drain pods matching this label selector. Pods labelled
    nvidia.com/gpu-driver-upgrade-drain.skip=true are never drained."""
    timeoutSeconds: NonNegativeInt = 300
    """How long the drain may take; 0 waits forever."""
    deleteEmptyDir: bool = False
    """Also drain pods that use emptyDir volumes (their data is lost)."""


class CanarySpec(Model):
    """Extension of this operator (ignored by NVIDIA's operator): a canary stage. Canary nodes are
    upgraded first, with no other node in progress; every other node waits until the canary nodes run
    the new driver, have passed the validation gate, and soakSeconds have passed since the last of them
    finished."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.nodeSelector) || has(self.count)",
                    "message": "canary needs nodeSelector, count or both",
                }
            ]
        }
    )

    KEEP_EMPTY: ClassVar[frozenset[str]] = frozenset({"nodeSelector"})

    nodeSelector: NodeSelector | None = None
    """Canary nodes are the GPU nodes with all these labels (with count: count of them); `{}` selects
    every GPU node."""
    count: PositiveInt | None = None
    """Number of canary nodes, among the nodes to upgrade (or nodeSelector's): already cordoned ones
    first, then by name."""
    soakSeconds: NonNegativeInt = 0
    """How long the upgraded canary nodes run before the other nodes start."""

    @model_validator(mode="after")
    def _selects_something(self) -> CanarySpec:
        if self.nodeSelector is None and self.count is None:
            raise ValueError("canary needs nodeSelector, count or both")
        return self


class ValidationSpec(Model):
    """Extension of this operator (ignored by NVIDIA's operator): the validation gate. A node is done only
    once its new driver pod and the operator-validator pod started after it are Ready; otherwise it
    goes upgrade-failed, which pauses the upgrade of every other node."""

    timeoutSeconds: NonNegativeInt = 600
    """How long the gate waits (NVIDIA's fixed validation timeout is 600 s); 0 waits forever."""


class UpgradePolicySpec(Model):
    """Automatic, rolling driver upgrades, node by node: cordon, wait for jobs, evict GPU pods, drain,
    restart the driver pod, validate, uncordon. The state of each node is its
    nvidia.com/gpu-driver-upgrade-state label. A failed node pauses the upgrade (extension of this
    operator); setting the previous version rolls back by the same path, failed nodes first."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.podDeletion) || !has(self.gpuPodDeletion)",
                    "message": "give podDeletion or its Helm name gpuPodDeletion, not both",
                }
            ]
        }
    )

    autoUpgrade: bool = False
    """Let the operator upgrade the driver node by node; when false the driver DaemonSet (OnDelete)
    waits for you to delete each node's driver pod, and all other fields are ignored."""
    maxParallelUpgrades: NonNegativeInt = 1
    """Nodes upgraded at once; 0 means no limit."""
    maxUnavailable: IntOrPercent = "25%"
    """GPU nodes with the driver that may be unavailable (cordoned or not Ready) at once, counting nodes
    that already are: a count, or a percentage of those nodes rounded up."""
    waitForCompletion: WaitForCompletionSpec | None = None
    """Wait for jobs to complete first."""
    podDeletion: PodDeletionSpec | None = None
    """Eviction of GPU pods (defaults apply when absent)."""
    gpuPodDeletion: PodDeletionSpec | None = None
    """NVIDIA's Helm name for podDeletion, accepted as an alias."""
    drain: DrainSpec | None = None
    """Drain the node first."""
    canary: CanarySpec | None = None
    """Upgrade canary nodes first."""
    validation: ValidationSpec | None = None
    """The validation gate."""

    @model_validator(mode="after")
    def _one_pod_deletion(self) -> UpgradePolicySpec:
        if self.podDeletion is not None and self.gpuPodDeletion is not None:
            raise ValueError("give podDeletion or its Helm name gpuPodDeletion, not both")
        return self

    def pod_deletion(self) -> PodDeletionSpec:
        return self.podDeletion or self.gpuPodDeletion or PodDeletionSpec()

    def max_unavailable(self, nodes: int) -> int:
        """NVIDIA's GetScaledValueFromIntOrPercent(maxUnavailable, nodes, roundUp=true)."""
        value = self.maxUnavailable
        if isinstance(value, str) and value.endswith("%"):
            return math.ceil(int(value[:-1]) * nodes / 100)
        return int(value)
