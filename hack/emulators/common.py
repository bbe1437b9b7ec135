"""Pieces several emulated images share: flags from env, node label writes, pod lists, NVML."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .api import STRATEGIC_MERGE_PATCH, Api, ApiError
from .node import DRIVER_ROOT
from .process import Proc

JSON = dict[str, Any]
NVML_LIBRARY = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NVIDIA_SMI = "usr/bin/nvidia-smi"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean flag as urfave/cli parses it from an env var (strconv.ParseBool)."""
    value = env.get(name, "").strip().lower()
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    return default


def duration(value: str, default: float) -> float:
    """A Go duration (`300s`, `5m`, `1h30m`, `0s`) in seconds."""
    if not value:
        return default
    total, found = 0.0, False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value):
        found = True
        total += float(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    return total if found else default


async def get_node(api: Api, name: str) -> JSON:
    return await api.get(f"/api/v1/nodes/{name}")


async def node_label(proc: Proc, api: Api, key: str) -> str:
    """A label of the pod's node, as an informer on that node lists it (metadata.name field selector).

    Later changes come from the emulators' own watch of the node (`proc.node.labels`)."""
    try:
        listed = await api.get("/api/v1/nodes", fieldSelector=f"metadata.name={proc.pod.node}")
    except ApiError as exc:
        proc.fail(f"failed to list *v1.Node: {exc}")
    items = listed.get("items") or []
    return str(((items[0].get("metadata") or {}).get("labels") or {}).get(key, "")) if items else ""


async def patch_node_labels(
    api: Api, name: str, labels: Mapping[str, str | None], strategic: bool = True
) -> None:
    """k8s-driver-manager UpdateNodeLabels (strategic merge) / mig-manager setNodeLabels (merge patch)."""
    body = {"metadata": {"labels": dict(labels)}}
    if strategic:
        await api.patch(f"/api/v1/nodes/{name}", body, STRATEGIC_MERGE_PATCH)
    else:
        await api.patch(f"/api/v1/nodes/{name}", body)


async def list_pods(api: Api, namespace: str | None, node: str, labels: str = "") -> list[JSON]:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    params = {"fieldSelector": f"spec.nodeName={node}"}
    if labels:
        params["labelSelector"] = labels
    answer = await api.get(path, **params)
    return list(answer.get("items") or [])


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """k8s-driver-manager internal/kubernetes/client.go:352-370 (podUsesGPU, device-plugin resources)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            if any(name.startswith(GPU_RESOURCE_PREFIXES) for name in resources.get(kind) or {}):
                return True
    return False


def controller_of(pod: Mapping[str, Any]) -> JSON | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def driver_libraries(proc: Proc, root: str) -> bool:
    """libnvidia-ml.so.1 and nvidia-smi under `root` as this container sees it."""
    return proc.fs.exists(f"{root.rstrip('/')}/{NVML_LIBRARY}") and proc.fs.exists(
        f"{root.rstrip('/')}/{NVIDIA_SMI}"
    )


def injected_by_runtime(proc: Proc) -> bool:
    """The nvidia runtime injects the driver's libraries and nvidia-smi into this container.

    That needs the pod to run with the nvidia RuntimeClass (its sandbox exists, so the handler is
    configured) and the container to ask for devices (NVIDIA_VISIBLE_DEVICES not void/none).
    """
    if not proc.pod.runtime_class:
        return False
    visible = proc.env.get("NVIDIA_VISIBLE_DEVICES", "")
    return visible not in ("", "void", "none") and proc.node.driver is not None and _driver_on_host(proc)


def _driver_on_host(proc: Proc) -> bool:
    node = proc.node
    return node.read(f"{DRIVER_ROOT}/{NVML_LIBRARY}") is not None or node.read(f"/{NVML_LIBRARY}") is not None


def nvml_error(proc: Proc, driver_root: str) -> str | None:
    """Why NVML cannot initialise in this container, or None if it can."""
    if not (driver_libraries(proc, driver_root) or injected_by_runtime(proc)):
        return "ERROR_LIBRARY_NOT_FOUND"
    if proc.node.driver is None:
        return "ERROR_DRIVER_NOT_LOADED"
    return None
