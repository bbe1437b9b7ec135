"""The chart's admission policy pins the operand RBAC to what hack/operand_rbac.py rendered for NVIDIA's
GPUCluster sample: every other GPUCluster must render the same roles, bindings, DeviceClasses and
admission policy names (a role that differs would be refused as `forbidden`)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.core.gpucluster_render import render_gpucluster
from gpu_operator.core.render import ClusterFacts
from hack import operand_rbac

PINNED = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", *operand_rbac.DRA_KINDS)


def pinned(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    return {
        (o["kind"], o["metadata"]["name"]): (o.get("rules"), o.get("roleRef"), o.get("subjects"))
        for o in objects
        if o["kind"] in PINNED
    }


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"nodeSelector": {"pool": "dra"}},
        {"dcgm": {"enabled": True}},
        {"dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": True}}},
        {"draDriver": {"computeDomains": {"enabled": True}}},
        {"draDriver": {"featureGates": {"PassthroughSupport": True, "MPSSupport": True}}},
    ],
)
def test_every_gpucluster_renders_the_pinned_rbac(spec: dict[str, Any]) -> None:
    facts = ClusterFacts(namespace=operand_rbac.NAMESPACE, service_monitor_crd=True)
    allowed = pinned(operand_rbac.gpucluster_objects(facts))
    found = pinned(render_gpucluster(parse_gpucluster_spec(spec), facts))
    assert {key: value for key, value in found.items() if allowed.get(key) != value} == {}
