"""Driver upgrades per NVIDIADriver pool (pure): while the pools run the driver, each NVIDIADriver's
`spec.upgradePolicy` drives the upgrade of its own nodes towards its own DaemonSets, through the state
machine of the ClusterPolicy's upgrade (core/upgrade/, core/driver_upgrade.py plan_step), one plan per
pool. NVIDIA's upgrade controller does the same: per NVIDIADriver its policy (with its defaults,
autoUpgrade on), its nodes grouped by the owner label.

Why one plan per pool keeps the pools independent: what the machine holds per upgrade rather than per
node (the pause on a failed node, the canary stage, maxParallelUpgrades and maxUnavailable) it works out
on every pass from the nodes it is given, and what it remembers lives on the nodes (their state label
and annotations). A node is in one pool only, so a failed canary pauses its own pool, the other pools go
on, and maxUnavailable's percentage is of the pool's nodes.

A node's pool is the owner label it carries once the pass is written (driver_pool_plan.Pools
.owner_labels): a node that joins a pool gets the pool's auto-upgrade annotation in the pass that labels
it, before the pool's driver pod starts there (the annotation goes before the objects:
upgrade/writes.py announcements). A node whose label waits only for an orphaned driver pod (its
DaemonSet gone: the ClusterPolicy's, deleted with Orphan when the pools took over) is in the pool that
takes it (Pools.orphaned), and its orphan needs an upgrade there (Facts.orphans, NVIDIA's
labelNodesWithOrphanedDriverPods): the pool's upgrade empties the node and deletes the orphan at
pod-restart-required, within the pool's limits; the label, and the pool's pod, follow once the orphan
is gone (core/driver_pool_plan.py). A node between two pools (no label until the old pool's driver pod
is gone), a node no NVIDIADriver owns, and a node held as it is (a conflict over it, or its
NVIDIADriver's spec does not parse: core/driver_pools.py) are in no plan: nothing of their upgrade
moves until they are in a pool again, where the pool's plan takes them on from the state they are in.

The runtime carries out one plan (`merged`), as without pools: the pools' nodes never overlap. Events
about an upgrade rather than a node go to the pool's NVIDIADriver (`addressed`). The ClusterPolicy's
`status.driverUpgrade` and NVIDIA's upgrade gauges add the pools up (`combined`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_operator.api.nvidiadriver import OWNER_LABEL
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import DriverUpgradeStatus, PendingNodes
from gpu_operator.core.caches import Caches
from gpu_operator.core.driver_pool_plan import Pools
from gpu_operator.core.driver_upgrade import (
    POLICY_PLAN,
    VALIDATOR,
    driver_rolling,
    plan_step,
    upgrade_nodes,
    upgrade_status,
)
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import DriverRef
from gpu_operator.core.upgrade import Facts, UpgradeNode, UpgradePlan
from gpu_operator.core.upgrade.facts import config_digest

COUNTS = ("nodes", "nodesDone", "nodesInProgress", "nodesFailed", "nodesPending")


@dataclass(frozen=True)
class PoolUpgrade:
    """One pool's step of its upgrade, and what its NVIDIADriver's `status.driverUpgrade` says."""

    plan: UpgradePlan
    status: DriverUpgradeStatus


def plan_pool_upgrades(
    spec: ClusterPolicySpec,
    pools: Pools,
    drivers: Iterable[DriverRef],
    nodes: Iterable[NodeInfo],
    facts: Facts,
    now: float,
    caches: Caches,
) -> dict[str, PoolUpgrade]:
    """NVIDIADriver name → its pool's upgrade, for every NVIDIADriver that runs a pool (not being
    deleted, its spec parsed). The validation gate is the ClusterPolicy's (its operator-validator)."""
    held = set(pools.assignment.held())
    nodes = list(nodes)
    by_name = {node.name: node for node in nodes}
    members: dict[str, list[UpgradeNode]] = {}
    for node in upgrade_nodes(caches, nodes, spec):
        owner = pools.owner_labels.get(node.name) or pools.orphaned.get(node.name)
        if owner is not None and node.name not in held:
            members.setdefault(owner, []).append(node)
    validate = VALIDATOR.enabled(spec)
    found: dict[str, PoolUpgrade] = {}
    for driver in drivers:
        if driver.deleting or driver.spec is None:
            continue
        objects = [o for o in pools.objects if o["metadata"]["ownerReferences"][0]["uid"] == driver.uid]
        names = {o["metadata"]["name"] for o in objects}
        own = replace(
            facts,
            driver_daemonsets=tuple(d for d in facts.driver_daemonsets if d.name in names),
            orphans={
                node: replacement_digest(objects, by_name[node])
                for node, pool in pools.orphaned.items()
                if pool == driver.name and node in by_name
            },
        )
        policy = driver.spec.upgrade_policy()
        key = ("pool", driver.name)
        plan = plan_step(policy, members.get(driver.name, []), own, objects, now, validate, caches, key)
        found[driver.name] = PoolUpgrade(
            addressed(plan, driver.name), upgrade_status(plan, driver_rolling(objects, own))
        )
    caches.manual_upgrade.keep({POLICY_PLAN, *(("pool", name) for name in found)})
    return found


def replacement_digest(daemonsets: Iterable[Mapping[str, Any]], node: NodeInfo) -> str:
    """DRIVER_CONFIG_DIGEST of the pool DaemonSet that will run on `node` (its OS and kernel select it;
    the owner label it lacks until its orphan is gone does not count); "" when none does."""
    for daemonset in daemonsets:
        template = daemonset["spec"]["template"]["spec"]
        selector = {k: v for k, v in (template.get("nodeSelector") or {}).items() if k != OWNER_LABEL}
        if all(node.labels.get(key) == value for key, value in selector.items()):
            return config_digest(template)
    return ""


def addressed(plan: UpgradePlan, pool: str) -> UpgradePlan:
    """The plan with its Events about the upgrade (not a node) addressed to the pool's NVIDIADriver."""
    actions = tuple(
        replace(a, events=tuple(replace(e, pool=pool) if e.node is None else e for e in a.events))
        for a in plan.actions
    )
    return replace(plan, actions=actions)


def merged(upgrades: Mapping[str, PoolUpgrade]) -> UpgradePlan:
    """The pools' plans as the one the runtime carries out: their writes (nodes in name order), the
    earliest wake-up, every node whose pods a pool needs, and the upgrades available in all; its status
    is `combined`."""
    plans = [u.plan for u in upgrades.values()]
    wakes = [p.wake_at for p in plans if p.wake_at is not None]
    return UpgradePlan(
        tuple(sorted((a for p in plans for a in p.actions), key=lambda a: a.node)),
        combined({name: u.status for name, u in upgrades.items()}).model_dump(mode="json"),
        min(wakes, default=None),
        frozenset(node for p in plans for node in p.pods_needed),
        sum(p.available for p in plans),
    )


def combined(statuses: Mapping[str, DriverUpgradeStatus]) -> DriverUpgradeStatus:
    """The ClusterPolicy's `status.driverUpgrade` while the pools run the driver: the pools' counts
    added up, each pool's summary and pause named after its NVIDIADriver, every node in progress or
    failed, and the pending groups of each pool. No canary: each pool has its own (its status)."""
    named = sorted(statuses.items())
    versions = sorted({v for _, s in named for v in s.targetVersion.split(", ") if v})
    return DriverUpgradeStatus(
        autoUpgrade=any(s.autoUpgrade for _, s in named),
        targetVersion=", ".join(versions),
        summary="; ".join(f"{name}: {s.summary}" for name, s in named) or NO_POOL,
        paused=any(s.paused for _, s in named),
        pausedReason="; ".join(f"NVIDIADriver {name}: {s.pausedReason}" for name, s in named if s.paused),
        **{count: sum(getattr(s, count) for _, s in named) for count in COUNTS},
        inProgress=sorted((e for _, s in named for e in s.inProgress), key=lambda e: e.node),
        failed=sorted((e for _, s in named for e in s.failed), key=lambda e: e.node),
        pending=[
            PendingNodes(reason=f"NVIDIADriver {name}: {g.reason}", count=g.count, nodes=g.nodes)
            for name, s in named
            for g in s.pending
        ],
    )


NO_POOL = "no NVIDIADriver runs a pool"
