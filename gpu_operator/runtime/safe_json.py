"""JSON decoding that no API response can crash, however deeply its content nests.

The API server stores custom resources nested up to 10000 levels deep where the CRD lets a field keep
unknown content (an older CRD, another version). Python's C decoder gives up with RecursionError at
about 1000 levels; raised inside a LIST or watch stream, that would stop the watch, and again at
every restart. `loads` takes orjson (faster than the standard C decoder on API objects: every watch
event is decoded, tens of thousands of them in a large rollout) and, for what orjson refuses (deeper than
1024 levels, a lone surrogate escape the API server may store), the standard decoder; only when that
runs out of recursion does it parse again with a small iterative parser that keeps at most MAX_DEPTH
levels (deeper content becomes None). The policy models refuse anything that deep (api.MAX_DEPTH)
with the field's path, so a truncated policy is reported as InvalidSpec and never acted on.

Every watched kind, ClusterPolicies included, is listed and watched by the operator's informers
(gpu_operator/runtime/informer.py): listings decode with `loads`, watch events with `loads_event`. No
other decoder of a library sees a watched object, so none needs to be replaced.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import orjson

MAX_DEPTH = 100
"""Levels kept by the iterative parser: more than any model accepts, so truncation is always reported."""

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


def loads(text: str | bytes | bytearray) -> Any:
    """json.loads, except that nesting depth never raises RecursionError."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except RecursionError:
        return parse_iteratively(text.decode() if isinstance(text, bytes | bytearray) else text)


_POD_EVENT = re.compile(rb'\{"type":"[A-Z]+","object":\{"kind":"Pod",')
_MANAGED_FIELDS = b',"managedFields":['
_METADATA_END = b']},"spec":{'
_RESTART_POLICY = b'"restartPolicy":'
_DRIVER = b'"app.kubernetes.io/component":"nvidia-driver"'


def loads_event(line: bytes) -> Any:
    """One watch event, as `loads` decodes it, except for what nothing reads of a pod, cut out of the
    text first (pod events are most of what the watches bring: every operand pod on every node, a few
    events each while it starts):

    - `metadata.managedFields` (a large part of an operand pod's JSON): only the field managers of nodes
      and of the operator's own objects are read. The API server writes ObjectMeta's fields in their Go
      order, managedFields last, and then the pod's spec; inside managedFields every key is prefixed
      (`f:spec`) and every quote in a string is escaped, so the first `]},"spec":{` after it ends it.
    - the spec's volumes and containers (about half of what is left, so decoding takes well under half
      the time; measured: bench/README.md), except in driver pods, whose containers'
      DRIVER_CONFIG_DIGEST an upgrade reads
      (gpu_operator/core/upgrade/facts.py). PodSpec's fields come in Go order too: `volumes`,
      `initContainers`, `containers`, `ephemeralContainers`, then `restartPolicy` (the API server always
      sets it), and what the operator reads of the spec (`nodeName`, `affinity`) comes after. A quote
      in a string is escaped, so the first `"restartPolicy":` after the spec's start is a key; if it is
      not the spec's own (a sidecar's, a resize policy's), the cut leaves more brackets closed than
      opened, which never decodes, and the pod is decoded without it.

    Any other layout (another kind, a text that would not decode) is decoded whole."""
    if _POD_EVENT.match(line):
        start = line.find(_MANAGED_FIELDS)
        end = line.find(_METADATA_END, start) if start != -1 else -1
        if end != -1:
            spec = end + len(_METADATA_END)
            policy = line.find(_RESTART_POLICY, spec)
            text = memoryview(line)
            if policy != -1 and line.find(_DRIVER, 0, start) == -1:
                with contextlib.suppress(orjson.JSONDecodeError):
                    return orjson.loads(b"".join((text[:start], text[end + 1 : spec], text[policy:])))
            with contextlib.suppress(ValueError):
                return loads(b"".join((text[:start], text[end + 1 :])))
    return loads(line)


def parse_iteratively(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a JSON document with an explicit stack; containers deeper than `max_depth` become None."""
    # Each open container: (the value, or None while it is too deep to keep; the key awaiting a value).
    stack: list[tuple[dict[str, Any] | list[Any] | None, str | None]] = []
    root: Any = None
    pos = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]
    while True:
        if pos >= len(text):
            raise json.JSONDecodeError("Expecting value", text, pos)
        char = text[pos]
        if char in "{[":
            kept = len(stack) < max_depth and (not stack or stack[-1][0] is not None)
            container: dict[str, Any] | list[Any] | None = ({} if char == "{" else []) if kept else None
            stack.append((container, None))
            pos = _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
            if text.startswith("}" if char == "{" else "]", pos):
                value: Any = stack.pop()[0]
                pos += 1
            elif char == "{":
                pos = _key(text, pos, stack)
                continue
            else:
                continue
        elif char == '"':
            value, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
        elif match := _NUMBER.match(text, pos):
            number = match.group()
            value = float(number) if match.group(1) or match.group(2) else int(number)
            pos = match.end()
        else:
            word = next((w for w in _LITERALS if text.startswith(w, pos)), None)
            if word is None:
                raise json.JSONDecodeError("Expecting value", text, pos)
            value, pos = _LITERALS[word], pos + len(word)
        # A complete value: store it, then close every container that ends here.
        while True:
            if not stack:
                root = value
                pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
                if pos != len(text):
                    raise json.JSONDecodeError("Extra data", text, pos)
                return root
            container, key = stack[-1]
            if isinstance(container, dict):
                container[key] = value  # type: ignore[index]
            elif isinstance(container, list):
                container.append(value)
            pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
            closing = "}" if key is not None else "]"
            if text.startswith(",", pos):
                pos = _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
                if key is not None:
                    pos = _key(text, pos, stack)
                break
            if not text.startswith(closing, pos):
                raise json.JSONDecodeError(f"Expecting ',' or {closing!r}", text, pos)
            value = stack.pop()[0]
            pos += 1


def truncated(value: Any, max_depth: int = MAX_DEPTH) -> Any:
    """A copy of `value` whose mappings and lists below `max_depth` levels are None (no recursion)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, list[Any] | dict[Any, Any], Any, int]] = [(value, root, 0, 0)]
    while stack:
        item, parent, slot, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                item_copy: Any = None
            else:
                item_copy = dict.fromkeys(item) if isinstance(item, dict) else [None] * len(item)
                pairs = item.items() if isinstance(item, dict) else enumerate(item)
                stack.extend((child, item_copy, key, depth + 1) for key, child in pairs)
        else:
            item_copy = item
        parent[slot] = item_copy
    return root[0]


def _key(text: str, pos: int, stack: list[tuple[Any, str | None]]) -> int:
    """Read `"key":` for the object on top of the stack; return the position of its value."""
    if not text.startswith('"', pos):
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
    key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
    pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
    if not text.startswith(":", pos):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
    stack[-1] = (stack[-1][0], key)
    return _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
