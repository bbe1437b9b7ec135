"""Every wait of the driver upgrade ends by itself when a person (or another controller) gets there
first: the thing it waits for removed by hand, deleted twice, or already there before the wait
starts. Each case meddles with a 3-node rollout at one step and runs it to the end; the invariants of
upgrade_world.check hold after every pass (never more cordoned or in progress than allowed, pods
evicted only on nodes being emptied, every waiting node explained). What ends each wait is listed in
docs/upgrades.md ("What ends each wait")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from upgrade_world import World

from gpu_operator.api.upgrade_policy import UpgradePolicySpec
from gpu_operator.core.upgrade import State

Meddle = Callable[[World, str], None]


def policy() -> UpgradePolicySpec:
    return UpgradePolicySpec.model_validate(
        {
            "autoUpgrade": True,
            "maxParallelUpgrades": 1,
            "waitForCompletion": {"podSelector": "app=batch", "timeoutSeconds": 120},
            "drain": {"enable": True, "timeoutSeconds": 600},
        }
    )


def job_deleted_by_hand(world: World, node: str) -> None:
    for uid, pod in list(world.pods.items()):
        if pod.node == node and pod.labels.get("app") == "batch":
            del world.pods[uid]


def gpu_pods_deleted_by_hand(world: World, node: str) -> None:
    for uid, pod in list(world.pods.items()):
        if pod.node == node and pod.gpu:
            del world.pods[uid]


def gpu_pods_deleted_twice(world: World, node: str) -> None:
    """A person deletes the pods the operator is evicting: terminating now, whatever the eviction says."""
    for uid, pod in list(world.pods.items()):
        if pod.node == node and pod.gpu:
            world.pods[uid] = replace(pod, terminating=True)


def other_pods_deleted_by_hand(world: World, node: str) -> None:
    for uid, pod in list(world.pods.items()):
        if pod.node == node and not pod.gpu:
            del world.pods[uid]


def driver_pod_deleted_by_hand(world: World, node: str) -> None:
    world.drivers[node] = replace(world.drivers[node], terminating=True, ready=False)


def new_driver_pod_already_there(world: World, node: str) -> None:
    """The DaemonSet already replaced the old pod (someone deleted it) before the operator's step."""
    world.drivers[node] = world._driver(node, ready=False, created=world.now)


def validator_deleted_by_hand(world: World, node: str) -> None:
    world.validators[node] = replace(world.validators[node], terminating=True, ready=False)


def uncordoned_by_hand(world: World, node: str) -> None:
    world.nodes[node] = replace(world.nodes[node], unschedulable=False)


CASES: list[tuple[State, Meddle, int]] = [
    (State.WAIT_FOR_JOBS_REQUIRED, job_deleted_by_hand, 1),
    (State.POD_DELETION_REQUIRED, gpu_pods_deleted_by_hand, 1),
    (State.POD_DELETION_REQUIRED, gpu_pods_deleted_twice, 1),
    (State.DRAIN_REQUIRED, other_pods_deleted_by_hand, 1),
    (State.POD_RESTART_REQUIRED, driver_pod_deleted_by_hand, 1),
    (State.POD_RESTART_REQUIRED, new_driver_pod_already_there, 1),
    (State.VALIDATION_REQUIRED, validator_deleted_by_hand, 2),
    (State.VALIDATION_REQUIRED, uncordoned_by_hand, 1),
]


@pytest.mark.parametrize(("state", "meddle", "times"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_wait_ends_when_someone_else_got_there_first(state: State, meddle: Meddle, times: int) -> None:
    world = World.make(3, gpu_pods=1)
    for node in world.nodes:
        world.add_pod(node, f"web-{node}")  # no GPU: only the drain moves it
        world.add_pod(node, f"batch-{node}", labels={"app": "batch"}, controller_kind="Job")
    world.revision = "r2"
    upgrade = policy()
    meddled: list[str] = []
    for _ in range(80):
        world.step(upgrade)
        for node in sorted(world.nodes):
            if world.state(node) == state and meddled.count(node) < times:
                meddle(world, node)
                meddled.append(node)
        if world.states() == dict.fromkeys(world.nodes, "upgrade-done"):
            break
    assert meddled, f"no node was seen at {state}"
    assert world.states() == dict.fromkeys(world.nodes, "upgrade-done"), world.states()
    assert all(d.revision == "r2" and d.ready and not d.terminating for d in world.drivers.values())
    assert not world.unavailable()
    # Every node's validator validated the new driver.
    assert all(world.validators[n].created >= world.drivers[n].created for n in world.nodes)


def test_a_done_node_whose_driver_pod_is_replaced_by_hand_is_validated_again() -> None:
    """Not an upgrade: the driver pod of a done node deleted by hand (the chaos test does it). Its
    replacement's k8s-driver-manager evicts nothing when no driver was loaded, so the validator that
    ran before stays: the node is not up to date until a validator started after the new driver
    pod is Ready, and a person's cordon stays."""
    world = World.make(2, gpu_pods=0, unschedulable=["node-0"])
    world.driver_replaced_by_hand = {"node-0"}
    world.drivers["node-0"] = world._driver("node-0", ready=False, created=world.now)
    upgrade = policy()
    summaries = []
    for _ in range(10):
        plan = world.step(upgrade)
        summaries.append(plan.status["summary"])
    assert summaries[0] != "up to date", summaries
    assert world.states() == dict.fromkeys(world.nodes, "upgrade-done")
    assert world.validators["node-0"].created >= world.drivers["node-0"].created
    assert world.nodes["node-0"].unschedulable and not world.nodes["node-1"].unschedulable
    assert summaries[-1] == "up to date"


def test_a_tenants_bare_gpu_pod_holds_the_upgrade_only_while_it_is_there() -> None:
    """A pod without a controller may only be deleted with `force`: the node fails at pod deletion
    and the upgrade pauses, naming the pod; once its owner deletes it, the node and the rest go on by
    themselves (no pause outlives its cause)."""
    world = World.make(3, gpu_pods=0)
    world.add_pod("node-0", "bare", gpu=True, controller_kind="")
    world.revision = "r2"
    upgrade = UpgradePolicySpec.model_validate(
        {"autoUpgrade": True, "maxParallelUpgrades": 1, "podDeletion": {"timeoutSeconds": 60}}
    )
    for _ in range(5):
        plan = world.step(upgrade)
    assert plan.status["paused"] and world.states()["node-0"] == "upgrade-failed"
    (failed,) = plan.status["failed"]
    assert "default/bare has no controller (force allows deleting it)" in failed["reason"]
    assert set(world.states().values()) == {"upgrade-failed", "upgrade-required"}, "nothing else moved"
    world.pods = {uid: pod for uid, pod in world.pods.items() if pod.name != "bare"}
    for _ in range(30):
        world.step(upgrade)
        if world.states() == dict.fromkeys(world.nodes, "upgrade-done"):
            break
    assert world.states() == dict.fromkeys(world.nodes, "upgrade-done"), world.states()
    assert not world.unavailable()
