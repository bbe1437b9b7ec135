"""Switching on (the ClusterPolicy's driver → NVIDIADriver pools) node by node, as NVIDIA's operator does
it: the ClusterPolicy's driver DaemonSet deleted with its pods orphaned, and each orphan replaced by its
pool's upgrade (cordon, wait for jobs, GPU pod deletion, drain, the orphan deleted at pod-restart), the
owner label once the orphan is gone, then the pool's pod, validation, uncordon, upgrade-done.

The whole walk, pass by pass, on an upgrade_world.World whose driver DaemonSet is the pool's: the owner
labels from driver_pool_plan.plan_pools and the upgrade from driver_pool_upgrade.plan_pool_upgrades, as
plan.build puts them together; after every pass, upgrade_world.check's invariants and ours: no node
carries the owner label while its orphan is there (the pool's pod would start beside it), never more
nodes in progress than maxParallelUpgrades, never more nodes without a Ready driver pod."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builders import gpu_node
from test_driver_pool_plan import DEPLOY_DRIVER, NS, UBUNTU
from upgrade_world import World, check

from gpu_operator.api import parse_spec
from gpu_operator.api.nvidiadriver import OWNER_LABEL, DriverUpgradePolicy, NVIDIADriverSpec
from gpu_operator.api.upgrade_policy import UpgradePolicySpec
from gpu_operator.core.caches import Caches
from gpu_operator.core.driver_pool_plan import Pools, plan_pools, pod_owners
from gpu_operator.core.driver_pool_upgrade import PoolUpgrade, plan_pool_upgrades, replacement_digest
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo, cluster_facts
from gpu_operator.core.observed import DriverRef, ObjectInfo
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.upgrade import (
    DeletePod,
    DriverDaemonSet,
    EvictPod,
    PatchNode,
    State,
    UpgradeEvent,
    plan_upgrade,
)
from gpu_operator.core.upgrade.facts import config_digest, image_tag
from gpu_operator.core.upgrade.rollout import MANUAL_ORPHAN
from gpu_operator.core.upgrade.states import STATE_LABEL, STATE_START_ANNOTATION

SPEC = parse_spec({"driver": {"useNvidiaDriverCRD": True}})
POOL = "default"
POLICY_UID = "uid-cluster-policy"
POLICY_APP = "nvidia-driver-daemonset"
"""The `app` label of the ClusterPolicy's driver pods (its DaemonSet's name and selector)."""
POOL_KEY = ("apps/v1", "DaemonSet", NS, "pool")
"""The pool's DaemonSet as pod_owners finds it (its pods' owner uid is "ds", upgrade_world's)."""


def orphaned(world: World) -> World:
    """The world once the ClusterPolicy's driver DaemonSet is deleted with Orphan: every driver pod has
    no owner left, at the ClusterPolicy's revision; the pool's DaemonSet (revision p1) selects no node."""
    for name, pod in world.drivers.items():
        world.drivers[name] = replace(pod, daemonset_uid="", revision="cp", app=POLICY_APP)
    world.revision, world.selects = "p1", set()
    return world


@dataclass
class Switch:
    """One NVIDIADriver (the default: every GPU node) taking the driver over on `world`, pass by pass;
    `policy` is its upgradePolicy."""

    world: World
    policy: dict[str, Any]
    caches: Caches = field(default_factory=Caches)
    events: list[UpgradeEvent] = field(default_factory=list)
    most_in_progress: int = 0
    most_without_driver: int = 0
    """The most nodes without a Ready driver pod at once (a terminating pod is not Ready)."""

    def driver(self) -> DriverRef:
        spec = {"version": "1.0", "default": True, "upgradePolicy": self.policy}
        return DriverRef(POOL, f"uid-{POOL}", 1, NVIDIADriverSpec.model_validate(spec))

    def nodes(self) -> dict[str, NodeInfo]:
        found = {}
        for n in self.world.nodes.values():
            own = {DEPLOY_DRIVER, GPU_PRESENT} | ({OWNER_LABEL} & set(n.labels))
            labels = {**UBUNTU, DEPLOY_DRIVER: "true", GPU_PRESENT: "true", **n.labels}
            found[n.name] = replace(
                gpu_node(n.name, labels, own_labels=frozenset(own)),
                upgrade_annotations=n.annotations,
                unschedulable=n.unschedulable,
                ready=n.ready,
            )
        return found

    def plan(self) -> tuple[Pools, PoolUpgrade]:
        """One pass's decisions: the owner labels and the pool's upgrade."""
        driver, nodes, world = self.driver(), self.nodes(), self.world
        pool_info = ObjectInfo(POOL_KEY, "driver", "", 1, "1", driver.uid, (FIELD_MANAGER,))
        owners = pod_owners(
            world.drivers.values(),
            {"ds": "pool"},
            {POOL_KEY: pool_info},
            (driver,),
            {POLICY_UID},
            {POLICY_APP},
        )
        facts = cluster_facts(nodes.values(), NS, {})
        pools = plan_pools(
            True, (driver,), nodes, owners, {}, frozenset({POLICY_UID}), facts, "/", self.caches
        )
        (daemonset,) = pools.objects
        pod = daemonset["spec"]["template"]["spec"]
        version = image_tag(pod["containers"][0]["image"])
        at = DriverDaemonSet(daemonset["metadata"]["name"], "ds", world.revision, config_digest(pod), version)
        upgrade = replace(world.facts(), driver_daemonsets=[at])
        found = plan_pool_upgrades(SPEC, pools, [driver], nodes.values(), upgrade, world.now, self.caches)
        return pools, found[POOL]

    def step(self) -> PoolUpgrade:
        """One pass: plan, check, write the owner labels and the upgrade's writes, let time pass."""
        world, policy = self.world, DriverUpgradePolicy.model_validate(self.policy)
        pools, upgrade = self.plan()
        check(world, upgrade.plan, policy)
        for name, owner in pools.owner_labels.items():
            node = world.nodes[name]
            labels = {k: v for k, v in node.labels.items() if k != OWNER_LABEL}
            world.nodes[name] = replace(node, labels=labels | ({OWNER_LABEL: owner} if owner else {}))
        world.apply(upgrade.plan)
        self.events += [e for action in upgrade.plan.actions for e in action.events]
        world.selects = {n for n, node in world.nodes.items() if node.labels.get(OWNER_LABEL) == POOL}
        for name in sorted(world.selects):
            pod = world.drivers.get(name)
            assert pod is None or pod.daemonset_uid, f"{name} labelled while its orphan {pod.name} is there"
        self.most_in_progress = max(self.most_in_progress, len(world.in_progress()))
        self.most_without_driver = max(self.most_without_driver, len(self.without_driver()))
        world.tick()
        return upgrade

    def run(self, passes: int = 120) -> PoolUpgrade:
        found = self.step()
        for _ in range(passes):
            if self.switched() and not found.plan.writes:
                break
            found = self.step()
        return found

    def without_driver(self) -> set[str]:
        return {
            n
            for n in self.world.nodes
            if (d := self.world.drivers.get(n)) is None or not d.ready or d.terminating
        }

    def switched(self) -> bool:
        """Every node labelled, on the pool's pod at its revision and Ready, upgrade-done, schedulable."""
        world = self.world
        return all(
            node.labels.get(OWNER_LABEL) == POOL
            and world.state(name) == State.DONE
            and not node.unschedulable
            and (pod := world.drivers.get(name)) is not None
            and (pod.daemonset_uid, pod.revision, pod.ready) == ("ds", world.revision, True)
            for name, node in world.nodes.items()
        )

    def told(self, node: str) -> str:
        return " | ".join(e.message for e in self.events if e.node == node)


def test_switching_on_replaces_each_orphan_through_the_pools_upgrade_within_its_limits() -> None:
    switch = Switch(
        orphaned(World.make(5, prefix="gpu")), {"maxParallelUpgrades": 2, "maxUnavailable": "100%"}
    )
    first = switch.step()
    assert first.status.nodesInProgress == 2 and first.status.nodesPending == 3
    (pending,) = first.status.pending
    assert pending.reason == "waiting for a free slot: maxParallelUpgrades is 2"
    switch.run()
    assert switch.switched()
    assert switch.most_in_progress == 2, "maxParallelUpgrades, reached and never passed"
    assert switch.most_without_driver <= 2
    orphan = "nvidia-driver-gpu-0-r1-1699999900"
    assert switch.told("gpu-0").split(" | ") == [
        "upgrade-done → upgrade-required → cordon-required → wait-for-jobs-required → pod-deletion-required: "
        f"driver pod {orphan} is orphaned (its DaemonSet is gone): a new driver replaces it; cordoned; "
        "evicting 1 GPU pod",
        "pod-deletion-required → drain-required → pod-restart-required: no GPU pods left; "
        f"deleted driver pod {orphan} (revision cp)",
        "pod-restart-required → validation-required: driver pod nvidia-driver-gpu-0-p1-1700000150 is ready",
        "validation-required → uncordon-required → upgrade-done: validated; uncordoned; "
        "driver 1.0-ubuntu22.04 running",
    ]
    final = switch.plan()[1]
    assert final.status.summary == "up to date" and final.plan.writes == []


def test_with_autoupgrade_off_an_orphan_stays_until_it_is_deleted_by_hand() -> None:
    switch = Switch(orphaned(World.make(3, prefix="gpu")), {"autoUpgrade": False})
    for _ in range(10):
        switch.step()
    world = switch.world
    assert {pod.revision for pod in world.drivers.values()} == {"cp"} and not world.unavailable()
    assert not any(OWNER_LABEL in node.labels for node in world.nodes.values())
    status = switch.plan()[1].status
    assert status.summary == "manual: 3 nodes wait for a driver pod restart"
    assert [(g.reason, g.count) for g in status.pending] == [(MANUAL_ORPHAN, 3)]
    # Its orphan deleted by hand, a node gets the owner label, then the pool's pod; the others wait on.
    world.drivers["gpu-1"] = replace(world.drivers["gpu-1"], terminating=True, ready=False)
    for _ in range(6):
        switch.step()
    assert world.nodes["gpu-1"].labels.get(OWNER_LABEL) == POOL
    assert (world.drivers["gpu-1"].daemonset_uid, world.drivers["gpu-1"].ready) == ("ds", True)
    assert [world.drivers[n].revision for n in ("gpu-0", "gpu-2")] == ["cp", "cp"]
    status = switch.plan()[1].status
    assert (status.nodesDone, status.nodesPending) == (1, 2)


def test_a_restarted_operator_resumes_the_switch_from_the_cluster() -> None:
    """Killed mid-switch, the operator starts with nothing in memory (new caches, no eviction answers):
    the orphaned pods, the owner labels and each node's upgrade state and annotations are enough."""
    world = orphaned(World.make(5, prefix="gpu"))
    start = {STATE_START_ANNOTATION: str(int(world.now) - 60)}

    def at(name: str, state: State, **labels: str) -> None:
        node = world.nodes[name]
        world.nodes[name] = replace(
            node,
            labels={**node.labels, STATE_LABEL: str(state), **labels},
            annotations={**node.annotations, **start},
            unschedulable=state not in (State.DONE, State.UPGRADE_REQUIRED),
        )

    # gpu-0 switched: labelled, on the pool's pod, validated after it.
    at("gpu-0", State.DONE, **{OWNER_LABEL: POOL})
    world.drivers["gpu-0"] = world._driver("gpu-0", ready=True, created=world.now - 40)
    world.validators["gpu-0"] = replace(world.validators["gpu-0"], created=world.now - 30)
    world.selects = {"gpu-0"}
    # gpu-1 emptied: the eviction of its GPU pod was asked for, the answer is lost with the operator.
    at("gpu-1", State.POD_DELETION_REQUIRED)
    # gpu-2 at pod-restart: its GPU pod gone, its orphan terminating.
    at("gpu-2", State.POD_RESTART_REQUIRED)
    world.pods = {uid: pod for uid, pod in world.pods.items() if pod.node != "gpu-2"}
    world.drivers["gpu-2"] = replace(world.drivers["gpu-2"], terminating=True, ready=False)
    # gpu-3 marked, waiting for a slot; gpu-4 as the ClusterPolicy left it.
    at("gpu-3", State.UPGRADE_REQUIRED)

    restarted = Switch(world, {"maxParallelUpgrades": 2, "maxUnavailable": "100%"})
    pools, upgrade = restarted.plan()
    assert {n: o for n, o in pools.owner_labels.items() if o} == {"gpu-0": POOL}
    assert set(pools.orphaned) == {"gpu-1", "gpu-2", "gpu-3", "gpu-4"}
    writes = upgrade.plan.writes
    assert [w.name for w in writes if isinstance(w, EvictPod)] == ["train-gpu-1-0"], "asked again"
    assert not any(isinstance(w, DeletePod) for w in writes), "gpu-2's orphan is going already"
    status = upgrade.status
    reasons = {e.node: e.reason for e in status.inProgress}
    assert reasons["gpu-2"] == f"waiting for the old driver pod {world.drivers['gpu-2'].name} to terminate"
    assert (status.nodesDone, status.nodesInProgress, status.nodesPending) == (1, 2, 2)
    assert [(g.reason, g.nodes) for g in status.pending] == [
        ("waiting for a free slot: maxParallelUpgrades is 2", ["gpu-3", "gpu-4"])
    ]
    restarted.run()
    assert restarted.switched() and restarted.most_in_progress == 2


def test_an_orphan_is_upgraded_only_where_the_upgrade_replaces_it() -> None:
    """NVIDIA's two rules: an upgrade leaves an orphaned driver pod alone (ProcessDoneOrUnknownNodes:
    the ClusterPolicy's upgrade), but a pool's replaces the orphans of the nodes it takes over
    (labelNodesWithOrphanedDriverPods: Facts.orphans)."""
    world = orphaned(World.make(2))
    policy = UpgradePolicySpec(autoUpgrade=True)
    alone = plan_upgrade(policy, world.facts())
    assert alone.writes == [] and alone.status["summary"] == "up to date"
    replaced = plan_upgrade(policy, replace(world.facts(), orphans={"node-1": ""}))
    assert {a.node for a in replaced.actions} == {"node-1"}
    assert replaced.status["nodesInProgress"] == 1 and replaced.status["nodesDone"] == 1


def test_an_orphan_replaced_by_the_same_driver_is_only_restarted() -> None:
    """The pool installs the driver the orphan runs (same DRIVER_CONFIG_DIGEST: a switch that keeps the
    driver): cordon and restart the pod, as NVIDIA's restart-only path, without evicting GPU pods or
    draining; another digest goes the whole way."""
    for digest, restart_only in (("d1", True), ("d2", False)):
        world = orphaned(World.make(2))
        world.drivers["node-1"] = replace(world.drivers["node-1"], config_digest="d1")
        facts = replace(world.facts(), orphans={"node-1": digest})
        plan = plan_upgrade(UpgradePolicySpec(autoUpgrade=True), facts)
        states = [w.labels.get(STATE_LABEL) for w in plan.writes if isinstance(w, PatchNode) and w.labels]
        assert (State.POD_RESTART_REQUIRED.value in states) is restart_only, (digest, states)
        deleted = [w.name for w in plan.writes if isinstance(w, DeletePod)]
        assert (deleted == [world.drivers["node-1"].name]) is restart_only, (digest, deleted)


def test_the_replacement_digest_is_that_of_the_daemonset_for_the_nodes_os() -> None:
    def daemonset(os_id: str, digest: str) -> dict[str, Any]:
        env = [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]
        selector = {OWNER_LABEL: POOL, "feature.node.kubernetes.io/system-os_release.ID": os_id}
        containers = [{"name": "nvidia-driver-ctr", "env": env}]
        return {"spec": {"template": {"spec": {"nodeSelector": selector, "containers": containers}}}}

    node = gpu_node("n", {**UBUNTU, GPU_PRESENT: "true"})
    found = [daemonset("rhel", "r"), daemonset("ubuntu", "u")]
    assert replacement_digest(found, node) == "u", "the owner label the node lacks yet does not count"
    assert replacement_digest(found[:1], node) == ""
