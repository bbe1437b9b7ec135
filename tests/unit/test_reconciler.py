"""The reconciler's glue, against a fake API (the real one is covered end to end): only differing
objects are written, rejected writes land in the status, transient failures abort the pass, and
Events are posted on transitions only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from gpu_operator.kube import ApiError, Kube
from gpu_operator.nodes import NodeInfo
from gpu_operator.observed import ObjectKey, object_key
from gpu_operator.plan import PolicyRef
from gpu_operator.psa import PREVIOUS_ANNOTATION, PSA_LABELS, NamespaceInfo
from gpu_operator.reconciler import Reconciler
from gpu_operator.settings import Settings
from gpu_operator.store import Store

PCI = "feature.node.kubernetes.io/pci-10de.present"


class FakeKube:
    """Records writes; answers an apply like the API server would (generation, resourceVersion)."""

    def __init__(self, reject: Mapping[str, ApiError] | None = None) -> None:
        self.reject = dict(reject or {})
        self.applied: list[ObjectKey] = []
        self.labels: dict[str, dict[str, str]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.deleted: list[ObjectKey] = []
        self.versions: dict[str, str] = {}
        self.bodies: list[dict[str, Any]] = []
        self.rewritten: dict[tuple[str, str], dict[str, tuple[str, str | None]]] = {}
        self.version = 0

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.reject:
            raise self.reject[body["metadata"]["name"]]
        self.applied.append(object_key(body))
        self.bodies.append(dict(body))
        self.version += 1
        result = {
            **body,
            "metadata": {**body["metadata"], "generation": 1, "resourceVersion": str(self.version)},
        }
        return result

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        raise ApiError(404, "NotFound", f"{kind} {name}")

    def apply_node_labels(
        self, node: str, labels: Mapping[str, str], resource_version: str = ""
    ) -> dict[str, Any]:
        if node in self.reject:
            raise self.reject[node]
        self.labels[node] = dict(labels)
        self.versions[node] = resource_version
        return {}

    def rewrite_labels(self, kind: str, name: str, changes: Mapping[str, tuple[str, str | None]]) -> None:
        self.rewritten[kind, name] = dict(changes)

    def delete(self, key: ObjectKey) -> None:
        self.deleted.append(key)

    def patch_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        self.statuses.append(dict(status))
        return {}

    def post_event(self, policy: Mapping[str, str], type_: str, reason: str, message: str, now: str) -> None:
        self.events.append((type_, reason))


def reconciler(fake: FakeKube, spec: dict[str, Any] | None = None) -> Reconciler:
    store = Store()
    store.put("policies", "p", PolicyRef("p", "uid-p", 1, "2026-01-01T00:00:00Z", spec or {}, {}))
    store.put("nodes", "gpu-0", NodeInfo("gpu-0", {PCI: "true"}))
    return Reconciler(cast(Kube, fake), store, Settings())


def settle(rec: Reconciler, fake: FakeKube) -> None:
    """Feed back what the watches would report after the writes: node labels and the status
    (applied objects are recorded from the apply responses already)."""
    policy = rec.store.get("policies", "p")
    rec.store.put(
        "policies", "p", PolicyRef(policy.name, policy.uid, 1, policy.created, policy.spec, fake.statuses[-1])
    )
    for node, labels in fake.labels.items():
        rec.store.put("nodes", node, NodeInfo(node, {PCI: "true", **labels}, 0, frozenset(labels)))


def test_second_pass_writes_nothing() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.run_once()
    assert fake.applied and fake.labels and fake.statuses
    settle(rec, fake)
    before = (len(fake.applied), len(fake.statuses), dict(fake.labels), len(fake.events))
    rec.run_once()
    assert (len(fake.applied), len(fake.statuses), dict(fake.labels), len(fake.events)) == before


def test_rejected_write_is_reported_and_the_rest_proceeds() -> None:
    fake = FakeKube(reject={"nvidia-driver-daemonset": ApiError(422, "Invalid", "spec.template: bad")})
    outcome = reconciler(fake).run_once()
    assert "driver" in outcome.errors  # the component of the object (its label is nvidia-driver)
    driver = next(c for c in fake.statuses[-1]["components"] if c["name"] == "driver")
    assert driver["state"] == "notReady" and "spec.template: bad" in driver["reason"]
    assert any(key[3] == "nvidia-container-toolkit" for key in fake.applied)  # later objects still written
    status = fake.statuses[-1]
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert error["reason"] == "ReconcileFailed" and "spec.template: bad" in error["message"]
    driver = next(c for c in status["components"] if c["name"] == "driver")
    assert driver["reason"].startswith("apply failed")


def test_transient_failure_aborts_the_pass() -> None:
    fake = FakeKube(reject={"nvidia-driver-daemonset": ApiError(503, "ServiceUnavailable", "etcd")})
    with pytest.raises(ApiError):
        reconciler(fake).run_once()


def test_events_on_transitions_only() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"ccManager": {"enabled": True}, "sandboxWorkloads": {"enabled": True}})
    rec.run_once()
    assert ("Normal", "Progressing") in fake.events  # rolling out, nothing failing
    assert ("Warning", "Unsupported") in fake.events
    count = len(fake.events)
    settle(rec, fake)
    rec.run_once()
    assert len(fake.events) == count  # same state, same notes: nothing new to say


def test_restarted_operator_does_not_repeat_events() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.run_once()
    settle(rec, fake)
    fresh = FakeKube()
    again = Reconciler(cast(Kube, fresh), rec.store, Settings())
    again.run_once()
    assert fresh.events == []
    assert fresh.statuses == []  # the status it would write is the one already there


def test_objects_are_recorded_from_apply_responses() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.run_once()
    key = next(k for k in fake.applied if k[1] == "DaemonSet")
    info = rec.store.get("objects", key)
    assert info.generation == 1 and info.resource_version


def test_label_writes_carry_the_planned_node_version_and_a_conflict_retries() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.store.put("nodes", "gpu-0", NodeInfo("gpu-0", {PCI: "true"}, resource_version="41"))
    # A newer resourceVersion alone replaces the entry (so the next write carries it) but is no change.
    assert not rec.store.put("nodes", "gpu-0", NodeInfo("gpu-0", {PCI: "true"}, resource_version="42"))
    rec.run_once()
    assert fake.versions == {"gpu-0": "42"}
    conflict = FakeKube(reject={"gpu-0": ApiError(409, "Conflict", "the object has been modified")})
    outcome = reconciler(conflict).run_once()
    # Not an error of the policy: the loop runs another pass on a fresh view.
    assert outcome.stale == ("node/gpu-0",) and not outcome.errors


def test_shared_labels_leaving_the_set_are_removed_explicitly() -> None:
    fake = FakeKube()
    rec = reconciler(fake, {"dcgm": {"enabled": False}})
    key = "nvidia.com/gpu.deploy.dcgm"
    # dcgm was ours and k8s-driver-manager's (it restored it after a driver upgrade); now it is disabled.
    rec.store.put(
        "nodes", "gpu-0", NodeInfo("gpu-0", {PCI: "true", key: "true"}, 0, frozenset({key}), frozenset({key}))
    )
    rec.run_once()
    assert key not in fake.labels["gpu-0"]
    assert fake.rewritten == {("Node", "gpu-0"): {key: ("true", None)}}


def test_psa_namespace_write_restores_then_applies() -> None:
    enforce, audit, warn = PSA_LABELS
    fake = FakeKube()
    rec = reconciler(fake, {"psa": {"enabled": True}})
    rec.store.put(
        "namespaces",
        "gpu-operator",
        NamespaceInfo("gpu-operator", {enforce: "baseline"}, {}, frozenset(), "5"),
    )
    rec.run_once()
    (namespace,) = [b for b in fake.bodies if b["kind"] == "Namespace"]
    assert namespace["metadata"]["resourceVersion"] == "5"
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
    )
    rec.store.put("namespaces", "gpu-operator", owned)
    rec.run_once()
    assert fake.rewritten == {("Namespace", "gpu-operator"): {enforce: ("privileged", "baseline")}}
    (namespace,) = [b for b in fake.bodies if b["kind"] == "Namespace"]
    assert namespace["metadata"] == {"name": "gpu-operator", "labels": {}, "annotations": {}}
