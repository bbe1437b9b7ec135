"""Input that cannot hurt, end to end: what the CRD refuses, what the operator refuses when an older or
looser CRD let it in, content nested thousands of levels deep, and Unicode that must arrive intact."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import CRD_FILE, install_crds
from .kube_helpers import Cluster, client, wait_for
from .operator_process import OperatorProcess
from .test_operator import (
    CONVERGE,
    GROUP,
    PLURAL,
    VERSION,
    apply_policy,
    condition,
    daemonsets,
    get_policy,
    operator_labels,
    policy_from,
    wait_state,
)

CRD_NAME = "clusterpolicies.nvidia.com"
SPEC_SCHEMA = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties"


def running_operands(cluster: Cluster) -> dict[str, Any]:
    """What a refused policy must leave exactly as it was: each operand DaemonSet (uid, generation),
    every RuntimeClass and the node set (none created, changed or deleted) and the operator's node
    labels."""
    found: dict[str, Any] = {
        name: (ds.metadata.uid, ds.metadata.generation) for name, ds in daemonsets(cluster).items()
    }
    for runtime_class in client.NodeV1Api(cluster.api).list_runtime_class().items:
        found[f"RuntimeClass/{runtime_class.metadata.name}"] = (
            runtime_class.metadata.uid,
            runtime_class.metadata.resource_version,
        )
    for node in client.CoreV1Api(cluster.api).list_node().items:
        labels = node.metadata.labels or {}
        found[f"Node/{node.metadata.name}"] = (
            node.metadata.uid,
            {k: labels[k] for k in operator_labels(labels)},
        )
    return found


def loosen(cluster: Cluster, fields: list[str]) -> None:
    """The ClusterPolicy CRD as an older version had it: no checks on these spec fields (dotted paths
    below spec). The current CRD goes back with install_crds (and the looser_crd fixture)."""
    patch = []
    for dotted in fields:
        path = SPEC_SCHEMA + "".join(f"/{step}/properties" for step in dotted.split(".")[:-1])
        leaf = dotted.split(".")[-1]
        patch.append(
            {"op": "replace", "path": f"{path}/{leaf}", "value": {"x-kubernetes-int-or-string": True}}
        )
    client.ApiextensionsV1Api(cluster.api).patch_custom_resource_definition(CRD_NAME, patch)


def applied(cluster: Cluster, body: dict[str, Any]) -> None:
    try:
        apply_policy(cluster, body)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None


@pytest.fixture
def looser_crd(cluster: Cluster) -> Iterator[None]:
    """Puts the current CRD back after a test that loosened it (the test does so itself too; this is
    the safety net)."""
    try:
        yield
    finally:
        install_crds(cluster, CRD_FILE)


# (spec, policy field, words of the reason): each refused by the CRD at once, and, behind a CRD that
# lets it through, by the operator, which then changes nothing.
BAD = [
    ({"operator": {"runtimeClass": "Not A Valid Name"}}, "spec.operator.runtimeClass", "DNS-1123 label"),
    (
        {"daemonsets": {"podSecurityContext": {"runAsUser": "root"}}},
        "spec.daemonsets.podSecurityContext.runAsUser",
        "integer",
    ),
    (
        {"driver": {"livenessProbe": {"initialDelaySeconds": 4294967301}}},
        "spec.driver.livenessProbe.initialDelaySeconds",
        "less than or equal to 2147483647",
    ),
    ({"hostPaths": {"rootFS": "host/root"}}, "spec.hostPaths.rootFS", "not an absolute path"),
    (
        {"hostPaths": {"driverInstallDir": "/"}},
        "spec.hostPaths.driverInstallDir",
        "the host's root directory",
    ),
]


@pytest.mark.parametrize(("spec", "field", "reason"), BAD, ids=[f for _, f, _ in BAD])
def test_invalid_values_are_refused_and_running_operands_untouched(
    cluster: Cluster,
    clean: OperatorProcess,
    looser_crd: None,
    spec: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    body = policy_from("empty")
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    before = running_operands(cluster)
    # The CRD refuses it at once, naming the field.
    with pytest.raises(RuntimeError, match=re.escape(field)):
        apply_policy(cluster, {**body, "spec": spec})
    # A CRD that let it through (an older version): the operator refuses it and changes nothing.
    loosen(cluster, [field.removeprefix("spec.")])
    # The API server takes the loosened schema into its server-side apply a moment after the update.
    wait_for(lambda: applied(cluster, {**body, "spec": spec}), timeout=30, what="the loosened CRD in effect")
    policy = wait_state(cluster, "cluster-policy", "notReady")
    error = condition(policy, "Error")
    assert error["reason"] == "InvalidSpec" and field in error["message"] and reason in error["message"], (
        error
    )
    assert "operands keep running generation" in error["message"], error
    assert running_operands(cluster) == before, "an invalid policy changed running operands"
    apply_policy(cluster, {**body, "spec": {}})
    wait_state(cluster, "cluster-policy", "ready")
    # The current CRD back. Its update restarts the API server's watches, and a deletion in that gap
    # would go unseen (Kopf relists without reporting what vanished): an edit the operator answers
    # (observedGeneration) shows its watch is back before the test ends and the policy goes.
    install_crds(cluster, CRD_FILE)
    apply_policy(cluster, {**body, "spec": {"psa": {"enabled": False}}})
    wait_state(cluster, "cluster-policy", "ready")
    assert running_operands(cluster) == before


def nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {}
    for _ in range(depth):
        inner = {"a": inner}
    return inner


def deep_status(cluster: Cluster) -> tuple[int, dict[str, Any]]:
    """The deep policy's generation and status, read without decoding its spec (this process's JSON
    decoder would give up too)."""
    generation = cluster.kubectl("get", "clusterpolicy", "deep", "-o", "jsonpath={.metadata.generation}")
    status: dict[str, Any] = json.loads(
        cluster.kubectl("get", "clusterpolicy", "deep", "-o", "jsonpath={.status}") or "{}"
    )
    return int(generation), status


def wait_deep(cluster: Cluster, state: str) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        generation, status = deep_status(cluster)
        assert status.get("state") == state and status.get("observedGeneration") == generation, status
        return status

    return wait_for(check, timeout=CONVERGE, what=f"deep policy {state}")


def test_deep_nesting_does_not_stop_the_operator(
    cluster: Cluster, clean: OperatorProcess, tmp_path: Path
) -> None:
    apply_policy(cluster, policy_from("empty", "first"))
    wait_state(cluster, "first", "ready")
    # 2000 levels in a free-form section (the CRD keeps it): Python's JSON decoder gives up at ~1000.
    deep = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterPolicy", "metadata": {"name": "deep"}}
    text = json.dumps({**deep, "spec": {"kataManager": {"config": {}}}})
    (tmp_path / "deep.json").write_text(
        text.replace('"config": {}', '"config": ' + '{"a": ' * 2000 + "{}" + "}" * 2000)
    )
    cluster.kubectl("create", "-f", str(tmp_path / "deep.json"))
    try:
        wait_deep(cluster, "ignored")  # its status written: the response carried the whole object
        # A restart lists it again, and the operator still serves the active policy.
        clean.kill()
        clean.start()
        body = policy_from("empty", "first")
        body["spec"] = {"dcgmExporter": {"enabled": False}}
        apply_policy(cluster, body)
        wait_for(
            lambda: assert_absent(daemonsets(cluster), "dcgm-exporter"),
            timeout=CONVERGE,
            what="first converges",
        )
        wait_state(cluster, "first", "ready")
        assert clean.running
        # Once it is the active one, it is refused with the path, like any invalid policy.
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, "first")
        error = next(c for c in wait_deep(cluster, "notReady")["conditions"] if c["type"] == "Error")
        assert error["reason"] == "InvalidSpec", error
        assert (
            "spec.kataManager.config.a.a.a" in error["message"]
            and "nested more than 32 levels" in error["message"]
        )
        assert clean.running
    finally:
        cluster.kubectl("delete", "clusterpolicy", "deep", "--ignore-not-found")


def assert_absent(found: dict[str, Any], key: str) -> None:
    assert key not in found, sorted(found)


TEXT = "GPU \U0001f600 ready ✓ ẞ 中文 \u2028 tab\t"
ARG = f"/bin/entrypoint.sh # {TEXT}"
"""The device plugin runs `/bin/sh -c <args>` (NVIDIA's command): its entrypoint, the text a comment."""


def test_any_unicode_reaches_the_daemonset_intact(cluster: Cluster, clean: OperatorProcess) -> None:
    body = policy_from("empty")
    body["spec"] = {
        "devicePlugin": {"env": [{"name": "GREETING", "value": TEXT}], "args": [ARG]},
        "daemonsets": {"annotations": {"example.com/note": TEXT}},
    }
    # Created as JSON, as a client other than kubectl would (control characters other than tab and
    # newlines are refused: tests/unit/test_bad_input.py).
    client.CustomObjectsApi(cluster.api).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    wait_state(cluster, "cluster-policy", "ready")
    plugin = daemonsets(cluster)["device-plugin"]
    container = plugin.spec.template.spec.containers[0]
    assert {e.name: e.value for e in container.env}["GREETING"] == TEXT
    assert container.args == [ARG]
    assert plugin.spec.template.metadata.annotations["example.com/note"] == TEXT
    assert get_policy(cluster, "cluster-policy")["spec"]["devicePlugin"]["env"][0]["value"] == TEXT
