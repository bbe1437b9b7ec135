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
from gpu_operator.reconciler import Reconciler, Store

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
        self.version = 0

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.reject:
            raise self.reject[body["metadata"]["name"]]
        self.applied.append(object_key(body))
        self.version += 1
        result = {
            **body,
            "metadata": {**body["metadata"], "generation": 1, "resourceVersion": str(self.version)},
        }
        return result

    def apply_node_labels(self, node: str, labels: Mapping[str, str]) -> dict[str, Any]:
        self.labels[node] = dict(labels)
        return {}

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
    return Reconciler(cast(Kube, fake), store, "gpu-operator", {})


def settle(rec: Reconciler, fake: FakeKube) -> None:
    """Feed back what the watches would report after the writes: node labels and the status
    (applied objects are recorded from the apply responses already)."""
    policy = rec.store.policies["p"]
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
    assert "nvidia-driver" in outcome.errors  # the object's component label
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
    rec = reconciler(fake, {"ccManager": {"enabled": True}})
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
    again = Reconciler(cast(Kube, fresh), rec.store, "gpu-operator", {})
    again.run_once()
    assert fresh.events == []
    assert fresh.statuses == []  # the status it would write is the one already there


def test_objects_are_recorded_from_apply_responses() -> None:
    fake = FakeKube()
    rec = reconciler(fake)
    rec.run_once()
    key = next(k for k in fake.applied if k[1] == "DaemonSet")
    info = rec.store.objects[key]
    assert info.generation == 1 and info.resource_version
