"""Kubernetes label selectors in their string form (`app=train,tier!=db,env in (a,b),!legacy`).

The same grammar as apimachinery's `labels.Parse`, which NVIDIA's upgrade library hands its
`podSelector` strings to: comma-separated requirements `k`, `!k`, `k=v`, `k==v`, `k!=v`,
`k in (v1,v2)`, `k notin (v1,v2)`, `k>n`, `k<n`; the empty string selects everything. Parsing
happens when the policy is validated, so a typo is an error naming the field, not an upgrade that
silently waits for nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpu_operator.api.common import _LABEL_NAME
from gpu_operator.api.quoting import quoted

Operator = Literal["exists", "!", "=", "!=", "in", "notin", ">", "<"]

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_KEY = r"(?P<key>[^\s!=<>(),]+)"
_FORMS: tuple[tuple[re.Pattern[str], Operator | None], ...] = (
    (re.compile(rf"^!\s*{_KEY}$"), "!"),
    (re.compile(rf"^{_KEY}$"), "exists"),
    (re.compile(rf"^{_KEY}\s*(?P<op>==|=|!=)\s*(?P<values>[^\s,()]*)$"), None),
    (re.compile(rf"^{_KEY}\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$"), None),
    (re.compile(rf"^{_KEY}\s*(?P<op>[<>])\s*(?P<values>-?[0-9]+)$"), None),
)


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "exists":
            return value is not None
        if self.operator == "!":
            return value is None
        if self.operator in ("=", "in"):
            return value is not None and value in self.values
        if self.operator in ("!=", "notin"):
            return value is None or value not in self.values
        # `>` and `<` compare integers; a missing or non-integer label never matches (as apimachinery).
        if value is None or not re.fullmatch(r"-?[0-9]+", value):
            return False
        (bound,) = self.values
        return int(value) > int(bound) if self.operator == ">" else int(value) < int(bound)


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _split(text: str) -> list[str]:
    """Top-level comma split: commas inside `( )` belong to a value set."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in label selector {quoted(text)}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"unbalanced '(' in label selector {quoted(text)}")
    return [*parts, current]


def _requirement(part: str, text: str) -> Requirement:
    part = part.strip()
    for pattern, fixed in _FORMS:
        found = pattern.fullmatch(part)
        if found is None:
            continue
        key = found["key"]
        if len(key) > 316 or not _LABEL_NAME.fullmatch(key):
            raise ValueError(f"{quoted(key)} in label selector {quoted(text)} is not a valid label key")
        operator: Operator = fixed or found["op"].replace("==", "=")  # type: ignore[assignment]
        raw = found.groupdict().get("values")
        values = [v.strip() for v in raw.split(",")] if raw is not None else []
        if operator in ("in", "notin") and values == [""]:
            raise ValueError(f"{quoted(part)} in label selector {quoted(text)} needs at least one value")
        for value in values if operator not in (">", "<") else ():
            if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
                raise ValueError(
                    f"{quoted(value)} in label selector {quoted(text)} is not a valid label value"
                )
        return Requirement(key, operator, frozenset(values))
    raise ValueError(
        f"{quoted(part)} in label selector {quoted(text)} is not a requirement such as 'key=value', "
        "'key!=value', 'key in (a,b)', 'key notin (a,b)', 'key' or '!key'"
    )


def parse_selector(text: str) -> Selector:
    """Parse a selector; ValueError with the offending part otherwise. The empty string selects all."""
    if not text.strip():
        return Selector()
    return Selector(tuple(_requirement(part, text) for part in _split(text)))


def valid_selector(text: str) -> str:
    """A pydantic validator: the selector must parse (the string itself is kept as written)."""
    parse_selector(text)
    return text
