"""The reconciler's glue, against a fake API (the real one is covered end to end): a change is proven
(lookups, dry runs) before anything of it is written, only differing objects are written, refusals
and failures land in the status without stopping the rest of the pass, nothing is deleted before its
replacement is in place, objects of our names that are someone else's are left alone, and Events are
posted on transitions only."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import pytest
from builders import PCI, gpu_node, label_owner, node_body, operand_pod, watched_node

from gpu_operator.api.common import PULL_SECRETS_MAX
from gpu_operator.api.crd import RESOURCES
from gpu_operator.api.status import ClusterPolicyStatus, ComponentState, ComponentStatus
from gpu_operator.core import plan, policy_fields
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import ADOPT_ANNOTATION, ObjectKey, component_of, object_key
from gpu_operator.core.plan import NVIDIA_DRIVER_CRD, POLICY_CRD, PolicyRef
from gpu_operator.core.psa import PREVIOUS_ANNOTATION, PSA_LABELS, NamespaceInfo
from gpu_operator.core.render import render as core_render
from gpu_operator.core.status import progress_only, status_body
from gpu_operator.runtime.client import ApiError, Kube, NotLeader
from gpu_operator.runtime.reconciler import Outcome, Reconciler
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

PLUGIN = "nvidia-device-plugin-daemonset"
RUNTIME_CLASS = ("node.k8s.io/v1", "RuntimeClass", "", "nvidia")


class FakeKube:
    """Kube's calls (coroutines, as client.Kube's are). Records writes and questions; answers like the
    API server would (generation, resourceVersion, managedFields), for objects it knows (`existing`,
    metadata of objects not in the caches)."""

    def __init__(
        self,
        reject: Mapping[str, ApiError] | None = None,
        reject_writes: Mapping[str, ApiError] | None = None,
    ) -> None:
        self.reject = dict(reject or {})
        """Object or node name → the answer to any apply of it (dry run or not)."""
        self.reject_writes = dict(reject_writes or {})
        """Object name → the answer to a real apply only (the dry run passed)."""
        self.applied: list[ObjectKey] = []
        self.dry_runs: list[ObjectKey] = []
        self.lookups: list[tuple[str, str]] = []
        self.existing: dict[ObjectKey, dict[str, Any]] = {}
        self.secrets: set[str] = set()
        self.priority_classes = {"system-node-critical"}
        self.labels: dict[str, dict[str, str]] = {}
        self.written: dict[str, dict[str, Any]] = {}
        """Node name → the node as the last label write left it (what the API server answered)."""
        self.statuses: list[dict[str, Any]] = []
        self.driver_statuses: list[tuple[str, dict[str, Any]]] = []
        """(NVIDIADriver name, status body) of each status write."""
        self.events: list[tuple[str, str]] = []
        self.subjects: list[tuple[str, str, str, str]] = []
        """(kind, name, uid, message) of what each Event is about."""
        self.deleted: list[ObjectKey] = []
        self.propagations: dict[ObjectKey, str] = {}
        self.versions: dict[str, tuple[str, str]] = {}
        self.bodies: list[dict[str, Any]] = []
        self.rewritten: dict[tuple[str, str], dict[str, tuple[str, str | None]]] = {}
        self.version = 0
        self.managers: list[str] = []
        self.added_labels: list[tuple[str, str, dict[str, str]]] = []
        """(kind, name, labels) of each merge patch that adds labels."""
        self.status_kinds: list[str] = []
        """The kind of each status write."""

    async def metadata(
        self, api_version: str, kind: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        self.lookups.append((kind, name))
        if kind == "Secret":
            return {"metadata": {"name": name}} if name in self.secrets else None
        if kind == "PriorityClass":
            return {"metadata": {"name": name}} if name in self.priority_classes else None
        found = self.existing.get((api_version, kind, namespace, name))
        return None if found is None else {"metadata": found}

    async def apply(
        self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
    ) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.reject:
            raise self.reject[name]
        if dry_run:
            self.dry_runs.append(object_key(body))
            return dict(body)
        if name in self.reject_writes:
            raise self.reject_writes[name]
        self.applied.append(object_key(body))
        self.bodies.append(dict(body))
        self.managers.append(manager)
        self.version += 1
        metadata = {
            **body["metadata"],
            "generation": 1,
            "resourceVersion": str(self.version),
            "managedFields": [{"manager": "gpu-operator", "operation": "Apply"}],
        }
        return {**body, "metadata": metadata}

    async def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        raise ApiError(404, "NotFound", f"{kind} {name}")

    async def apply_node_labels(
        self, node: str, labels: Mapping[str, str], uid: str, resource_version: str = ""
    ) -> dict[str, Any]:
        if node in self.reject:
            raise self.reject[node]
        self.labels[node] = dict(labels)
        self.versions[node] = (uid, resource_version)
        self.version += 1
        self.written[node] = node_body(
            node,
            {PCI: "true", **labels},
            uid=uid,
            resource_version=str(self.version),
            managed_fields=[label_owner(labels)],
            typed=True,
        )
        return copy.deepcopy(self.written[node])

    async def rewrite_labels(
        self, kind: str, name: str, changes: Mapping[str, tuple[str, str | None]]
    ) -> None:
        self.rewritten[kind, name] = dict(changes)

    async def delete(self, key: ObjectKey, propagation: str = "Background") -> None:
        self.deleted.append(key)
        self.propagations[key] = propagation

    async def patch_status(
        self, name: str, status: Mapping[str, Any], kind: tuple[str, str] = ("nvidia.com/v1", "ClusterPolicy")
    ) -> dict[str, Any]:
        self.status_kinds.append(kind[1])
        if kind[1] == "ClusterPolicy":
            self.statuses.append(dict(status))
        return {}

    async def add_labels(self, kind: tuple[str, str], name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        self.added_labels.append((kind[1], name, dict(labels)))
        self.version += 1
        metadata = {"name": name, "uid": f"uid-{name}", "resourceVersion": str(self.version)}
        return {"metadata": {**metadata, "labels": dict(labels)}}

    async def patch_driver_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """As the API server answers: the object with the status written (its spec left out here: the
        reconciler takes only the status)."""
        self.driver_statuses.append((name, dict(status)))
        return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "status": dict(status)}

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
        self.subjects.append((kind[1], policy["name"], policy["uid"], message))


OUR_CRDS = frozenset(resource.name for resource in RESOURCES.values())


def run_once(rec: Reconciler) -> Outcome:
    """One pass, on an event loop of its own (the operator runs its passes on Kopf's)."""
    return asyncio.run(rec.run_once())


def reconciler(fake: FakeKube, spec: dict[str, Any] | None = None) -> Reconciler:
    store = Store()
    store.put("policies", "p", PolicyRef("p", "uid-p", 1, "2026-01-01T00:00:00Z", spec or {}, {}))
    store.put("nodes", "gpu-0", watched_node())
    # Our CRDs are current (reconciler.ensure_crd has its own tests).
    # A refused label write waits this long for the node's watch event before reading the node.
    return Reconciler(cast(Kube, fake), store, Settings(stale_wait_seconds=0.05), crds_current=set(OUR_CRDS))


def settle(rec: Reconciler, fake: FakeKube) -> None:
    """Feed back what the watches would report after the writes: node labels and the status
    (applied objects are recorded from the apply responses already)."""
    policy = rec.store.get("policies", "p")
    rec.store.put(
        "policies",
        "p",
        PolicyRef(
            policy.name,
            policy.uid,
            policy.generation,
            policy.created,
            policy.spec,
            fake.statuses[-1] if fake.statuses else {},
        ),
    )
    for node, labels in fake.labels.items():
        rec.store.put("nodes", node, gpu_node(node, labels, own_labels=frozenset(labels), uid=f"uid-{node}"))


def test_a_label_write_goes_into_the_store_at_once_and_its_watch_event_wakes_no_pass() -> None:
    """Before the watch brings the node, a second pass must not write the same labels again on the
    version the first write replaced (409 Conflict at the API server), nor pass again for the event."""
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    assert fake.labels["gpu-0"]["nvidia.com/gpu.deploy.driver"] == "true"
    node = rec.store.get("nodes", "gpu-0")
    assert node.resource_version == fake.written["gpu-0"]["metadata"]["resourceVersion"]
    assert node.labels["nvidia.com/gpu.deploy.driver"] == "true"
    fake.labels.clear()
    run_once(rec)
    assert fake.labels == {}, "nothing written again"
    assert not rec.store.record_node(copy.deepcopy(fake.written["gpu-0"]), False), "the echo changes nothing"


async def arrives(event: asyncio.Event, guard: float = 5.0) -> bool:
    """Wait for `event`; False if it is not set within `guard` seconds (a guard against a pass that
    would wait for it forever, not a bound on how long anything takes)."""
    try:
        await asyncio.wait_for(event.wait(), guard)
    except TimeoutError:
        return False
    return True


def test_node_labels_go_out_while_the_objects_are_applied_not_after() -> None:
    """The first stage of a rollout: the driver's deploy label need not wait for every component's
    ServiceAccount, RBAC and DaemonSet to be applied (most of a 10-node rollout's first second)."""
    labelling, applying = asyncio.Event(), asyncio.Event()
    stalled: list[str] = []

    class SlowDaemonSets(FakeKube):
        async def apply(
            self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
        ) -> dict[str, Any]:
            # An API server slow to write DaemonSets and labels: each DaemonSet's apply waits until a
            # label write is under way, and each label write until a DaemonSet's apply is (or gives up
            # on it: one written only after the other, that waited for it). Both answered: both were
            # in flight at the same time.
            if not dry_run and body["kind"] == "DaemonSet":
                applying.set()
                if not await arrives(labelling):
                    stalled.append(body["metadata"]["name"])
            return await super().apply(body, manager, dry_run)

        async def apply_node_labels(
            self, node: str, labels: Mapping[str, str], uid: str, resource_version: str = ""
        ) -> dict[str, Any]:
            labelling.set()
            if not await arrives(applying):
                stalled.append(f"node {node}")
            return await super().apply_node_labels(node, labels, uid, resource_version)

    fake = SlowDaemonSets()
    run_once(reconciler(fake))
    assert stalled == [], "the DaemonSets waited for a label that waited for them"
    assert fake.labels["gpu-0"]["nvidia.com/gpu.deploy.driver"] == "true"
    assert any(key[1] == "DaemonSet" for key in fake.applied)


def test_objects_go_in_waves_the_labelled_components_daemonset_after_its_own_objects_only() -> None:
    """A DaemonSet never before its component's ServiceAccount, RBAC and ConfigMaps nor before the
    RuntimeClasses, and the first stage's DaemonSet (the driver's: its label goes out in this pass)
    waits for its own objects, not for every other component's: its pods are the rollout's critical
    path."""

    class TakesTime(FakeKube):
        async def apply(
            self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
        ) -> dict[str, Any]:
            if not dry_run:
                await asyncio.sleep(0.01)  # each write a round trip, as on an API server
            return await super().apply(body, manager, dry_run)

    fake = TakesTime()
    run_once(reconciler(fake))
    order = {key: index for index, key in enumerate(fake.applied)}
    components = {object_key(b): component_of(b["metadata"]) for b in fake.bodies}
    daemonsets = [key for key in order if key[1] == "DaemonSet"]
    driver = [key for key in daemonsets if components[key] == "driver"]
    assert driver and len(daemonsets) > len(driver)
    for key in daemonsets:
        own = [k for k in order if components[k] == components[key] and k[1] != "DaemonSet"]
        assert own and all(order[k] < order[key] for k in own), key
    runtime_classes = [k for k in order if k[1] == "RuntimeClass"]
    assert runtime_classes and max(order[k] for k in runtime_classes) < min(order[k] for k in daemonsets)
    others = [k for k in order if components[k] != "driver"]
    assert max(order[k] for k in driver) < min(order[k] for k in daemonsets if k not in driver)
    assert max(order[k] for k in driver) < max(order[k] for k in others if k[1] != "DaemonSet")


def test_the_first_stages_daemonset_does_not_queue_behind_the_node_labels() -> None:
    """60 nodes, each label write slow: the driver's DaemonSet goes out while they are written, not
    after the last of them."""
    done: list[str] = []
    daemonset = asyncio.Event()

    class Busy(FakeKube):
        async def apply(
            self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
        ) -> dict[str, Any]:
            written = await super().apply(body, manager, dry_run)
            if not dry_run:
                done.append(body["metadata"]["name"])
                if body["metadata"]["name"] == "nvidia-driver-daemonset":
                    daemonset.set()
            return written

        async def apply_node_labels(
            self, node: str, labels: Mapping[str, str], uid: str, resource_version: str = ""
        ) -> dict[str, Any]:
            # An API server slow to write labels: each waits until the driver's DaemonSet is written
            # (or gives up on it: a label write the DaemonSet queued behind).
            await arrives(daemonset)
            written = await super().apply_node_labels(node, labels, uid, resource_version)
            done.append(f"node {node}")
            return written

    fake = Busy()
    rec = reconciler(fake)
    for index in range(1, 60):
        rec.store.put("nodes", f"gpu-{index}", watched_node(f"gpu-{index}"))
    run_once(rec)
    assert len(fake.labels) == 60
    last_label = max(index for index, name in enumerate(done) if name.startswith("node "))
    assert done.index("nvidia-driver-daemonset") < last_label


def edit(rec: Reconciler, spec: dict[str, Any]) -> None:
    policy = rec.store.get("policies", "p")
    rec.store.put(
        "policies",
        "p",
        PolicyRef(policy.name, policy.uid, policy.generation + 1, policy.created, spec, policy.status),
    )


def error_of(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Error")


def component(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in status["components"] if c["name"] == name)


def refusal(field: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f"DaemonSet.apps is invalid: {field}: {message}", ((field, message),))


def test_a_change_is_proven_then_written_and_a_second_pass_asks_nothing() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    assert fake.applied and fake.labels and fake.statuses
    # Every object was dry-run before the first real write, and looked up (not in the caches).
    assert sorted(fake.dry_runs) == sorted(fake.applied)
    assert ("RuntimeClass", "nvidia") in fake.lookups and (
        "PriorityClass",
        "system-node-critical",
    ) in fake.lookups
    settle(rec, fake)
    before = (len(fake.applied), len(fake.dry_runs), len(fake.lookups), len(fake.statuses), len(fake.events))
    outcome = run_once(rec)
    assert not outcome.errors
    assert (
        len(fake.applied),
        len(fake.dry_runs),
        len(fake.lookups),
        len(fake.statuses),
        len(fake.events),
    ) == before


def test_the_passes_of_a_reconciler_share_the_cores_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's memory lives as long as the reconciler (one per operator process): a pass after
    which nothing changed renders nothing again, and another reconciler starts cold."""
    renders: list[str] = []

    def render(*args: Any, **kwargs: Any) -> Any:
        renders.append("render")
        return core_render(*args, **kwargs)

    monkeypatch.setattr(plan, "render", render)
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    run_once(rec)
    assert renders == ["render"]
    again = Reconciler(
        cast(Kube, fake), rec.store, Settings(stale_wait_seconds=0.05), crds_current=set(OUR_CRDS)
    )
    assert again.memory.caches is not rec.memory.caches
    run_once(again)
    assert renders == ["render", "render"]


def test_a_refused_dry_run_writes_nothing_and_names_the_policy_field() -> None:
    # Valid for the models; refused by the cluster (an admission policy, say) as the server names it.
    path = "spec.template.spec.containers[0].resources.requests"
    fake = FakeKube(reject={PLUGIN: refusal(path, 'Invalid value: "2": must be less than or equal to 1')})
    spec = {"devicePlugin": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "3"}}}}
    outcome = run_once(reconciler(fake, spec))
    assert fake.applied == [] and fake.deleted == []  # all or nothing
    assert fake.labels == {}  # nothing known to run (a fresh start): no labels either
    error = error_of(fake.statuses[-1])
    assert error["reason"] == "InvalidSpec", error
    assert "spec.devicePlugin.resources.requests: Invalid value" in error["message"], error
    assert "must be less than or equal to 1" in error["message"]
    assert outcome.errors  # retried with backoff


def test_a_refused_generation_keeps_the_last_one_running_and_new_nodes_still_get_labels() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    written = len(fake.applied)
    fake.reject[PLUGIN] = refusal("spec.template.spec.priorityClassName", "Invalid value")
    edit(rec, {"devicePlugin": {"env": [{"name": "A", "value": "b"}]}})
    rec.store.put("nodes", "gpu-1", watched_node("gpu-1"))  # joins while the new generation is refused
    run_once(rec)
    assert len(fake.applied) == written  # the running generation's objects untouched
    assert "nvidia.com/gpu.present" in fake.labels["gpu-1"]
    assert fake.labels["gpu-1"].get("nvidia.com/gpu.deploy.driver") == "true"
    status = fake.statuses[-1]
    assert status["observedGeneration"] == 2 and status["state"] == "notReady"
    error = error_of(status)
    assert error["reason"] == "InvalidSpec" and "keep running generation 1" in error["message"], error
    # The next valid edit converges.
    del fake.reject[PLUGIN]
    edit(rec, {})
    outcome = run_once(rec)
    assert not outcome.errors and len(fake.applied) == written  # generation 3 is generation 1's content


def test_a_typed_patch_500_is_a_refusal_and_does_not_stop_the_pass() -> None:
    message = (
        "failed to create typed patch object (gpu-operator/x; apps/v1, Kind=DaemonSet): "
        ".spec.template.spec.securityContext.runAsUser: expected numeric (int or float), got string"
    )
    fake = FakeKube(reject={PLUGIN: ApiError(500, "", message)})
    rec = reconciler(fake, {"daemonsets": {"podSecurityContext": {"runAsUser": 0}}})
    rec.store.put("nodes", "gpu-0", watched_node())
    run_once(rec)
    error = error_of(fake.statuses[-1])
    assert error["reason"] == "InvalidSpec", error
    assert "spec.daemonsets.podSecurityContext.runAsUser: expected numeric" in error["message"], error


def test_an_api_failure_while_proving_writes_nothing_and_retries() -> None:
    fake = FakeKube(reject={PLUGIN: ApiError(503, "ServiceUnavailable", "etcd leader changed")})
    outcome = run_once(reconciler(fake))
    assert fake.applied == []
    error = error_of(fake.statuses[-1])
    assert error["reason"] == "ReconcileFailed" and "etcd leader changed" in error["message"]
    assert outcome.errors


def test_a_failed_write_does_not_stop_the_rest_and_nothing_is_deleted() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    # runtimeClass renamed: the new RuntimeClass fails to be written after a good dry run.
    fake.reject_writes["nvidia-two"] = ApiError(503, "ServiceUnavailable", "etcd")
    edit(rec, {"operator": {"runtimeClass": "nvidia-two"}})
    rec.store.put("nodes", "gpu-1", watched_node("gpu-1"))
    outcome = run_once(rec)
    assert "pre-requisites" in outcome.errors
    assert fake.deleted == []  # the RuntimeClass the running pods use stays
    assert any(key[3] == "nvidia-container-toolkit-daemonset" for key in fake.applied[-20:])
    assert "gpu-1" in fake.labels  # node labels still written
    status = fake.statuses[-1]
    assert error_of(status)["reason"] == "ReconcileFailed" and status["observedGeneration"] == 2
    assert status["state"] == "notReady"


def test_a_replica_that_lost_the_lease_stops_the_pass_at_once() -> None:
    """NotLeader is no failure to record and report: a standby writes nothing, not even a status."""
    # Every write asks the lease (kube.Kube may_write): the labels written alongside are refused too.
    fake = FakeKube(reject={"gpu-0": NotLeader()}, reject_writes={PLUGIN: NotLeader()})
    with pytest.raises(NotLeader):
        run_once(reconciler(fake))
    assert fake.statuses == [] and fake.labels == {}


def test_old_objects_go_only_once_their_replacements_are_written() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    edit(rec, {"operator": {"runtimeClass": "nvidia-two"}})
    run_once(rec)
    assert fake.deleted == [RUNTIME_CLASS]
    assert ("node.k8s.io/v1", "RuntimeClass", "", "nvidia-two") in fake.applied


def test_the_policys_driver_daemonset_goes_with_its_pods_orphaned_when_the_pools_take_over() -> None:
    """Each pool's upgrade replaces the orphaned driver pods node by node (core/driver_pool_plan.py);
    every other delete takes its dependents with it."""
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    driver = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-driver-daemonset")
    assert driver in fake.applied
    rec.store.put("crds", "nvidiadrivers.nvidia.com", True)
    spec = {"version": "1.2", "default": True, "upgradePolicy": {"autoUpgrade": False}}
    rec.store.record_driver({"metadata": {"name": "default", "uid": "uid-default"}, "spec": spec}, False)
    edit(rec, {"driver": {"useNvidiaDriverCRD": True}, "operator": {"runtimeClass": "nvidia-two"}})
    run_once(rec)
    assert fake.propagations == {driver: "Orphan", RUNTIME_CLASS: "Background"}


def test_missing_references_refuse_the_change_naming_the_field() -> None:
    fake = FakeKube()
    spec = {
        "daemonsets": {"priorityClassName": "no-such-priority-class"},
        "devicePlugin": {"imagePullSecrets": ["registry-key"], "config": {"name": "plugin-config"}},
    }
    outcome = run_once(reconciler(fake, spec))
    assert fake.applied == [] and fake.dry_runs == []  # refused before any dry run
    error = error_of(fake.statuses[-1])
    assert error["reason"] == "PrerequisiteNotMet", error
    message = error["message"]
    assert "spec.daemonsets.priorityClassName: PriorityClass 'no-such-priority-class' not found" in message
    assert "spec.devicePlugin.imagePullSecrets[0]: Secret 'registry-key' not found" in message
    assert "spec.devicePlugin.config.name: ConfigMap 'plugin-config' not found" in message
    assert outcome.errors


def test_pull_secrets_cost_one_walk_of_the_policy_and_one_lookup_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding the field that names each Secret once walked the whole policy per name (quadratic: 10 000
    names never finished a pass); now a pass walks it the same few times for 1 name as for many, and
    asks for each Secret once however many components name it."""
    walks: list[object] = []
    real = policy_fields._nodes

    def counting(value: Any, path: policy_fields.Path = ()) -> Any:
        walks.append(path)
        return real(value, path)

    monkeypatch.setattr(policy_fields, "_nodes", counting)
    sections = ("driver", "toolkit", "devicePlugin", "dcgmExporter", "gfd", "validator")

    def run(names: list[str]) -> tuple[int, list[str]]:
        walks.clear()
        fake = FakeKube()
        run_once(reconciler(fake, {section: {"imagePullSecrets": names} for section in sections}))
        assert "spec.driver.imagePullSecrets[0]: Secret" in error_of(fake.statuses[-1])["message"]
        return len(walks), [name for kind, name in fake.lookups if kind == "Secret"]

    one_walks, one_lookups = run(["key-0"])
    names = [f"key-{i}" for i in range(PULL_SECRETS_MAX)]
    many_walks, many_lookups = run(names)
    assert one_lookups == ["key-0"]
    assert sorted(many_lookups) == sorted(names)
    assert many_walks == one_walks


def test_the_device_plugin_config_needs_its_default_key() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"devicePlugin": {"config": {"name": "plugin-config", "default": "any"}}})
    rec.store.put("config_maps", "plugin-config", ("a100", "h100"))
    run_once(rec)
    assert fake.applied == []
    error = error_of(fake.statuses[-1])
    assert "spec.devicePlugin.config.default: ConfigMap 'plugin-config' has no key 'any'" in error["message"]
    rec.store.put("config_maps", "plugin-config", ("a100", "any"))
    assert not run_once(rec).errors and fake.applied


def test_an_object_of_our_name_that_is_someone_elses_is_a_conflict_the_rest_converges() -> None:
    fake = FakeKube()
    key = ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "nvidia-driver")
    fake.existing[key] = {"name": "nvidia-driver", "managedFields": [{"manager": "kubectl-create"}]}
    outcome = run_once(reconciler(fake))
    assert not any(k[3] == "nvidia-driver" or k[3] == "nvidia-driver-daemonset" for k in fake.applied)
    assert any(k[3] == PLUGIN for k in fake.applied)  # other components converge
    status = fake.statuses[-1]
    driver = component(status, "driver")
    assert driver["state"] == "notReady" and "ClusterRole nvidia-driver exists" in driver["reason"]
    assert ADOPT_ANNOTATION in driver["reason"] and "kubectl-create" in driver["reason"]
    assert error_of(status)["reason"] == "ObjectConflict"
    assert "driver" in outcome.errors


def test_an_object_handed_over_or_controlled_by_the_policy_is_taken_over() -> None:
    fake = FakeKube()
    handed = ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "nvidia-driver")
    fake.existing[handed] = {"name": "nvidia-driver", "annotations": {ADOPT_ANNOTATION: "true"}}
    # NVIDIA's operator's object under the same ClusterPolicy: controlled by it, its field manager.
    nvidias = ("v1", "ServiceAccount", "gpu-operator", "nvidia-device-plugin")
    fake.existing[nvidias] = {
        "name": "nvidia-device-plugin",
        "ownerReferences": [
            {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "uid": "uid-p", "controller": True}
        ],
        "managedFields": [{"manager": "gpu-operator", "operation": "Update"}],
    }
    outcome = run_once(reconciler(fake))
    assert handed in fake.applied and nvidias in fake.applied
    assert not outcome.errors


def test_a_label_write_on_a_node_gone_meanwhile_is_stale_not_an_error() -> None:
    fake = FakeKube(
        reject={"gpu-0": ApiError(409, "Conflict", "uid mismatch: the provided object specified uid x")}
    )
    outcome = run_once(reconciler(fake))
    assert outcome.stale == ("node/gpu-0",) and "node/gpu-0" not in outcome.errors
    fake = FakeKube(
        reject={
            "gpu-0": ApiError(422, "Invalid", 'Node "gpu-0" is invalid: metadata.uid: field is immutable')
        }
    )
    assert run_once(reconciler(fake)).stale == ("node/gpu-0",)


def test_label_writes_carry_the_planned_node_uid_and_version_and_a_conflict_retries() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    # A newer resourceVersion alone replaces the entry (so the next write carries it) but is no change.
    assert not rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="42"))
    run_once(rec)
    assert fake.versions == {"gpu-0": ("u0", "42")}
    conflict = FakeKube(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    outcome = run_once(reconciler(conflict))
    # Not an error of the policy: the loop runs another pass on a fresh view.
    assert outcome.stale == ("node/gpu-0",) and not outcome.errors


def node_at_57(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The node as a GET after a refused label write answers it: moved on to resourceVersion 57."""
    return node_body(name, labels, uid="u0", resource_version="57", typed=True)


def test_a_stale_label_write_reads_the_node_so_the_next_pass_writes_on_its_new_version() -> None:
    """A node whose watch events lag stays at the refused version in the Store; without the read every
    pass would write on it again until its event came."""

    class Moved(FakeKube):
        async def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
            self.lookups.append((kind, name))
            return node_at_57(name, {PCI: "true", "feature.node.kubernetes.io/gfd": "yes"})

    fake = Moved(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    rec = reconciler(fake)
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    assert run_once(rec).stale == ("node/gpu-0",)
    assert fake.lookups.count(("Node", "gpu-0")) == 1
    assert rec.store.get("nodes", "gpu-0").resource_version == "57"
    # The node's late watch event, older than what was read, does not take the Store back.
    late = node_body("gpu-0", {PCI: "true"}, uid="u0", resource_version="49")
    assert not rec.store.record_node(late, False)
    del fake.reject["gpu-0"]
    run_once(rec)
    assert fake.versions["gpu-0"] == ("u0", "57")


def test_a_label_write_refused_only_because_the_version_moved_goes_again_at_once() -> None:
    """A status update or another manager's annotation moved the node's resourceVersion but nothing
    the plan read: the same write goes again on the new version, in the same pass."""

    class Touched(FakeKube):
        async def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
            self.lookups.append((kind, name))
            del self.reject[name]  # the next write finds the node as read
            return node_at_57(name, {PCI: "true"})

    fake = Touched(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    rec = reconciler(fake)
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    outcome = run_once(rec)
    assert outcome.stale == () and not outcome.errors
    assert fake.versions["gpu-0"] == ("u0", "57")
    assert fake.labels["gpu-0"]["nvidia.com/gpu.deploy.driver"] == "true"


def test_a_refused_label_write_takes_the_new_version_from_the_watch_without_reading_the_node() -> None:
    """The watch brings the node's newer version while the writer waits (a status update moved it):
    the write goes again on it at once, and the node is never read."""

    class Watched(FakeKube):
        async def apply_node_labels(
            self, node: str, labels: Mapping[str, str], uid: str, resource_version: str = ""
        ) -> dict[str, Any]:
            if node in self.reject:
                del self.reject[node]
                moved = replace(rec.store.get("nodes", node), resource_version="57")
                # The watch event comes while the refused write waits for it.
                asyncio.get_running_loop().call_later(0.02, rec.store.put, "nodes", node, moved)
                raise ApiError(409, "Conflict", "the object has been modified")
            return await super().apply_node_labels(node, labels, uid, resource_version)

    fake = Watched(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    rec = reconciler(fake)
    rec.settings = replace(rec.settings, stale_wait_seconds=5.0)
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    outcome = run_once(rec)
    assert outcome.stale == () and not outcome.errors
    assert fake.versions["gpu-0"] == ("u0", "57") and ("Node", "gpu-0") not in fake.lookups


def moved_while_proving(node: NodeInfo) -> tuple[FakeKube, Reconciler]:
    """A pass whose node `gpu-0` the watch brings again as `node` while the pass proves its change
    (before any label write goes out)."""

    class Watched(FakeKube):
        async def apply(
            self, body: Mapping[str, Any], manager: str = "gpu-operator", dry_run: bool = False
        ) -> dict[str, Any]:
            if dry_run:
                rec.store.put("nodes", "gpu-0", node)
            return await super().apply(body, manager, dry_run)

    fake = Watched()
    rec = reconciler(fake)
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    return fake, rec


def test_a_label_write_goes_on_the_newest_version_the_watch_brought_while_it_waited() -> None:
    """Only the resourceVersion moved (another manager's annotation): no refused write, no read."""
    fake, rec = moved_while_proving(gpu_node(uid="u0", resource_version="44"))
    outcome = run_once(rec)
    assert outcome.stale == () and not outcome.errors
    assert fake.versions["gpu-0"] == ("u0", "44")
    assert ("Node", "gpu-0") not in fake.lookups


def test_a_label_write_whose_node_changed_while_it_waited_is_left_to_the_next_pass() -> None:
    """Something the plan reads changed (a label another manager set): the write would be refused."""
    changed = gpu_node(labels={"nvidia.com/gpu.deploy.driver": "false"}, uid="u0")
    fake, rec = moved_while_proving(replace(changed, resource_version="44"))
    outcome = run_once(rec)
    assert outcome.stale == ("node/gpu-0",) and not outcome.errors
    assert "gpu-0" not in fake.labels and ("Node", "gpu-0") not in fake.lookups


def test_a_node_that_cannot_be_read_after_a_stale_write_is_left_to_its_watch() -> None:
    fake = FakeKube(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    rec = reconciler(fake)  # FakeKube.get answers 404: the node went meanwhile
    rec.store.put("nodes", "gpu-0", gpu_node(uid="u0", resource_version="41"))
    outcome = run_once(rec)
    assert outcome.stale == ("node/gpu-0",) and not outcome.errors
    assert rec.store.get("nodes", "gpu-0").resource_version == "41"


def test_events_on_transitions_only() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"kataManager": {"enabled": True}, "sandboxWorkloads": {"enabled": True}})
    run_once(rec)
    assert ("Normal", "Progressing") in fake.events  # rolling out, nothing failing
    assert ("Warning", "Unsupported") in fake.events
    count = len(fake.events)
    settle(rec, fake)
    run_once(rec)
    assert len(fake.events) == count  # same state, same notes: nothing new to say


def test_restarted_operator_does_not_repeat_events() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    settle(rec, fake)
    fresh = FakeKube()
    again = Reconciler(cast(Kube, fresh), rec.store, Settings())
    run_once(again)
    assert fresh.events == []
    assert fresh.statuses == []  # the status it would write is the one already there


def test_objects_are_recorded_from_apply_responses() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    run_once(rec)
    key = next(k for k in fake.applied if k[1] == "DaemonSet")
    info = rec.store.get("objects", key)
    assert info.generation == 1 and info.resource_version and "gpu-operator" in info.managers


def test_shared_labels_leaving_the_set_are_removed_explicitly() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"dcgm": {"enabled": False}})
    key = "nvidia.com/gpu.deploy.dcgm"
    # dcgm was ours and k8s-driver-manager's (it restored it after a driver upgrade); now it is disabled.
    rec.store.put(
        "nodes",
        "gpu-0",
        gpu_node(labels={key: "true"}, own_labels=frozenset({key}), shared_labels=frozenset({key}), uid="u0"),
    )
    run_once(rec)
    assert key not in fake.labels["gpu-0"]
    assert fake.rewritten == {("Node", "gpu-0"): {key: ("true", None)}}


def test_with_no_policy_the_managers_labels_go_even_where_the_operator_owns_none() -> None:
    fake = FakeKube()
    store = Store()
    nvsm, plugin = "nvidia.com/gpu.deploy.nvsm", "nvidia.com/gpu.deploy.device-plugin"
    # Only k8s-driver-manager's marks are left: its "" and a pause (the operator's apply went already).
    store.put(
        "nodes",
        "gpu-0",
        NodeInfo(
            "gpu-0",
            {PCI: "true", nvsm: "", plugin: "paused-for-driver-upgrade"},
            protocol_labels=frozenset({nvsm, plugin}),
            uid="u0",
        ),
    )
    rec = Reconciler(cast(Kube, fake), store, Settings(stale_wait_seconds=0.05), crds_current=set(OUR_CRDS))
    outcome = run_once(rec)
    assert fake.labels == {}, "an apply with nothing of the operator's to change"
    assert fake.rewritten == {
        ("Node", "gpu-0"): {nvsm: ("", None), plugin: ("paused-for-driver-upgrade", None)}
    }
    assert not outcome.errors


def test_psa_namespace_write_restores_then_applies_never_creating_it() -> None:
    enforce, audit, warn = PSA_LABELS
    fake = FakeKube()
    rec = reconciler(fake, {"psa": {"enabled": True}})
    rec.store.put(
        "namespaces",
        "gpu-operator",
        NamespaceInfo("gpu-operator", {enforce: "baseline"}, {}, frozenset(), "5", "uid-ns"),
    )
    run_once(rec)
    (namespace,) = [b for b in fake.bodies if b["kind"] == "Namespace"]
    assert namespace["metadata"]["resourceVersion"] == "5" and namespace["metadata"]["uid"] == "uid-ns"
    assert namespace["metadata"]["labels"] == dict.fromkeys(PSA_LABELS, "privileged")
    assert namespace["metadata"]["annotations"] == {
        PREVIOUS_ANNOTATION: '{"pod-security.kubernetes.io/enforce": "baseline"}'
    }
    fake = FakeKube()
    rec = reconciler(fake, {"psa": {"enabled": False}})
    owned = NamespaceInfo(
        "gpu-operator",
        dict.fromkeys(PSA_LABELS, "privileged"),
        {enforce: "baseline"},
        frozenset({enforce, audit, warn, PREVIOUS_ANNOTATION}),
        "6",
        "uid-ns",
    )
    rec.store.put("namespaces", "gpu-operator", owned)
    run_once(rec)
    assert fake.rewritten == {("Namespace", "gpu-operator"): {enforce: ("privileged", "baseline")}}
    (namespace,) = [b for b in fake.bodies if b["kind"] == "Namespace"]
    assert namespace["metadata"] == {"name": "gpu-operator", "uid": "uid-ns", "labels": {}, "annotations": {}}


def test_progress_waits_for_the_status_interval_and_a_new_state_does_not() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    # An hour: however slow the machine, the passes below run well within it after the write.
    rec.settings = replace(rec.settings, status_interval_seconds=3600.0)
    rec.store.put("nodes", "gpu-1", watched_node("gpu-1"))
    run_once(rec)
    settle(rec, fake)
    written = len(fake.statuses)
    # One of the two drivers comes up: counts change, no state does.
    rec.store.put("pods", "d0", operand_pod("d0", "driver", "gpu-0"))
    outcome = run_once(rec)
    assert len(fake.statuses) == written, "progress only, just after a write: it waits"
    assert (
        outcome.wake_at is not None
        and 0 < outcome.wake_at - time.time() <= rec.settings.status_interval_seconds
    )
    rec.memory.status_written["p"] -= rec.settings.status_interval_seconds
    run_once(rec)
    assert len(fake.statuses) == written + 1 and component(fake.statuses[-1], "driver")["nodesReady"] == 1
    settle(rec, fake)
    # A new state is never held back: the policy generation changes.
    edit(rec, {"dcgmExporter": {"enabled": False}})
    run_once(rec)
    assert len(fake.statuses) == written + 2 and fake.statuses[-1]["observedGeneration"] == 2


def test_only_progress_counts_as_progress() -> None:
    before = status_body(ClusterPolicyStatus(state="notReady", observedGeneration=1, gpuNodes=2))
    same_state = ClusterPolicyStatus(
        state="notReady", observedGeneration=1, gpuNodes=2, componentsReady="1/9"
    )
    assert progress_only(before, same_state)
    for changed in ({"state": "ready"}, {"observedGeneration": 2}, {"gpuNodes": 3}):
        assert not progress_only(before, same_state.model_copy(update=changed))
    assert not progress_only({}, same_state), "no status yet"
    ready = status_body(ClusterPolicyStatus(state="ready", observedGeneration=1, gpuNodes=2))
    assert not progress_only(
        ready, ClusterPolicyStatus(state="ready", observedGeneration=1, gpuNodes=2, componentsReady="9/9")
    )


def test_a_component_becoming_ready_mid_rollout_is_progress_and_any_other_change_is_not() -> None:
    def status(*states: tuple[str, bool, ComponentState]) -> ClusterPolicyStatus:
        components = [ComponentStatus(name=n, enabled=e, state=s) for n, e, s in states]
        return ClusterPolicyStatus(state="notReady", observedGeneration=1, gpuNodes=2, components=components)

    rolling = status(
        ("driver", True, "ready"), ("dcgm", True, "notReady"), ("mig-manager", False, "disabled")
    )
    before = status_body(rolling)
    assert progress_only(
        before, status(("driver", True, "ready"), ("dcgm", True, "ready"), ("mig-manager", False, "disabled"))
    )
    for changed in (
        status(("driver", True, "notReady"), ("dcgm", True, "notReady"), ("mig-manager", False, "disabled")),
        status(("driver", True, "ready"), ("dcgm", False, "disabled"), ("mig-manager", False, "disabled")),
        status(("driver", True, "ready"), ("dcgm", True, "notReady"), ("mig-manager", True, "notReady")),
        status(("driver", True, "ready"), ("dcgm", True, "notReady")),
    ):
        assert not progress_only(before, changed), changed.components


CRD_KEY = ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", POLICY_CRD)
DRIVER_CRD_KEY = ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", NVIDIA_DRIVER_CRD)


def test_a_crd_gone_is_created_again_once_and_nothing_more_is_written_to_it() -> None:
    """The CRD's watch saw it go: the pass creates it again. Nothing else is written to it (the
    informer of ClusterPolicies lists them again on the CRD's own events)."""
    fake = FakeKube()
    r = reconciler(fake)
    r.store.put("crds", POLICY_CRD, False)
    run_once(r)
    writes = [
        (key, manager) for key, manager in zip(fake.applied, fake.managers, strict=True) if key == CRD_KEY
    ]
    assert writes == [(CRD_KEY, "gpu-operator")]
    assert r.crds_current == set(OUR_CRDS) and r.store.get("crds", POLICY_CRD)
    run_once(r)
    assert fake.applied.count(CRD_KEY) == 1, "a current CRD is left alone"
    assert DRIVER_CRD_KEY not in fake.applied, "only the one that went"


def test_every_crd_of_ours_is_created_at_start_and_only_with_create_crd() -> None:
    fake = FakeKube()
    r = reconciler(fake)
    r.crds_current.clear()
    run_once(r)
    assert {CRD_KEY, DRIVER_CRD_KEY} <= set(fake.applied)
    assert r.store.get("crds", NVIDIA_DRIVER_CRD) is True
    fake = FakeKube()
    r = reconciler(fake)
    r.crds_current.clear()
    r.settings = Settings(create_crd=False)
    run_once(r)
    assert not {CRD_KEY, DRIVER_CRD_KEY} & set(fake.applied)
    assert not r.crds_current


def test_a_crd_present_at_start_is_not_written() -> None:
    fake = FakeKube()
    r = reconciler(fake)
    r.store.put("crds", POLICY_CRD, True)
    run_once(r)
    assert CRD_KEY not in fake.applied


def test_a_crd_that_cannot_be_written_is_tried_again_next_pass() -> None:
    fake = FakeKube()
    r = reconciler(fake)
    r.store.put("crds", POLICY_CRD, False)
    fake.reject[POLICY_CRD] = ApiError(403, "Forbidden", "patch customresourcedefinitions")
    run_once(r)
    assert POLICY_CRD not in r.crds_current
    del fake.reject[POLICY_CRD]
    run_once(r)
    assert POLICY_CRD in r.crds_current and CRD_KEY in fake.applied


def test_nvidiadriver_statuses_are_written_once_and_not_again_at_rest() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"driver": {"useNvidiaDriverCRD": True}})
    rec.store.put("crds", "nvidiadrivers.nvidia.com", True)
    body = {
        "metadata": {"name": "h100", "uid": "uid-h100", "generation": 1},
        "spec": {"version": "595.91.07", "nodeSelector": {"pool": "h100"}},
    }
    rec.store.record_driver(body, False)
    run_once(rec)
    ((name, status),) = fake.driver_statuses
    assert name == "h100" and status["state"] == "ready", "it owns no node: nothing to wait for"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True", "Error": "False"}
    # What the write returned is in the Store: the next pass, before the watch event, writes nothing.
    assert rec.store.get("drivers", "h100").status == status
    run_once(rec)
    assert len(fake.driver_statuses) == 1
    # The ClusterPolicy stops delegating: the driver is disabled, said once.
    edit(rec, {"driver": {"useNvidiaDriverCRD": False}})
    run_once(rec)
    run_once(rec)
    assert [s["state"] for _, s in fake.driver_statuses] == ["ready", "disabled"]


def test_a_conflict_is_told_on_each_nvidiadriver_after_its_status_and_once() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"driver": {"useNvidiaDriverCRD": True}})
    rec.store.put("crds", "nvidiadrivers.nvidia.com", True)
    for name in ("a100", "h100"):  # no nodeSelector: both select gpu-0
        rec.store.record_driver(
            {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"version": "1.2"}}, False
        )
    run_once(rec)
    told = [s for s in fake.subjects if s[0] == "NVIDIADriver"]
    assert [(kind, name, uid) for kind, name, uid, _ in told] == [
        ("NVIDIADriver", "a100", "uid-a100"),
        ("NVIDIADriver", "h100", "uid-h100"),
    ]
    assert "NVIDIADriver h100" in told[0][3] and "gpu-0" in told[0][3]
    assert [name for name, _ in fake.driver_statuses] == ["a100", "h100"]
    run_once(rec)
    assert [s for s in fake.subjects if s[0] == "NVIDIADriver"] == told, "not again at rest"


def test_a_driver_status_write_on_a_driver_gone_meanwhile_is_no_error() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.store.put("crds", "nvidiadrivers.nvidia.com", True)
    rec.store.record_driver({"metadata": {"name": "gone", "uid": "u"}, "spec": {"version": "1.2.3"}}, False)

    async def refuse(name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        raise ApiError(404, "NotFound", name)

    fake.patch_driver_status = refuse  # type: ignore[method-assign]
    assert run_once(rec).errors == {}


ADMIN_ACCESS = "resource.kubernetes.io/admin-access"


def namespace_body(labels: Mapping[str, str], version: str) -> dict[str, Any]:
    metadata = {"name": "gpu-operator", "uid": "uid-gpu-operator", "resourceVersion": version}
    return {"metadata": {**metadata, "labels": dict(labels)}}


def test_the_admin_access_label_written_its_watch_event_wakes_the_pass_that_applies_the_claims() -> None:
    """The first pass with a GPUCluster proves and writes its stack without the admin-access claim
    templates (the API server refuses them until the namespace has the label) and writes the label; the
    namespace's watch event then carries a change the planner reads, which wakes the next pass, and
    that one writes them."""
    fake = FakeKube()
    rec = reconciler(fake)
    rec.store.record_namespace(namespace_body({}, "5"), False)
    gpucluster = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {
            "name": "gpu-cluster",
            "uid": "uid-gc",
            "generation": 1,
            "resourceVersion": "3",
            "finalizers": ["gpucluster.nvidia.com/dra-resourceclaim"],
        },
        "spec": {},
    }
    rec.store.record_gpucluster(gpucluster, False)
    outcome = run_once(rec)
    assert not outcome.errors, outcome.errors
    assert fake.added_labels == [("Namespace", "gpu-operator", {ADMIN_ACCESS: "true"})]
    kinds = {key[1] for key in fake.applied}
    assert "DeviceClass" in kinds and "ResourceClaimTemplate" not in kinds
    assert not any(key[1] == "ResourceClaimTemplate" for key in fake.dry_runs), "never dry-run unlabelled"
    assert ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dra-validator") not in fake.applied
    # The watch brings the namespace with the label: the Store takes it as a change, so a pass is woken.
    assert rec.store.record_namespace(namespace_body({ADMIN_ACCESS: "true"}, "6"), False)
    fake.applied.clear()
    fake.added_labels.clear()
    outcome = run_once(rec)
    assert not outcome.errors, outcome.errors
    template = ("resource.k8s.io/v1", "ResourceClaimTemplate", "gpu-operator", "nvidia-dra-validator-gpu")
    assert template in fake.applied
    assert ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dra-validator") in fake.applied
    assert fake.added_labels == [], "the label is there: not written again"
