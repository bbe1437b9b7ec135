"""Names the operator writes on cluster objects: its field manager and its standard labels."""

from __future__ import annotations

FIELD_MANAGER = "gpu-operator"
"""Server-side apply field manager of every write; also the `managed-by` and `part-of` value."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
