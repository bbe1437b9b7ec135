"""Property test against the real API server: any policy the CRD accepts either renders objects the
API server accepts (a server-side dry run of each) or is reported InvalidSpec, naming a policy field:
by the models, or by the operator's judge of the dry-run answers (gpu_operator/core/vetting.py) — never
half applied, never mistaken for an API failure.

Policies come from the unit tests' strategies: realistic ones (tests/unit/test_render_properties.py)
and anything the CRD's schema admits (tests/unit/test_crd_properties.py); the CRD's own verdict, CEL
rules included, is a dry-run create of the ClusterPolicy. A bounded number of examples: each costs one
request per rendered object.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, reject, settings
from hypothesis import strategies as st

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.core.answers import Failure
from gpu_operator.core.node_labels import cluster_facts
from gpu_operator.core.observed import object_key
from gpu_operator.core.render import render
from gpu_operator.core.vetting import Answers, Context, judge
from gpu_operator.runtime.client import ApiError, path
from gpu_operator.runtime.sync_client import SyncKube

from .kube_helpers import Cluster, client
from .operator_process import ROOT

NS = "gpu-operator"
EXAMPLES = 40


def unit_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "unit" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


POLICIES = st.one_of(
    unit_module("test_render_properties").policies(), unit_module("test_crd_properties").specs()
)


@pytest.fixture(scope="module")
def operand_namespace(cluster: Cluster) -> Iterator[str]:
    core = client.CoreV1Api(cluster.api)
    names = {n.metadata.name for n in core.list_namespace().items}
    if NS not in names:
        core.create_namespace({"metadata": {"name": NS}})
    try:
        yield NS
    finally:
        if NS not in names:
            core.delete_namespace(NS)


def service_monitors_served(cluster: Cluster) -> bool:
    names = {
        c.metadata.name
        for c in client.ApiextensionsV1Api(cluster.api).list_custom_resource_definition().items
    }
    return "servicemonitors.monitoring.coreos.com" in names


def crd_accepts(kube: SyncKube, spec: dict[str, Any]) -> bool:
    body = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "property"},
        "spec": spec,
    }
    try:
        kube.request("POST", path("nvidia.com/v1", "ClusterPolicy"), body=body, query={"dryRun": "All"})
    except RecursionError:
        # Nested deeper than the Python client can serialize (the unit strategies draw 2000 levels):
        # nothing to ask the API server. Decoding such objects and refusing them with their path are
        # unit-tested (test_safe_json, test_crd_properties).
        reject()
    except ApiError as exc:
        if exc.status in (400, 422):
            return False
        raise
    return True


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # Bounded time: no shrinking (each example costs a request per object); the failing one is printed.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(spec=POLICIES)
def test_what_the_crd_accepts_is_accepted_by_the_api_server_or_reported_invalid(
    cluster: Cluster, operand_namespace: str, spec: dict[str, Any]
) -> None:
    kube = cluster.api
    assume(crd_accepts(kube, spec))
    try:
        parsed = parse_spec(spec)
    except PolicyError as exc:  # InvalidSpec with every field's path (tests/unit/test_crd_properties.py)
        assert all(e.path.startswith("spec") for e in exc.errors)
        return
    core = client.CoreV1Api(cluster.api)
    nodes = core.api_client.sanitize_for_serialization(core.list_node().items)
    # As the operator renders: ServiceMonitors only where their CRD is served (not on the local cluster).
    facts = replace(
        cluster_facts(nodes, operand_namespace, {}, parsed.operator.defaultRuntime),
        service_monitor_crd=service_monitors_served(cluster),
    )
    objects = render(parsed, facts)
    answers: dict[tuple[str, str, str, str], Failure | None] = {}
    for obj in objects:
        try:
            kube.apply(obj, dry_run=True)
            answers[object_key(obj)] = None
        except ApiError as exc:
            answers[object_key(obj)] = Failure(exc.status, exc.reason, exc.message, exc.causes)
    if not any(answers.values()):
        return
    context = Context(
        policy="property",
        policy_uid="uid",
        policy_uids=frozenset({"uid"}),
        spec=parsed,
        namespace=operand_namespace,
        cached={},
        config_maps={},
    )
    verdict = judge(context, objects, [], Answers(dry_run=answers))
    refused = {key: str(failure) for key, failure in answers.items() if failure}
    assert verdict.problems.invalid, f"refused {refused}, but not reported InvalidSpec: {verdict.problems}"
    assert not verdict.problems.failures, f"a refusal taken for an API failure: {verdict.problems.failures}"
    for error in verdict.problems.invalid:
        assert error.path.startswith("spec."), error
