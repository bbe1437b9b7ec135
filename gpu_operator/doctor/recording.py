"""Recording a cluster for `gpu-operator doctor`: read only, with the user's kubeconfig, through
runtime/sync_client.py; and saving and loading recorded states (--save-state, --from-state).

It reads nodes, pods (and the logs of failing operand containers), Events, ResourceQuotas,
RuntimeClasses, the operand DaemonSets, ClusterPolicies and, where a ClusterPolicy delegates its driver
to them, NVIDIADrivers (`READS`; the chart's `<release>-doctor` ClusterRole grants exactly these) and
never writes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.api.nvidiadriver import API_VERSION as DRIVER_API_VERSION
from gpu_operator.api.nvidiadriver import KIND as DRIVER_KIND
from gpu_operator.core.observed import pod_info
from gpu_operator.core.ownership import FIELD_MANAGER, MANAGED_BY_LABEL
from gpu_operator.doctor.scheduling import requested_by_node
from gpu_operator.doctor.state import (
    LOG_LINES,
    ClusterState,
    Scope,
    event_worth_recording,
    is_operand,
    quota_worth_recording,
    worth_recording,
)
from gpu_operator.runtime.client import ApiError
from gpu_operator.runtime.sync_client import SyncKube

DEFAULT_NAMESPACE = "gpu-operator"
MAX_LOGS = 20
"""Operand pods whose logs are read at most (the first failing ones)."""

READS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("list",)),
    ("", "pods", ("list",)),
    ("", "pods/log", ("get",)),
    ("", "events", ("list",)),
    ("", "resourcequotas", ("list",)),
    ("apps", "daemonsets", ("list",)),
    ("node.k8s.io", "runtimeclasses", ("list",)),
    ("nvidia.com", "clusterpolicies", ("list",)),
    ("nvidia.com", "nvidiadrivers", ("list",)),
    # Only when a recorded pod names a ResourceClaim (doctor/dra.py).
    ("resource.k8s.io", "resourceclaims", ("list",)),
    ("resource.k8s.io", "resourceslices", ("list",)),
    ("resource.k8s.io", "deviceclasses", ("list",)),
    ("nvidia.com", "gpuclusters", ("list",)),
)
"""(apiGroup, resource, verbs) doctor reads; the chart's doctor ClusterRole is held to it by a test."""


class DoctorError(Exception):
    """Cannot diagnose: bad input or no access (exit 2), said in one line."""


# What a recording keeps of each kind: (section, fields) pairs, "*" for the whole section. Enough for
# the diagnosis and for a person reading the file, and small enough to attach to a bug report even for
# a large cluster (measured: bench/README.md).
_KEEP: dict[str, dict[str, tuple[str, ...]]] = {
    "Node": {
        "metadata": ("name", "uid", "labels", "annotations", "creationTimestamp"),
        "spec": ("taints", "unschedulable"),
        "status": ("allocatable", "capacity", "conditions"),
    },
    "Pod": {
        "metadata": (
            "name",
            "namespace",
            "uid",
            "labels",
            "ownerReferences",
            "creationTimestamp",
            "deletionTimestamp",
        ),
        "spec": (
            "nodeName",
            "nodeSelector",
            "affinity",
            "tolerations",
            "runtimeClassName",
            "overhead",
            "containers",
            "initContainers",
            "resourceClaims",
        ),
        "status": (
            "phase",
            "reason",
            "message",
            "conditions",
            "containerStatuses",
            "initContainerStatuses",
            "resourceClaimStatuses",
        ),
    },
    # Operand pods: where they run and how they fare; their spec is the operator's, not the user's.
    "OperandPod": {
        "metadata": ("name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp"),
        "spec": ("nodeName", "affinity", "containers", "initContainers"),
        "status": ("phase", "reason", "message", "conditions", "containerStatuses", "initContainerStatuses"),
    },
    "DaemonSet": {"metadata": ("name", "namespace", "labels"), "status": ("*",)},
    "Event": {
        "metadata": ("name", "namespace"),
        "involvedObject": ("kind", "namespace", "name", "uid"),
        "*": ("type", "reason", "message", "count", "firstTimestamp", "lastTimestamp", "eventTime"),
    },
}
_CONTAINER = ("name", "image", "resources", "env")


def _slim(obj: Mapping[str, Any], kind: str = "") -> dict[str, Any]:
    """What a recording keeps of an object: for nodes, pods and Events the fields in _KEEP, for the
    rest everything but managedFields and the last-applied annotation."""
    keep = _KEEP.get(kind)
    if keep is None:
        metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
        annotations = (metadata.get("annotations") or {}).copy()
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        metadata["annotations"] = annotations
        return {**obj, "metadata": {k: v for k, v in metadata.items() if v}}
    body: dict[str, Any] = {}
    for section, fields in keep.items():
        source = obj if section == "*" else obj.get(section) or {}
        if fields == ("*",):
            body[section] = source
            continue
        kept = {f: source[f] for f in fields if source.get(f) not in (None, "", [], {})}
        if section == "*":
            body.update(kept)
        elif kept:
            body[section] = kept
    spec = body.get("spec") or {}
    container_fields = ("name", "image") if kind == "OperandPod" else _CONTAINER
    for key in ("containers", "initContainers"):
        if key in spec:
            spec[key] = [{f: c[f] for f in container_fields if c.get(f)} for c in spec[key]]
    return body


def _ref(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _failure(what: str, exc: ApiError) -> DoctorError:
    if exc.status == 0:
        return DoctorError(f"cannot reach the API server: {exc}")
    if exc.status in (401, 403):
        return DoctorError(
            f"not allowed to read {what} ({exc}): bind the chart's gpu-operator-doctor ClusterRole "
            "to your user (charts/gpu-operator/README.md, RBAC)"
        )
    return DoctorError(f"cannot read {what}: {exc}")


def _read(what: str, call: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    try:
        return call()
    except ApiError as exc:
        raise _failure(what, exc) from None


def _logs(kube: SyncKube, pods: list[dict[str, Any]], lines: int) -> dict[str, str]:
    """The last lines of each failing container of the not-ready operand pods."""
    logs: dict[str, str] = {}
    failing = [
        p for p in pods if (info := pod_info(p)) is not None and not info.ready and not info.terminating
    ]
    for pod in failing[:MAX_LOGS]:
        status = pod.get("status") or {}
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            state = container.get("state") or {}
            if container.get("ready") or ((state.get("terminated") or {}).get("reason") == "Completed"):
                continue
            previous = bool((container.get("lastState") or {}).get("terminated"))
            metadata = pod["metadata"]
            key = f"{metadata['namespace']}/{metadata['name']}/{container['name']}"
            try:
                logs[key] = kube.pod_log(
                    metadata["namespace"], metadata["name"], container["name"], lines, previous
                )
            except ApiError as exc:
                logs[key] = f"(log unavailable: {exc})"
    return logs


def _nvidia_drivers(kube: SyncKube, policies: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The NVIDIADrivers, read only where a ClusterPolicy delegates its driver to them (so that doctor
    needs no access to them otherwise); None when not read or their CRD is not installed."""
    if not any(
        ((p.get("spec") or {}).get("driver") or {}).get("useNvidiaDriverCRD") is True for p in policies
    ):
        return None
    try:
        return [_slim(d) for d in kube.list(DRIVER_API_VERSION, DRIVER_KIND)]
    except ApiError as exc:
        if exc.status != 404:
            raise _failure("NVIDIADrivers", exc) from None
        return None


DRA_READS = (
    ("resource_claims", "resource.k8s.io/v1", "ResourceClaim"),
    ("resource_slices", "resource.k8s.io/v1", "ResourceSlice"),
    ("device_classes", "resource.k8s.io/v1", "DeviceClass"),
    ("gpuclusters", "nvidia.com/v1alpha1", "GPUCluster"),
)


def _dra(kube: SyncKube, pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]] | None]:
    """What doctor/dra.py reads, only when a recorded pod names a ResourceClaim (so that doctor needs no
    access to it otherwise); a kind that is not served is None."""
    if not any((p.get("spec") or {}).get("resourceClaims") for p in pods):
        return {}
    found: dict[str, list[dict[str, Any]] | None] = {}
    for key, api_version, kind in DRA_READS:
        try:
            found[key] = [_slim(o) for o in kube.list(api_version, kind)]
        except ApiError as exc:
            if exc.status != 404:
                raise _failure(f"{kind}s", exc) from None
            found[key] = None
    return found


def record(kube: SyncKube, namespace: str = "", log_lines: int = LOG_LINES, pod: str = "") -> ClusterState:
    """Read what the diagnosis needs. `namespace` of the operands: default the active ClusterPolicy's
    status.namespace, else gpu-operator; `pod` (NAMESPACE/NAME) is recorded whatever it is."""
    try:
        policies: list[dict[str, Any]] | None = [
            _slim(p) for p in kube.list("nvidia.com/v1", "ClusterPolicy")
        ]
    except ApiError as exc:
        if exc.status != 404:
            raise _failure("ClusterPolicies", exc) from None
        policies = None  # the CRD is not installed
    if not namespace:
        oldest = sorted(
            policies or [],
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
        )
        namespace = (
            (oldest[0].get("status") or {}).get("namespace") if oldest else None
        ) or DEFAULT_NAMESPACE
    nodes = _read("nodes", lambda: kube.list("v1", "Node"))
    drivers = _nvidia_drivers(kube, policies or [])
    every_pod = _read("pods", lambda: kube.list("v1", "Pod"))
    pods = [
        _slim(p, "OperandPod" if is_operand(p, namespace) else "Pod")
        for p in every_pod
        if worth_recording(p, namespace) or _ref(p) == pod
    ]
    uids = {p["metadata"].get("uid") for p in pods}
    events = _read("events", lambda: kube.list("v1", "Event"))
    quotas = _read("resourcequotas", lambda: kube.list("v1", "ResourceQuota"))
    operands = [p for p in pods if p["metadata"].get("namespace") == namespace]
    return ClusterState(
        namespace=namespace,
        now=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        nodes=[_slim(n, "Node") for n in nodes],
        pods=pods,
        requested=requested_by_node(every_pod),
        events=[_slim(e, "Event") for e in events if event_worth_recording(e, uids)],
        quotas=[_slim(q) for q in quotas if quota_worth_recording(q)],
        runtime_classes=[
            _slim(r) for r in _read("runtimeclasses", lambda: kube.list("node.k8s.io/v1", "RuntimeClass"))
        ],
        daemonsets=[
            _slim(d, "DaemonSet")
            for d in _read(
                "daemonsets",
                lambda: kube.list("apps/v1", "DaemonSet", namespace, f"{MANAGED_BY_LABEL}={FIELD_MANAGER}"),
            )
        ],
        policies=policies,
        nvidia_drivers=drivers,
        logs=_logs(kube, operands, log_lines) if log_lines > 0 else {},
        **_dra(kube, pods),
    )


def save_state(state: ClusterState, path: str) -> None:
    try:
        Path(path).write_text(json.dumps(dataclasses.asdict(state), indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise DoctorError(f"{path}: cannot write: {exc.strerror or exc}") from None


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_state(path: str) -> ClusterState:
    """A state saved by --save-state; DoctorError naming the problem otherwise."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=_Loader)  # JSON, or YAML for hand-written states
    except OSError as exc:
        raise DoctorError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DoctorError(f"{path}: not JSON or YAML: {str(exc).splitlines()[0]}") from None
    fields = {f.name: f for f in dataclasses.fields(ClusterState)}
    if not isinstance(data, dict) or "namespace" not in data or "now" not in data:
        raise DoctorError(f"{path}: not a doctor state (saved by --save-state): needs namespace and now")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise DoctorError(f"{path}: unknown keys {', '.join(unknown)}")
    for name, value in data.items():
        kind = dict if name in ("requested", "logs") else str if name in ("namespace", "now") else list
        nullable = ("policies", "nvidia_drivers", *(key for key, _, _ in DRA_READS))
        if not isinstance(value, kind) and not (name in nullable and value is None):
            raise DoctorError(f"{path}: {name} must be a {kind.__name__}")
    return ClusterState(**data)


def check_scope(state: ClusterState, scope: Scope) -> None:
    if scope.node and scope.node not in {(n.get("metadata") or {}).get("name") for n in state.nodes}:
        raise DoctorError(f"--node {scope.node}: no such node")
    if scope.pod and scope.pod not in {_ref(p) for p in state.pods}:
        raise DoctorError(f"--pod {scope.pod}: no such pod")


# --- the command ----------------------------------------------------------------------------------


def kube_from_kubeconfig(path: str | None, context: str | None) -> SyncKube:
    try:
        return SyncKube.connect(path, context)
    except Exception as exc:  # the loader raises ConfigException, OSError, YAML and type errors alike
        where = path or "$KUBECONFIG or ~/.kube/config"
        raise DoctorError(f"cannot use the kubeconfig ({where}): {exc}") from None
