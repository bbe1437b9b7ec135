"""Property test: any spec the CRD's schema lets through either parses or is InvalidSpec with a path.

Specs are drawn from the generated CRD itself (types, enums, patterns, bounds, free-form sections with
any content, nested up to thousands of levels), so this covers exactly what the API server stores and
the operator then reads. CEL rules are not applied: the drawn set is a superset of what admission lets
through, which only makes the property stronger. No exception but PolicyError may escape.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import NVIDIA_DRIVER, crd, definition
from gpu_operator.api.nvidiadriver import parse_driver_spec

Schema = dict[str, Any]
SPEC: Schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
DRIVER_SPEC: Schema = definition(NVIDIA_DRIVER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A value nested far deeper than any model allows (lists and mappings alternating)."""
    value: Any = draw(SCALARS)
    for level in range(draw(st.sampled_from([33, 100, 2000]))):
        value = [value] if level % 2 else {"k": value}
    return value


JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
)
FREE = st.dictionaries(TEXT, JSON | deep(), max_size=4)


def strings(node: Schema) -> st.SearchStrategy[str]:
    if "enum" in node:
        return st.sampled_from(node["enum"])
    strategy: st.SearchStrategy[str] = (
        st.from_regex(str(node["pattern"]), fullmatch=True) if "pattern" in node else TEXT
    )
    low, high = node.get("minLength", 0), node.get("maxLength")
    return strategy.filter(lambda s: len(s) >= low and (high is None or len(s) <= high))


def integers(node: Schema) -> st.SearchStrategy[int]:
    return st.integers(node.get("minimum", -(2**63)), node.get("maximum", 2**63 - 1))


def from_schema(node: Schema) -> st.SearchStrategy[Any]:
    """Values the structural schema `node` admits."""
    if node.get("x-kubernetes-int-or-string"):
        return integers(node) | strings(node)
    kind = node.get("type")
    if kind == "object" and "properties" in node:
        properties = {name: from_schema(sub) for name, sub in node["properties"].items()}
        required = {name: properties.pop(name) for name in node.get("required", [])}
        strategy: st.SearchStrategy[Any] = st.fixed_dictionaries(required, optional=properties)
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        strategy = st.dictionaries(TEXT, from_schema(node["additionalProperties"]), max_size=3)
    elif kind == "object" or node.get("x-kubernetes-preserve-unknown-fields"):
        strategy = FREE
    elif kind == "array":
        strategy = st.lists(from_schema(node["items"]), max_size=min(3, node.get("maxItems", 3)))
    elif kind == "string":
        strategy = strings(node)
    elif kind == "integer":
        strategy = integers(node)
    elif kind == "boolean":
        strategy = st.booleans()
    elif kind == "number":
        strategy = st.floats(allow_nan=False, allow_infinity=False)
    else:
        raise AssertionError(f"schema node the test does not know: {node}")
    return st.none() | strategy if node.get("nullable") else strategy


@st.composite
def specs(draw: st.DrawFn, spec: Schema = SPEC) -> dict[str, Any]:
    """A few sections of the spec at a time (drawing all of them at once is slow and says no more)."""
    names = draw(st.sets(st.sampled_from(sorted(spec["properties"])), min_size=1, max_size=4))
    return {name: draw(from_schema(spec["properties"][name])) for name in sorted(names)}


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(specs())
def test_what_the_crd_admits_parses_or_is_invalid_spec_with_a_path(spec: dict[str, Any]) -> None:
    try:
        parse_spec(spec)
    except PolicyError as exc:
        assert exc.errors
        for error in exc.errors:
            assert error.path == "spec" or error.path.startswith("spec."), error
            assert error.message, error


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(specs(DRIVER_SPEC))
def test_what_the_nvidiadriver_crd_admits_parses_or_is_invalid_spec_with_a_path(spec: dict[str, Any]) -> None:
    try:
        parse_driver_spec(spec)
    except PolicyError as exc:
        assert exc.errors
        for error in exc.errors:
            assert error.path == "spec" or error.path.startswith("spec."), error
            assert error.message, error
