"""Property test of the upgrade state machine: random clusters, policies and sequences of events
(passes, time, version changes, crashing drivers, PodDisruptionBudgets, lost validators, operator
restarts) never break the invariants `upgrade_world.check` asserts after every pass: no more nodes
unavailable than maxUnavailable allows, no more in progress than maxParallelUpgrades, no pod evicted or
deleted on a node that is not being emptied, no cordon outside an upgrade, every node that is not done
explained in the status."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from upgrade_world import World

from gpu_operator.api.upgrade_policy import UpgradePolicySpec

SOMETIMES = st.sampled_from([False, False, False, True])
POLICIES = st.fixed_dictionaries(
    {
        "autoUpgrade": st.sampled_from([True, True, True, False]),  # mostly on: that is what is tested
        "maxParallelUpgrades": st.integers(0, 3),
        "maxUnavailable": st.one_of(st.integers(0, 4), st.sampled_from(["0%", "25%", "50%", "100%"])),
    },
    optional={
        "waitForCompletion": st.fixed_dictionaries(
            {"podSelector": st.sampled_from(["", "app=batch"]), "timeoutSeconds": st.sampled_from([0, 60])}
        ),
        "podDeletion": st.fixed_dictionaries(
            {
                "force": st.booleans(),
                "timeoutSeconds": st.sampled_from([0, 60, 300]),
                "deleteEmptyDir": st.booleans(),
            }
        ),
        "drain": st.fixed_dictionaries(
            {
                "enable": st.booleans(),
                "force": st.booleans(),
                "podSelector": st.sampled_from(["", "app=batch"]),
                "timeoutSeconds": st.sampled_from([0, 120]),
            }
        ),
        "canary": st.one_of(
            st.fixed_dictionaries({"count": st.integers(1, 2), "soakSeconds": st.sampled_from([0, 100])}),
            st.just({"nodeSelector": {"pool": "canary"}}),
        ),
        "validation": st.fixed_dictionaries({"timeoutSeconds": st.sampled_from([0, 120, 600])}),
    },
)

NODE = st.fixed_dictionaries(
    {
        "unschedulable": SOMETIMES,
        "ready": SOMETIMES.map(lambda b: not b),
        "skip": SOMETIMES,
        "canary": st.booleans(),
        "pods": st.lists(
            st.fixed_dictionaries(
                {
                    "gpu": st.sampled_from([True, True, False]),
                    "controller_kind": st.sampled_from(["ReplicaSet", "ReplicaSet", "Job", "", "DaemonSet"]),
                    "empty_dir": SOMETIMES,
                    "batch": st.booleans(),
                    "blocked": st.booleans(),
                }
            ),
            max_size=2,
        ),
    }
)

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "pass": st.sampled_from([5, 30, 130, 400]),  # seconds until the next pass
    "revision": st.sampled_from(["r1", "r2", "r3"]),
    "crash": st.booleans(),
    "unblock": st.just(0),
    "restart": st.just(0),
    "validator": st.booleans(),
}
# Mostly passes, so that upgrades get somewhere between the other events.
EVENTS = st.lists(
    st.sampled_from(["pass"] * 10 + [k for k in VALUES if k != "pass"]).flatmap(
        lambda kind: st.tuples(st.just(kind), VALUES[kind])
    ),
    min_size=10,
    max_size=80,
)


def build(nodes: list[dict[str, Any]]) -> World:
    world = World.make(
        len(nodes),
        unschedulable=[f"node-{i}" for i, n in enumerate(nodes) if n["unschedulable"]],
        skip=[f"node-{i}" for i, n in enumerate(nodes) if n["skip"]],
        labels={f"node-{i}": {"pool": "canary"} for i, n in enumerate(nodes) if n["canary"]},
        gpu_pods=0,
    )
    for i, spec in enumerate(nodes):
        name = f"node-{i}"
        world.nodes[name] = replace(world.nodes[name], ready=spec["ready"])
        for j, pod in enumerate(spec["pods"]):
            added = world.add_pod(
                name,
                f"pod-{i}-{j}",
                gpu=pod["gpu"],
                controller_kind=pod["controller_kind"],
                empty_dir=pod["empty_dir"],
                labels={"app": "batch" if pod["batch"] else "web"},
            )
            if pod["blocked"]:
                world.blocked.add(added.key)
    return world


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(NODE, min_size=1, max_size=6), POLICIES, EVENTS)
def test_invariants_hold_for_any_scenario(
    nodes: list[dict[str, Any]], policy: dict[str, Any], events: list[tuple[str, Any]]
) -> None:
    world = build(nodes)
    upgrade = UpgradePolicySpec.model_validate(policy)
    world.revision = "r2"
    for kind, value in events:
        if kind == "pass":
            world.step(upgrade, seconds=value)
        elif kind == "revision":
            world.revision = value
        elif kind == "crash":
            world.crashing = {world.revision} if value else set()
        elif kind == "unblock":
            world.blocked.clear()
        elif kind == "restart":
            world.evictions.clear()  # the operator's memory is all it loses
        else:
            world.validator_ok = value
    world.step(upgrade)


@settings(max_examples=60, deadline=None)
@given(st.lists(NODE, min_size=1, max_size=6), POLICIES)
def test_a_cooperative_cluster_ends_up_upgraded_and_as_cordoned_as_it_was(
    nodes: list[dict[str, Any]], policy: dict[str, Any]
) -> None:
    """With no PDB in the way, healthy drivers and Ready nodes, every node reaches the new driver and
    ends exactly as cordoned as it started, unless it is skipped, or holds a pod the policy does not
    allow to delete (then it fails and the nodes not yet started stay untouched)."""
    for node in nodes:
        node["ready"] = True
        for pod in node["pods"]:
            pod["blocked"] = False
    if "waitForCompletion" in policy:
        policy["waitForCompletion"]["timeoutSeconds"] = 60  # batch pods here never finish by themselves
    canaries = [n for n in nodes if n["canary"] and not n["skip"]]
    if "nodeSelector" in policy.get("canary", {}) and not canaries:
        policy.pop("canary")  # a selector that matches nothing waits on purpose (tested elsewhere)
    world = build(nodes)
    upgrade = UpgradePolicySpec.model_validate(
        {**policy, "autoUpgrade": True, "maxUnavailable": "100%", "validation": {"timeoutSeconds": 0}}
    )
    world.revision = "r2"
    world.run(upgrade, passes=300)
    states = world.states()
    failed = [n for n, state in states.items() if state == "upgrade-failed"]
    for name in failed:
        # Only pods the policy does not allow to delete can stop a node here.
        reason = world.nodes[name].annotations["nvidia.com/gpu-driver-upgrade-failure"]
        assert "cannot evict" in reason, reason
    for name, final in world.nodes.items():
        if name in failed:
            continue
        if final.labels.get("nvidia.com/gpu-driver-upgrade.skip") == "true" or (
            failed and states[name] == "upgrade-required"
        ):
            # Skipped, or paused by a failed node: untouched.
            assert states[name] == "upgrade-required" and world.drivers[name].revision == "r1"
        else:
            assert states[name] == "upgrade-done", (name, states)
            assert world.drivers[name].revision == "r2"
        assert final.unschedulable == (name in world.initially_unschedulable)
