"""The driver upgrade wired into the operator, against a fake API: the Store keeps what the state machine
decides on, the planner runs it every pass, the reconciler carries out its writes in the safe order and
feeds the API's answers back, the metrics and the pod watches of the nodes being emptied."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import builders
import pytest
from builders import PCI, condition, label_owner
from kubernetes_asyncio import client
from test_informer import FAST, line
from test_reconciler import FakeKube, run_once

from gpu_operator.core.driver_pool_render import app_name
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.plan import PolicyRef, build
from gpu_operator.core.status import status_body
from gpu_operator.core.upgrade import node_steps
from gpu_operator.core.upgrade.states import (
    AUTO_UPGRADE_ANNOTATION,
    FAILURE_ANNOTATION,
    STATE_LABEL,
    STATE_START_ANNOTATION,
)
from gpu_operator.runtime import metrics
from gpu_operator.runtime.client import ApiError, Kube
from gpu_operator.runtime.drain_watches import NodePodWatches
from gpu_operator.runtime.reconciler import Reconciler
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store
from gpu_operator.runtime.workqueue import WorkQueue

OURS = {"app.kubernetes.io/managed-by": "gpu-operator"}
NOW = time.time()
"""The time the fixtures are stamped from: set again before each test (`fresh_now`), since the passes
read the real clock and a suite slowed down by a busy machine would otherwise see the stamps minutes old."""
PDB = "Cannot evict pod as it would violate the pod's disruption budget."
BUDGET = "The disruption budget guarded needs 1 healthy pods and has 1 currently"
"""The budget, in the 429's details.causes (kubernetes pkg/registry/core/pod/storage/eviction.go)."""


@pytest.fixture(autouse=True)
def fresh_now() -> None:
    global NOW
    NOW = time.time()


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def node_body(
    name: str, version: int, state: str = "upgrade-done", unschedulable: bool = False, **annotations: str
) -> dict[str, Any]:
    """A GPU node in the upgrade, as a GET or a watch event has it: kept here rather than in builders.py
    since it is the upgrade's (its state label, the auto-upgrade and state-start annotations stamped
    from NOW, an annotation not the upgrade's, Ready); builders.node_body writes the fields."""
    return builders.node_body(
        name,
        {PCI: "true", STATE_LABEL: state},
        uid=f"uid-{name}",
        resource_version=str(version),
        annotations={
            AUTO_UPGRADE_ANNOTATION: "true",
            STATE_START_ANNOTATION: str(int(NOW - 60)),
            "other.example.com/note": "not the upgrade's",
            **annotations,
        },
        spec={"unschedulable": True} if unschedulable else {},
        status={"conditions": [condition("Ready", True)]},
        typed=True,
    )


def driver_daemonset() -> dict[str, Any]:
    labels = {**OURS, "app.kubernetes.io/component": "nvidia-driver"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-driver-daemonset",
            "namespace": "gpu-operator",
            "uid": "ds",
            "labels": labels,
            # Created by the operator for policy p, so that it may rewrite it.
            "ownerReferences": [
                {
                    "apiVersion": "nvidia.com/v1",
                    "kind": "ClusterPolicy",
                    "name": "p",
                    "uid": "uid-p",
                    "controller": True,
                }
            ],
            "managedFields": [{"manager": "gpu-operator", "operation": "Apply"}],
        },
        "spec": {
            "template": {"spec": {"containers": [{"name": "nvidia-driver-ctr", "image": "driver:stale"}]}}
        },
    }


def revision(number: int, digest: str = "") -> dict[str, Any]:
    env = [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}] if digest else []
    template = {
        "spec": {"containers": [{"name": "nvidia-driver-ctr", "image": f"driver:v{number}", "env": env}]}
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"nvidia-driver-daemonset-h{number}",
            "namespace": "gpu-operator",
            "labels": {
                **OURS,
                "app.kubernetes.io/component": "nvidia-driver",
                "controller-revision-hash": f"h{number}",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "nvidia-driver-daemonset",
                    "uid": "ds",
                    "controller": True,
                }
            ],
        },
        "revision": number,
        "data": {"spec": {"template": {**template, "$patch": "replace"}}},
    }


def pod_body(
    name: str,
    node: str,
    component: str = "",
    *,
    revision_hash: str = "",
    ready: bool = True,
    created: float | None = None,
    restarts: int = 0,
    gpu: bool = False,
) -> dict[str, Any]:
    """A running pod on `node`: an operand's of `component` (owned by a DaemonSet, the driver's one
    for nvidia-driver) or else a workload's in namespace ml (owned by a ReplicaSet), of the template
    `revision_hash` when given, asking for a GPU if `gpu`, created at `created` (Unix seconds; ten
    minutes before NOW unless given). Kept here rather than in builders.py since the owners,
    revisions and stamps are the upgrade's; builders.pod_body writes the fields."""
    labels: dict[str, str] = {}
    owner: dict[str, Any] = {"kind": "ReplicaSet", "uid": "rs", "controller": True}
    if component:
        labels = {**OURS, "app.kubernetes.io/component": component}
        owner = {
            "kind": "DaemonSet",
            "uid": "ds" if component == "nvidia-driver" else "other",
            "controller": True,
        }
    if revision_hash:
        labels["controller-revision-hash"] = revision_hash
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    statuses = [{"name": "c", "ready": ready, "restartCount": restarts}]
    return builders.pod_body(
        name,
        node,
        namespace="gpu-operator" if component else "ml",
        uid=f"uid-{name}",
        labels=labels,
        owners=[owner],
        created=stamp(NOW - 600 if created is None else created),
        containers=[{"name": "c", "resources": resources}],
        conditions=[condition("Ready", ready)],
        status={"phase": "Running", "containerStatuses": statuses},
        typed=True,
    )


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            _merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


class UpgradeKube(FakeKube):
    """Also answers the upgrade's calls: node merge patches (applied, resourceVersion bumped),
    evictions (refused for `refuse`), pod deletions, Events with their involved object."""

    def __init__(
        self, nodes: dict[str, dict[str, Any]], refuse: frozenset[str] = frozenset(), **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.nodes = nodes
        self.refuse = refuse
        self.calls: list[tuple[str, str]] = []
        self.targets: list[tuple[str, str, str, str]] = []

    async def patch_node(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if name in self.reject:
            raise self.reject[name]
        self.calls.append(("patch", name))
        node = self.nodes[name]
        _merge(node, body)
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 100)
        return copy.deepcopy(node)

    async def apply_node_labels(
        self, node: str, labels: Mapping[str, str], uid: str, resource_version: str = ""
    ) -> dict[str, Any]:
        """As FakeKube records it, on the node as it is here (labels merged, managedFields ours)."""
        await super().apply_node_labels(node, labels, uid, resource_version)
        metadata = self.nodes[node]["metadata"]
        metadata.setdefault("labels", {}).update(labels)
        others = [m for m in metadata.get("managedFields") or [] if m.get("manager") != FIELD_MANAGER]
        metadata["managedFields"] = [*others, label_owner(labels)]
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 100)
        return copy.deepcopy(self.nodes[node])

    async def evict(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self.calls.append(("evict", name))
        if name in self.refuse:
            raise ApiError(429, "TooManyRequests", PDB, (("", BUDGET),))

    async def delete_pod(self, namespace: str, name: str, options: Mapping[str, Any]) -> None:
        self.calls.append(("delete", name))

    async def post_event(
        self,
        policy: Mapping[str, str],
        type_: str,
        reason: str,
        message: str,
        now: str,
        kind: tuple[str, str] = ("nvidia.com/v1", "ClusterPolicy"),
    ) -> None:
        self.events.append((type_, reason))
        self.targets.append((kind[1], policy["name"], policy["uid"], message))


class Follow:
    """The pod watches: what the pods of a node are once listed (`listing`; nodes not in it are never
    listed in time)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes: list[frozenset[str]] = []
        self.listing: dict[str, list[dict[str, Any]]] = {}

    def follow(self, nodes: Any) -> None:
        self.nodes.append(frozenset(nodes))

    async def wait_listed(self, nodes: Any, timeout: float) -> bool:
        listed = [node for node in nodes if node in self.listing]
        for node in listed:
            self.store.list_node_pods(node, self.listing[node])
        return bool(listed)


def world(
    nodes: dict[str, dict[str, Any]], pods: list[dict[str, Any]], upgrade: dict[str, Any] | None = None
) -> tuple[Reconciler, Follow]:
    """A Store as the watches would fill it: the policy, the nodes, the driver DaemonSet at revision 2."""
    store = Store()
    spec = {"driver": {"upgradePolicy": {"autoUpgrade": True, **(upgrade or {})}}}
    store.put("policies", "p", PolicyRef("p", "uid-p", 1, "2026-01-01T00:00:00Z", spec, {}))
    for body in nodes.values():
        store.record_node(copy.deepcopy(body), False)
    store.record_managed(driver_daemonset(), False)
    for number in (1, 2):
        store.record_revision(revision(number), False)
    for body in pods:
        store.record_pod(body, False)
    follow = Follow(store)
    return Reconciler(cast(Kube, None), store, Settings(), pod_watches=follow), follow


def with_kube(rec: Reconciler, kube: UpgradeKube) -> Reconciler:
    rec.kube = cast(Kube, kube)
    return rec


# --- the Store ------------------------------------------------------------------------------------


def test_store_keeps_the_driver_revision_pods_and_upgrade_annotations_only() -> None:
    nodes = {"gpu-0": node_body("gpu-0", 10)}
    rec, _ = world(nodes, [pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h1")])
    rec.store.record_revision({**revision(7), "metadata": {**revision(7)["metadata"], "labels": OURS}}, False)
    facts = rec.store.snapshot("gpu-operator", {}).upgrade
    (daemonset,) = facts.driver_daemonsets
    assert (daemonset.revision, daemonset.version) == ("h2", "v2")  # the newest revision of the driver's
    (driver,) = facts.driver_pods
    assert (driver.node, driver.revision, driver.daemonset_uid) == ("gpu-0", "h1", "ds")
    node = rec.store.get("nodes", "gpu-0")
    assert set(node.upgrade_annotations) == {AUTO_UPGRADE_ANNOTATION, STATE_START_ANNOTATION}
    assert facts.pods_known == frozenset()  # no node's pods are watched at rest


def test_store_drops_a_node_event_older_than_what_it_holds() -> None:
    store = Store()
    assert store.record_node(node_body("gpu-0", 20, "pod-restart-required", unschedulable=True), False)
    # The watch brings the node as it was before our write: kept out, it would un-cordon it for a pass.
    assert not store.record_node(node_body("gpu-0", 19), False)
    assert store.get("nodes", "gpu-0").unschedulable
    assert store.record_node(node_body("gpu-0", 21), False)
    assert not store.get("nodes", "gpu-0").unschedulable


def test_node_pods_are_known_from_their_listing_until_forgotten() -> None:
    store = Store()
    train = pod_body("train", "gpu-0", gpu=True)
    assert not store.record_node_pod("gpu-0", train, False)  # not listed: an event alone says nothing
    assert store.list_node_pods("gpu-0", [train, pod_body("elsewhere", "gpu-1")])
    facts = store.snapshot("gpu-operator", {}).upgrade
    assert facts.pods_known == frozenset({"gpu-0"}) and [p.name for p in facts.pods] == ["train"]
    assert store.record_node_pod("gpu-0", train, True)
    assert store.snapshot("gpu-operator", {}).upgrade.pods == ()
    store.forget_node_pods("gpu-0")
    assert store.snapshot("gpu-operator", {}).upgrade.pods_known == frozenset()


def test_a_nodes_pods_are_known_only_once_its_first_listing_is_complete() -> None:
    """The drain watches' path (record_node_pod while listing, then node_pods_listed): a pass never
    takes half a listing for all of a node's pods."""
    store = Store()
    train, infer = pod_body("train", "gpu-0", gpu=True), pod_body("infer", "gpu-0")

    def names() -> list[str]:
        return sorted(p.name for p in store.snapshot("gpu-operator", {}).upgrade.pods)

    def known() -> frozenset[str] | None:
        return store.snapshot("gpu-operator", {}).upgrade.pods_known

    # The first listing under way: its pods are kept aside, and no pass is asked for.
    assert not store.record_node_pod("gpu-0", train, False)
    assert not store.record_node_pod("gpu-0", infer, False)
    assert not store.record_node_pod("gpu-0", pod_body("moved", "gpu-1"), False)  # not on the node
    assert known() == frozenset() and names() == []
    # Complete: the node's pods are known, exactly those it named of the pods recorded on the node.
    assert store.node_pods_listed("gpu-0", {("ml", "train"), ("ml", "moved")})
    assert known() == frozenset({"gpu-0"}) and names() == ["train"]
    # Listed: an event counts at once; a relisting (after a 410) forgets the pods it does not name.
    assert store.record_node_pod("gpu-0", infer, False)
    assert store.record_node_pod("gpu-0", pod_body("etl", "gpu-0"), False)
    assert names() == ["etl", "infer", "train"]
    assert store.node_pods_listed("gpu-0", {("ml", "train"), ("ml", "etl")})
    assert names() == ["etl", "train"]
    assert not store.node_pods_listed("gpu-0", {("ml", "train"), ("ml", "etl")}), "nothing changed"
    # A pod deleted and created again under its name, its DELETED event lost to a relisting: one pod.
    again = pod_body("etl", "gpu-0")
    again["metadata"]["uid"] = "uid-etl-again"
    assert store.record_node_pod("gpu-0", again, False)
    assert store.node_pods_listed("gpu-0", {("ml", "train"), ("ml", "etl")}) is False
    assert [p.uid for p in store.snapshot("gpu-operator", {}).upgrade.pods if p.name == "etl"] == [
        "uid-etl-again"
    ]
    # Forgotten: the listed node's pods, and those of a listing under way.
    assert not store.record_node_pod("gpu-1", pod_body("other", "gpu-1"), False)
    store.forget_node_pods("gpu-0")
    store.forget_node_pods("gpu-1")
    assert known() == frozenset() and names() == []
    # A listing of gpu-1 completing now holds nothing recorded before it was forgotten.
    assert store.node_pods_listed("gpu-1", {("ml", "other")})
    assert known() == frozenset({"gpu-1"}) and names() == []


# --- the planner ----------------------------------------------------------------------------------


def test_every_pass_plans_the_upgrade_and_writes_its_status() -> None:
    nodes = {"gpu-0": node_body("gpu-0", 10), "gpu-1": node_body("gpu-1", 11)}
    pods = [pod_body(f"drv-{i}", f"gpu-{i}", "nvidia-driver", revision_hash="h1") for i in (0, 1)]
    rec, _ = world(nodes, pods)
    plan = build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW)
    assert plan.upgrade is not None
    first = plan.upgrade.actions[0]
    assert first.node == "gpu-0" and first.starts
    assert plan.upgrade.pods_needed == {"gpu-0"}
    status = status_body(plan.statuses["p"])["driverUpgrade"]
    assert status["autoUpgrade"] and status["nodesInProgress"] == 1 and status["nodesPending"] == 1
    assert status["inProgress"][0]["reason"] == "listing the pods on the node"
    # With the driver off the operator upgrades nothing and its status says nothing about upgrades.
    rec.store.put(
        "policies",
        "p",
        PolicyRef("p", "uid-p", 2, "2026-01-01T00:00:00Z", {"driver": {"enabled": False}}, {}),
    )
    off = build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW)
    assert status_body(off.statuses["p"])["driverUpgrade"] is None


def test_no_node_is_up_to_date_while_the_driver_daemonset_rolls_to_a_new_template() -> None:
    """Between our apply of a new driver DaemonSet and the DaemonSet controller's new revision, every
    pod still matches the previous revision: the status must not call that up to date."""
    nodes = {"gpu-0": node_body("gpu-0", 10)}
    rec, _ = world(nodes, [pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h2")])

    def summary() -> str:
        plan = build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW)
        return str(status_body(plan.statuses["p"])["driverUpgrade"]["summary"])

    # The newest revision (h2) is driver:v2, not what the policy renders.
    assert summary().startswith("waiting for the driver DaemonSet's new revision (595.91.07")
    plan = build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW)
    (desired,) = [o for o in plan.objects if o["metadata"]["name"] == "nvidia-driver-daemonset"]
    newest = revision(3)
    newest["data"]["spec"]["template"] = {**copy.deepcopy(desired["spec"]["template"]), "$patch": "replace"}
    rec.store.record_revision(newest, False)
    assert summary() == "0/1 upgraded"  # h3 now: gpu-0 is behind, its upgrade starts
    rec.store.record_pod(pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h3"), False)
    assert summary() == "up to date"


# --- the reconciler -------------------------------------------------------------------------------


def finishing_and_pending() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """gpu-0 validated at revision 2 (it finishes this pass), gpu-1 still at revision 1 (it starts)."""
    nodes = {
        "gpu-0": node_body("gpu-0", 10, "validation-required", unschedulable=True),
        "gpu-1": node_body("gpu-1", 11, "upgrade-required"),
    }
    pods = [
        pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h2", created=NOW - 30),
        pod_body("val-0", "gpu-0", "operator-validator", created=NOW - 20),
        pod_body("drv-1", "gpu-1", "nvidia-driver", revision_hash="h1"),
        pod_body("val-1", "gpu-1", "operator-validator"),
    ]
    return nodes, pods


def test_a_start_is_written_after_the_node_that_frees_its_slot() -> None:
    nodes, pods = finishing_and_pending()
    kube = UpgradeKube(nodes)
    rec, follow = world(nodes, pods)
    outcome = run_once(with_kube(rec, kube))
    assert [c for c in kube.calls if c[0] == "patch"] == [("patch", "gpu-0"), ("patch", "gpu-1")]
    # The Store holds what the patches returned before any watch event: the next pass counts right.
    started = rec.store.get("nodes", "gpu-1")
    assert started.unschedulable and started.labels[STATE_LABEL] == "wait-for-jobs-required"
    assert not rec.store.get("nodes", "gpu-0").unschedulable
    assert follow.nodes[-1] == {"gpu-1"}  # its pods are watched from now on
    assert not outcome.errors and outcome.wake_at is None
    # Node Events are about the Node (its UID), the resumption-free pass posts none on the policy.
    kinds = {(kind, name, uid) for kind, name, uid, _ in kube.targets}
    assert ("Node", "gpu-0", "uid-gpu-0") in kinds and ("Node", "gpu-1", "uid-gpu-1") in kinds


def test_a_starting_node_goes_as_far_as_it_can_once_its_pods_are_listed() -> None:
    nodes, pods = finishing_and_pending()
    kube = UpgradeKube(nodes)
    rec, follow = world(nodes, pods)
    follow.listing["gpu-1"] = [pod_body("train", "gpu-1", gpu=True)]
    run_once(with_kube(rec, kube))
    # One pass: cordoned and at pod-deletion-required in one patch, then its GPU pod evicted.
    assert kube.calls[-2:] == [("patch", "gpu-1"), ("evict", "train")]
    node = kube.nodes["gpu-1"]
    assert (
        node["spec"]["unschedulable"] and node["metadata"]["labels"][STATE_LABEL] == "pod-deletion-required"
    )


def test_no_start_when_the_finishing_node_could_not_be_written() -> None:
    nodes, pods = finishing_and_pending()
    kube = UpgradeKube(nodes, reject={"gpu-0": ApiError(422, "Invalid", "no")})
    rec, _ = world(nodes, pods)
    outcome = run_once(with_kube(rec, kube))
    assert ("patch", "gpu-1") not in kube.calls  # gpu-0 still counts as in progress on the API server
    assert "node/gpu-0" in outcome.errors


def test_a_refused_eviction_is_a_fact_for_the_next_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asked again an hour after the refusal, not 10 s: however slow the machine, the next pass runs
    # within it (the passes read the real clock).
    monkeypatch.setattr(node_steps, "EVICTION_RETRY_SECONDS", 3600)
    nodes = {"gpu-0": node_body("gpu-0", 10, "pod-deletion-required", unschedulable=True)}
    pods = [
        pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h1"),
        pod_body("val-0", "gpu-0", "operator-validator"),
    ]
    kube = UpgradeKube(nodes, refuse=frozenset({"train"}))
    rec, _ = world(nodes, pods, {"podDeletion": {"timeoutSeconds": 300}})
    rec.store.list_node_pods("gpu-0", [pod_body("train", "gpu-0", gpu=True)])
    outcome = run_once(with_kube(rec, kube))
    assert kube.calls == [("evict", "train")]
    assert rec.memory.evictions["uid-train"].status == 429
    assert outcome.wake_at is not None and outcome.wake_at <= time.time()  # say why at once
    kube.calls.clear()
    again = run_once(rec)
    assert kube.calls == []  # not asked again before the retry time
    reason = status_body(again.plan.statuses["p"])["driverUpgrade"]["inProgress"][0]["reason"]
    assert f"eviction refused (429: {PDB} ({BUDGET}))" in reason, "the budget named, as the server does"
    assert again.wake_at is not None and again.wake_at > time.time()


def test_a_failure_is_told_on_the_node_and_on_the_policy() -> None:
    nodes = {
        "gpu-0": node_body("gpu-0", 10, "pod-restart-required", unschedulable=True),
        "gpu-1": node_body("gpu-1", 11),
    }
    pods = [
        pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h2", ready=False, restarts=11),
        pod_body("drv-1", "gpu-1", "nvidia-driver", revision_hash="h1"),
    ]
    kube = UpgradeKube(nodes)
    rec, _ = world(nodes, pods)
    run_once(with_kube(rec, kube))
    failure = json.loads(kube.nodes["gpu-0"]["metadata"]["annotations"][FAILURE_ANNOTATION])
    assert failure["step"] == "pod-restart-required" and "crash-looping" in failure["reason"]
    warnings = [(kind, name) for kind, name, _, message in kube.targets if "failed" in message]
    assert ("Node", "gpu-0") in warnings and ("ClusterPolicy", "p") in warnings
    assert ("patch", "gpu-1") in kube.calls  # marked upgrade-required, but not started: paused
    assert not kube.nodes["gpu-1"]["spec"].get("unschedulable")


def test_a_pools_failure_is_told_on_the_node_and_on_its_nvidiadriver() -> None:
    """With the ClusterPolicy delegating its driver, the NVIDIADriver's own policy (autoUpgrade on by
    default, where the ClusterPolicy's is off) upgrades its pool, and the pause is its Event."""
    nodes = {
        "gpu-0": pooled(node_body("gpu-0", 10, "pod-restart-required", unschedulable=True)),
        "gpu-1": pooled(node_body("gpu-1", 11)),
    }
    pods = [
        pod_body("drv-0", "gpu-0", "nvidia-driver", revision_hash="h2", ready=False, restarts=11),
        pod_body("drv-1", "gpu-1", "nvidia-driver", revision_hash="h1"),
    ]
    kube = UpgradeKube(nodes)
    rec, _ = world(nodes, pods)
    rec.store.put("policies", "p", PolicyRef("p", "uid-p", 1, "2026-01-01T00:00:00Z", POOLS_ON, {}))
    rec.store.put("crds", "nvidiadrivers.nvidia.com", True)
    rec.store.record_driver(
        {"metadata": {"name": "h100", "uid": "uid-h100"}, "spec": {"version": "1.0"}}, False
    )
    rec.store.record_managed(driver_daemonset(), True)
    rec.store.record_managed(pool_daemonset(), False)
    run_once(with_kube(rec, kube))
    failure = json.loads(kube.nodes["gpu-0"]["metadata"]["annotations"][FAILURE_ANNOTATION])
    assert failure["step"] == "pod-restart-required" and "crash-looping" in failure["reason"]
    warnings = [(kind, name, uid) for kind, name, uid, message in kube.targets if "failed" in message]
    assert ("Node", "gpu-0", "uid-gpu-0") in warnings and ("NVIDIADriver", "h100", "uid-h100") in warnings
    assert not any(kind == "ClusterPolicy" for kind, _, _ in warnings)
    assert not kube.nodes["gpu-1"]["spec"].get("unschedulable"), "paused"
    ((name, status),) = kube.driver_statuses
    assert (
        name == "h100" and status["driverUpgrade"]["paused"] and status["driverUpgrade"]["nodesFailed"] == 1
    )


POOLS_ON = {"driver": {"useNvidiaDriverCRD": True}}


def pooled(body: dict[str, Any]) -> dict[str, Any]:
    """A node of NVIDIADriver h100's pool (NFD's OS labels, the owner label)."""
    body["metadata"]["labels"].update(
        {
            "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
            "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
            "nvidia.com/gpu-operator.driver.owner": "h100",
        }
    )
    return body


def pool_daemonset() -> dict[str, Any]:
    """The driver DaemonSet of NVIDIADriver h100's Ubuntu 22.04 pool, where driver_daemonset() was:
    the same uid (its pods' and revisions' owner), its pool name, owned by the NVIDIADriver."""
    body = driver_daemonset()
    body["metadata"]["name"] = app_name("uid-h100", "gpu", "ubuntu22.04")
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "name": "h100",
            "uid": "uid-h100",
            "controller": True,
        }
    ]
    return body


# --- metrics, the loop's wake-up, the pod watches ---------------------------------------------------


def gauge(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name)


def test_upgrade_gauges_exist_only_while_known() -> None:
    nodes, pods = finishing_and_pending()
    rec, _ = world(nodes, pods)
    plan = build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW)
    metrics.observe_pass(plan, {}, 2, 0.1)
    assert gauge("gpu_operator_driver_auto_upgrade_enabled") == 1
    # As the pass leaves the nodes: gpu-0 done, gpu-1 started in the slot gpu-0 gave back.
    assert gauge("gpu_operator_nodes_upgrades_done") == 1
    assert gauge("gpu_operator_nodes_upgrades_in_progress") == 1
    assert gauge("gpu_operator_nodes_upgrades_pending") == 0
    assert gauge("gpu_operator_nodes_upgrades_available") == 1
    off = {"driver": {"upgradePolicy": {"autoUpgrade": False}}}
    rec.store.put("policies", "p", PolicyRef("p", "uid-p", 2, "2026-01-01T00:00:00Z", off, {}))
    metrics.observe_pass(build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW), {}, 2, 0.1)
    assert gauge("gpu_operator_driver_auto_upgrade_enabled") == 0
    assert gauge("gpu_operator_nodes_upgrades_done") is None
    rec.store.put("policies", "p", None)
    metrics.observe_pass(build(rec.store.snapshot("gpu-operator", {}), stamp(NOW), clock=NOW), {}, 2, 0.1)
    assert gauge("gpu_operator_driver_auto_upgrade_enabled") is None


def test_the_queue_asks_for_a_pass_at_the_asked_time() -> None:
    async def scenario() -> None:
        queue = WorkQueue(Settings())
        queue.add_at(time.time() + 0.05, "wake_at")
        await asyncio.wait_for(queue.dirty.wait(), timeout=10)
        queue.dirty.clear()
        queue.add_at(time.time() + 3600, "wake_at")
        queue.add_at(None, "wake_at")  # the latest answer wins: no timer left
        assert queue.later == {}

    asyncio.run(scenario())


@dataclass
class NodePods:
    """One node's pods as the fake API server below serves them: its listing (in pages of the
    informer's `limit`, at resourceVersion `version`), the pages after the first only once `gate` is
    set when there is one (a listing under way), and its watch stream: what the test puts in `stream`
    (b"" ends the watch)."""

    items: list[dict[str, Any]]
    gate: asyncio.Event | None = None
    version: str = "100"
    stream: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)


class PodsResponse:
    """What `call_api(..., _preload_content=False)` hands back, as far as the informer reads an
    aiohttp.ClientResponse: a listing's status and body, or a watch's stream (`content.readany`)."""

    status = 200
    connection = None

    def __init__(self, body: bytes = b"", stream: asyncio.Queue[bytes] | None = None) -> None:
        self.body = body
        self.stream = stream
        self.content = self

    async def read(self) -> bytes:
        return self.body

    async def readany(self) -> bytes:
        assert self.stream is not None
        return await self.stream.get()

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class PodsApi:
    """A kubernetes_asyncio ApiClient as the drain watches use it: `call_api` answers for the node its
    field selector names, with that node's `NodePods`; a node it does not know is never answered."""

    def __init__(self, nodes: dict[str, NodePods]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def call_api(
        self, path: str, method: str, query_params: list[tuple[str, str]], **_: Any
    ) -> PodsResponse:
        query = dict(query_params)
        self.requests.append((path, query))
        node = self.nodes.get(query.get("fieldSelector", "").removeprefix("spec.nodeName="))
        if node is None:
            await asyncio.Event().wait()
            raise AssertionError("never answered")
        if query.get("watch") == "true":
            return PodsResponse(stream=node.stream)
        start, limit = int(query.get("continue") or 0), int(query["limit"])
        if start and node.gate is not None:
            await node.gate.wait()
        metadata = {"resourceVersion": node.version}
        if start + limit < len(node.items):
            metadata["continue"] = str(start + limit)
        # As the API server lists a built-in kind: the items without their kind and apiVersion.
        page = [
            {key: value for key, value in item.items() if key not in ("kind", "apiVersion")}
            for item in node.items[start : start + limit]
        ]
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page}
        return PodsResponse(json.dumps(body).encode())


async def until(holds: Callable[[], bool]) -> None:
    """Let the event loop run until `holds()` (a bounded number of turns, not a time)."""
    for _ in range(1000):
        if holds():
            return
        await asyncio.sleep(0)
    raise AssertionError("never came")


def test_a_node_watch_lists_then_follows_its_pods() -> None:
    """A node's pods reach the Store from their listing, known only once the whole listing is in; the
    watch, from the listing's version, brings their changes; a stopped watch leaves the Store at once
    and records nothing afterwards; a listing that does not come in time is a False, not a hang."""
    store = Store()
    wakes: list[bool] = []
    train = pod_body("train", "gpu-0", gpu=True)
    gone = {**train, "metadata": {**train["metadata"], "resourceVersion": "105"}}

    def pods() -> list[str]:
        return sorted(p.name for p in store.snapshot("gpu-operator", {}).upgrade.pods)

    def known() -> frozenset[str] | None:
        return store.snapshot("gpu-operator", {}).upgrade.pods_known

    async def scenario() -> None:
        gate = asyncio.Event()
        gpu_0 = NodePods([train, pod_body("infer", "gpu-0"), pod_body("etl", "gpu-0")], gate)
        # gpu-1's second page never comes.
        gpu_1 = NodePods([pod_body(f"job-{i}", "gpu-1") for i in range(3)], asyncio.Event())
        api = PodsApi({"gpu-0": gpu_0, "gpu-1": gpu_1})
        watches = NodePodWatches(
            cast(client.ApiClient, api), store, lambda: wakes.append(True), lambda: None, FAST
        )
        # A pass starting the node's upgrade waits for its pods: listed in pages of two.
        waiting = asyncio.ensure_future(watches.wait_listed({"gpu-0"}, timeout=30))
        await until(lambda: len(api.requests) == 2)  # the first page recorded, the second asked for
        assert len(store.get("listing_pods", "gpu-0")) == 2
        assert not waiting.done() and known() == frozenset() and pods() == [], "half a listing"
        gate.set()
        assert await waiting
        assert known() == frozenset({"gpu-0"}) and pods() == ["etl", "infer", "train"]
        gpu_0.stream.put_nowait(line("ADDED", pod_body("new", "gpu-0")) + line("DELETED", gone))
        await until(lambda: "train" not in pods())
        assert pods() == ["etl", "infer", "new"]  # new came and train went
        assert api.requests[2][1]["watch"] == "true" and api.requests[2][1]["resourceVersion"] == "100"
        # Every namespace, one node.
        assert {(path, query["fieldSelector"]) for path, query in api.requests} == {
            ("/api/v1/pods", "spec.nodeName=gpu-0")
        }
        assert len(wakes) == 3  # the listing, and each change
        # Stopped with an event arrived but not read yet: the node leaves the Store, the event never
        # lands in it.
        task = watches.watches["gpu-0"].task
        gpu_0.stream.put_nowait(line("ADDED", pod_body("late", "gpu-0")))
        watches.follow(())
        assert known() == frozenset() and pods() == []  # stopped: forgotten at once
        await until(task.done)
        assert task.cancelled() and known() == frozenset() and pods() == [] and len(wakes) == 3
        assert store.get("listing_pods", "gpu-0") is None, "nothing recorded, not even aside"
        # A node whose listing does not complete in time: not waited for past the timeout.
        assert not await watches.wait_listed({"gpu-1"}, timeout=0.01)
        await until(lambda: store.get("listing_pods", "gpu-1") is not None)  # its first page, aside
        assert known() == frozenset() and pods() == []
        await watches.stop()
        assert watches.watches == {} and store.get("listing_pods", "gpu-1") is None

    asyncio.run(scenario())


def test_pod_watches_follow_exactly_the_nodes_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    monkeypatch.setattr("gpu_operator.runtime.drain_watches._NodeWatch.__init__", _fake_init(started))

    async def scenario() -> None:
        watches = NodePodWatches(cast(client.ApiClient, None), Store(), lambda: None, lambda: None, FAST)
        watches.follow({"gpu-0", "gpu-1"})
        watches.follow({"gpu-1", "gpu-2"})
        assert sorted(watches.watches) == ["gpu-1", "gpu-2"] and started == ["gpu-0", "gpu-1", "gpu-2"]
        # Waiting for a listing follows the node too; a node not listed in time is a False, not a hang.
        assert await watches.wait_listed({"gpu-0"}, timeout=5)
        assert sorted(watches.watches) == ["gpu-0", "gpu-1", "gpu-2"]
        assert not await watches.wait_listed({"gpu-3"}, timeout=0.01)
        # A watch that is running and not listed yet (failing) is not waited for again.
        watches.watches["gpu-3"].listed.wait = _never_called  # type: ignore[method-assign,assignment]
        assert not await watches.wait_listed({"gpu-3"}, timeout=5)
        await watches.stop()
        assert watches.watches == {}

    asyncio.run(scenario())


def _fake_init(started: list[str]) -> Any:
    def init(self: Any, node: str, watches: Any) -> None:
        started.append(node)
        self.node = node
        self.task = asyncio.ensure_future(asyncio.Event().wait())  # runs until stopped
        self.stop = self.task.cancel
        self.listed = asyncio.Event()
        if node != "gpu-3":
            self.listed.set()

    return init


def _never_called() -> bool:
    raise AssertionError("waited for a watch that was already running")


def test_a_relisting_forgets_the_upgrade_facts_that_vanished() -> None:
    from gpu_operator.main import watches

    store = Store()
    store.record_managed(driver_daemonset(), False)
    store.record_revision(revision(1), False)
    store.record_pod(pod_body("driver-a", "gpu-0", "nvidia-driver", revision_hash="h1"), False)
    store.record_pod(pod_body("validator-a", "gpu-0", "operator-validator"), False)
    retain = {w.plural: w.retain for w in watches(store)}
    facts = store.snapshot("gpu-operator", {}).upgrade
    assert facts.driver_daemonsets and facts.driver_pods and facts.validator_pods
    # Deleted while no watch was open: a fresh listing without them forgets them as upgrade facts too.
    assert retain["pods"]({("gpu-operator", "validator-a")})
    assert retain["daemonsets"](set())
    assert retain["controllerrevisions"](set())
    facts = store.snapshot("gpu-operator", {}).upgrade
    assert facts.driver_daemonsets == () and facts.driver_pods == () and len(facts.validator_pods) == 1
    assert store.size("revisions") == 0


def test_the_auto_upgrade_annotation_goes_before_the_driver_daemonset() -> None:
    """A fresh install: k8s-driver-manager, started by the new driver DaemonSet, must find NVIDIA's
    auto-upgrade annotation on its node, or it cordons the node and evicts GPU pods itself."""
    nodes = {name: node_body(name, 10 + i) for i, name in enumerate(("gpu-0", "gpu-1"))}
    for body in nodes.values():
        del body["metadata"]["annotations"][AUTO_UPGRADE_ANNOTATION]
        del body["metadata"]["labels"][STATE_LABEL]
    order: list[str] = []

    class Ordered(UpgradeKube):
        async def patch_node(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
            order.append(f"node/{name}")
            return await super().patch_node(name, body)

        async def apply(
            self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
        ) -> dict[str, Any]:
            if not dry_run:
                order.append(f"{body['kind']}/{body['metadata']['name']}")
            return await super().apply(body, manager, dry_run)

    kube = Ordered(nodes)
    rec, _ = world(nodes, [])
    rec.store.put("objects", ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-driver-daemonset"), None)
    run_once(with_kube(rec, kube))
    annotated = [i for i, what in enumerate(order) if what.startswith("node/")]
    driver = order.index("DaemonSet/nvidia-driver-daemonset")
    assert len(annotated) == 2 and max(annotated) < driver, order
    assert all(n["metadata"]["annotations"][AUTO_UPGRADE_ANNOTATION] == "true" for n in nodes.values())
