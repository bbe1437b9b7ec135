"""The ClusterPolicy API: pydantic models, parsing with field-path errors, and the CRD schema. The
NVIDIADriver API (gpu_operator/api/nvidiadriver.py) parses with the same helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpu_operator.api.quoting import quoted
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"

_M = TypeVar("_M", bound=BaseModel)
T = TypeVar("T")

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ClusterPolicySpec",
    "ClusterPolicyStatus",
    "FieldError",
    "PolicyError",
    "identity_errors",
    "parse_document",
    "parse_model",
    "parse_spec",
]


@dataclass(frozen=True)
class FieldError:
    """One problem with a policy: where (a dotted field path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyError(ValueError):
    """A ClusterPolicy (or NVIDIADriver) that cannot be used; every problem is listed with its field
    path."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    # pydantic prefixes messages of custom validators with "Value error, "; the path already says where.
    return message.removeprefix("Value error, ")


def errors_from(exc: ValidationError, prefix: str) -> list[FieldError]:
    """Turn pydantic's errors into one line per field, deduplicating union branches."""
    seen: dict[str, FieldError] = {}
    for error in exc.errors():
        # Union members add their type name to the location (e.g. `int`, `str`); drop those steps.
        loc = tuple(p for p in error["loc"] if not _is_union_tag(p))
        path = _path(prefix, loc)
        seen.setdefault(path, FieldError(path, _message(error)))
    return list(seen.values())


def _is_union_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part in {"int", "str", "bool"} or "[" in part or "(" in part)


MAX_DEPTH = 32
"""How deeply a spec may nest: far deeper than any typed field (five levels), so only free-form
content can hit it. Checked without recursion before anything else walks the spec, so no content can
exhaust a recursion limit downstream."""


def too_deep(value: Any, prefix: str = "spec", limit: int = MAX_DEPTH) -> str | None:
    """The path of the first mapping or list nested more than `limit` levels deep, else None."""
    stack: list[tuple[Any, str, int]] = [(value, prefix, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[tuple[str, Any]] = ((f"{path}.{k}", v) for k, v in item.items())
        elif isinstance(item, list):
            children = ((f"{path}[{i}]", v) for i, v in enumerate(item))
        else:
            continue
        if depth >= limit:
            return path
        stack.extend((child, child_path, depth + 1) for child_path, child in children)
    return None


def parse_model(model: type[_M], spec: Any, prefix: str = "spec") -> _M:
    """Validate `spec` as `model` (a CR's spec); raise PolicyError naming every bad field. An absent
    spec is an empty one: every CR here has a default for each of its fields."""
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise PolicyError([FieldError(prefix, f"must be a mapping, not {type(spec).__name__}")])
    deep = too_deep(spec, prefix)
    if deep is not None:
        raise PolicyError([FieldError(deep, f"nested more than {MAX_DEPTH} levels deep")])
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        raise PolicyError(errors_from(exc, prefix)) from None


def parse_spec(spec: Any) -> ClusterPolicySpec:
    """Validate a ClusterPolicy `spec`; raise PolicyError naming every bad field."""
    return parse_model(ClusterPolicySpec, spec)


def identity_errors(doc: Mapping[str, Any], api_version: str, kind: str) -> list[FieldError]:
    """What is wrong with a document's apiVersion, kind and metadata.name for this kind of object."""
    errors = []
    if doc.get("apiVersion") != api_version:
        errors.append(FieldError("apiVersion", f"must be {api_version}, not {quoted(doc.get('apiVersion'))}"))
    if doc.get("kind") != kind:
        errors.append(FieldError("kind", f"must be {kind}, not {quoted(doc.get('kind'))}"))
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        errors.append(FieldError("metadata.name", "required field is missing"))
    return errors


def parse_whole(doc: Any, api_version: str, kind: str, parse: Callable[[Any], T], article: str = "a") -> T:
    """Validate a whole document of `kind` (apiVersion, kind, metadata.name, and its spec with
    `parse`): every problem at once, as one PolicyError."""
    if not isinstance(doc, Mapping):
        what = "empty" if doc is None else f"a {type(doc).__name__}"
        raise PolicyError([FieldError("(document)", f"must be {article} {kind} mapping, not {what}")])
    errors = identity_errors(doc, api_version, kind)
    try:
        spec = parse(doc.get("spec"))
    except PolicyError as exc:
        errors.extend(exc.errors)
    if errors:
        raise PolicyError(errors)
    return spec


def parse_document(doc: Any) -> ClusterPolicySpec:
    """Validate a whole ClusterPolicy document (apiVersion, kind, metadata.name, spec)."""
    return parse_whole(doc, f"{GROUP}/{VERSION}", KIND, parse_spec)
