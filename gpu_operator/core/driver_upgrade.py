"""The driver upgrade as part of every pass (pure): the state machine's facts from what the watches
saw, its plan, and the status it writes.

The watches give the driver and validator pods, the driver DaemonSets and their ControllerRevisions,
and the pods of the nodes being emptied (Store.snapshot puts them in `Observed.upgrade`); the GPU
nodes and the time are added here. The state machine itself is gpu_operator/core/upgrade/.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus, DriverUpgradeStatus
from gpu_operator.api.upgrade_policy import UpgradePolicySpec
from gpu_operator.core.caches import Caches
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import NodeInfo, gpu_nodes, runs_on
from gpu_operator.core.observed import component_of
from gpu_operator.core.upgrade import Facts, UpgradeNode, UpgradePlan, plan_upgrade
from gpu_operator.core.upgrade.facts import config_digest, image_tag
from gpu_operator.core.upgrade.rollout import manual_inputs
from gpu_operator.core.workloads import workload_type

VALIDATOR = BY_NAME["operator-validator"]


def upgrade_nodes(caches: Caches, nodes: Iterable[NodeInfo], spec: ClusterPolicySpec) -> list[UpgradeNode]:
    """The GPU nodes as the state machine sees them (kept in `caches.upgrade_nodes`); the validation
    gate waits for a validator only where one runs (enabled, and the node not opted out of it)."""
    validating = VALIDATOR.enabled(spec)

    def seen(n: NodeInfo) -> UpgradeNode:
        return UpgradeNode(
            name=n.name,
            labels=n.labels,
            annotations=n.upgrade_annotations,
            unschedulable=n.unschedulable,
            ready=n.ready,
            validator_expected=validating and runs_on(VALIDATOR, n, spec),
        )

    found = gpu_nodes(nodes)
    caches.upgrade_nodes.keep({n.name for n in found})
    # The node's workload type under this spec decides whether the validator runs there.
    return [
        caches.upgrade_nodes.get(n.name, (n, validating, workload_type(n.labels, spec)), partial(seen, n))
        for n in found
    ]


def _driver_daemonsets(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [o for o in objects if o["kind"] == "DaemonSet" and component_of(o["metadata"]) == "driver"]


def target_version(objects: Iterable[Mapping[str, Any]]) -> str:
    """The driver image tags the rendered driver DaemonSets carry (one per kernel when precompiled)."""
    tags = set()
    for obj in _driver_daemonsets(objects):
        containers = obj["spec"]["template"]["spec"]["containers"]
        tags.add(image_tag(str(containers[0].get("image") or "")))
    return ", ".join(sorted(t for t in tags if t))


def driver_rolling(objects: Iterable[Mapping[str, Any]], facts: Facts) -> bool:
    """Whether a driver DaemonSet's newest ControllerRevision is not yet the desired template (its
    driver version or DRIVER_CONFIG_DIGEST differ): between our apply and the DaemonSet controller's
    new revision every pod still matches the previous one, and no node is up to date with the new
    driver. A change of neither (a restart-only change) is not told apart, for that moment."""
    known = {d.name: (d.version, d.config_digest) for d in facts.driver_daemonsets}
    for obj in _driver_daemonsets(objects):
        pod = obj["spec"]["template"]["spec"]
        wanted = (image_tag(str(pod["containers"][0].get("image") or "")), config_digest(pod))
        if known.get(obj["metadata"]["name"]) != wanted:
            return True
    return False


def plan_driver_upgrade(
    spec: ClusterPolicySpec,
    nodes: Iterable[NodeInfo],
    facts: Facts,
    objects: Iterable[Mapping[str, Any]],
    now: float,
    caches: Caches,
) -> UpgradePlan:
    """This pass's step of the driver upgrade. With the driver disabled nothing is upgraded (as with
    autoUpgrade off, only NVIDIA's auto-upgrade annotation goes)."""
    policy = spec.driver.upgradePolicy if spec.driver.is_enabled() else None
    seen = upgrade_nodes(caches, nodes, spec)
    return plan_step(policy, seen, facts, objects, now, VALIDATOR.enabled(spec), caches, POLICY_PLAN)


POLICY_PLAN = "plan"
"""The ClusterPolicy's plan in `caches.manual_upgrade` (an NVIDIADriver pool's is ("pool", its name))."""


def plan_step(
    policy: UpgradePolicySpec | None,
    nodes: list[UpgradeNode],
    facts: Facts,
    objects: Iterable[Mapping[str, Any]],
    now: float,
    validate: bool,
    caches: Caches,
    key: Hashable,
) -> UpgradePlan:
    """The step of the upgrade of `nodes` under `policy`, towards the driver DaemonSets `objects`
    renders (`facts.driver_daemonsets` being theirs); `key` names the plan in the caches. The
    ClusterPolicy's upgrade is one (every GPU node, its DaemonSets), each NVIDIADriver pool's another
    (core/driver_pool_upgrade.py)."""
    found = replace(facts, nodes=nodes, now=now)
    target = target_version(objects)
    step = partial(plan_upgrade, policy, found, target_version=target, validate=validate)
    if policy is not None and policy.autoUpgrade:
        return step()
    # With autoUpgrade off the plan reads little of the facts (upgrade/rollout.py manual_inputs): while
    # that stays the same so does the plan, and a pass of a large rollout, where validator pods,
    # driver readiness and deploy labels change at every pass, need not build a view of every node.
    return caches.manual_upgrade.get(key, (policy, manual_inputs(found), target), step)


def upgrade_status(upgrade: UpgradePlan, rolling: bool) -> DriverUpgradeStatus:
    """What a plan's status says. While a driver DaemonSet is `rolling` to a new template, no node can
    be up to date with it yet, whatever the previous revision says."""
    found = DriverUpgradeStatus.model_validate(upgrade.status)
    if rolling:
        summary = (
            f"{WAITING_FOR_REVISION} ({found.targetVersion})" if found.targetVersion else WAITING_FOR_REVISION
        )
        found = found.model_copy(update={"summary": summary})
    return found


def with_upgrade_status(
    status: ClusterPolicyStatus, spec: ClusterPolicySpec, upgrade: UpgradePlan, rolling: bool
) -> ClusterPolicyStatus:
    """`status.driverUpgrade` while the operator runs the driver; null (removed by the merge patch)
    once it does not."""
    if not spec.driver.is_enabled():
        return status.model_copy(update={"driverUpgrade": None})
    return status.model_copy(update={"driverUpgrade": upgrade_status(upgrade, rolling)})


WAITING_FOR_REVISION = "waiting for the driver DaemonSet's new revision"
