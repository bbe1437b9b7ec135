"""Names the operator writes on cluster objects: its field manager and its standard labels."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

FIELD_MANAGER = "gpu-operator"
"""Server-side apply field manager of every write; also the `managed-by` and `part-of` value."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"


HASH_ANNOTATION = "nvidia.com/gpu-operator.applied-hash"


def content_hash(body: Mapping[str, Any]) -> str:
    """The hash an object's applied-hash annotation carries (plan.in_sync)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]


def owned(obj: dict[str, Any], api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """`obj` controlled by the object named (SetControllerReference: deleting the owner deletes it),
    with its applied-hash annotation; returns `obj`."""
    metadata = obj.setdefault("metadata", {})
    metadata["ownerReferences"] = [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    metadata.setdefault("annotations", {})[HASH_ANNOTATION] = content_hash(obj)
    return obj
