"""`psa.enabled`: the Pod Security Admission labels of the operand namespace (pure, no I/O).

NVIDIA sets `pod-security.kubernetes.io/{enforce,audit,warn}=privileged` on the operator namespace
when `psa.enabled` (gpu-operator v26.7.0 controllers/state_manager.go:613-661, modes at l.95),
overwriting any other level, and never takes them back. Here the labels are owned by server-side
apply under the operator's field manager, and a level that was there before is remembered in an
annotation on the namespace, so that turning `psa` off, or deleting the policy, removes what the
operator added and puts back what it replaced.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.core.ownership import FIELD_MANAGER

PSA_LABELS = tuple(f"pod-security.kubernetes.io/{mode}" for mode in ("enforce", "audit", "warn"))
PRIVILEGED = "privileged"
PREVIOUS_ANNOTATION = "nvidia.com/gpu-operator.psa-previous"
"""JSON {label: value} of the levels the operator replaced with `privileged`."""
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
"""The namespace label without which the API server refuses admin-access device requests."""


@dataclass(frozen=True)
class NamespaceInfo:
    """The operand namespace as the watch last saw it: just its pod-security labels and our marks."""

    name: str
    labels: Mapping[str, str]
    """Its `pod-security.kubernetes.io/*` labels."""
    previous: Mapping[str, str]
    """What PREVIOUS_ANNOTATION remembers (empty without it)."""
    own: frozenset[str]
    """Label and annotation keys the operator's server-side apply owns."""
    resource_version: str = field(default="", compare=False)
    uid: str = ""
    """Writes carry it, so that none can create the namespace if it was deleted meanwhile."""
    admin_access: bool = False
    """It carries `resource.kubernetes.io/admin-access=true` (the DRA stack's admin-access claims need it:
    core/gpucluster_plan.py)."""


def namespace_info(body: Mapping[str, Any]) -> NamespaceInfo:
    metadata = body.get("metadata") or {}
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k in PSA_LABELS}
    try:
        previous = json.loads((metadata.get("annotations") or {}).get(PREVIOUS_ANNOTATION) or "{}")
    except ValueError:
        previous = {}
    if not isinstance(previous, dict):
        previous = {}
    return NamespaceInfo(
        name=metadata["name"],
        labels=labels,
        previous={k: str(v) for k, v in previous.items() if k in PSA_LABELS},
        own=_owned(metadata.get("managedFields") or ()),
        resource_version=str(metadata.get("resourceVersion") or ""),
        uid=str(metadata.get("uid") or ""),
        admin_access=(metadata.get("labels") or {}).get(ADMIN_ACCESS_LABEL) == "true",
    )


def _owned(managed_fields: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    keys: set[str] = set()
    for entry in managed_fields:
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            metadata = (entry.get("fieldsV1") or {}).get("f:metadata", {})
            for section in ("f:labels", "f:annotations"):
                keys.update(k.removeprefix("f:") for k in metadata.get(section, {}) if k.startswith("f:"))
    return frozenset(keys)


@dataclass(frozen=True)
class NamespaceWrite:
    """What to write to the namespace: first `restore` (labels put back to their earlier level, each
    only if it is still `privileged`), then own exactly `labels` and `annotations` (server-side apply:
    what the operator owned and leaves out is removed)."""

    restore: dict[str, str]
    labels: dict[str, str]
    annotations: dict[str, str]

    def restores(self) -> dict[str, tuple[str, str]]:
        """`restore` as label rewrites (the value each must still have, the value put back)."""
        return {key: (PRIVILEGED, value) for key, value in self.restore.items()}


def namespace_write(namespace: NamespaceInfo | None, enabled: bool) -> NamespaceWrite | None:
    """The write that brings the namespace to `enabled` (None: nothing to change, or no namespace)."""
    if namespace is None:
        return None
    if not enabled:
        if not namespace.own:
            return None
        restore = {
            key: value
            for key, value in namespace.previous.items()
            if key in namespace.own and namespace.labels.get(key) == PRIVILEGED
        }
        return NamespaceWrite(restore, {}, {})
    previous = {key: value for key, value in namespace.previous.items() if key in namespace.own}
    for key in PSA_LABELS:
        value = namespace.labels.get(key)
        if key not in namespace.own and value not in (None, PRIVILEGED):
            previous[key] = value  # someone else's level, replaced now: remember it
    labels = dict.fromkeys(PSA_LABELS, PRIVILEGED)
    annotations = {PREVIOUS_ANNOTATION: json.dumps(previous, sort_keys=True)} if previous else {}
    owned_now = {key: namespace.labels.get(key) for key in PSA_LABELS if key in namespace.own}
    if (
        owned_now == labels
        and dict(namespace.previous) == previous
        and (PREVIOUS_ANNOTATION in namespace.own) == bool(previous)
    ):
        return None
    return NamespaceWrite({}, labels, annotations)
