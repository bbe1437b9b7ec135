"""A kubeconfig that logs in as a ServiceAccount: a fresh TokenRequest token, the cluster of another
kubeconfig. How the operator runs outside a pod with exactly the chart's RBAC (`gpu-operator kubeconfig`,
the demo, the tests and the bench all write theirs here).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.runtime.sync_client import SyncKube


def request_token(
    kube: SyncKube,
    namespace: str,
    service_account: str,
    seconds: int = 7200,
    bound_pod: tuple[str, str] | None = None,
) -> str:
    """A token of the ServiceAccount valid for `seconds`. With `bound_pod` (name, uid) it is bound to
    that pod, as the kubelet mounts it: it then carries the pod's node (user extra
    authentication.kubernetes.io/node-name)."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if bound_pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_pod[0],
            "uid": bound_pod[1],
        }
    answer = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


def _current_cluster(kubeconfig: Path) -> dict[str, Any]:
    """The cluster entry of the kubeconfig's current context, its CA embedded (a relative CA path is
    relative to the kubeconfig's folder), so the new file works from anywhere."""
    admin: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    current = admin.get("current-context") or admin["contexts"][0]["name"]
    context = next(c["context"] for c in admin["contexts"] if c["name"] == current)
    cluster = dict(next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"]))
    ca = cluster.pop("certificate-authority", None)
    if ca:
        ca_path = Path(ca) if Path(ca).is_absolute() else kubeconfig.parent / ca
        cluster["certificate-authority-data"] = base64.b64encode(ca_path.read_bytes()).decode()
    return cluster


def token_kubeconfig(cluster_of: Path, user: str, token: str) -> dict[str, Any]:
    """A kubeconfig for the cluster of `cluster_of`'s current context that logs in with `token`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": _current_cluster(cluster_of)}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "cluster", "user": user}}],
        "current-context": user,
    }


def write_service_account_kubeconfig(
    kube: SyncKube,
    cluster_of: Path,
    namespace: str,
    service_account: str,
    path: Path,
    seconds: int = 7200,
    bound_pod: tuple[str, str] | None = None,
) -> Path:
    """Write (mode 0600) a kubeconfig at `path` that logs in as the ServiceAccount; `kube` must be
    allowed to create its tokens."""
    token = request_token(kube, namespace, service_account, seconds, bound_pod)
    body = token_kubeconfig(cluster_of, service_account, token)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump(body))
    return path
