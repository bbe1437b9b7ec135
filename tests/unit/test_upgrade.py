"""The driver-upgrade state machine, table-tested without a cluster: every transition and its exact
writes, the limits, evictions refused by a PodDisruptionBudget, the canary stage, the pause, rollback,
the skip label, autoUpgrade off, and a restarted operator resuming at the right step."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from builders import condition, node_body
from hypothesis import given
from hypothesis import strategies as st
from upgrade_world import PDB_MESSAGE, START, World

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import crd
from gpu_operator.api.selector import parse_selector
from gpu_operator.api.status import ClusterPolicyStatus
from gpu_operator.api.upgrade_policy import UpgradePolicySpec
from gpu_operator.core.upgrade import (
    DeletePod,
    EvictPod,
    NodeActions,
    PatchNode,
    State,
    UpgradeEvent,
    UpgradePlan,
    controller_revision,
    current_revision,
    driver_daemonset,
    driver_pod,
    event_subject,
    plan_upgrade,
    rounds,
    upgrade_node,
    validator_pod,
    workload_pod,
)
from gpu_operator.core.upgrade.facts import format_time
from gpu_operator.core.upgrade.node_steps import CRASH_LOOP_RESTARTS, EVICTION_RETRY_SECONDS
from gpu_operator.core.upgrade.rollout import manual_inputs
from gpu_operator.core.upgrade.states import (
    AUTO_UPGRADE_ANNOTATION,
    FAILURE_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REQUESTED_ANNOTATION,
    SAFE_LOAD_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_START_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    WAIT_FOR_JOBS_START_ANNOTATION,
)


def policy(**fields: Any) -> UpgradePolicySpec:
    return UpgradePolicySpec.model_validate({"autoUpgrade": True, **fields})


def plan(world: World, upgrade: UpgradePolicySpec, **kwargs: Any) -> UpgradePlan:
    return plan_upgrade(upgrade, world.facts(**kwargs), target_version=f"v-{world.revision}")


def node_writes(result: UpgradePlan, node: str) -> list[Any]:
    return [w for a in result.actions if a.node == node for w in a.writes]


def midway(world: World, node: str, state: State, *, since: float = START) -> None:
    """The node is on its way to a new driver revision r2, at `state`."""
    world.revision = "r2"
    put_state(world, node, state, since=since)


def put_state(
    world: World, node: str, state: State, *, since: float = START, annotations: dict[str, str] | None = None
) -> None:
    current = world.nodes[node]
    world.nodes[node] = replace(
        current,
        labels={**current.labels, STATE_LABEL: str(state)},
        annotations={**current.annotations, STATE_START_ANNOTATION: str(int(since)), **(annotations or {})},
        unschedulable=True,
    )


def pending_reasons(result: UpgradePlan) -> dict[str, str]:
    return {n: g["reason"] for g in result.status["pending"] for n in g["nodes"]}


# --- the policy model ----------------------------------------------------------------------------


def test_upgrade_policy_has_nvidias_defaults() -> None:
    spec = parse_spec({"driver": {"upgradePolicy": {}}}).driver.upgradePolicy
    assert spec is not None
    assert (spec.autoUpgrade, spec.maxParallelUpgrades, spec.maxUnavailable) == (False, 1, "25%")
    deletion = spec.pod_deletion()
    assert (deletion.force, deletion.timeoutSeconds, deletion.deleteEmptyDir) == (False, 300, False)
    assert spec.drain is None and spec.canary is None and spec.validation is None
    helm = parse_spec({"driver": {"upgradePolicy": {"gpuPodDeletion": {"force": True}}}}).driver.upgradePolicy
    assert helm is not None and helm.pod_deletion().force is True


@pytest.mark.parametrize(
    ("value", "nodes", "expected"),
    [
        ("25%", 4, 1),
        ("25%", 5, 2),
        ("25%", 0, 0),
        ("10%", 1, 1),
        ("0%", 8, 0),
        ("100%", 3, 3),
        (2, 8, 2),
        ("3", 8, 3),
    ],
)
def test_max_unavailable_rounds_percentages_up(value: int | str, nodes: int, expected: int) -> None:
    assert policy(maxUnavailable=value).max_unavailable(nodes) == expected


@pytest.mark.parametrize(
    ("upgrade", "path", "fragment"),
    [
        ({"podDeletion": {}, "gpuPodDeletion": {}}, "spec.driver.upgradePolicy", "not both"),
        ({"canary": {"soakSeconds": 60}}, "spec.driver.upgradePolicy.canary", "nodeSelector, count or both"),
        ({"canary": {"count": 0}}, "spec.driver.upgradePolicy.canary.count", "1"),
        (
            {"canary": {"nodeSelector": {"pool": "a b"}}},
            "spec.driver.upgradePolicy.canary.nodeSelector",
            "label value",
        ),
        (
            {"drain": {"podSelector": "app in (a"}},
            "spec.driver.upgradePolicy.drain.podSelector",
            "unbalanced",
        ),
        (
            {"waitForCompletion": {"podSelector": "=app"}},
            "spec.driver.upgradePolicy.waitForCompletion.podSelector",
            "is not a requirement",
        ),
        (
            {"waitForCompletion": {"podSelector": "a=b=c"}},
            "spec.driver.upgradePolicy.waitForCompletion.podSelector",
            "label value",
        ),
        ({"validation": {"timeoutSeconds": -1}}, "spec.driver.upgradePolicy.validation.timeoutSeconds", "0"),
        ({"canary": {"count": 1, "extra": 1}}, "spec.driver.upgradePolicy.canary.extra", "unknown field"),
    ],
)
def test_invalid_upgrade_policies_name_the_field(upgrade: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_spec({"driver": {"upgradePolicy": upgrade}})
    found = {e.path: e.message for e in info.value.errors}
    assert path in found, found
    assert fragment in found[path]


def _upgrade_policy_crd() -> dict[str, Any]:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node: dict[str, Any] = spec["properties"]["driver"]["properties"]["upgradePolicy"]
    return node


@pytest.mark.parametrize("present", list(itertools.product([False, True], repeat=2)))
def test_cross_field_rules_agree_with_cel(present: tuple[bool, bool]) -> None:
    """The two admission rules say what the models say (has() is all they use)."""
    schema = _upgrade_policy_crd()
    (deletion_rule,) = schema["x-kubernetes-validations"]
    (canary_rule,) = schema["properties"]["canary"]["x-kubernetes-validations"]
    assert deletion_rule["rule"] == "!has(self.podDeletion) || !has(self.gpuPodDeletion)"
    assert canary_rule["rule"] == "has(self.nodeSelector) || has(self.count)"
    both, either = present
    deletion: dict[str, Any] = (
        {"podDeletion": {}, **({"gpuPodDeletion": {}} if both else {})} if either else {}
    )
    canary = {k: v for k, v, keep in (("nodeSelector", {"a": "b"}, both), ("count", 1, either)) if keep}
    for upgrade, by_cel in ((deletion, not (either and both)), ({"canary": canary}, both or either)):
        try:
            parse_spec({"driver": {"upgradePolicy": upgrade}})
            accepted = True
        except PolicyError:
            accepted = False
        assert accepted == by_cel, upgrade


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("app=train", {"app": "train"}, True),
        ("app==train", {"app": "serve"}, False),
        ("app!=train", {}, True),
        ("app in (a, b),tier", {"app": "b", "tier": "x"}, True),
        ("app notin (a,b)", {"app": "a"}, False),
        ("!legacy", {"legacy": ""}, False),
        ("gpus>2", {"gpus": "4"}, True),
        ("gpus<2", {"gpus": "many"}, False),
        ("example.com/team=ml, app", {"example.com/team": "ml", "app": ""}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_selector(selector).matches(labels) is matches


@given(st.text(alphabet="ab=!,() in<>1-./", max_size=16))
def test_any_selector_text_parses_or_says_why(text: str) -> None:
    """A bad selector is a ValueError (a field error in the status), never another exception."""
    try:
        parse_selector(text)
    except ValueError as exc:
        assert repr(text) in str(exc) or text.strip() in str(exc)


# --- facts from API bodies -----------------------------------------------------------------------


def test_facts_from_bodies() -> None:
    body = node_body(
        "n1", {"a": "b"}, spec={"unschedulable": True}, status={"conditions": [condition("Ready", False)]}
    )
    node = upgrade_node(body)
    assert (node.name, node.unschedulable, node.ready) == ("n1", True, False)
    template = {
        "spec": {
            "initContainers": [{"name": "m", "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "d1"}]}],
            "containers": [{"name": "driver", "image": "nvcr.io/nvidia/driver:595.58.03-ubuntu24.04"}],
        }
    }
    owner = {"controller": True, "kind": "DaemonSet", "name": "nvidia-driver-daemonset", "uid": "u1"}
    bodies = [
        {
            "metadata": {"name": f"nvidia-driver-daemonset-h{i}", "ownerReferences": [owner]},
            "revision": i,
            "data": {"spec": {"template": {**template, "$patch": "replace"}}},
        }
        for i in (1, 3, 2)
    ] + [
        {
            "metadata": {"name": "other-x", "ownerReferences": [{**owner, "uid": "u2", "name": "other"}]},
            "revision": 9,
        },
        {"metadata": {"name": "orphan", "ownerReferences": []}, "revision": 12},
    ]
    revisions = [r for r in map(controller_revision, bodies) if r is not None]
    assert len(revisions) == 4  # the orphan is nobody's revision
    newest = current_revision("u1", revisions)
    assert newest is not None and (newest.hash, newest.number) == ("h3", 3)
    daemonset = driver_daemonset("nvidia-driver-daemonset", "u1", revisions)
    assert daemonset is not None
    assert (daemonset.revision, daemonset.config_digest, daemonset.version) == (
        "h3",
        "d1",
        "595.58.03-ubuntu24.04",
    )
    # Without a known revision nothing can be said about its pods: no DaemonSet to compare with.
    assert driver_daemonset("nvidia-driver-daemonset", "u3", revisions) is None
    pod = driver_pod(
        {
            "metadata": {
                "name": "drv",
                "namespace": "gpu-operator",
                "uid": "p1",
                "labels": {
                    "app.kubernetes.io/component": "driver",
                    "controller-revision-hash": "h2",
                    "app": "nvidia-driver-daemonset",
                },
                "ownerReferences": [{"controller": True, "kind": "DaemonSet", "uid": "u1"}],
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"nodeName": "n1"},
            "status": {
                "containerStatuses": [
                    {"ready": False, "restartCount": 12, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
                ]
            },
        }
    )
    assert pod is not None
    assert (pod.daemonset_uid, pod.revision, pod.restarts, pod.reason, pod.ready) == (
        "u1",
        "h2",
        12,
        "CrashLoopBackOff",
        False,
    )
    assert pod.created == 1704067200.0 and pod.app == "nvidia-driver-daemonset"
    validator = validator_pod(
        {
            "metadata": {"name": "v", "labels": {"app.kubernetes.io/component": "operator-validator"}},
            "spec": {"nodeName": "n1"},
        }
    )
    assert validator is not None and (validator.node, validator.ready) == ("n1", False)


@pytest.mark.parametrize(
    ("resources", "gpu"),
    [
        ({"limits": {"nvidia.com/gpu": 1}}, True),
        ({"requests": {"nvidia.com/mig-1g.10gb": 1}}, True),
        ({"requests": {"nvidia.com/gpu.shared": 1}}, True),
        ({"requests": {"cpu": 1}}, False),
        ({}, False),
    ],
)
def test_gpu_pods_are_found_by_their_requests(resources: dict[str, Any], gpu: bool) -> None:
    body = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "u",
            "ownerReferences": [{"controller": True, "kind": "Job"}],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": resources}],
            "volumes": [{"emptyDir": {}}],
        },
        "status": {"phase": "Running"},
    }
    pod = workload_pod(body)
    assert pod is not None
    assert (pod.gpu, pod.controller_kind, pod.empty_dir, pod.key) == (gpu, "Job", True, "ml/p")
    assert workload_pod({**body, "spec": {}}) is None  # not scheduled: on no node yet


# --- single transitions, exact writes ------------------------------------------------------------


def test_first_pass_marks_nodes_done_and_sets_nvidias_annotation() -> None:
    world = World.make(2)
    world.nodes = {n: replace(node, labels={}, annotations={}) for n, node in world.nodes.items()}
    result = plan(world, policy())
    assert result.writes == [
        PatchNode(
            n,
            labels={STATE_LABEL: "upgrade-done"},
            annotations={AUTO_UPGRADE_ANNOTATION: "true", STATE_START_ANNOTATION: str(int(START))},
        )
        for n in ("node-0", "node-1")
    ]
    world.apply(result)
    again = plan(world, policy())
    assert again.writes == [] and again.wake_at is None  # at rest: nothing to write
    assert again.status["summary"] == "up to date"


def test_out_of_date_node_is_cordoned_and_its_gpu_pods_evicted_in_one_pass() -> None:
    world = World.make(1, gpu_pods=0)
    gpu = world.add_pod("node-0", "train", gpu=True)
    world.add_pod("node-0", "web")  # not a GPU pod
    world.add_pod("node-0", "monitor", gpu=True, controller_kind="DaemonSet")  # comes back at once
    world.add_pod("node-0", "done", gpu=True, phase="Succeeded")
    world.revision = "r2"
    result = plan(world, policy())
    patch, *pods = node_writes(result, "node-0")
    assert patch == PatchNode(
        "node-0",
        labels={STATE_LABEL: "pod-deletion-required"},
        annotations={STATE_START_ANNOTATION: str(int(START))},
        unschedulable=True,
    )
    assert pods == [EvictPod("default", "train", gpu.uid)]
    assert patch.body() == {
        "metadata": {"labels": dict(patch.labels), "annotations": dict(patch.annotations)},
        "spec": {"unschedulable": True},
    }
    assert pods[0].body()["deleteOptions"] == {"preconditions": {"uid": gpu.uid}}
    (event,) = result.events
    assert event.node == "node-0" and event.type == "Normal" and event.reason == "GPUDriverUpgrade"
    assert "upgrade-done → upgrade-required → cordon-required" in event.message
    assert result.wake_at == START + EVICTION_RETRY_SECONDS


def test_unlisted_pods_are_waited_for_never_taken_for_none() -> None:
    """The caller lists pods only on nodes being emptied: a node that starts is cordoned and waits
    for its list, and its pods are asked for (pods_needed); with the list it goes on."""
    world = World.make(2, gpu_pods=1)
    world.revision = "r2"
    unlisted = replace(world.facts(), pods=[], pods_known=frozenset())
    first = plan_upgrade(policy(), unlisted, target_version="v-r2")
    (patch,) = node_writes(first, "node-0")
    assert patch.labels == {STATE_LABEL: "wait-for-jobs-required"} and patch.unschedulable
    assert first.status["inProgress"][0]["reason"] == "listing the pods on the node"
    assert first.pods_needed == {"node-0"} and first.wake_at is None
    world.apply(first)
    listed = replace(world.facts(), pods_known=first.pods_needed)
    second = plan_upgrade(policy(), listed, target_version="v-r2")
    evicted = [w for w in node_writes(second, "node-0") if isinstance(w, EvictPod)]
    assert [w.name for w in evicted] == ["train-node-0-0"]
    assert second.pods_needed == {"node-0"}


def test_failed_node_resumes_on_gone_pods_only_once_they_are_listed() -> None:
    world = World.make(2, gpu_pods=0)
    world.revision = "r2"
    failure = {"step": "pod-deletion-required", "revision": "r2", "reason": "eviction timed out"}
    put_state(world, "node-0", State.FAILED, annotations={FAILURE_ANNOTATION: json.dumps(failure)})
    unlisted = plan_upgrade(policy(), replace(world.facts(), pods_known=frozenset()))
    assert node_writes(unlisted, "node-0") == [] and unlisted.pods_needed == {"node-0"}
    listed = plan_upgrade(policy(), replace(world.facts(), pods_known=frozenset({"node-0"})))
    assert node_writes(listed, "node-0")[0].labels == {STATE_LABEL: "pod-restart-required"}


@pytest.mark.parametrize(
    ("parallel", "unavailable", "available"), [(1, 1, 0), (3, 4, 2), (0, 2, 1), (0, "100%", 5)]
)
def test_available_upgrades_as_nvidia_counts_them(
    parallel: int, unavailable: int | str, available: int
) -> None:
    """NVIDIA's gauge, taken before the pass starts anything: free slots (every pending node with
    maxParallelUpgrades 0) within what maxUnavailable leaves; exactly that many nodes start."""
    world = World.make(6)
    midway(world, "node-0", State.POD_RESTART_REQUIRED)
    upgrade = policy(maxParallelUpgrades=parallel, maxUnavailable=unavailable)
    result = plan(world, upgrade)
    assert result.available == available
    world.apply(result)
    assert len(world.in_progress() - {"node-0"}) == available


def test_no_upgrade_is_available_while_paused() -> None:
    world = World.make(3)
    world.revision = "r2"
    failure = {"step": "validation-required", "revision": "r2", "reason": "validator not Ready"}
    put_state(world, "node-0", State.FAILED, annotations={FAILURE_ANNOTATION: json.dumps(failure)})
    assert plan(world, policy(maxParallelUpgrades=0, maxUnavailable="100%")).available == 0


def test_initially_cordoned_node_is_recorded_and_left_cordoned() -> None:
    world = World.make(2, unschedulable=["node-1"])
    world.revision = "r2"
    first = plan(world, policy(maxParallelUpgrades=2, maxUnavailable=2))
    patch = node_writes(first, "node-1")[0]
    assert patch.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"
    world.run(policy(maxParallelUpgrades=2, maxUnavailable=2))
    assert world.states() == {"node-0": "upgrade-done", "node-1": "upgrade-done"}
    assert world.nodes["node-1"].unschedulable and not world.nodes["node-0"].unschedulable
    assert INITIAL_UNSCHEDULABLE_ANNOTATION not in world.nodes["node-1"].annotations


def test_wait_for_jobs_waits_then_times_out() -> None:
    world = World.make(1, gpu_pods=0)
    job = world.add_pod("node-0", "job", labels={"kind": "batch"}, controller_kind="Job")
    midway(world, "node-0", State.WAIT_FOR_JOBS_REQUIRED)
    upgrade = policy(waitForCompletion={"podSelector": "kind=batch", "timeoutSeconds": 120})
    first = plan(world, upgrade)
    assert node_writes(first, "node-0") == [
        PatchNode(
            "node-0",
            annotations={WAIT_FOR_JOBS_START_ANNOTATION: str(int(START))},
        )
    ]
    assert first.wake_at == START + 120
    assert (
        "waiting for 1 pod matching 'kind=batch' to complete: default/job"
        in first.status["inProgress"][0]["reason"]
    )
    world.apply(first)
    world.now += 60
    assert node_writes(plan(world, upgrade), "node-0") == []  # still waiting, nothing new to write
    world.now += 60
    world.apply(plan(world, upgrade))
    assert world.state("node-0") == State.POD_RESTART_REQUIRED
    assert WAIT_FOR_JOBS_START_ANNOTATION not in world.nodes["node-0"].annotations
    forever = World.make(1, gpu_pods=0)
    forever.pods[job.uid] = job
    midway(forever, "node-0", State.WAIT_FOR_JOBS_REQUIRED)
    waiting = plan(forever, policy(waitForCompletion={"podSelector": "kind=batch"}), forget_evictions=True)
    assert waiting.wake_at is None and "(no timeout)" in waiting.status["inProgress"][0]["reason"]


def test_finished_jobs_let_the_node_go_on() -> None:
    world = World.make(1, gpu_pods=0)
    world.add_pod("node-0", "job", labels={"kind": "batch"}, phase="Succeeded")
    midway(world, "node-0", State.WAIT_FOR_JOBS_REQUIRED)
    world.apply(plan(world, policy(waitForCompletion={"podSelector": "kind=batch"})))
    assert world.state("node-0") == State.POD_RESTART_REQUIRED


def test_refused_eviction_is_retried_then_fails_without_force() -> None:
    world = World.make(1, gpu_pods=0)
    pod = world.add_pod("node-0", "train", gpu=True)
    world.blocked.add(pod.key)
    midway(world, "node-0", State.POD_DELETION_REQUIRED)
    upgrade = policy(podDeletion={"timeoutSeconds": 60})
    world.apply(first := plan(world, upgrade))
    assert EvictPod("default", "train", pod.uid) in first.writes
    assert world.evictions[pod.uid].status == 429
    world.now += 5
    soon = plan(world, upgrade)
    assert not any(isinstance(w, EvictPod) for w in soon.writes)  # not before the retry time
    assert soon.wake_at == START + EVICTION_RETRY_SECONDS
    assert PDB_MESSAGE in soon.status["inProgress"][0]["reason"]
    world.now += EVICTION_RETRY_SECONDS
    assert EvictPod("default", "train", pod.uid) in plan(world, upgrade).writes
    world.now = START + 60
    world.apply(late := plan(world, upgrade))
    assert world.state("node-0") == State.FAILED
    failure = json.loads(world.nodes["node-0"].annotations[FAILURE_ANNOTATION])
    assert failure["step"] == "pod-deletion-required" and failure["revision"] == "r2"
    assert "eviction timed out after 60s" in failure["reason"] and PDB_MESSAGE in failure["reason"]
    assert late.status["paused"] and "node-0 failed at pod-deletion-required" in late.status["pausedReason"]
    assert [e.type for e in late.events] == ["Warning", "Warning"]
    assert late.events[1].node is None and late.events[1].message.startswith("driver upgrade paused")


def test_refused_eviction_with_force_deletes_after_the_timeout() -> None:
    world = World.make(1, gpu_pods=0)
    pod = world.add_pod("node-0", "train", gpu=True)
    world.blocked.add(pod.key)
    midway(world, "node-0", State.POD_DELETION_REQUIRED)
    upgrade = policy(podDeletion={"timeoutSeconds": 60, "force": True})
    world.apply(plan(world, upgrade))
    world.now = START + 60
    result = plan(world, upgrade)
    assert node_writes(result, "node-0") == [DeletePod("default", "train", pod.uid, "forced")]
    world.apply(result)
    world.tick()
    world.tick()  # terminating for a while, then gone
    world.apply(plan(world, upgrade))
    assert world.state("node-0") == State.POD_RESTART_REQUIRED


def test_operator_restart_keeps_the_eviction_timeout() -> None:
    """The timeout runs from the state's start annotation, not from the operator's memory."""
    world = World.make(1, gpu_pods=0)
    pod = world.add_pod("node-0", "train", gpu=True)
    world.blocked.add(pod.key)
    midway(world, "node-0", State.POD_DELETION_REQUIRED, since=START - 300)
    world.apply(plan(world, policy(), forget_evictions=True))
    assert world.state("node-0") == State.FAILED


@pytest.mark.parametrize(
    ("pod", "fix"),
    [({"controller_kind": ""}, {"force": True}), ({"empty_dir": True}, {"deleteEmptyDir": True})],
)
def test_pods_that_need_force_or_delete_empty_dir(pod: dict[str, Any], fix: dict[str, Any]) -> None:
    world = World.make(1, gpu_pods=0)
    world.add_pod("node-0", "train", gpu=True, **pod)
    midway(world, "node-0", State.POD_DELETION_REQUIRED)
    refused = plan(world, policy())
    assert "cannot evict default/train" in refused.status["failed"][0]["reason"]
    with_drain = plan(world, policy(drain={"enable": True, **fix}))
    assert any(isinstance(w, EvictPod) for w in with_drain.writes)  # NVIDIA's fallback: drain instead
    assert "draining instead" in with_drain.events[0].message
    assert any(isinstance(w, EvictPod) for w in plan(world, policy(podDeletion=fix)).writes)


def test_drain_honours_its_selector_and_the_skip_label() -> None:
    world = World.make(1, gpu_pods=0)
    batch = world.add_pod("node-0", "batch", labels={"app": "batch"})
    world.add_pod("node-0", "web", labels={"app": "web"})
    world.add_pod(
        "node-0", "keep", labels={"app": "batch", "nvidia.com/gpu-driver-upgrade-drain.skip": "true"}
    )
    world.add_pod("node-0", "static", labels={"app": "batch"}, mirror=True)
    midway(world, "node-0", State.DRAIN_REQUIRED)
    result = plan(world, policy(drain={"enable": True, "podSelector": "app=batch"}))
    assert [w for w in result.writes if not isinstance(w, PatchNode)] == [
        EvictPod("default", "batch", batch.uid)
    ]
    no_drain = plan(world, policy())
    world.apply(no_drain)
    assert world.state("node-0") == State.POD_RESTART_REQUIRED


def test_pod_restart_deletes_the_old_driver_pod_and_waits_for_the_new_one() -> None:
    world = World.make(1, gpu_pods=0)
    world.revision = "r2"
    put_state(world, "node-0", State.POD_RESTART_REQUIRED)
    old = world.drivers["node-0"]
    first = plan(world, policy())
    assert node_writes(first, "node-0")[-1] == DeletePod("gpu-operator", old.name, old.uid, "driver-restart")
    assert first.status["inProgress"][0]["reason"].startswith("restarting the driver")
    world.apply(first)
    assert not any(isinstance(w, DeletePod) for w in plan(world, policy()).writes)  # terminating: wait
    assert "terminate" in plan(world, policy()).status["inProgress"][0]["reason"]
    world.tick()
    world.tick()  # gone; the DaemonSet creates the new pod, not ready yet
    starting = plan(world, policy())
    assert starting.writes == [] and "to become ready" in starting.status["inProgress"][0]["reason"]
    world.run(policy())
    assert world.state("node-0") == State.DONE and not world.nodes["node-0"].unschedulable


def test_crash_looping_driver_fails_the_node() -> None:
    world = World.make(1, gpu_pods=0)
    put_state(world, "node-0", State.POD_RESTART_REQUIRED)
    driver = replace(
        world.drivers["node-0"], ready=False, restarts=CRASH_LOOP_RESTARTS, reason="CrashLoopBackOff"
    )
    world.drivers["node-0"] = driver
    labels = [w.labels for w in plan(world, policy()).writes if isinstance(w, PatchNode)]
    assert all(State.of(lab.get(STATE_LABEL)) != State.FAILED for lab in labels)
    world.drivers["node-0"] = replace(driver, restarts=CRASH_LOOP_RESTARTS + 1, message="modprobe: ERROR")
    world.apply(plan(world, policy()))
    assert world.state("node-0") == State.FAILED
    reason = json.loads(world.nodes["node-0"].annotations[FAILURE_ANNOTATION])["reason"]
    assert "crash-looping (11 restarts, CrashLoopBackOff: modprobe: ERROR)" in reason


def test_validation_gate_needs_a_validator_started_after_the_driver() -> None:
    world = World.make(1, gpu_pods=0)
    put_state(world, "node-0", State.VALIDATION_REQUIRED)
    world.drivers["node-0"] = replace(world.drivers["node-0"], created=START - 10)  # newer than the validator
    stale = world.validators["node-0"]
    first = plan(world, policy(validation={"timeoutSeconds": 100}))
    # The driver pod is Ready, so its k8s-driver-manager is done and nothing else replaces the
    # validator: the gate restarts it (by uid), and waits for the new one within its timeout.
    assert node_writes(first, "node-0") == [
        PatchNode("node-0", annotations={VALIDATION_START_ANNOTATION: str(int(START))}),
        DeletePod("gpu-operator", stale.name, stale.uid, "validator-restart"),
    ]
    assert "validated the previous driver" in first.status["inProgress"][0]["reason"]
    assert first.wake_at == START + 100
    world.apply(first)
    again = plan(world, policy(validation={"timeoutSeconds": 100}))  # terminating: not deleted twice
    assert not [w for w in node_writes(again, "node-0") if isinstance(w, DeletePod)]
    world.validators["node-0"] = replace(
        world.validators["node-0"], terminating=False, created=START, uid="v2", ready=False, reason="Init:0/4"
    )
    newer = plan(world, policy())
    assert "(Init:0/4)" in newer.status["inProgress"][0]["reason"]
    assert not [w for w in node_writes(newer, "node-0") if isinstance(w, DeletePod)]  # never the new one
    world.validators["node-0"] = replace(world.validators["node-0"], ready=True)
    world.apply(plan(world, policy()))
    assert world.state("node-0") == State.DONE
    assert VALIDATION_START_ANNOTATION not in world.nodes["node-0"].annotations


def test_validator_is_left_alone_while_the_new_driver_pod_is_not_ready() -> None:
    # Its k8s-driver-manager may still be about to evict it: the gate waits for the driver pod first.
    world = World.make(1, gpu_pods=0)
    put_state(world, "node-0", State.VALIDATION_REQUIRED)
    world.drivers["node-0"] = replace(world.drivers["node-0"], created=START - 10, ready=False)
    result = plan(world, policy())
    assert not [w for w in node_writes(result, "node-0") if isinstance(w, DeletePod)]


def test_driver_pod_replaced_by_hand_while_installing_still_finishes() -> None:
    # NVIDIA's update test: the version changes, and 10 s later the driver pods are deleted by hand.
    # The replacement's k8s-driver-manager finds no driver loaded and evicts nothing, so no new
    # validator pod comes by itself: the gate restarts the old one, and every node ends done.
    world = World.make(3, gpu_pods=0)
    world.revision = "r2"
    world.driver_replaced_by_hand = set(world.nodes)
    for _ in range(30):  # a node takes five passes, one at a time
        world.apply(plan(world, policy(maxParallelUpgrades=1)))
        world.tick()
    assert all(d.revision == "r2" for d in world.drivers.values())
    assert world.states() == dict.fromkeys(world.nodes, "upgrade-done"), world.states()
    assert all(v.created > START for v in world.validators.values())  # each validated the new driver
    assert not world.unavailable()


def test_nvidias_update_test_with_driver_pods_deleted_by_hand_is_never_done_early() -> None:
    # update-clusterpolicy.sh: patch the driver version, 10 s later `kubectl delete pod -l
    # app=nvidia-driver-daemonset`. The replacements start at the target revision with no operator
    # step in between, and their k8s-driver-manager evicts no validator (no driver loaded yet).
    world = World.make(3, gpu_pods=0)
    world.revision = "r2"
    world.driver_replaced_by_hand = set(world.nodes)
    world.apply(plan(world, policy(maxParallelUpgrades=1)))
    world.tick(10)
    for node in world.nodes:
        world.drivers[node] = world._driver(node, ready=False, created=world.now)
    said_done = []
    for _ in range(30):
        result = plan(world, policy(maxParallelUpgrades=1))
        if result.status["summary"] == "up to date":
            said_done.append(
                all(
                    world.drivers[n].ready
                    and world.validators[n].ready
                    and world.validators[n].created >= world.drivers[n].created
                    for n in world.nodes
                )
            )
        world.apply(result)
        world.tick()
    assert said_done and all(said_done)  # "up to date" came, and never before every node was validated
    assert world.states() == dict.fromkeys(world.nodes, "upgrade-done")
    assert not world.unavailable()


def test_validation_gate_times_out_into_failure() -> None:
    world = World.make(1, gpu_pods=0)
    put_state(
        world,
        "node-0",
        State.VALIDATION_REQUIRED,
        annotations={VALIDATION_START_ANNOTATION: str(int(START - 600))},
    )
    del world.validators["node-0"]
    world.apply(plan(world, policy()))
    assert world.state("node-0") == State.FAILED
    reason = json.loads(world.nodes["node-0"].annotations[FAILURE_ANNOTATION])["reason"]
    assert reason == "validation gate: not Ready within 600s: an operator-validator pod on the node"
    assert VALIDATION_START_ANNOTATION not in world.nodes["node-0"].annotations


@pytest.mark.parametrize("how", ["validator disabled", "not expected on the node"])
def test_validation_without_a_validator(how: str) -> None:
    world = World.make(1, gpu_pods=0)
    put_state(world, "node-0", State.VALIDATION_REQUIRED)
    del world.validators["node-0"]
    if how == "not expected on the node":
        world.nodes["node-0"] = replace(world.nodes["node-0"], validator_expected=False)
    result = plan_upgrade(policy(), world.facts(), validate=how != "validator disabled")
    world.apply(result)
    assert world.state("node-0") == State.DONE


def test_restart_only_change_skips_eviction() -> None:
    world = World.make(1)
    world.digest = "same"
    world.drivers["node-0"] = replace(world.drivers["node-0"], config_digest="same")
    world.revision = "r2"  # e.g. only a label of the pod template changed
    result = plan(world, policy())
    patch, delete = node_writes(result, "node-0")
    assert isinstance(patch, PatchNode) and patch.labels[STATE_LABEL] == "pod-restart-required"
    assert patch.unschedulable is True and isinstance(delete, DeletePod) and delete.why == "driver-restart"


def test_safe_driver_load_is_unblocked_at_pod_restart() -> None:
    world = World.make(1, gpu_pods=0)
    world.nodes["node-0"] = replace(world.nodes["node-0"], annotations={SAFE_LOAD_ANNOTATION: "true"})
    world.drivers["node-0"] = replace(world.drivers["node-0"], ready=False)
    result = plan(world, policy())
    patch = node_writes(result, "node-0")[0]
    assert (
        patch.labels[STATE_LABEL] == "pod-restart-required"
        and patch.annotations[SAFE_LOAD_ANNOTATION] is None
    )
    assert not any(isinstance(w, DeletePod) for w in result.writes)  # the new pod is already there


def test_requested_upgrade_of_an_up_to_date_node() -> None:
    world = World.make(1)
    world.nodes["node-0"] = replace(world.nodes["node-0"], annotations={REQUESTED_ANNOTATION: "true"})
    world.apply(result := plan(world, policy()))
    assert world.state("node-0") == State.POD_DELETION_REQUIRED and any(
        isinstance(w, EvictPod) for w in result.writes
    )
    world.run(policy())
    assert (
        world.state("node-0") == State.DONE and REQUESTED_ANNOTATION not in world.nodes["node-0"].annotations
    )


# --- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("parallel", "started"), [(1, 1), (2, 2), (0, 6)])
def test_max_parallel_upgrades(parallel: int, started: int) -> None:
    world = World.make(6)
    world.revision = "r2"
    world.apply(plan(world, policy(maxParallelUpgrades=parallel, maxUnavailable="100%")))
    assert len(world.in_progress()) == started
    reasons = set(
        pending_reasons(plan(world, policy(maxParallelUpgrades=parallel, maxUnavailable="100%"))).values()
    )
    assert reasons == (
        {f"waiting for a free slot: maxParallelUpgrades is {parallel}"} if started < 6 else set()
    )


@pytest.mark.parametrize(
    ("max_unavailable", "already", "started"),
    [(2, [], 2), ("25%", [], 2), ("10%", [], 1), ("50%", ["node-7"], 4), (1, ["node-7"], 1), ("0%", [], 0)],
)
def test_max_unavailable_counts_nodes_already_unavailable(
    max_unavailable: int | str, already: list[str], started: int
) -> None:
    """8 nodes; node-7 already cordoned costs nothing, so it starts as well (it is unavailable anyway)."""
    world = World.make(8, unschedulable=already)
    world.revision = "r2"
    upgrade = policy(maxParallelUpgrades=0, maxUnavailable=max_unavailable)
    result = plan(world, upgrade)
    world.apply(result)
    assert len(world.in_progress()) == started
    assert len(world.unavailable()) <= max(upgrade.max_unavailable(8), len(already))
    if already and started:
        assert "node-7" in world.in_progress()
    if started < 8:
        assert any("maxUnavailable" in r for r in pending_reasons(result).values())


def test_not_ready_node_is_not_started_but_counts_as_unavailable() -> None:
    world = World.make(4)
    world.nodes["node-0"] = replace(world.nodes["node-0"], ready=False)
    world.revision = "r2"
    result = plan(world, policy(maxParallelUpgrades=0, maxUnavailable=2))
    world.apply(result)
    assert world.in_progress() == {"node-1"}
    assert pending_reasons(result)["node-0"] == "waiting for the node to be Ready"


def test_skip_label() -> None:
    world = World.make(2, skip=["node-0"])
    world.revision = "r2"
    world.run(policy())
    assert world.states() == {"node-0": "upgrade-required", "node-1": "upgrade-done"}
    final = plan(world, policy())
    assert pending_reasons(final) == {"node-0": "skipped: label nvidia.com/gpu-driver-upgrade.skip=true"}
    assert not world.nodes["node-0"].unschedulable and world.drivers["node-0"].revision == "r1"


# --- canary, pause, rollback ---------------------------------------------------------------------


def test_canary_by_selector_goes_first_alone_then_soaks() -> None:
    world = World.make(4, labels={"node-2": {"pool": "canary"}, "node-3": {"pool": "canary"}})
    world.revision = "r2"
    upgrade = policy(
        maxParallelUpgrades=4,
        maxUnavailable="100%",
        canary={"nodeSelector": {"pool": "canary"}, "soakSeconds": 600},
    )
    world.apply(first := plan(world, upgrade))
    assert world.in_progress() == {"node-2", "node-3"}
    assert set(pending_reasons(first).values()) == {
        "waiting for the canary stage: 0/2 canary nodes upgraded (node-2, node-3 in progress)"
    }
    while world.in_progress():
        world.step(upgrade)
    soaking = plan(world, upgrade)
    assert world.states()["node-0"] == "upgrade-required" and soaking.status["canary"]["complete"] is False
    assert "waiting for the canary soak until" in pending_reasons(soaking)["node-0"]
    assert soaking.wake_at is not None
    assert format_time(soaking.wake_at) == soaking.status["canary"]["soakUntil"]
    world.now = soaking.wake_at
    world.run(upgrade)
    assert set(world.states().values()) == {"upgrade-done"}


def test_canary_by_count_and_its_failure_pauses_the_rest_untouched() -> None:
    world = World.make(4)
    world.revision = "r2"
    world.crashing = {"r2"}
    upgrade = policy(maxParallelUpgrades=2, canary={"count": 1})
    world.run(upgrade, passes=20)
    assert world.states() == {
        "node-0": "upgrade-failed",
        "node-1": "upgrade-required",
        "node-2": "upgrade-required",
        "node-3": "upgrade-required",
    }
    for name in ("node-1", "node-2", "node-3"):
        assert not world.nodes[name].unschedulable and world.drivers[name].revision == "r1"
    paused = plan(world, upgrade)
    assert paused.writes == [] and paused.status["paused"] is True
    assert set(pending_reasons(paused).values()) == {"paused: node-0 failed (see failed)"}
    # Rollback: the old version again. The failed canary goes back first, nothing else is touched.
    world.revision = "r1"
    world.run(upgrade)
    assert set(world.states().values()) == {"upgrade-done"}
    assert not any(node.unschedulable for node in world.nodes.values())


def test_canary_waits_for_other_nodes_in_progress() -> None:
    world = World.make(3, labels={"node-2": {"pool": "canary"}})
    world.revision = "r2"
    put_state(world, "node-0", State.POD_RESTART_REQUIRED)
    result = plan(
        world, policy(maxParallelUpgrades=3, maxUnavailable=3, canary={"nodeSelector": {"pool": "canary"}})
    )
    assert (
        pending_reasons(result)["node-2"] == "waiting for node-0 to finish: canary nodes are upgraded alone"
    )


def test_canary_selector_matching_nothing_says_so() -> None:
    world = World.make(2)
    world.revision = "r2"
    result = plan(world, policy(canary={"nodeSelector": {"pool": "none"}}))
    assert set(pending_reasons(result).values()) == {
        "waiting for the canary stage: no GPU node matches canary.nodeSelector {'pool': 'none'}"
    }


def test_rollback_goes_to_failed_nodes_first() -> None:
    """Two failed nodes resume at once on rollback although maxParallelUpgrades is 1: they hold their
    slots already; the nodes that were upgraded meanwhile follow one by one."""
    world = World.make(4)
    world.revision = "r2"
    while not all(
        world.drivers[n].revision == "r2" and world.state(n) == State.DONE for n in ("node-0", "node-1")
    ):
        world.step(policy(maxParallelUpgrades=2, maxUnavailable=2))
    world.crashing = {"r2"}
    for name in ("node-2", "node-3"):
        put_state(
            world,
            name,
            State.FAILED,
            annotations={
                FAILURE_ANNOTATION: json.dumps(
                    {"step": "pod-restart-required", "revision": "r2", "reason": "crash"}
                )
            },
        )
        world.drivers[name] = replace(
            world.drivers[name], revision="r2", ready=False, restarts=20, terminating=False
        )
    assert world.states()["node-0"] == "upgrade-done" and world.drivers["node-0"].revision == "r2"
    world.revision = "r1"
    world.apply(first := plan(world, policy()))
    assert world.states() == {
        "node-0": "upgrade-required",
        "node-1": "upgrade-required",
        "node-2": "pod-restart-required",
        "node-3": "pod-restart-required",
    }
    assert sum(isinstance(w, DeletePod) for w in first.writes) == 2
    world.run(policy())
    assert set(world.states().values()) == {"upgrade-done"}
    assert {d.revision for d in world.drivers.values()} == {"r1"}


def test_rollback_midway_leaves_the_flow_without_evicting() -> None:
    world = World.make(1, gpu_pods=0)
    pod = world.add_pod("node-0", "train", gpu=True)
    world.blocked.add(pod.key)
    put_state(
        world, "node-0", State.POD_DELETION_REQUIRED, annotations={INITIAL_UNSCHEDULABLE_ANNOTATION: "true"}
    )
    result = plan(world, policy())  # the driver pod is at the target already: nothing to make safe
    assert not any(isinstance(w, EvictPod) for w in result.writes)
    world.apply(result)
    assert world.state("node-0") == State.DONE and world.nodes["node-0"].unschedulable


def test_failed_node_resumes_when_the_blocking_pod_is_gone() -> None:
    world = World.make(2, gpu_pods=0)
    world.revision = "r2"
    failure = {"step": "pod-deletion-required", "revision": "r2", "reason": "eviction timed out"}
    put_state(world, "node-0", State.FAILED, annotations={FAILURE_ANNOTATION: json.dumps(failure)})
    blocker = world.add_pod("node-0", "train", gpu=True)
    stuck = plan(world, policy())
    assert stuck.status["failed"][0]["reason"] == "failed at pod-deletion-required: eviction timed out"
    assert pending_reasons(stuck)["node-1"] == "paused: node-0 failed (see failed)"
    del world.pods[blocker.uid]
    world.apply(resumed := plan(world, policy()))
    assert world.state("node-0") == State.POD_RESTART_REQUIRED
    assert any(e.node is None and "resumed" in e.message for e in resumed.events)


def test_failed_node_with_the_skip_label_no_longer_pauses() -> None:
    world = World.make(2)
    world.revision = "r2"
    put_state(world, "node-0", State.FAILED, annotations={FAILURE_ANNOTATION: "broken by hand"})
    assert plan(world, policy()).status["failed"][0]["reason"] == "failed at : broken by hand"
    world.nodes["node-0"] = replace(
        world.nodes["node-0"], labels={**world.nodes["node-0"].labels, SKIP_LABEL: "true"}
    )
    world.apply(plan(world, policy(maxUnavailable=2)))
    assert world.in_progress() == {"node-0", "node-1"}


def test_failed_node_relabelled_by_hand_is_uncordoned_at_the_end() -> None:
    """NVIDIA's way to retry a failed node (label it upgrade-required) works, and the cordon that the
    failed upgrade left is not mistaken for the node's own."""
    world = World.make(1)
    world.revision = "r2"
    world.crashing = {"r2"}
    world.run(policy(), passes=20)
    assert world.state("node-0") == State.FAILED and world.nodes["node-0"].unschedulable
    world.crashing = set()
    world.drivers["node-0"] = replace(world.drivers["node-0"], revision="r1", ready=True, restarts=0)
    current = world.nodes["node-0"]
    world.nodes["node-0"] = replace(current, labels={**current.labels, STATE_LABEL: "upgrade-required"})
    world.run(policy())
    assert world.state("node-0") == State.DONE and not world.nodes["node-0"].unschedulable
    assert world.drivers["node-0"].revision == "r2"


def test_failed_validation_stays_failed_until_the_gate_would_pass() -> None:
    world = World.make(1, gpu_pods=0)
    failure = {"step": "validation-required", "revision": "r1", "reason": "validator not Ready"}
    put_state(world, "node-0", State.FAILED, annotations={FAILURE_ANNOTATION: json.dumps(failure)})
    world.validators["node-0"] = replace(world.validators["node-0"], ready=False)
    assert plan(world, policy()).writes == []
    world.validators["node-0"] = replace(world.validators["node-0"], ready=True)
    world.apply(plan(world, policy()))
    assert world.state("node-0") == State.DONE


# --- autoUpgrade off, restarts, status -----------------------------------------------------------


def test_auto_upgrade_off_touches_nothing_and_says_why() -> None:
    world = World.make(3)
    world.nodes["node-0"] = replace(world.nodes["node-0"], annotations={})
    world.revision = "r2"
    result = plan(world, UpgradePolicySpec())
    # Only NVIDIA's auto-upgrade annotation goes, so that k8s-driver-manager evicts GPU pods itself.
    assert result.writes == [
        PatchNode(n, annotations={AUTO_UPGRADE_ANNOTATION: None}) for n in ("node-1", "node-2")
    ]
    status = result.status
    assert (
        status["autoUpgrade"] is False
        and status["summary"] == "manual: 3 nodes wait for a driver pod restart"
    )
    (group,) = status["pending"]
    assert group["count"] == 3 and "deleted by hand" in group["reason"]
    assert plan_upgrade(None, world.facts()).status == {**status, "targetVersion": ""}


def _manual_changes(world: World) -> dict[str, tuple[bool, Any]]:
    """name → (whether a plan with autoUpgrade off reads it, a change of one node of `world`)."""

    def node(**fields: Any) -> Any:
        """A change of node-1's NodeInfo in `world` (no API body: what the planner reads)."""
        return lambda: world.nodes.update({"node-1": replace(world.nodes["node-1"], **fields)})

    def driver(**fields: Any) -> Any:
        return lambda: world.drivers.update({"node-1": replace(world.drivers["node-1"], **fields)})

    labels, annotations = world.nodes["node-1"].labels, world.nodes["node-1"].annotations
    return {
        "time": (False, lambda: world.tick(300)),
        "validator readiness": (
            False,
            lambda: world.validators.update({"node-1": replace(world.validators["node-1"], ready=False)}),
        ),
        "driver readiness": (False, driver(ready=False, restarts=4, reason="CrashLoopBackOff")),
        "a deploy label": (False, node(labels={**labels, "nvidia.com/gpu.deploy.dcgm": "true"})),
        "a workload pod": (False, lambda: world.add_pod("node-1", "extra", gpu=True)),
        "cordoned": (False, node(unschedulable=True)),
        "driver revision": (True, driver(revision="r0")),
        "driver pod gone": (True, lambda: world.drivers.pop("node-1")),
        "state label": (True, node(labels={**labels, STATE_LABEL: "cordon-required"})),
        "auto-upgrade annotation": (True, node(annotations={AUTO_UPGRADE_ANNOTATION: "true"})),
        "upgrade requested": (True, node(annotations={**annotations, REQUESTED_ANNOTATION: "true"})),
        "DaemonSet revision": (True, lambda: setattr(world, "revision", "r2")),
    }


@pytest.mark.parametrize("change", list(_manual_changes(World.make(3))))
def test_a_manual_plan_depends_on_its_inputs_alone(change: str) -> None:
    """With autoUpgrade off the plan is reused while `manual_inputs` stay the same
    (core/driver_upgrade.py): what
    they leave out never changes the plan; what they hold does change them."""
    world = World.make(3)
    world.nodes["node-1"] = replace(world.nodes["node-1"], annotations={})
    before_inputs, before = (
        manual_inputs(world.facts()),
        plan_upgrade(None, world.facts(), target_version="v"),
    )
    read, make = _manual_changes(world)[change]
    make()
    after_inputs, after = manual_inputs(world.facts()), plan_upgrade(None, world.facts(), target_version="v")
    assert (after_inputs != before_inputs) == read
    if not read:
        assert after == before


def test_operator_restart_resumes_at_the_same_step() -> None:
    """All state is in node labels and annotations: a fresh call with no memory picks up every node where
    it was, and a run that restarts the operator at every pass ends like one that never does."""
    steady, restarting = World.make(4, gpu_pods=2), World.make(4, gpu_pods=2)
    for world in (steady, restarting):
        world.revision = "r2"
        world.blocked = {next(iter(world.pods.values())).key}
    upgrade = policy(
        maxParallelUpgrades=2, maxUnavailable=2, podDeletion={"timeoutSeconds": 120, "force": True}
    )
    for _ in range(6):
        steady.step(upgrade)
    fresh = plan(steady, upgrade, forget_evictions=True)
    remembered = plan(steady, upgrade)
    assert [a.node for a in fresh.actions if any(isinstance(w, PatchNode) for w in a.writes)] == [
        a.node for a in remembered.actions if any(isinstance(w, PatchNode) for w in a.writes)
    ]
    assert {e["node"]: e["state"] for e in fresh.status["inProgress"]} == {
        e["node"]: e["state"] for e in remembered.status["inProgress"]
    }
    for _ in range(60):
        result = plan_upgrade(upgrade, restarting.facts(forget_evictions=True))
        restarting.apply(result)
        restarting.tick()
    steady.run(upgrade)
    assert restarting.states() == steady.states() == {f"node-{i}": "upgrade-done" for i in range(4)}


def test_status_validates_against_the_model_and_names_every_node() -> None:
    world = World.make(5, skip=["node-4"])
    world.revision = "r2"
    put_state(
        world,
        "node-3",
        State.FAILED,
        annotations={
            FAILURE_ANNOTATION: json.dumps({"step": "drain-required", "revision": "r2", "reason": "x"})
        },
    )
    status = plan(world, policy(canary={"count": 1})).status
    model = ClusterPolicyStatus.model_validate({"driverUpgrade": status}).driverUpgrade
    assert model is not None and model.paused and model.nodesFailed == 1 and model.nodesPending == 4
    assert model.failed[0].since == "2023-11-14T22:13:20Z"
    assert {n for g in model.pending for n in g.nodes} == {"node-0", "node-1", "node-2", "node-4"}
    assert model.canary is not None and model.canary.required == 1


def test_after_the_objects_the_nodes_going_on_come_before_those_starting() -> None:
    going_on = NodeActions("a", (PatchNode("a", unschedulable=False),))
    starting = NodeActions("b", (PatchNode("b", unschedulable=True),), starts=True)
    also_going_on = NodeActions("c", (DeletePod("ns", "p", "u", "driver-restart"),))
    assert rounds([starting, going_on, also_going_on]) == ([going_on, also_going_on], [starting])
    assert rounds([]) == ([], [])


def test_an_upgrade_event_is_about_its_node_or_else_the_policy() -> None:
    policy = {"name": "cluster-policy", "uid": "p-1"}
    on_node = UpgradeEvent("gpu-0", "Warning", "failed")
    assert event_subject(on_node, {"gpu-0": "n-1"}, policy) == (
        {"name": "gpu-0", "uid": "n-1"},
        ("v1", "Node"),
    )
    # A node gone from the watch meanwhile: still named, without a uid.
    assert event_subject(on_node, {}, policy)[0] == {"name": "gpu-0", "uid": ""}
    on_policy = UpgradeEvent(None, "Normal", "done")
    assert event_subject(on_policy, {}, policy) == (policy, ("nvidia.com/v1", "ClusterPolicy"))
