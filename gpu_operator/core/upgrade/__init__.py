"""Driver upgrades as a pure state machine: (upgrade policy, nodes, pods, driver DaemonSets, eviction
results, time) → per node the next state, the exact writes, the Events, the status and the time to plan
again. The reconciler only carries out the writes (see writes.py for their API calls)."""

from gpu_operator.core.upgrade.facts import (
    DriverDaemonSet,
    DriverPod,
    EvictionResult,
    Facts,
    Revision,
    UpgradeNode,
    ValidatorPod,
    WorkloadPod,
    controller_revision,
    current_revision,
    driver_daemonset,
    driver_pod,
    upgrade_node,
    validator_pod,
    workload_pod,
)
from gpu_operator.core.upgrade.rollout import UpgradePlan, plan_upgrade
from gpu_operator.core.upgrade.states import State
from gpu_operator.core.upgrade.writes import (
    DeletePod,
    EvictPod,
    NodeActions,
    PatchNode,
    UpgradeEvent,
    Write,
    announcements,
    event_subject,
    rounds,
)

__all__ = [
    "DeletePod",
    "DriverDaemonSet",
    "DriverPod",
    "EvictPod",
    "EvictionResult",
    "Facts",
    "NodeActions",
    "PatchNode",
    "Revision",
    "State",
    "UpgradeEvent",
    "UpgradeNode",
    "UpgradePlan",
    "ValidatorPod",
    "WorkloadPod",
    "Write",
    "announcements",
    "controller_revision",
    "current_revision",
    "driver_daemonset",
    "driver_pod",
    "event_subject",
    "plan_upgrade",
    "rounds",
    "upgrade_node",
    "validator_pod",
    "workload_pod",
]
