"""NVIDIADriver pools in the pass (core/driver_pool_plan.py through plan.build): which pool DaemonSets
are written, which owner labels, what becomes of the ClusterPolicy's driver, and in which order a
switch goes, so that no node ever runs two driver pods."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from builders import gpu_node, operand_daemonset, operand_pod

from gpu_operator.api import FieldError
from gpu_operator.api.nvidiadriver import OWNER_LABEL, NVIDIADriverSpec
from gpu_operator.core.caches import Caches
from gpu_operator.core.driver_pool_counts import PoolCounts
from gpu_operator.core.driver_pool_plan import ORPHAN, POLICY, POLICY_ORPHAN, PolicyDriver
from gpu_operator.core.images import OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo
from gpu_operator.core.observed import DriverRef, ObjectInfo, ObjectKey
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.plan import Observed, Plan, PolicyRef, build
from gpu_operator.core.upgrade import DeletePod, DriverPod, Facts, PatchNode
from gpu_operator.core.upgrade.states import STATE_LABEL

NS = "gpu-operator"
NOW = "2026-12-01T00:00:00Z"
UBUNTU = {OS_ID_LABEL: "ubuntu", OS_VERSION_LABEL: "22.04"}
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
DEPLOY_TOOLKIT = "nvidia.com/gpu.deploy.container-toolkit"
POLICY_DS = "nvidia-driver-daemonset"
CP_UID = "uid-cp"


def policy(delegate: bool = True) -> PolicyRef:
    return PolicyRef("cluster-policy", CP_UID, 1, NOW, {"driver": {"useNvidiaDriverCRD": delegate}}, {})


def node(name: str, pool: str | None = None, owner: str | None = None) -> NodeInfo:
    """A GPU node with NFD's OS labels, the driver's deploy label, and the owner label it carries."""
    labels = {**UBUNTU, DEPLOY_DRIVER: "true", GPU_PRESENT: "true"}
    own = {DEPLOY_DRIVER, GPU_PRESENT}
    if pool is not None:
        labels["pool"] = pool
    if owner is not None:
        labels[OWNER_LABEL] = owner
        own.add(OWNER_LABEL)
    return gpu_node(name, labels, own_labels=frozenset(own), uid=f"u-{name}")


def driver(name: str, version: str = "595.91.07", **spec: Any) -> DriverRef:
    return DriverRef(name, f"uid-{name}", 1, NVIDIADriverSpec.model_validate({"version": version, **spec}))


def h100() -> DriverRef:
    return driver("h100", nodeSelector={"pool": "h100"})


def l4() -> DriverRef:
    return driver("l4", "580.105.08", nodeSelector={"pool": "l4"})


@dataclass
class World:
    """The cluster a pass sees: nodes, NVIDIADrivers, the driver DaemonSets (name → owner uid) and the
    driver pods on each node (node → DaemonSet names: the one that created it; a pod of a DaemonSet
    that is not there is orphaned, no owner left)."""

    nodes: list[NodeInfo]
    drivers: list[DriverRef] = field(default_factory=list)
    daemonsets: dict[str, str] = field(default_factory=dict)
    pods: dict[str, list[str]] = field(default_factory=dict)
    rolled_out: set[str] = field(default_factory=set)
    delegate: bool = True
    crd: bool = True
    deleting: set[str] = field(default_factory=set)
    """DaemonSets being deleted (a deletionTimestamp, the garbage collector's finalizer still on)."""
    terminating: set[str] = field(default_factory=set)
    """Nodes whose driver pods are terminating."""

    def observed(self) -> Observed:
        objects = {
            _key(name): _info(name, owner, name in self.deleting) for name, owner in self.daemonsets.items()
        }
        uids = {f"ds-{name}": name for name in self.daemonsets}
        driver_pods = tuple(
            DriverPod(
                f"{ds}-{n}",
                NS,
                f"pod-{ds}-{n}",
                n,
                f"ds-{ds}" if ds in self.daemonsets else "",
                "rev",
                terminating=n in self.terminating,
                app=ds,
            )
            for n, names in self.pods.items()
            for ds in names
        )
        pods = tuple(operand_pod(p.name, "driver", p.node, terminating=p.terminating) for p in driver_pods)
        return Observed(
            policies=(policy(self.delegate),),
            nodes={n.name: n for n in self.nodes},
            pods=pods,
            daemonsets={name: operand_daemonset(name, "driver") for name in self.rolled_out},
            objects=objects,
            namespace=NS,
            nvidia_driver_crd=self.crd,
            drivers=tuple(self.drivers),
            driver_daemonsets=uids,
            upgrade=Facts(nodes=(), driver_pods=driver_pods),
        )

    def plan(self, caches: Caches | None = None) -> Plan:
        return build(self.observed(), NOW, caches=caches)


def _key(name: str) -> ObjectKey:
    return ("apps/v1", "DaemonSet", NS, name)


def _info(name: str, owner: str, deleting: bool = False) -> ObjectInfo:
    return ObjectInfo(_key(name), "driver", "", 1, "1", owner, (FIELD_MANAGER,), deleting=deleting)


def pool_daemonsets(plan: Plan, name: str | None = None) -> dict[str, dict[str, Any]]:
    """The plan's driver DaemonSets owned by an NVIDIADriver (that one, if named), by name."""
    return {
        o["metadata"]["name"]: o
        for o in plan.objects
        if o["kind"] == "DaemonSet"
        and (owners := o["metadata"].get("ownerReferences"))
        and owners[0]["kind"] == "NVIDIADriver"
        and (name is None or owners[0]["name"] == name)
    }


def policy_daemonsets(plan: Plan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.objects if o["metadata"]["name"] == POLICY_DS]


def owner_after(world: World, plan: Plan, name: str) -> str | None:
    """The owner label the node carries once the plan is written."""
    rewrite = plan.label_rewrites.get(name, {}).get(OWNER_LABEL)
    if rewrite is not None:
        return rewrite[1]
    if name in plan.node_labels:
        return plan.node_labels[name].get(OWNER_LABEL)
    return next(n for n in world.nodes if n.name == name).labels.get(OWNER_LABEL)


def owners(world: World, plan: Plan) -> dict[str, str | None]:
    return {n.name: owner_after(world, plan, n.name) for n in world.nodes}


def owner_writes(world: World, plan: Plan) -> dict[str, str | None]:
    """The nodes whose owner label the plan changes, and to what."""
    return {
        n.name: after
        for n in world.nodes
        if (after := owner_after(world, plan, n.name)) != n.labels.get(OWNER_LABEL)
        or (n.name in plan.node_labels and OWNER_LABEL in n.labels and OWNER_LABEL not in n.own_labels)
    }


def image(daemonset: dict[str, Any]) -> str:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    return str(next(c for c in containers if c["name"] == "nvidia-driver-ctr")["image"])


def state(plan: Plan, name: str) -> tuple[str, str]:
    """(state, the Error condition's reason) of the NVIDIADriver's status as the plan writes it."""
    body = plan.driver_status_writes[name]
    error = next(c for c in body["conditions"] if c["type"] == "Error")
    return body["state"], error["reason"]


def running(plan: Plan, world: World) -> World:
    """The world once `plan` is written and the DaemonSet controller has caught up: owner labels as
    planned, every wanted pool DaemonSet there and rolled out, each labelled node running its pool's pod."""
    nodes = []
    for n in world.nodes:
        owner = owner_after(world, plan, n.name)
        labels = {k: v for k, v in n.labels.items() if k != OWNER_LABEL}
        own = n.own_labels - {OWNER_LABEL}
        if owner is not None:
            labels[OWNER_LABEL] = owner
            own |= {OWNER_LABEL}
        nodes.append(replace(n, labels=labels, own_labels=own))
    daemonsets = {
        name: o["metadata"]["ownerReferences"][0]["uid"] for name, o in pool_daemonsets(plan).items()
    }
    pods = {}
    for n in nodes:
        owner = n.labels.get(OWNER_LABEL)
        mine = [
            name
            for name, o in pool_daemonsets(plan).items()
            if o["metadata"]["ownerReferences"][0]["name"] == owner
        ]
        if mine:
            pods[n.name] = mine[:1]
    return replace(world, nodes=nodes, daemonsets=daemonsets, pods=pods, rolled_out=set(daemonsets))


def written(world: World, plan: Plan) -> World:
    """The world once the plan's NVIDIADriver statuses are written."""
    drivers = [replace(d, status=plan.driver_status_writes.get(d.name, d.status)) for d in world.drivers]
    return replace(world, drivers=drivers)


# --- pools ------------------------------------------------------------------------------------------


def test_two_pools_with_two_versions_get_their_own_daemonsets_and_owner_labels() -> None:
    world = World([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), l4()])
    plan = world.plan()
    h100s, l4s = pool_daemonsets(plan, "h100"), pool_daemonsets(plan, "l4")
    assert len(h100s) == len(l4s) == 1
    assert [image(d) for d in h100s.values()] == ["nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"]
    assert [image(d) for d in l4s.values()] == ["nvcr.io/nvidia/driver:580.105.08-ubuntu22.04"]
    (selector,) = [d["spec"]["template"]["spec"]["nodeSelector"] for d in h100s.values()]
    assert selector[OWNER_LABEL] == "h100" and selector["pool"] == "h100"
    assert policy_daemonsets(plan) == [], "the ClusterPolicy does not deploy the driver"
    assert owners(world, plan) == {"a": "h100", "b": "h100", "c": "l4"}
    # The pools run under the ClusterPolicy driver's account, whose RBAC the ClusterPolicy renders.
    accounts = {d["spec"]["template"]["spec"]["serviceAccountName"] for d in [*h100s.values(), *l4s.values()]}
    assert accounts == {"nvidia-driver"}
    assert ("v1", "ServiceAccount", NS, "nvidia-driver") in {
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in plan.objects
    }
    assert state(plan, "h100") == ("notReady", "DriverNotReady")
    # Written and rolled out: ready, and nothing more to write.
    after = running(plan, world)
    again = after.plan()
    assert owner_writes(after, again) == {} and again.deletes == []
    assert state(again, "h100") == ("ready", "Ready") and state(again, "l4") == ("ready", "Ready")
    assert written(after, again).plan().driver_status_writes == {}, "nothing is written at rest"


def test_each_pool_counts_its_nodes_and_ready_driver_pods_for_its_status_and_the_metrics() -> None:
    world = World([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), l4()])
    plan = world.plan()
    assert plan.driver_pools == {"h100": PoolCounts("notReady", 2, 0), "l4": PoolCounts("notReady", 1, 0)}
    written = plan.driver_status_writes["h100"]
    assert (written["nodesDesired"], written["nodesReady"]) == (2, 0), "kubectl get's Ready and Desired"
    after = running(plan, world)
    (h100_ds,) = pool_daemonsets(plan, "h100")
    observed = after.observed()
    one_of_two = {**observed.daemonsets, h100_ds: operand_daemonset(h100_ds, "driver", 2, 1)}
    counts = build(replace(observed, daemonsets=one_of_two), NOW).driver_pools
    assert counts == {"h100": PoolCounts("notReady", 2, 1), "l4": PoolCounts("ready", 1, 1)}
    disabled = replace(after, delegate=False).plan()
    assert disabled.driver_status_writes["h100"]["nodesDesired"] is None, "no pool: no counts"
    assert disabled.driver_pools == {
        "h100": PoolCounts("disabled", 0, 0),
        "l4": PoolCounts("disabled", 0, 0),
    }
    gone = replace(after, drivers=[replace(after.drivers[0], deleting=True), after.drivers[1]])
    assert set(gone.plan().driver_pools) == {"l4"}, "a driver being deleted has no numbers"


def test_the_default_driver_takes_the_gpu_nodes_no_other_selects() -> None:
    world = World([node("a", "h100"), node("b"), node("cpu")], [h100(), driver("rest", default=True)])
    world.nodes[2] = NodeInfo("cpu", {})
    plan = world.plan()
    assert owners(world, plan) == {"a": "h100", "b": "rest", "cpu": None}
    assert len(pool_daemonsets(plan, "rest")) == 1


def test_a_conflicting_third_driver_changes_nothing_on_its_nodes() -> None:
    before = World([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    settled = world.plan()
    world = written(world, settled)
    third = replace(
        world, drivers=[*world.drivers, driver("h100-canary", "600.1.2", nodeSelector={"pool": "h100"})]
    )
    plan = third.plan()
    assert owner_writes(third, plan) == {} and plan.label_rewrites == {} and plan.deletes == []
    assert plan.node_labels == settled.node_labels
    assert pool_daemonsets(plan) == pool_daemonsets(settled), "every pool runs on as it was"
    assert pool_daemonsets(plan, "h100-canary") == {}
    assert state(plan, "h100") == ("notReady", "ConflictingNodeSelector")
    assert state(plan, "h100-canary") == ("notReady", "ConflictingNodeSelector")
    message = next(c for c in plan.driver_status_writes["h100"]["conditions"] if c["type"] == "Error")[
        "message"
    ]
    assert "h100-canary" in message and "a, b" in message
    assert "l4" not in plan.driver_status_writes, "the other pool's status stays as it is"


def test_a_spec_that_does_not_parse_holds_its_nodes_and_daemonsets() -> None:
    before = World([node("a", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    broken = DriverRef("h100", "uid-h100", 2, None, (FieldError("spec.version", "bad"),))
    plan = replace(world, drivers=[broken, l4()]).plan()
    assert owners(world, plan)["a"] == "h100"
    kept = [name for name, owner in world.daemonsets.items() if owner == "uid-h100"]
    assert kept and not set(map(_key, kept)) & set(plan.deletes), "its DaemonSet stays"
    assert state(plan, "h100") == ("notReady", "ReconcileFailed")
    assert "spec.version: bad" in str(plan.driver_status_writes["h100"])


def test_a_relabelled_node_leaves_its_pool_before_it_joins_the_other() -> None:
    before = World([node("a", "h100"), node("b", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    a = next(n for n in world.nodes if n.name == "a")
    moved = replace(world, nodes=[replace(a, labels={**a.labels, "pool": "l4"}), *world.nodes[1:]])
    first = moved.plan()
    assert owner_after(moved, first, "a") is None, "h100's pod there goes first"
    assert {n: owner_after(moved, first, n) for n in "bc"} == {"b": "h100", "c": "l4"}
    assert state(first, "l4")[1] == "DriverNotReady"
    # Its label gone, the h100 DaemonSet no longer selects it: the pod goes, then it joins l4.
    gone = replace(
        moved,
        nodes=[
            replace(n, labels={k: v for k, v in n.labels.items() if k != OWNER_LABEL}) if n.name == "a" else n
            for n in moved.nodes
        ],
        pods={k: v for k, v in moved.pods.items() if k != "a"},
    )
    second = gone.plan()
    assert owner_after(gone, second, "a") == "l4"


def test_a_driver_being_deleted_gives_its_nodes_to_the_default() -> None:
    before = World([node("a", "h100")], [h100(), driver("rest", default=True)])
    world = running(before.plan(), before)
    deleting = replace(world, drivers=[replace(world.drivers[0], deleting=True), world.drivers[1]])
    plan = deleting.plan()
    assert owner_after(deleting, plan, "a") is None, "h100's pod is still there"
    assert {_key(n) for n in world.daemonsets if world.daemonsets[n] == "uid-h100"} <= set(plan.deletes)
    assert "h100" not in plan.driver_status_writes


# --- switching useNvidiaDriverCRD -------------------------------------------------------------------


def switched_on() -> World:
    """GPU nodes on the ClusterPolicy's driver, the switch just set."""
    nodes = [node("a", "h100"), node("b", "h100"), node("c", "l4")]
    return World(
        nodes, [h100(), l4()], {POLICY_DS: CP_UID}, {n.name: [POLICY_DS] for n in nodes}, {POLICY_DS}
    )


def upgrading(plan: Plan) -> dict[str, str]:
    """Node → the upgrade state the plan's driver upgrade moves it to."""
    assert plan.upgrade is not None
    return {
        w.node: str(w.labels[STATE_LABEL])
        for w in plan.upgrade.writes
        if isinstance(w, PatchNode) and w.labels.get(STATE_LABEL)
    }


def deleted_pods(plan: Plan) -> set[str]:
    assert plan.upgrade is not None
    return {w.name for w in plan.upgrade.writes if isinstance(w, DeletePod)}


def test_switching_on_orphans_the_policys_driver_pods_for_the_pools_upgrades() -> None:
    world = switched_on()
    plan = world.plan()
    assert len(pool_daemonsets(plan)) == 2, "the pools are written first"
    assert plan.deletes == [_key(POLICY_DS)], "the ClusterPolicy's driver goes after them"
    assert plan.propagation(_key(POLICY_DS)) == "Orphan", "its pods stay: no node loses its driver"
    assert policy_daemonsets(plan) == []
    assert owners(world, plan) == {"a": None, "b": None, "c": None}, "no pool pod beside the old one"
    assert upgrading(plan) == {}, "the pods of a DaemonSet still there are not orphans yet"
    status = plan.driver_status_writes["h100"]
    assert status["state"] == "notReady" and "wait for another driver's pod to go" in str(status)
    # Being deleted (the garbage collector orphans its pods), then gone: each pool's upgrade takes its
    # nodes, one at a time (maxParallelUpgrades 1), and deletes the orphaned pod at pod-restart.
    for going in (replace(world, deleting={POLICY_DS}), replace(world, daemonsets={}, rolled_out=set())):
        plan = going.plan()
        assert plan.deletes == [], "a DaemonSet being deleted is not deleted again"
        assert owners(going, plan) == {"a": None, "b": None, "c": None}
        assert upgrading(plan) == {
            "a": "pod-restart-required",
            "b": "upgrade-required",
            "c": "pod-restart-required",
        }
        assert deleted_pods(plan) == {f"{POLICY_DS}-a", f"{POLICY_DS}-c"}
    # A node whose orphan is gone joins its pool: its pod starts only now.
    gone = replace(world, daemonsets={}, pods={"b": [POLICY_DS], "c": [POLICY_DS]}, rolled_out=set())
    plan = gone.plan()
    assert owners(gone, plan) == {"a": "h100", "b": None, "c": None}


def test_a_conflict_at_switch_on_holds_its_nodes_on_their_orphaned_pods_and_the_others_switch() -> None:
    world = replace(
        switched_on(), drivers=[h100(), l4(), driver("h100-canary", nodeSelector={"pool": "h100"})]
    )
    plan = world.plan()
    assert plan.deletes == [_key(POLICY_DS)] and plan.orphans == {_key(POLICY_DS)}
    assert not any(note.reason == "DriverSwitchWaiting" for note in plan.notes)
    gone = replace(world, daemonsets={}, rolled_out=set())
    plan = gone.plan()
    assert owners(gone, plan) == {"a": None, "b": None, "c": None}
    assert upgrading(plan) == {"c": "pod-restart-required"}, "held: a and b keep their orphaned pods"
    assert deleted_pods(plan) == {f"{POLICY_DS}-c"}
    # The conflict resolved, h100's upgrade takes a and b.
    resolved = replace(gone, drivers=[h100(), l4()])
    assert upgrading(resolved.plan()) == {
        "a": "pod-restart-required",
        "b": "upgrade-required",
        "c": "pod-restart-required",
    }


def test_switching_off_removes_the_pools_before_the_policys_driver_comes() -> None:
    before = World([node("a", "h100"), node("c", "l4")], [h100(), l4()])
    world = replace(running(before.plan(), before), delegate=False)
    plan = world.plan()
    assert owners(world, plan) == {"a": None, "c": None}
    assert set(map(_key, world.daemonsets)) <= set(plan.deletes)
    assert policy_daemonsets(plan) == [], "the pool pods are still there"
    assert state(plan, "h100") == ("disabled", "Reconciled")
    assert any(note.reason == "DriverSwitchWaiting" for note in plan.notes)
    # Their pods gone: the ClusterPolicy's driver DaemonSet is written.
    gone = replace(
        world,
        nodes=[
            replace(n, labels={k: v for k, v in n.labels.items() if k != OWNER_LABEL}) for n in world.nodes
        ],
        daemonsets={},
        pods={},
        rolled_out=set(),
    )
    assert policy_daemonsets(gone.plan()) == [POLICY_DS]


def test_switching_off_keeps_an_existing_policy_driver_daemonset() -> None:
    world = World(
        [node("a", "h100", owner="h100")],
        [h100()],
        {POLICY_DS: CP_UID, "pool": "uid-h100"},
        {"a": ["pool"]},
        delegate=False,
    )
    plan = world.plan()
    assert _key(POLICY_DS) not in plan.deletes and policy_daemonsets(plan) == []
    assert _key("pool") in plan.deletes


def test_switching_off_mid_switch_gives_the_orphaned_pods_back_to_the_policys_driver() -> None:
    """Switched back before every node switched: the ClusterPolicy's driver DaemonSet, written again,
    adopts the orphaned pods that were its own (its selector matches them), so they hold nothing back;
    a pool's pod does, and so does an orphan that is terminating (not adopted: a new pod would start
    beside it)."""
    world = World(
        [node("a", "h100", owner="h100"), node("b", "h100"), node("c", "l4")],
        [h100(), l4()],
        {"pool": "uid-h100"},
        {"a": ["pool"], "b": [POLICY_DS], "c": [POLICY_DS]},
        delegate=False,
    )
    plan = world.plan()
    assert policy_daemonsets(plan) == [] and owners(world, plan)["a"] is None
    (note,) = [n for n in plan.notes if n.reason == "DriverSwitchWaiting"]
    assert note.endswith("(a)")
    gone = replace(
        world,
        nodes=[node("a", "h100"), *world.nodes[1:]],
        daemonsets={},
        pods={"b": [POLICY_DS], "c": [POLICY_DS]},
    )
    plan = gone.plan()
    assert policy_daemonsets(plan) == [POLICY_DS]
    assert deleted_pods(plan) == set() and upgrading(plan) == {}, "the orphans are left as they are"
    assert policy_daemonsets(replace(gone, terminating={"b"}).plan()) == []


def test_without_the_crd_the_policy_keeps_its_driver_and_says_so() -> None:
    world = replace(switched_on(), crd=False, drivers=[])
    plan = world.plan()
    assert policy_daemonsets(plan) == [POLICY_DS] and pool_daemonsets(plan) == {}
    assert _key(POLICY_DS) not in plan.deletes


def test_the_stack_follows_each_nodes_own_driver() -> None:
    before = World([node("a", "h100"), node("c", "l4")], [h100(), l4()])
    world = running(before.plan(), before)
    observed = world.observed()
    # Only a's pool pod is ready: the toolkit is labelled there, not on c.
    pods = tuple(replace(p, ready=p.node == "a") for p in observed.pods)
    plan = build(replace(observed, pods=pods), NOW)
    assert plan.node_labels["a"].get(DEPLOY_TOOLKIT) == "true"
    assert DEPLOY_TOOLKIT not in plan.node_labels.get("c", {})


def test_owners_of_driver_pods() -> None:
    from gpu_operator.core.driver_pool_plan import pod_owners

    world = World(
        [node("a")],
        [h100()],
        {POLICY_DS: CP_UID, "pool": "uid-h100", "lost": "uid-deleted", "going": CP_UID},
        deleting={"going"},
    )
    world.pods = {"a": [POLICY_DS, "pool", "lost"], "b": ["unknown", "going"], "c": [POLICY_DS, "x"]}
    observed = world.observed()
    pods = [replace(p, daemonset_uid="") if p.node == "c" else p for p in observed.upgrade.driver_pods]
    found = pod_owners(
        pods, observed.driver_daemonsets, observed.objects, observed.drivers, {CP_UID}, {POLICY_DS}
    )
    assert found == {"a": {POLICY, "h100", ORPHAN}, "b": {ORPHAN}, "c": {POLICY_ORPHAN, ORPHAN}}
    # A terminating orphan is nobody's to adopt.
    dying = [replace(p, terminating=True) for p in pods]
    assert pod_owners(dying, {}, {}, (), {CP_UID}, {POLICY_DS})["c"] == {ORPHAN}


def test_the_plan_is_the_same_warm_and_cold() -> None:
    world = switched_on()
    caches = Caches()
    for step in _steps(world):
        assert _decisions(step.plan(caches)) == _decisions(step.plan()), step


def _steps(world: World) -> Iterable[World]:
    yield world
    plan = world.plan()
    gone = replace(world, daemonsets={}, pods={}, rolled_out=set())
    yield gone
    yield running(gone.plan(), gone)
    del plan


def _decisions(plan: Plan) -> tuple[Any, ...]:
    return (plan.node_labels, plan.label_rewrites, plan.objects, plan.deletes, plan.driver_status_writes)


def test_the_policy_driver_enum_is_exhaustive() -> None:
    assert {p.value for p in PolicyDriver} == {"deploy", "keep", "delete"}


def test_an_nvidiadrivers_status_wakes_no_pass_and_changes_no_decision() -> None:
    """The Store compares NVIDIADrivers without their status (runtime/store.py record_driver): the
    plan reads it only to tell whether its status must be written."""
    assert {f.name for f in fields(DriverRef) if not f.compare} == {"status"}
    world = switched_on()
    bare, said = (
        world.plan(),
        replace(world, drivers=[replace(d, status={"state": "ready"}) for d in world.drivers]),
    )
    assert _decisions(bare)[:-1] == _decisions(said.plan())[:-1]


def test_the_same_driver_from_the_clusterpolicy_or_a_pool_has_the_same_digest() -> None:
    """So a switch between them restarts the driver pod without reinstalling the driver (render.py
    _NOT_INSTALL: the pool's NVIDIA_VISIBLE_DEVICES=void is not part of it); another version is not."""

    def digest(daemonset: dict[str, Any]) -> str:
        containers = daemonset["spec"]["template"]["spec"]["containers"]
        (driver_ctr,) = [c for c in containers if c["name"] == "nvidia-driver-ctr"]
        return next(str(e["value"]) for e in driver_ctr["env"] if e["name"] == "DRIVER_CONFIG_DIGEST")

    legacy = World([node("a")], delegate=False).plan()
    (policy_ds,) = [
        o for o in legacy.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == POLICY_DS
    ]
    for version, same in (("595.91.07", True), ("580.105.08", False)):
        pooled = World([node("a")], [driver("default", version, default=True)]).plan()
        (pool_ds,) = pool_daemonsets(pooled).values()
        assert (digest(pool_ds) == digest(policy_ds)) is same, version


def test_gpu_nodes_no_nvidiadriver_selects_are_named_in_the_policys_status() -> None:
    """The seed sample delegates its driver: without an NVIDIADriver for them, the ClusterPolicy says
    which GPU nodes get none, and why, instead of waiting without a word."""
    plan = World([node("a", "h100"), node("b")], [h100()]).plan()
    (note,) = [n for n in plan.notes if n.reason == "NoNVIDIADriver"]
    assert "GPU nodes b and none is the default" in note
    covered = World([node("a", "h100"), node("b")], [h100(), driver("rest", default=True)]).plan()
    assert not [n for n in covered.notes if n.reason == "NoNVIDIADriver"]
