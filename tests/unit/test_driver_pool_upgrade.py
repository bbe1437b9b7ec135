"""Driver upgrades per NVIDIADriver pool (core/driver_pool_upgrade.py): each NVIDIADriver's upgradePolicy
upgrades its own nodes towards its own DaemonSets through the ClusterPolicy's state machine, the pools
independent of each other (limits, canary, pause); each NVIDIADriver's status shows its upgrade, and the
Events about a pool's upgrade, or a conflict it enters, are the NVIDIADriver's."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builders import gpu_node
from test_driver_pool_plan import NOW, driver, h100, l4, node, running, written
from test_driver_pool_plan import World as PoolWorld
from upgrade_world import World, check

from gpu_operator.api import parse_spec
from gpu_operator.api.nvidiadriver import DriverUpgradePolicy, NVIDIADriverSpec, NVIDIADriverStatus
from gpu_operator.api.status import DriverUpgradeStatus, NodeUpgrade, PendingNodes
from gpu_operator.core.caches import Caches
from gpu_operator.core.driver_pool_plan import Pools
from gpu_operator.core.driver_pool_status import driver_status_body, driver_status_differs
from gpu_operator.core.driver_pool_upgrade import PoolUpgrade, combined, plan_pool_upgrades
from gpu_operator.core.driver_pools import Assignment, NodeOwner
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import DriverRef
from gpu_operator.core.plan import Observed, build
from gpu_operator.core.upgrade import DriverDaemonSet, Facts, PatchNode, UpgradeEvent, event_subject
from gpu_operator.core.upgrade.facts import config_digest, image_tag
from gpu_operator.core.upgrade.states import AUTO_UPGRADE_ANNOTATION, STATE_LABEL

SPEC = parse_spec({"driver": {"useNvidiaDriverCRD": True}})


@dataclass
class Cluster:
    """NVIDIADriver pools, each an upgrade_world.World of its own (its nodes, driver DaemonSet, revision
    and pods), planned together by plan_pool_upgrades as a pass does; the events of every pass kept."""

    worlds: dict[str, World]
    policies: dict[str, dict[str, Any]]
    caches: Caches = field(default_factory=Caches)
    events: list[UpgradeEvent] = field(default_factory=list)

    @property
    def now(self) -> float:
        return next(iter(self.worlds.values())).now

    def policy(self, pool: str) -> DriverUpgradePolicy:
        return DriverUpgradePolicy.model_validate(self.policies[pool])

    def drivers(self) -> list[DriverRef]:
        return [
            DriverRef(
                pool,
                f"uid-{pool}",
                1,
                NVIDIADriverSpec.model_validate(
                    {"version": "1.0", "nodeSelector": {"pool": pool}, "upgradePolicy": self.policies[pool]}
                ),
            )
            for pool in self.worlds
        ]

    def nodes(self) -> list[NodeInfo]:
        return [
            replace(
                gpu_node(n.name, {**n.labels, "pool": pool}),
                upgrade_annotations=n.annotations,
                unschedulable=n.unschedulable,
                ready=n.ready,
            )
            for pool, world in self.worlds.items()
            for n in world.nodes.values()
        ]

    def pools(self) -> Pools:
        """The pools as driver_pool_plan leaves them: every node labelled for its pool, one DaemonSet
        each, owned by its NVIDIADriver, at its world's revision."""
        objects = tuple(
            {
                "kind": "DaemonSet",
                "metadata": {
                    "name": f"nvidia-driver-{pool}",
                    "labels": {"app.kubernetes.io/component": "nvidia-driver"},
                    "ownerReferences": [{"kind": "NVIDIADriver", "name": pool, "uid": f"uid-{pool}"}],
                },
                "spec": {"template": {"spec": {"containers": [{"image": f"driver:v-{world.revision}"}]}}},
            }
            for pool, world in self.worlds.items()
        )
        labels = {name: pool for pool, world in self.worlds.items() for name in world.nodes}
        return Pools(True, owner_labels=labels, objects=objects)

    def facts(self) -> Facts:
        worlds = self.worlds.items()
        return Facts(
            nodes=(),
            driver_daemonsets=[
                DriverDaemonSet(f"nvidia-driver-{p}", f"ds-{p}", w.revision, w.digest, f"v-{w.revision}")
                for p, w in worlds
            ],
            driver_pods=[replace(d, daemonset_uid=f"ds-{p}") for p, w in worlds for d in w.drivers.values()],
            validator_pods=[v for _, w in worlds for v in w.validators.values()],
            pods=[pod for _, w in worlds for pod in w.pods.values()],
            evictions={uid: e for _, w in worlds for uid, e in w.evictions.items()},
            now=self.now,
        )

    def plan(self) -> dict[str, PoolUpgrade]:
        return plan_pool_upgrades(
            SPEC, self.pools(), self.drivers(), self.nodes(), self.facts(), self.now, self.caches
        )

    def step(self) -> dict[str, PoolUpgrade]:
        """One pass: plan, check each pool's invariants, carry out the writes, let time pass."""
        found = self.plan()
        for pool, world in self.worlds.items():
            plan = found[pool].plan
            check(world, plan, self.policy(pool))
            world.apply(plan)
            world.tick()
            self.events += [e for action in plan.actions for e in action.events]
        return found

    def run(self, passes: int = 40) -> dict[str, PoolUpgrade]:
        found = self.step()
        for _ in range(passes):
            found = self.step()
        return found


def two_pools(h100: dict[str, Any], l4: dict[str, Any], count: int = 3) -> Cluster:
    return Cluster(
        {"h100": World.make(count, prefix="h100"), "l4": World.make(count, prefix="l4")},
        {"h100": h100, "l4": l4},
    )


def pause_events(cluster: Cluster) -> list[UpgradeEvent]:
    return [e for e in cluster.events if e.node is None and "paused" in e.message]


# --- the pools' upgrades -----------------------------------------------------------------------------


def test_two_pools_upgrade_at_once_each_within_its_own_limits() -> None:
    cluster = two_pools({"maxParallelUpgrades": 1}, {"maxParallelUpgrades": 0, "maxUnavailable": "100%"})
    cluster.worlds["h100"].revision, cluster.worlds["l4"].revision = "r2", "r3"
    first = cluster.step()
    assert len(cluster.worlds["h100"].in_progress()) == 1, "h100: maxParallelUpgrades 1"
    assert len(cluster.worlds["l4"].in_progress()) == 3, "l4: all at once, whatever h100 does"
    assert (first["h100"].status.nodesInProgress, first["h100"].status.nodesPending) == (1, 2)
    assert first["l4"].status.nodesInProgress == 3 and first["l4"].status.targetVersion == "v-r3"
    done = cluster.run()
    for pool, world in cluster.worlds.items():
        assert set(world.states().values()) == {"upgrade-done"}, pool
        assert {d.revision for d in world.drivers.values()} == {world.revision}, pool
        assert done[pool].status.summary == "up to date"
    assert combined({p: u.status for p, u in done.items()}).targetVersion == "v-r2, v-r3"


def test_a_failing_canary_pauses_its_pool_only() -> None:
    cluster = two_pools({"canary": {"count": 1}}, {"canary": {"count": 1}})
    h100 = cluster.worlds["h100"]
    h100.revision, h100.crashing = "r2", {"r2"}
    cluster.worlds["l4"].revision = "r2"  # the same version, fine on l4's nodes
    found = cluster.run()
    assert h100.states() == {
        "h100-0": "upgrade-failed",
        "h100-1": "upgrade-required",
        "h100-2": "upgrade-required",
    }
    assert not h100.nodes["h100-1"].unschedulable and h100.drivers["h100-1"].revision == "r1"
    assert set(cluster.worlds["l4"].states().values()) == {"upgrade-done"}, "l4 went on"
    assert found["h100"].status.paused and not found["l4"].status.paused
    assert found["l4"].status.summary == "up to date"
    # The pause is told on the NVIDIADriver whose pool it stops, and on no other.
    (paused,) = pause_events(cluster)
    assert paused.pool == "h100" and paused.type == "Warning" and "h100-0" in paused.message
    assert event_subject(paused, {}, {"name": "cluster-policy", "uid": "p"}, {"h100": "uid-h100"}) == (
        {"name": "h100", "uid": "uid-h100"},
        ("nvidia.com/v1alpha1", "NVIDIADriver"),
    )
    # The ClusterPolicy adds the pools up and names the paused one.
    total = combined({p: u.status for p, u in found.items()})
    assert total.paused and total.pausedReason.startswith("NVIDIADriver h100: node h100-0 failed")
    assert (total.nodes, total.nodesDone, total.nodesFailed, total.nodesPending) == (6, 3, 1, 2)
    # Rolled back: h100's failed canary resumes, said on h100 again.
    h100.revision = "r1"
    cluster.run()
    assert set(h100.states().values()) == {"upgrade-done"}
    resumed = [e for e in cluster.events if e.node is None and "resumed" in e.message]
    assert [e.pool for e in resumed] == ["h100"]


def test_a_manual_pool_is_left_to_its_owner_while_the_other_upgrades() -> None:
    cluster = two_pools({}, {"autoUpgrade": False})
    for world in cluster.worlds.values():
        world.revision = "r2"
    first = cluster.plan()
    # NVIDIA's auto-upgrade annotation goes from l4's nodes only (k8s-driver-manager reads it).
    writes = [w for a in first["l4"].plan.actions for w in a.writes]
    assert writes == [PatchNode(f"l4-{i}", annotations={AUTO_UPGRADE_ANNOTATION: None}) for i in range(3)]
    cluster.run()
    assert set(cluster.worlds["h100"].states().values()) == {"upgrade-done"}
    l4 = cluster.worlds["l4"]
    assert {d.revision for d in l4.drivers.values()} == {"r1"} and not l4.unavailable()
    status = cluster.plan()["l4"].status
    assert not status.autoUpgrade and status.summary == "manual: 3 nodes wait for a driver pod restart"


def test_a_node_in_no_pool_or_held_is_left_where_it_is() -> None:
    """Between two pools (no owner label until the old driver pod is gone), owned by no NVIDIADriver,
    or held as it is by a conflict over it: no plan takes it, whatever its upgrade state."""
    cluster = two_pools({}, {})
    h100 = cluster.worlds["h100"]
    h100.revision = "r2"
    for name in ("h100-0", "h100-2"):
        h100.nodes[name] = replace(
            h100.nodes[name], labels={STATE_LABEL: "drain-required"}, unschedulable=True
        )
    pools = cluster.pools()
    conflict = NodeOwner("h100-0", None, "h100", ("h100", "h100-canary"))
    pools = replace(
        pools,
        owner_labels={**pools.owner_labels, "h100-2": None},
        assignment=Assignment(nodes={"h100-0": conflict}),
    )
    found = plan_pool_upgrades(
        SPEC, pools, cluster.drivers(), cluster.nodes(), cluster.facts(), cluster.now, Caches()
    )
    assert {a.node for u in found.values() for a in u.plan.actions} & {"h100-0", "h100-2"} == set()
    assert found["h100"].status.nodes == 1


def test_a_driver_being_deleted_or_unparsed_upgrades_nothing() -> None:
    cluster = two_pools({}, {})
    gone, broken = cluster.drivers()
    drivers = [replace(gone, deleting=True), replace(broken, spec=None)]
    found = plan_pool_upgrades(
        SPEC, cluster.pools(), drivers, cluster.nodes(), cluster.facts(), cluster.now, Caches()
    )
    assert found == {}


def test_the_pools_plans_are_the_same_warm_and_cold() -> None:
    cluster = two_pools({}, {"autoUpgrade": False})
    for world in cluster.worlds.values():
        world.revision = "r2"
    for _ in range(6):
        warm, cold = (
            cluster.plan(),
            plan_pool_upgrades(
                SPEC,
                cluster.pools(),
                cluster.drivers(),
                cluster.nodes(),
                cluster.facts(),
                cluster.now,
                Caches(),
            ),
        )
        assert warm == cold
        cluster.step()


def test_the_clusterpolicy_status_adds_the_pools_up() -> None:
    entry = NodeUpgrade(node="a-1", state="drain-required", reason="draining")
    pools = {
        "b": DriverUpgradeStatus(
            autoUpgrade=False, targetVersion="2", summary="up to date", nodes=1, nodesDone=1
        ),
        "a": DriverUpgradeStatus(
            autoUpgrade=True,
            targetVersion="1",
            summary="1/3 upgraded",
            nodes=3,
            nodesDone=1,
            nodesInProgress=1,
            nodesPending=1,
            inProgress=[entry],
            pending=[PendingNodes(reason="waiting for a free slot", count=1, nodes=["a-2"])],
        ),
    }
    total = combined(pools)
    assert total.summary == "a: 1/3 upgraded; b: up to date"
    assert (total.autoUpgrade, total.targetVersion, total.paused) == (True, "1, 2", False)
    assert (total.nodes, total.nodesDone, total.nodesInProgress, total.nodesPending) == (4, 2, 1, 1)
    assert total.inProgress == [entry] and total.canary is None
    assert [g.reason for g in total.pending] == ["NVIDIADriver a: waiting for a free slot"]
    assert combined({}).summary == "no NVIDIADriver runs a pool"


# --- through the pass: statuses, Events, the ClusterPolicy's path ------------------------------------


def at_revision(world: PoolWorld, revision: str) -> Observed:
    """The world's observed cluster with every pool DaemonSet at `revision` (its pods are at "rev"),
    the revision rendering what the plan renders (so that none is still rolling)."""
    rendered = {o["metadata"]["name"]: o for o in world.plan().objects if o["kind"] == "DaemonSet"}
    observed = world.observed()
    daemonsets = []
    for name in world.daemonsets:
        pod = rendered[name]["spec"]["template"]["spec"]
        daemonsets.append(
            DriverDaemonSet(
                name, f"ds-{name}", revision, config_digest(pod), image_tag(pod["containers"][0]["image"])
            )
        )
    return replace(observed, upgrade=replace(observed.upgrade, driver_daemonsets=tuple(daemonsets)))


def test_each_nvidiadriver_status_shows_its_pools_upgrade() -> None:
    manual = driver("l4", "580.105.08", nodeSelector={"pool": "l4"}, upgradePolicy={"autoUpgrade": False})
    before = PoolWorld([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), manual])
    world = running(before.plan(), before)
    plan = build(at_revision(world, "rev2"), NOW)
    h100_status = plan.driver_status_writes["h100"]["driverUpgrade"]
    assert h100_status["autoUpgrade"] and h100_status["nodes"] == 2
    assert (h100_status["nodesInProgress"], h100_status["nodesPending"]) == (1, 1), "maxParallelUpgrades 1"
    assert h100_status["targetVersion"] == "595.91.07-ubuntu22.04"
    l4_status = plan.driver_status_writes["l4"]["driverUpgrade"]
    assert not l4_status["autoUpgrade"] and l4_status["summary"].startswith("manual: 1 nodes")
    assert DriverUpgradeStatus.model_validate(l4_status).nodes == 1
    # The ClusterPolicy's upgradePolicy (autoUpgrade off by default) drives none of it.
    assert plan.upgrade is not None
    assert {a.node for a in plan.upgrade.actions if a.starts} == {"a"}
    summary = plan.statuses["cluster-policy"].driverUpgrade
    assert summary is not None and summary.summary.startswith("h100: 0/2 upgraded; l4: manual")


def test_the_clusterpolicy_upgrades_as_before_while_it_runs_the_driver() -> None:
    """Pools off: the ClusterPolicy's driver.upgradePolicy over every GPU node, no NVIDIADriver says
    anything of an upgrade."""
    world = replace(PoolWorld([node("a", "h100")], [h100()]), delegate=False)
    plan = build(world.observed(), NOW)
    assert plan.upgrade is not None and plan.upgrade.status["autoUpgrade"] is False
    status = plan.statuses["cluster-policy"].driverUpgrade
    assert status is not None and not status.autoUpgrade
    assert plan.driver_status_writes["h100"]["driverUpgrade"] is None


def test_a_pools_status_is_written_once_then_not_at_rest() -> None:
    before = PoolWorld([node("a", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    plan = build(at_revision(world, "rev"), NOW)
    assert plan.driver_status_writes["h100"]["driverUpgrade"]["summary"] == "up to date"
    said = written(world, plan)
    assert build(at_revision(said, "rev"), NOW).driver_status_writes == {}


def status_with(upgrade: DriverUpgradeStatus | None) -> NVIDIADriverStatus:
    return NVIDIADriverStatus(state="ready", namespace="gpu-operator", driverUpgrade=upgrade)


def test_a_null_and_an_absent_field_are_the_same_status() -> None:
    """The API server keeps no null a merge patch sends: what it kept of a status written with nulls
    (the canary, an entry's since) is no change."""
    status = status_with(DriverUpgradeStatus(autoUpgrade=True, summary="up to date"))
    body = driver_status_body(status)
    assert body["driverUpgrade"]["canary"] is None, "written as null, so that an earlier canary goes"
    kept = {**body, "driverUpgrade": {k: v for k, v in body["driverUpgrade"].items() if v is not None}}
    assert not driver_status_differs(kept, status)
    assert driver_status_differs({**kept, "driverUpgrade": None}, status)
    none = status_with(None)
    assert driver_status_body(none)["driverUpgrade"] is None, "a merge patch removes an earlier upgrade"
    assert not driver_status_differs({"state": "ready", "namespace": "gpu-operator", "conditions": []}, none)


def test_entering_a_conflict_is_told_once_on_each_nvidiadriver_involved() -> None:
    before = PoolWorld([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    world = written(world, world.plan())
    assert world.plan().driver_events == {}
    third = replace(
        world, drivers=[*world.drivers, driver("h100-canary", "600.1.2", nodeSelector={"pool": "h100"})]
    )
    plan = third.plan()
    assert set(plan.driver_events) == {"h100", "h100-canary"}, "l4 is not involved"
    (event,) = plan.driver_events["h100"]
    assert (event.name, event.uid, event.type, event.reason) == (
        "h100",
        "uid-h100",
        "Warning",
        "ConflictingNodeSelector",
    )
    assert event.message.startswith(
        "its nodeSelector selects the same GPU nodes as NVIDIADriver h100-canary:"
    )
    assert "2 nodes: a, b" in event.message
    (other,) = plan.driver_events["h100-canary"]
    assert "NVIDIADriver h100:" in other.message
    # Its status written, the next pass says nothing again; a fourth driver changes the conflict.
    said = written(third, plan)
    assert said.plan().driver_events == {}
    fourth = replace(said, drivers=[*said.drivers, driver("h100-b", nodeSelector={"pool": "h100"})])
    (again,) = fourth.plan().driver_events["h100"]
    assert "NVIDIADrivers h100-b, h100-canary" in again.message


def test_several_defaults_are_told_as_nvidia_names_them() -> None:
    world = PoolWorld([node("a")], [driver("one", default=True), driver("two", default=True)])
    (event,) = world.plan().driver_events["one"]
    assert event.reason == "ReconcileFailed"
    assert event.message.startswith("NVIDIADriver two is a default driver too: the driver on the GPU nodes")


def test_an_upgrade_event_of_a_pool_is_about_its_nvidiadriver() -> None:
    policy = {"name": "cluster-policy", "uid": "p-1"}
    on_pool = UpgradeEvent(None, "Warning", "paused", pool="h100")
    assert event_subject(on_pool, {}, policy, {"h100": "d-1"}) == (
        {"name": "h100", "uid": "d-1"},
        ("nvidia.com/v1alpha1", "NVIDIADriver"),
    )
    # A node's Event stays the node's, whichever pool it is in.
    on_node = UpgradeEvent("gpu-0", "Normal", "done", pool="h100")
    assert event_subject(on_node, {"gpu-0": "n-1"}, policy, {"h100": "d-1"})[1] == ("v1", "Node")
