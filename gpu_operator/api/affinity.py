"""Node affinity (core/v1 NodeAffinity), typed as the API server types and checks it.

A wrong shape here would otherwise surface only when a DaemonSet carrying it is applied (the server
refuses the pod template) or, for a `Gt` value that is not a number, never: the scheduler would leave
the pods Pending. The rules are apimachinery's core validation (ValidateNodeSelector,
ValidateNodeSelectorRequirement, ValidateNodeFieldSelectorRequirement, ValidatePreferredSchedulingTerms),
checked when the object is parsed, so the error names the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpu_operator.api.common import LIST_MAX, LabelKey, Model, ShortText
from gpu_operator.api.quoting import quoted

_INTEGER = re.compile(r"^-?[0-9]{1,18}$", re.ASCII)

Values = Annotated[list[ShortText], Field(max_length=LIST_MAX)]


class NodeSelectorRequirement(Model):
    """A requirement on one node label: its key, an operator and values."""

    key: LabelKey
    """The label key the requirement applies to."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In, NotIn, Exists, DoesNotExist, Gt or Lt."""
    values: Values | None = None
    """Values: at least one for In and NotIn, none for Exists and DoesNotExist, exactly one integer for
    Gt and Lt."""

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> NodeSelectorRequirement:
        values = self.values or []
        if self.operator in ("In", "NotIn") and not values:
            raise ValueError(f"values must be given when operator is {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"values must be empty when operator is {self.operator}")
        if self.operator in ("Gt", "Lt"):
            if len(values) != 1:
                raise ValueError(f"values must be exactly one integer when operator is {self.operator}")
            if not _INTEGER.fullmatch(values[0]):
                raise ValueError(f"{quoted(values[0])} is not an integer (operator {self.operator})")
        return self


class NodeFieldSelectorRequirement(Model):
    """A requirement on a node field; the API server allows metadata.name only."""

    key: Literal["metadata.name"]
    """The field: metadata.name."""
    operator: Literal["In", "NotIn"]
    """In or NotIn."""
    values: Annotated[list[ShortText], Field(min_length=1, max_length=1)]
    """Exactly one node name."""


class NodeSelectorTerm(Model):
    """Requirements that must all hold; an empty term matches no node."""

    matchExpressions: Annotated[list[NodeSelectorRequirement], Field(max_length=LIST_MAX)] | None = None
    """Requirements on node labels."""
    matchFields: Annotated[list[NodeFieldSelectorRequirement], Field(max_length=LIST_MAX)] | None = None
    """Requirements on node fields."""


class NodeSelector(Model):
    """Terms of which at least one must hold."""

    nodeSelectorTerms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=LIST_MAX)]
    """The terms (at least one), ORed."""


class PreferredSchedulingTerm(Model):
    """A weighted preference for nodes that match a term."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight from 1 to 100, added to a node's score when it matches."""
    preference: NodeSelectorTerm
    """The term a node should match."""


class NodeAffinity(Model):
    """Node affinity of the pods: required and preferred node selector terms."""

    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None
    """Nodes the pods may be scheduled on."""
    preferredDuringSchedulingIgnoredDuringExecution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=LIST_MAX)] | None
    ) = None
    """Nodes the scheduler prefers, by weight."""
