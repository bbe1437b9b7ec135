"""Helm pre-delete hook: delete the release's ClusterPolicy while the operator can still clean up.

`helm uninstall` deletes the operator's Deployment, ServiceAccount and RBAC before custom resources,
so without this hook the ClusterPolicy would go last, when no operator is left to remove the node
labels it set (nvidia.com/gpu.present, nvidia.com/gpu.deploy.*). The operands themselves would
still go (the garbage collector follows their ownerReferences), the labels would not.

Deletes the ClusterPolicy named by $POLICY, then waits (at most $TIMEOUT seconds) until no node
carries a label owned by the operator's field manager. Always exits 0: a missing operator must not
make the release impossible to uninstall; it is logged instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

FIELD_MANAGER = "gpu-operator"
LABEL_PREFIXES = ("nvidia.com/gpu.deploy.", "nvidia.com/gpu.present")


def operator_labels(node: Any) -> list[str]:
    """Labels of `node` set by the operator (owned by its field manager), not by hand."""
    owned: set[str] = set()
    for entry in node.metadata.managed_fields or []:
        if entry.manager == FIELD_MANAGER and entry.fields_v1:
            owned |= {k[2:] for k in entry.fields_v1.get("f:metadata", {}).get("f:labels", {})}
    labels = node.metadata.labels or {}
    return sorted(k for k in owned if k in labels and k.startswith(LABEL_PREFIXES))


def log(message: str, **fields: Any) -> None:
    print(json.dumps({"message": message, **fields}), flush=True)


def main() -> int:
    policy = os.environ["POLICY"]
    deadline = time.monotonic() + float(os.environ.get("TIMEOUT", "120"))
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    custom = client.CustomObjectsApi()
    core = client.CoreV1Api()
    try:
        custom.delete_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", policy)
        log("deleted the ClusterPolicy", policy=policy)
    except ApiException as exc:
        if exc.status != 404:
            log("cannot delete the ClusterPolicy", policy=policy, error=str(exc))
            return 0
    left: dict[str, list[str]] = {}
    while (remaining := deadline - time.monotonic()) > 0:
        nodes = core.list_node()
        left = {str(n.metadata and n.metadata.name): operator_labels(n) for n in nodes.items}
        left = {name: labels for name, labels in left.items() if labels}
        if not left:
            log("the operator removed its node labels")
            return 0
        # Wake on the next node change (or at the deadline) instead of polling.
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for _event in stream.stream(  # type: ignore[no-untyped-call]
            core.list_node,
            resource_version=nodes.metadata and nodes.metadata.resource_version,
            timeout_seconds=max(1, int(remaining)),
        ):
            stream.stop()  # type: ignore[no-untyped-call]
    log("gave up waiting: is the operator running? Node labels left behind", nodes=left)
    return 0


if __name__ == "__main__":
    sys.exit(main())
