"""The Store's wake rules come from what the planner reads (gpu_operator/core/observed.py): a pod event
wakes a pass at once unless it changed only POD_SHOWN fields, and a DaemonSet event only when its
`rollout` changed. These tests fail when the planner starts deciding on something the rules leave out."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from builders import gpu_node, operand_pod

from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import POD_SHOWN, DaemonSetInfo, PodInfo, pod_decides, rollout
from gpu_operator.core.plan import Observed, Plan, PolicyRef, build

NOW = "2026-12-01T00:00:00Z"
DRIVER = "nvidia.com/gpu.deploy.driver"
REASONS = ("", "ContainerCreating", "PodInitializing", "CrashLoopBackOff", "Terminating", "ImagePullBackOff")
MESSAGES = ("", "back-off restarting failed container")


def other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        return value + "-other"
    raise AssertionError(f"no other value for {value!r}: teach this test the field's type")


def test_a_pod_wakes_a_pass_for_every_field_but_those_only_shown() -> None:
    """A field added to PodInfo is decided on, and wakes a pass, unless declared POD_SHOWN."""
    pod = operand_pod("d0", "driver", "gpu-0", False, "ContainerCreating", "", created=NOW)
    names = {f.name for f in fields(PodInfo)}
    assert POD_SHOWN.issubset(names)
    for name in names:
        changed = replace(pod, **{name: other_value(getattr(pod, name))})
        assert (pod_decides(changed) != pod_decides(pod)) == (name not in POD_SHOWN), name
    assert pod_decides(None) is None


def nodes() -> dict[str, NodeInfo]:
    """Two GPU nodes with the driver's deploy label: what follows (the toolkit's label, the status)
    depends on the driver pod there."""
    found = {}
    for i in range(2):
        node = gpu_node(f"gpu-{i}", uid=f"u{i}")
        found[node.name] = replace(
            node, labels={**node.labels, DRIVER: "true"}, own_labels=frozenset({*node.own_labels, DRIVER})
        )
    return found


def plan_of(pods: tuple[PodInfo, ...], daemonsets: dict[str, DaemonSetInfo] | None = None) -> Plan:
    policy = PolicyRef("p", "uid-p", 1, NOW, {}, {})
    return build(Observed((policy,), nodes(), pods, daemonsets or {}, {}, "gpu-operator"), NOW)


def decisions(plan: Plan) -> tuple[Any, ...]:
    """Everything a plan does but its status: what must not wait for a pass that is only `soon`."""
    upgrade = plan.upgrade
    return (
        plan.node_labels,
        plan.label_rewrites,
        plan.objects,
        plan.deletes,
        plan.namespace_write,
        plan.running,
        plan.gpu_nodes,
        None
        if upgrade is None
        else (upgrade.actions, upgrade.wake_at, upgrade.pods_needed, upgrade.available),
    )


SCENARIOS: tuple[tuple[PodInfo, ...], ...] = (
    (operand_pod("d0", "driver", "gpu-0", False, "ContainerCreating", created=NOW),),
    (operand_pod("d0", "driver", "gpu-0", False, "PodInitializing", initialized=True, created=NOW),),
    (
        operand_pod("d0", "driver", "gpu-0", created=NOW),
        operand_pod("d1", "driver", "gpu-1", False, "CrashLoopBackOff", "x", initialized=True, created=NOW),
    ),
    (
        operand_pod("d0", "driver", "gpu-0", created=NOW),
        operand_pod("t0", "container-toolkit", "gpu-0", False, "ContainerCreating", created=NOW),
        operand_pod("d1", "driver", "gpu-1", False, "Terminating", terminating=True, created=NOW),
    ),
    (
        # Ready driver and toolkit: the components that wait for them follow on gpu-0.
        operand_pod("d0", "driver", "gpu-0", created=NOW),
        operand_pod("t0", "container-toolkit", "gpu-0", created=NOW),
        operand_pod("v0", "operator-validator", "gpu-0", False, "PodInitializing", created=NOW),
        operand_pod("d1", "driver", "gpu-1", created=NOW),
    ),
)


def test_what_a_pod_only_shows_changes_no_decision_of_the_plan() -> None:
    """A pod event that changed only POD_SHOWN fields wakes no pass at once (only soon): then no label,
    object or upgrade step may depend on them, only the status."""
    for pods in SCENARIOS:
        base = decisions(plan_of(pods))
        for i, pod in enumerate(pods):
            for reason in REASONS:
                for message in MESSAGES:
                    varied = (*pods[:i], replace(pod, reason=reason, message=message), *pods[i + 1 :])
                    assert decisions(plan_of(varied)) == base, (pod.name, reason, message)


def test_the_scenarios_would_see_a_decision_on_a_pod() -> None:
    """The test above would catch a decision: flipping what decides (started, ready) changes what
    these plans do."""
    driver = SCENARIOS[0][0]
    assert decisions(plan_of((replace(driver, initialized=True),))) != decisions(plan_of((driver,)))
    ready = SCENARIOS[-1]
    toolkit = ready[1]
    assert "nvidia.com/gpu.deploy.device-plugin" in plan_of(ready).node_labels["gpu-0"]
    unready = (ready[0], replace(toolkit, ready=False), *ready[2:])
    assert decisions(plan_of(ready)) != decisions(plan_of(unready))


def daemonset(**changes: Any) -> DaemonSetInfo:
    """The driver's DaemonSet on 2 nodes, rolled out, with `changes`."""
    fields_ = dict(
        name="nvidia-driver-daemonset",
        component="driver",
        generation=1,
        observed_generation=1,
        desired=2,
        ready=2,
        updated=2,
        available=2,
        unavailable=0,
        on_delete=False,
    )
    return DaemonSetInfo(**{**fields_, **changes})


def test_a_daemonset_is_read_only_through_its_rollout() -> None:
    """DaemonSet events wake a pass only when `rollout` changed: the plan, status included, is the same
    for every DaemonSet with the same rollout."""
    variants = [
        daemonset(),
        daemonset(ready=0),  # RollingUpdate: updated and available count, not ready
        daemonset(ready=1, on_delete=True, updated=0),
        daemonset(desired=1, ready=1, updated=1, available=1),
        daemonset(generation=2),
        daemonset(unavailable=1, available=1),
        daemonset(updated=1),
        daemonset(on_delete=True, ready=1),
    ]
    pods = tuple(operand_pod(f"d{i}", "driver", f"gpu-{i}", created=NOW) for i in range(2))
    by_rollout: dict[Any, Plan] = {}
    for variant in variants:
        plan = plan_of(pods, {variant.name: variant})
        seen = by_rollout.setdefault(rollout(variant), plan)
        assert (plan.statuses, decisions(plan)) == (seen.statuses, decisions(seen)), variant
    assert len(by_rollout) == 3, "rolled out on 2 nodes, on 1, and not"
    assert len({repr(p.statuses) for p in by_rollout.values()}) > 1, "the rollout shows in the status"
