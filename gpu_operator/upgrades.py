"""The driver upgrade as part of every pass (pure): the state machine's facts from what the watches
saw, its plan, and the status it writes.

The watches give the driver and validator pods, the driver DaemonSets and their ControllerRevisions,
and the pods of the nodes being emptied (Store.snapshot puts them in `Observed.upgrade`); the GPU
nodes and the time are added here. The state machine itself is gpu_operator/upgrade/.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus, DriverUpgradeStatus
from gpu_operator.components import BY_NAME
from gpu_operator.nodes import NodeInfo, gpu_nodes, runs_on
from gpu_operator.observed import component_of
from gpu_operator.upgrade import Facts, UpgradeNode, UpgradePlan, plan_upgrade
from gpu_operator.upgrade.facts import image_tag

VALIDATOR = BY_NAME["operator-validator"]


def upgrade_nodes(nodes: Iterable[NodeInfo], spec: ClusterPolicySpec) -> list[UpgradeNode]:
    """The GPU nodes as the state machine sees them; the validation gate waits for a validator only
    where one runs (enabled, and the node not opted out of it)."""
    validating = VALIDATOR.enabled(spec)
    return [
        UpgradeNode(
            name=n.name,
            labels=n.labels,
            annotations=n.upgrade_annotations,
            unschedulable=n.unschedulable,
            ready=n.ready,
            validator_expected=validating and runs_on(VALIDATOR, n),
        )
        for n in gpu_nodes(nodes)
    ]


def target_version(objects: Iterable[Mapping[str, Any]]) -> str:
    """The driver image tags the rendered driver DaemonSets carry (one per kernel when precompiled)."""
    tags = set()
    for obj in objects:
        if obj["kind"] == "DaemonSet" and component_of(obj["metadata"]) == "driver":
            containers = obj["spec"]["template"]["spec"]["containers"]
            tags.add(image_tag(str(containers[0].get("image") or "")))
    return ", ".join(sorted(t for t in tags if t))


def plan_driver_upgrade(
    spec: ClusterPolicySpec,
    nodes: Iterable[NodeInfo],
    facts: Facts,
    objects: Iterable[Mapping[str, Any]],
    now: float,
) -> UpgradePlan:
    """This pass's step of the driver upgrade. With the driver disabled nothing is upgraded (as with
    autoUpgrade off, only NVIDIA's auto-upgrade annotation goes)."""
    policy = spec.driver.upgradePolicy if spec.driver.is_enabled() else None
    found = replace(facts, nodes=upgrade_nodes(nodes, spec), now=now)
    return plan_upgrade(
        policy, found, target_version=target_version(objects), validate=VALIDATOR.enabled(spec)
    )


def with_upgrade_status(
    status: ClusterPolicyStatus, spec: ClusterPolicySpec, upgrade: UpgradePlan
) -> ClusterPolicyStatus:
    """`status.driverUpgrade` while the operator runs the driver; null (removed by the merge patch)
    once it does not."""
    found = DriverUpgradeStatus.model_validate(upgrade.status) if spec.driver.is_enabled() else None
    return status.model_copy(update={"driverUpgrade": found})
