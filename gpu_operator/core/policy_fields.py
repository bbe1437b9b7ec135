"""Which ClusterPolicy field an API server's complaint is about (pure, no I/O).

The API server names the field of the object it refused (`spec.template.spec.containers[0].env[2]
.value` of a DaemonSet); the user wrote `spec.devicePlugin.env[0].value`. Instead of a table that
mirrors every template, the value is followed back: the value the rendered object holds at the
server's path is looked for in the policy (with its defaults, so `daemonsets.priorityClassName` is
found even when the policy does not set it). A value the renderer computed (an image reference, a
path under `kubeletRootDir`) matches nothing; then its parents are tried, and in the end the
component's own section is named. Several fields with the same value: the one whose name ends the
server's path wins, then one of the component's section, then the shortest.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec

Path = tuple[str | int, ...]

SHARED_SECTIONS = frozenset({"daemonsets", "hostPaths", "operator", "cdi", "validator"})
"""Sections whose values every component's objects carry (pod settings, host paths, the runtime class)."""

_TOKEN = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


def parse_path(text: str) -> Path:
    """`spec.containers[0].env[1].value` (or with a leading dot, or `labels[key]`) as its steps."""
    steps: list[str | int] = []
    for name, index in _TOKEN.findall(text.strip()):
        if name:
            steps.append(name)
        else:
            steps.append(int(index) if index.isdigit() else index)
    return tuple(steps)


def format_path(path: Path) -> str:
    text = "spec"
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text


def spec_values(spec: ClusterPolicySpec) -> dict[str, Any]:
    """The policy as JSON, defaults included (what the renderer saw)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # dcgmExporter.serviceMonitoring
        return spec.model_dump(mode="json", exclude_none=True)


def _at(obj: Any, path: Path) -> tuple[bool, Any]:
    for step in path:
        in_list = isinstance(step, int) and isinstance(obj, list) and 0 <= step < len(obj)
        if in_list or (isinstance(step, str) and isinstance(obj, Mapping) and step in obj):
            obj = obj[step]
        else:
            return False, None
    return True, obj


def _nodes(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every value of a JSON document with its path, iteratively (a policy is at most 32 levels deep)."""
    stack: list[tuple[Path, Any]] = [(path, value)]
    while stack:
        here, item = stack.pop()
        yield here, item
        if isinstance(item, Mapping):
            stack.extend(((*here, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(((*here, i), v) for i, v in enumerate(item))


def _same(a: Any, b: Any) -> bool:
    # json.dumps: True is not 1, and mappings compare whatever their key order.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _telling(value: Any) -> bool:
    """Values worth following back: not empty, not a bare boolean (every switch would match)."""
    return value not in (None, "", {}, []) and not isinstance(value, bool)


def _subset(small: Any, big: Any) -> bool:
    """A policy value merged into a larger one: user labels among the object's, user env among the
    container's."""
    if isinstance(small, Mapping) and isinstance(big, Mapping) and small:
        return all(k in big and _same(v, big[k]) for k, v in small.items())
    if isinstance(small, list) and isinstance(big, list) and small:
        return all(any(_same(item, other) for other in big) for item in small)
    return False


def policy_field(values: Mapping[str, Any], obj: Mapping[str, Any], server_path: str, section: str) -> str:
    """The policy field (`spec.devicePlugin.env[0].value`) behind the field `server_path` of the
    rendered `obj`; `values` is spec_values(policy), `section` the component's (the fallback)."""
    path = parse_path(server_path)
    while path:
        found, value = _at(obj, path)
        if found and _telling(value):
            best = _best(values, value, path, section)
            if best is not None:
                return format_path(best)
        path = path[:-1]
    return format_path((section,)) if section else "spec"


def _best(values: Mapping[str, Any], value: Any, server_path: Path, section: str) -> Path | None:
    last = server_path[-1]
    ranked: list[tuple[tuple[int, int, int, int], Path]] = []
    for here, item in _nodes(values):
        if not here:
            continue
        exact = _same(item, value)
        if not exact and not _subset(item, value):
            continue
        name_matches = isinstance(last, str) and here[-1] == last
        where = 0 if here[0] == section else (1 if here[0] in SHARED_SECTIONS else 2)
        ranked.append(((0 if exact else 1, 0 if name_matches else 1, where, len(here)), here))
    return min(ranked, key=lambda r: r[0])[1] if ranked else None


StringFields = Mapping[str, Sequence[Path]]
"""Each string value of a policy → the paths of the fields that hold it."""


def string_fields(values: Mapping[str, Any]) -> dict[str, list[Path]]:
    """Every string of the policy with the fields that hold it, in one walk: looking up the fields that
    name each of n references then costs what those fields are, not n walks of the whole policy (10 000
    image pull Secrets once took minutes of CPU)."""
    found: dict[str, list[Path]] = {}
    for here, item in _nodes(values):
        if here and isinstance(item, str):
            found.setdefault(item, []).append(here)
    return found


def fields_named(fields: StringFields, name: str, hints: Sequence[str], section: str) -> str:
    """The policy field that holds `name` (a ConfigMap, Secret or PriorityClass the objects refer
    to): a field whose path mentions one of `hints` first, then the component's section. `fields` is
    string_fields(spec_values(policy))."""
    ranked: list[tuple[tuple[int, int, int], Path]] = []
    for here in fields.get(name, ()):
        text = format_path(here).lower()
        hinted = any(h.lower() in text for h in hints)
        where = 0 if here[0] == section else (1 if here[0] in SHARED_SECTIONS else 2)
        ranked.append(((0 if hinted else 1, where, len(here)), here))
    return (
        format_path(min(ranked, key=lambda r: r[0])[1])
        if ranked
        else (format_path((section,)) if section else "spec")
    )
