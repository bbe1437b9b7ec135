"""`gpu-operator cleanup`: the Helm chart's pre-delete hook (charts/gpu-operator/templates/cleanup-hook.yaml).

`helm uninstall` deletes the operator's Deployment, ServiceAccount and RBAC before custom resources,
so without this hook the ClusterPolicy would go last, when no operator is left to remove the node
labels it set (nvidia.com/gpu.present, nvidia.com/gpu.deploy.*). The operands themselves would
still go (the garbage collector follows their ownerReferences), the labels would not.

Deletes the ClusterPolicy, then waits (at most `timeout` seconds) until no node carries a label the
operator removes once no policy is active (core/node_labels.py `left_on_uninstall`: its own, and the
deploy labels its operand managers wrote on its behalf). Always returns 0: a missing operator must
not make the release impossible to uninstall; it is logged instead, one JSON line per message.

With a GPUCluster (`gpucluster`, the chart's gpuCluster.deployCR), that goes first, and the ClusterPolicy
only once it is gone: the operator drains its claim-holding DaemonSets before it removes the
GPUCluster's finalizer (core/gpucluster_plan.py), which a GPUCluster deleted after the operator would
keep for good; and with the ClusterPolicy gone first, the operator would let the finalizer go at once,
without that order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gpu_operator.core.node_labels import left_on_uninstall, node_info
from gpu_operator.runtime.client import ApiError, path
from gpu_operator.runtime.sync_client import SyncKube


def operator_labels(node: Mapping[str, Any]) -> list[str]:
    """Labels of `node` the operator still has to remove, not those set by hand."""
    return left_on_uninstall(node_info(node))


GPUCLUSTER = ("nvidia.com/v1alpha1", "GPUCluster")


def _delete_gpucluster(kube: SyncKube, name: str, deadline: float, log: Callable[..., None]) -> None:
    """Delete the GPUCluster and wait, at most until `deadline`, until it is gone."""
    url = path(*GPUCLUSTER, name=name)
    try:
        kube.request("DELETE", url, kind=GPUCLUSTER[1])
        log("deleted the GPUCluster", gpucluster=name)
        while (remaining := deadline - time.monotonic()) > 0:
            found = kube.request("GET", url, kind=GPUCLUSTER[1])
            version = str((found.get("metadata") or {}).get("resourceVersion") or "")
            # Wake on its next change (its finalizer removed, then its deletion) instead of polling.
            query = {"fieldSelector": f"metadata.name={name}", "resourceVersion": version}
            for _event in kube.watch(*GPUCLUSTER, query, max(1, int(remaining))):
                break
    except ApiError as exc:
        if exc.status == 404:
            log("the GPUCluster is gone", gpucluster=name)
            return
        log("cannot delete the GPUCluster", gpucluster=name, error=str(exc))
        return
    log("gave up waiting for the GPUCluster: is the operator running?", gpucluster=name)


def cleanup(kube: SyncKube, policy: str, timeout: float, out: TextIO, gpucluster: str = "") -> int:
    def log(message: str, **fields: Any) -> None:
        print(json.dumps({"message": message, **fields}), file=out, flush=True)

    deadline = time.monotonic() + timeout
    if gpucluster:
        _delete_gpucluster(kube, gpucluster, deadline, log)
    try:
        kube.request("DELETE", path("nvidia.com/v1", "ClusterPolicy", name=policy), kind="ClusterPolicy")
        log("deleted the ClusterPolicy", policy=policy)
    except ApiError as exc:
        if exc.status != 404:
            log("cannot delete the ClusterPolicy", policy=policy, error=str(exc))
            return 0
    left: dict[str, list[str]] = {}
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            listing = kube.request("GET", path("v1", "Node"))
            found = {n["metadata"]["name"]: operator_labels(n) for n in listing.get("items") or []}
            left = {name: labels for name, labels in found.items() if labels}
            if not left:
                log("the operator removed its node labels")
                return 0
            # Wake on the next node change (or at the deadline) instead of polling.
            version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
            for _event in kube.watch("v1", "Node", {"resourceVersion": version}, max(1, int(remaining))):
                break
    except ApiError as exc:
        log("cannot read the nodes", error=str(exc))
    log("gave up waiting: is the operator running? Node labels left behind", nodes=left)
    return 0
