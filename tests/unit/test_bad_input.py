"""Bad input that no node can run is refused, with the field and the reason, by the models and, where
a structural schema can say it, by the CRD, so that `kubectl apply` refuses it at once.

The cases are generated: every mutation below applied to every operand section of a known-good policy
(about 170 edits, a fixed set, no randomness), the same kinds of edits a fuzz of `kubectl apply` once
found accepted and rolled out: megabyte images, env values and args, tens of thousands of env entries,
args or pull Secrets, resource amounts no node holds, NUL and lone surrogates in what goes into a
container.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from builders import gpu_node

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import crd
from gpu_operator.core.plan import Observed, PolicyRef, build
from gpu_operator.core.status import status_body

Obj = dict[str, Any]
SPEC_SCHEMA: Obj = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
MiB = 2**20

SECTIONS = (
    "driver",
    "toolkit",
    "devicePlugin",
    "dcgm",
    "dcgmExporter",
    "gfd",
    "migManager",
    "nodeStatusExporter",
    "validator",
)


def good_section(name: str) -> Obj:
    return {
        "enabled": True,
        "repository": "nvcr.io/nvidia",
        "image": name.lower(),
        "version": "v1.0.0",
        "imagePullSecrets": ["registry-key"],
        "env": [{"name": "LOG_LEVEL", "value": "info"}],
        "args": ["--verbose"],
        "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "100m"}},
    }


GOOD: Obj = {name: good_section(name) for name in SECTIONS}


@dataclass(frozen=True)
class Mutation:
    name: str
    edit: Callable[[Obj], None]
    """Changes one section in place."""
    field: str
    """The field the error names, below the section."""
    by_crd: bool = True
    """Whether the CRD's structural schema refuses it too (not: what needs arithmetic on quantities, and
    lone surrogates, which the API server's JSON decoder turns into U+FFFD before any check)."""


def _set(key: str, value: Any) -> Callable[[Obj], None]:
    def edit(section: Obj) -> None:
        section[key] = value

    return edit


def _env_value(value: str) -> Callable[[Obj], None]:
    return _set("env", [{"name": "LOG_LEVEL", "value": "info"}, {"name": "BAD", "value": value}])


def _limit(resource: str, amount: Any) -> Callable[[Obj], None]:
    def edit(section: Obj) -> None:
        section["resources"] = {"limits": {resource: amount}}

    return edit


MUTATIONS = (
    Mutation("image-1MiB", _set("image", "a" * MiB), "image"),
    Mutation("whole-reference-1MiB", _set("image", "nvcr.io/" + "a" * MiB), "image"),
    Mutation("repository-1MiB", _set("repository", "nvcr.io/" + "a" * MiB), "repository"),
    Mutation("version-1MiB", _set("version", "v" * MiB), "version"),
    Mutation("env-value-1MiB", _env_value("x" * MiB), "env[1].value"),
    Mutation("env-name-1MiB", _set("env", [{"name": "A" * MiB, "value": "1"}]), "env[0].name"),
    Mutation("arg-1MiB", _set("args", ["--flag=" + "x" * MiB]), "args[0]"),
    Mutation("env-20000", _set("env", [{"name": f"V{i}", "value": "1"} for i in range(20_000)]), "env"),
    Mutation("args-50000", _set("args", ["-v"] * 50_000), "args"),
    Mutation(
        "pull-secrets-10000",
        _set("imagePullSecrets", [f"key-{i}" for i in range(10_000)]),
        "imagePullSecrets",
    ),
    Mutation("pull-secret-1MiB", _set("imagePullSecrets", ["k" * MiB]), "imagePullSecrets[0]"),
    Mutation("cpu-1e100", _limit("cpu", "1e100"), "resources.limits", by_crd=False),
    Mutation("memory-99999999Ei", _limit("memory", "99999999Ei"), "resources.limits", by_crd=False),
    Mutation("cpu-int-10^30", _limit("cpu", 10**30), "resources.limits", by_crd=False),
    Mutation("quantity-1MiB", _limit("cpu", "1" * MiB), "resources.limits.cpu"),
    Mutation(
        "resources-17-names",
        _set("resources", {"limits": {f"example.com/r{i}": "1" for i in range(17)}}),
        "resources.limits",
    ),
    Mutation("env-value-NUL", _env_value("a\x00b"), "env[1].value"),
    Mutation("arg-escape", _set("args", ["--color=\x1b[31m"]), "args[0]"),
    Mutation("env-value-lone-surrogate", _env_value("a\ud800b"), "env[1].value", by_crd=False),
)

CASES = [(section, mutation) for section in SECTIONS for mutation in MUTATIONS]


def bad_spec(section: str, mutation: Mutation) -> Obj:
    spec = copy.deepcopy(GOOD)
    mutation.edit(spec[section])
    return spec


# --- the CRD's structural schema, as the API server applies it (without CEL) ------------------------


def crd_refusals(node: Obj, value: Any, path: str = "spec") -> list[str]:
    """Where the structural schema `node` refuses `value`: types, lengths, counts, patterns, bounds.
    Unknown fields are not refusals (the API server prunes them)."""
    if value is None:
        return [] if node.get("nullable") else [f"{path}: null"]
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, int) and not isinstance(value, bool):
            return _number(node, value, path)
        return _string(node, value, path) if isinstance(value, str) else [f"{path}: not int or string"]
    kind = node.get("type")
    if kind == "string":
        return _string(node, value, path) if isinstance(value, str) else [f"{path}: not a string"]
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return _number(node, value, path) if ok else [f"{path}: not an integer"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: not a boolean"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        if len(value) > node.get("maxItems", len(value)):
            return [f"{path}: more than maxItems"]
        return [r for i, item in enumerate(value) for r in crd_refusals(node["items"], item, f"{path}[{i}]")]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        if len(value) > node.get("maxProperties", len(value)):
            return [f"{path}: more than maxProperties"]
        if "properties" in node:
            props = node["properties"]
            return [
                r for k, v in value.items() if k in props for r in crd_refusals(props[k], v, f"{path}.{k}")
            ]
        if isinstance(node.get("additionalProperties"), dict):
            extra = node["additionalProperties"]
            return [r for k, v in value.items() for r in crd_refusals(extra, v, f"{path}.{k}")]
    return []


def _string(node: Obj, value: str, path: str) -> list[str]:
    if len(value) > node.get("maxLength", len(value)):
        return [f"{path}: longer than maxLength"]
    if "enum" in node and value not in node["enum"]:
        return [f"{path}: not in enum"]
    if "pattern" in node and not re.search(node["pattern"], value):
        return [f"{path}: does not match pattern"]
    return []


def _number(node: Obj, value: int, path: str) -> list[str]:
    if value < node.get("minimum", value) or value > node.get("maximum", value):
        return [f"{path}: out of bounds"]
    return []


# --- the tests ------------------------------------------------------------------------------------


def test_the_good_policy_is_good() -> None:
    parse_spec(GOOD)
    assert crd_refusals(SPEC_SCHEMA, GOOD) == []
    assert len(CASES) >= 170


@pytest.mark.parametrize(
    ("section", "mutation"), CASES, ids=[f"{section}-{mutation.name}" for section, mutation in CASES]
)
def test_bad_input_is_refused_naming_the_field(section: str, mutation: Mutation) -> None:
    spec = bad_spec(section, mutation)
    with pytest.raises(PolicyError) as info:
        parse_spec(spec)
    field = f"spec.{section}.{mutation.field}"
    paths = {error.path: error.message for error in info.value.errors}
    assert field in paths, paths
    assert all(len(message) < 500 for message in paths.values()), "a message quotes the value whole"
    refusals = crd_refusals(SPEC_SCHEMA, spec)
    if mutation.by_crd:
        assert any(r.startswith(field) for r in refusals), refusals
    else:
        assert refusals == []


NOW = "2026-11-29T12:00:00Z"


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_bad_input_changes_nothing_running(mutation: Mutation) -> None:
    """The operator's side: InvalidSpec naming the field, and nothing written or deleted."""
    bad = PolicyRef("cluster-policy", "uid-cluster-policy", 2, NOW, bad_spec("driver", mutation), {})
    node = gpu_node()
    facts = Observed(
        policies=(bad,),
        nodes={node.name: node},
        pods=(),
        daemonsets={},
        objects={},
        namespace="gpu-operator",
        config_maps={},
        service_monitor_crd=False,
    )
    plan = build(facts, NOW)
    assert plan.objects == [] and plan.deletes == [] and plan.node_labels == {}
    status = status_body(plan.statuses["cluster-policy"])
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert error["reason"] == "InvalidSpec"
    assert f"spec.driver.{mutation.field}" in error["message"]
    assert len(error["message"]) < 2000
