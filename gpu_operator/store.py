"""What the watches last saw, in slim form: written by the watch handlers (on Kopf's event loop) and by
the reconciler's writers (the objects their applies returned), read by a pass as one snapshot.

Every read and write takes the lock: the watch handlers and the writer threads run at the same time.
The `record_*` methods turn a watched body into its slim record and say whether a pass must follow.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator import safe_json
from gpu_operator.api import MAX_DEPTH, too_deep
from gpu_operator.labels import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.nodes import NodeInfo, node_info
from gpu_operator.observed import (
    DaemonSetInfo,
    ObjectInfo,
    ObjectKey,
    PodInfo,
    PolicyRef,
    config_map_keys,
    daemonset_info,
    object_info,
    object_key,
    pod_info,
)
from gpu_operator.plan import SERVICE_MONITOR_CRD, Observed
from gpu_operator.psa import NamespaceInfo, namespace_info

Body = Mapping[str, Any]


def policy_ref(body: Body) -> PolicyRef:
    spec = dict(body.get("spec") or {})
    if too_deep(spec) is not None:
        # Keep just enough for the planner to name the path (InvalidSpec); comparing or copying the
        # whole would recurse as deep as the content goes.
        spec = safe_json.truncated(spec, MAX_DEPTH + 1)
    return PolicyRef(
        name=body["metadata"]["name"],
        uid=body["metadata"]["uid"],
        generation=int(body["metadata"].get("generation") or 0),
        created=body["metadata"].get("creationTimestamp") or "",
        spec=spec,
        status=dict(body.get("status") or {}),
    )


@dataclass
class Store:
    """The tables; read them only through `get`, `size` and `snapshot` (they hold the lock)."""

    policies: dict[str, PolicyRef] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    daemonsets: dict[str, DaemonSetInfo] = field(default_factory=dict)
    objects: dict[ObjectKey, ObjectInfo] = field(default_factory=dict)
    config_maps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every ConfigMap of the operand namespace → its keys (users' ones feed the driver's mounts)."""
    crds: dict[str, bool] = field(default_factory=dict)
    """CRD name → established (only the CRDs the operator watches)."""
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _swap(self, table: str, key: Any, value: Any) -> Any:
        """Set or (value None) remove an entry; the entry it replaced (None if there was none)."""
        with self.lock:
            entries: dict[Any, Any] = getattr(self, table)
            if value is None:
                return entries.pop(key, None)
            before = entries.get(key)
            entries[key] = value
            return before

    def put(self, table: str, key: Any, value: Any) -> bool:
        """Set or (value None) remove an entry; True when that changed anything a decision reads (an
        entry is replaced even then: fields outside comparison, such as a resourceVersion, stay current)."""
        before = self._swap(table, key, value)
        return before is not None if value is None else bool(before != value)

    def get(self, table: str, key: Any) -> Any:
        with self.lock:
            return getattr(self, table).get(key)

    def size(self, table: str) -> int:
        with self.lock:
            return len(getattr(self, table))

    def snapshot(self, namespace: str, environ: Mapping[str, str], nvidia_driver_crd: bool) -> Observed:
        with self.lock:
            return Observed(
                policies=tuple(self.policies.values()),
                nodes=dict(self.nodes),
                pods=tuple(self.pods.values()),
                daemonsets={d.name: d for d in self.daemonsets.values()},
                objects=dict(self.objects),
                config_maps=dict(self.config_maps),
                namespace=namespace,
                environ=dict(environ),
                nvidia_driver_crd=nvidia_driver_crd,
                service_monitor_crd=self.crds.get(SERVICE_MONITOR_CRD, False),
                operand_namespace=self.namespaces.get(namespace),
            )

    # --- what the watches report: (body, deleted) → whether a pass must follow -------------------

    def record_policy(self, body: Body, deleted: bool) -> bool:
        name = body["metadata"]["name"]
        if deleted:
            return self.put("policies", name, None)
        ref = policy_ref(body)
        before: PolicyRef | None = self._swap("policies", name, ref)
        # Our own status writes come back as events too; only spec or identity changes need a pass.
        return before is None or (before.spec, before.generation, before.uid) != (
            ref.spec,
            ref.generation,
            ref.uid,
        )

    def record_node(self, body: Body, deleted: bool) -> bool:
        return self.put("nodes", body["metadata"]["name"], None if deleted else node_info(body))

    def record_pod(self, body: Body, deleted: bool) -> bool:
        key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
        return self.put("pods", key, None if deleted else pod_info(body))

    def record_managed(self, body: Body, deleted: bool) -> bool:
        key = object_key(body)
        changed = self.put("objects", key, None if deleted else object_info(body))
        if body["kind"] == "DaemonSet":
            changed |= self.put("daemonsets", key, None if deleted else daemonset_info(body))
        return changed

    def record_config_map(self, body: Body, deleted: bool) -> bool:
        """ConfigMaps are watched without the label selector: the driver mounts the files of users'
        ConfigMaps (repoConfig, certConfig, kernelModuleConfig) one by one, so it needs their keys."""
        ours = (body["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == FIELD_MANAGER
        changed = self.record_managed(body, deleted or not ours)
        keys = None if deleted else config_map_keys(body)
        return self.put("config_maps", body["metadata"]["name"], keys) or changed

    def record_crd(self, body: Body, deleted: bool) -> bool:
        conditions = (body.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        return self.put("crds", body["metadata"]["name"], None if deleted else established)

    def record_namespace(self, body: Body, deleted: bool) -> bool:
        return self.put("namespaces", body["metadata"]["name"], None if deleted else namespace_info(body))
