"""The ClusterPolicy API: pydantic models, parsing with field-path errors, and the CRD schema."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ClusterPolicySpec",
    "ClusterPolicyStatus",
    "FieldError",
    "PolicyError",
    "parse_document",
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
    """A ClusterPolicy that cannot be used; every problem is listed with its field path."""

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


def parse_spec(spec: Any) -> ClusterPolicySpec:
    """Validate a ClusterPolicy `spec`; raise PolicyError naming every bad field."""
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise PolicyError([FieldError("spec", f"must be a mapping, not {type(spec).__name__}")])
    try:
        return ClusterPolicySpec.model_validate(dict(spec))
    except ValidationError as exc:
        raise PolicyError(errors_from(exc, "spec")) from None


def parse_document(doc: Any) -> ClusterPolicySpec:
    """Validate a whole ClusterPolicy document (apiVersion, kind, metadata.name, spec)."""
    if not isinstance(doc, Mapping):
        what = "empty" if doc is None else f"a {type(doc).__name__}"
        raise PolicyError([FieldError("(document)", f"must be a ClusterPolicy mapping, not {what}")])
    errors = []
    if doc.get("apiVersion") != f"{GROUP}/{VERSION}":
        errors.append(FieldError("apiVersion", f"must be {GROUP}/{VERSION}, not {doc.get('apiVersion')!r}"))
    if doc.get("kind") != KIND:
        errors.append(FieldError("kind", f"must be {KIND}, not {doc.get('kind')!r}"))
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        errors.append(FieldError("metadata.name", "required field is missing"))
    try:
        spec = parse_spec(doc.get("spec"))
    except PolicyError as exc:
        errors.extend(exc.errors)
    if errors:
        raise PolicyError(errors)
    return spec
