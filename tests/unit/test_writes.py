"""The order of a pass's writes, which of them wait, and what the pass leaves to the next (core/writes.py):
decisions alone, no API."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from builders import watched_node

from gpu_operator.api import FieldError
from gpu_operator.core.plan import Conclusion, Plan, PolicyRef
from gpu_operator.core.upgrade import UpgradePlan
from gpu_operator.core.vetting import Problems
from gpu_operator.core.writes import (
    deletes_after,
    in_waves,
    label_version,
    labelled_components,
    next_pass_at,
    paced_statuses,
    unsettled,
    version_after_conflict,
)


def test_waves_are_the_labelled_components_objects_their_daemonsets_with_the_rest_then_the_rest() -> None:
    def body(kind: str, component: str) -> dict[str, Any]:
        labels = {"app.kubernetes.io/component": component}
        return {"kind": kind, "metadata": {"name": f"{component}-{kind}", "labels": labels}}

    objects = [
        body(kind, name)
        for name in ("nvidia-driver", "nvidia-dcgm")
        for kind in ("ServiceAccount", "DaemonSet")
    ]
    objects.append(body("RuntimeClass", "pre-requisites"))
    first, second, third = in_waves(objects, {"driver"})
    assert [o["metadata"]["name"] for o in first] == [
        "nvidia-driver-ServiceAccount",
        "pre-requisites-RuntimeClass",
    ]
    assert [o["metadata"]["name"] for o in second] == [
        "nvidia-driver-DaemonSet",
        "nvidia-dcgm-ServiceAccount",
    ]
    assert [o["metadata"]["name"] for o in third] == ["nvidia-dcgm-DaemonSet"]
    assert [o["metadata"]["name"] for o in in_waves(objects, set())[0]] == ["pre-requisites-RuntimeClass"]
    deploy = {"n1": {"nvidia.com/gpu.deploy.driver": "true"}, "n2": {"nvidia.com/gpu.deploy.dcgm": "false"}}
    assert labelled_components(deploy) == {"driver"}
    assert labelled_components({"n1": {"nvidia.com/gpu.deploy.device-plugin": "true"}}) == {
        "device-plugin",
        "mps-control-daemon",
    }


NO_POLICY = Plan(None, None, [], [], [], {}, {}, [])


def concluded(writes: dict[str, dict[str, Any]], progress: set[str]) -> Conclusion:
    """A pass's end with these status writes, those of `progress` telling a rollout's progress only."""
    plan = NO_POLICY
    events: dict[str, list[Any]] = {name: [] for name in writes}
    return Conclusion(plan, writes, events, {}, frozenset(progress))


def test_progress_waits_for_the_interval_after_the_policys_last_status_write() -> None:
    body = {"componentsReady": "1/9"}
    conclusion = concluded({"p": body}, {"p"})
    held = paced_statuses(conclusion, {"p": 100.0}, interval=2.0, now=100.5)
    assert held.writes == {} and held.due_in == 1.5
    assert paced_statuses(conclusion, {"p": 100.0}, interval=2.0, now=102.0).writes == {"p": body}
    assert paced_statuses(conclusion, {}, interval=2.0, now=0.0).writes == {"p": body}, "never written"


def test_a_new_state_goes_at_once_and_the_soonest_held_back_write_says_when() -> None:
    state, progress = {"state": "ready"}, {"componentsReady": "2/9"}
    conclusion = concluded({"a": state, "b": progress, "c": progress}, {"b", "c"})
    paced = paced_statuses(conclusion, {"a": 10.0, "b": 9.5, "c": 9.0}, interval=2.0, now=10.0)
    assert paced.writes == {"a": state}, "a new state is never held back, however recent the last write"
    assert paced.due_in == 1.0
    assert paced_statuses(concluded({"a": state}, set()), {"a": 10.0}, 2.0, 10.0).due_in is None


def test_nothing_is_deleted_while_a_write_of_the_pass_failed() -> None:
    old = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-driver-daemonset-5.15")
    role = ("rbac.authorization.k8s.io/v1", "Role", "gpu-operator", "nvidia-dcgm")
    assert deletes_after([old, role], {}) == (old, role)
    assert deletes_after([old, role], {"driver": "500 Internal Server Error"}) == ()


def test_the_next_pass_comes_at_the_first_timeout_or_held_back_status_and_at_once_after_a_refusal() -> None:
    upgrade = UpgradePlan((), {}, wake_at=1060.0)
    assert next_pass_at(upgrade, 1002.0, False, clock=1000.0) == 1002.0
    assert next_pass_at(upgrade, None, False, clock=1000.0) == 1060.0
    assert next_pass_at(replace(upgrade, wake_at=None), None, False, clock=1000.0) is None
    assert next_pass_at(None, 1002.0, False, clock=1000.0) == 1002.0
    assert next_pass_at(upgrade, 1002.0, True, clock=1000.0) == 1000.0, "say what the eviction waits for"


def test_unsettled_are_the_conflicts_the_failed_writes_and_what_keeps_the_generation_back() -> None:
    conflicts = {"dcgm": "ServiceAccount nvidia-dcgm exists and was not created by this operator"}
    errors = {"node/gpu-0": "500 Internal Server Error"}
    assert unsettled(NO_POLICY, conflicts, errors) == {**conflicts, **errors}
    active = PolicyRef("p", "uid-p", 3, "2026-01-01T00:00:00Z", {}, {})
    problems = Problems(
        missing=(FieldError("spec.driver.licensingConfig", "ConfigMap 'licensing' not found"),),
        failures=("looking up Secret registry: 503 ServiceUnavailable: etcd leader changed",),
    )
    held = replace(NO_POLICY, active=active, problems=problems)
    assert unsettled(held, {}, {}) == {"generation 3": "; ".join(problems.lines())}
    assert unsettled(replace(held, problems=Problems()), {}, {}) == {}, "nothing keeps it back"


def test_a_label_write_goes_on_the_newest_version_unless_what_the_plan_read_changed() -> None:
    planned = watched_node()
    assert label_version(planned, None) == "1"  # nothing newer known: the plan's own
    # Only its version moved (a status update, another manager's annotation): the decision stands.
    assert label_version(planned, replace(planned, resource_version="7")) == "7"
    # A label the plan reads changed meanwhile (k8s-driver-manager's pause): the next pass decides.
    paused = replace(
        planned, labels={**planned.labels, "nvidia.com/gpu.deploy.driver": "paused"}, resource_version="8"
    )
    assert label_version(planned, paused) is None


def test_after_a_conflict_the_write_goes_again_at_once_only_if_the_version_alone_moved() -> None:
    planned = watched_node()
    assert version_after_conflict(planned, replace(planned, resource_version="9")) == "9"
    assert version_after_conflict(planned, None) is None  # not known: its watch brings it
    cordoned = replace(planned, unschedulable=True, resource_version="9")
    assert version_after_conflict(planned, cordoned) is None
