"""Text the API server and users read: JSON that is also safe YAML (`tojson`, for every user value a
template inserts and for apply bodies), and the YAML that `gpu-operator render` prints."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from pydantic import BaseModel

# json.dumps(ensure_ascii=False) leaves characters that YAML reads differently inside a double-quoted
# scalar: C1 controls and DEL are not printable for YAML, NEL/LS/PS are line breaks (and get folded),
# and `ensure_ascii=True` would not help because PyYAML does not join `\ud83d\ude00` surrogate pairs.
# So: keep printable characters raw, escape the rest as \uXXXX (all of them are in the BMP).
_NOT_YAML_SAFE = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def _model_default(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def tojson(value: Any) -> str:
    """A JSON text (one line) that YAML parses back to exactly `value`; pydantic models are dumped."""
    text = json.dumps(value, ensure_ascii=False, default=_model_default)
    return _NOT_YAML_SAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class _Dumper(yaml.SafeDumper):
    """Block style with sequences indented under their key; short lists of plain values (commands,
    RBAC verbs) on one line; multi-line strings (scripts, config files) as literal blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


# With allow_unicode, PyYAML writes these raw in plain, single-quoted and block scalars, where a
# reader takes them for line breaks; only a double-quoted scalar escapes them.
_UNICODE_BREAKS = frozenset("\x85\u2028\u2029\ufeff")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style: str | None = None
    if not _UNICODE_BREAKS.isdisjoint(value):
        style = '"'
    elif "\n" in value:
        style = "|"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
    short = (
        bool(value)
        and all(isinstance(item, str | int | float | bool) and "\n" not in str(item) for item in value)
        and sum(len(str(item)) + 4 for item in value) <= _FLOW_WIDTH
    )
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=short)


_FLOW_WIDTH = 72
_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(list, _represent_list)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, each document starting with `---`, keys in rendered order."""
    return yaml.dump_all(
        objects,
        Dumper=_Dumper,
        explicit_start=True,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=10_000,
    )
