"""An NVIDIADriver's objects for its pool: one driver DaemonSet per OS (per OS and kernel with
precompiled drivers), with NVIDIA's names, labels and node selectors, rendered by the driver
component's own templates (pure, no I/O).

NVIDIA's NVIDIADriver controller at v26.7.0 (internal/state/driver.go, internal/state/nodepool.go):

- The driver's nodes (those the pool rules give it, core/driver_pools.py; NVIDIA's owner label) are
  split into OS pools: one per OS tag, and with precompiled drivers one per OS tag and kernel
  (getNodePools, nodepool.go:50-155). Nodes without NFD's OS labels are left out, as NVIDIA does.
- Each pool's DaemonSet is named `nvidia-<driverType>-driver-<osTag>-<hash>` (getDriverAppName,
  driver.go:505-534: the hash of the object's UID, and of the kernel for precompiled drivers, so it is
  stable while the object lives), selects its pods by `app: <that name>`, and its ServiceAccount and
  RBAC objects are `nvidia-<driverType>-driver-<object name>-<osTag>` (getDriverName, driver.go:480-498).
- Its node selector is the object's nodeSelector, `nvidia.com/gpu.present=true`, the owner label set
  to the object's name and the pool's OS (and kernel) labels (nodepool.go:65-130), besides the
  driver's deploy label (`nvidia.com/gpu.deploy.driver=true`, NVIDIA's asset).

The pod is the ClusterPolicy driver's: the NVIDIADriver spec is read as the ClusterPolicy's driver
section (`policy_view`), so both render through the same template and cannot drift apart. The render
variant carries the `driverType`: a vgpu-host-manager pool's pod is NVIDIA's vGPU manager (its own
component label and deploy label `nvidia.com/gpu.deploy.vgpu-manager`, no probe; see the template).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_operator.api.nvidiadriver import OWNER_LABEL, NVIDIADriverSpec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.driver_pools import DriverObject
from gpu_operator.core.images import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo
from gpu_operator.core.render import ClusterFacts, Variant, render_variants, runtimes_in_order

OS_VERSION_MAJOR_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major"
APP_NAME_MAX = 63
"""A label value's limit (the DaemonSet's `app` label is its name)."""
NAME_MAX = 253
DEFAULT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# k8s.io/apimachinery/pkg/util/rand: the alphabet SafeEncodeString maps each byte into (no vowels, no
# look-alike digits, so that a hash never spells a word).
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def string_hash(text: str) -> str:
    """NVIDIA's utils.GetStringHash (internal/utils/utils.go:122-128): FNV-1a 32 of the text, its
    decimal digits mapped by rand.SafeEncodeString."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_ALPHABET[ord(digit) % len(_SAFE_ALPHABET)] for digit in str(value))


def os_tag(os_id: str, version: str) -> str:
    """NVIDIA's getOSTag (nodepool.go:157-167): Rocky, Oracle Linux and RHEL by major version only."""
    return os_id + (version.split(".")[0] if os_id in ("ol", "rocky", "rhel") else version)


def driver_name(name: str, driver_type: str, tag: str) -> str:
    """The ServiceAccount and RBAC objects' name (getDriverName, driver.go:480-498)."""
    full = f"nvidia-vgpu-manager-{name}-{tag}" if driver_type == "vgpu-host-manager" else None
    return (full or f"nvidia-{driver_type}-driver-{name}-{tag}")[:NAME_MAX]


def app_name(uid: str, driver_type: str, tag: str, kernel: str | None = None) -> str:
    """The DaemonSet's name and `app` label (getDriverAppName, driver.go:505-534)."""
    digest = string_hash(uid + (f"-{kernel}" if kernel else ""))
    prefix = f"nvidia-{driver_type}-driver-{tag}"
    return f"{prefix[: APP_NAME_MAX - len(digest) - 1]}-{digest}"


def pools(driver: DriverObject, nodes: Iterable[NodeInfo]) -> list[Variant]:
    """One DaemonSet per OS (and kernel, with precompiled drivers) among `nodes`, the driver's own
    (getNodePools); nodes without NFD's OS labels (or kernel label, precompiled) get none."""
    spec = driver.spec
    if spec is None:
        return []
    precompiled = bool(spec.usePrecompiled)
    base = {**(spec.nodeSelector or {}), GPU_PRESENT: "true", OWNER_LABEL: driver.name}
    found: dict[tuple[str, str | None], tuple[dict[str, str], list[str]]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        os_id, version = node.labels.get(OS_ID_LABEL), node.labels.get(OS_VERSION_LABEL)
        kernel = node.labels.get(KERNEL_LABEL) if precompiled else None
        if not os_id or not version or (precompiled and not kernel):
            continue
        tag = os_tag(os_id, version)
        selector = {**base, OS_ID_LABEL: os_id}
        if tag.endswith(version):
            selector[OS_VERSION_LABEL] = version
        elif major := node.labels.get(OS_VERSION_MAJOR_LABEL):
            selector[OS_VERSION_MAJOR_LABEL] = major
        else:
            continue
        if kernel:
            selector[KERNEL_LABEL] = kernel
        _, runtimes = found.setdefault((tag, kernel), (selector, []))
        runtimes.append(node.runtime or "containerd")
    return [
        Variant(
            app_name(driver.uid, spec.driverType, tag, kernel),
            runtimes_in_order(runtimes)[0],
            tag,
            kernel,
            node_selector=selector,
            app=app_name(driver.uid, spec.driverType, tag, kernel),
            account=driver_name(driver.name, spec.driverType, tag),
        )
        for (tag, kernel), (selector, runtimes) in sorted(found.items(), key=lambda item: str(item[0]))
    ]


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", exclude_none=True)


def policy_view(spec: NVIDIADriverSpec, host_root: str = "/") -> ClusterPolicySpec:
    """The NVIDIADriver as the ClusterPolicy's driver section (and the DaemonSet settings and GDS/GDRCopy
    sections it carries), which the driver templates read. What differs in meaning: its tolerations
    add to the default one, where the ClusterPolicy's replace it (NVIDIA's asset and driver.go); the
    manager's pull secrets go to the pod's (driver-full-spec.yaml); an unset licensingConfig.nlsEnabled
    means NLS."""
    manager = _dump(spec.manager) or {}
    secrets = [*(spec.imagePullSecrets or []), *manager.pop("imagePullSecrets", [])]
    driver: dict[str, Any] = {
        "enabled": True,
        "repository": spec.repository,
        "image": spec.image,
        "version": spec.version,
        "imagePullPolicy": spec.imagePullPolicy,
        "imagePullSecrets": secrets or None,
        "resources": _dump(spec.resources),
        # NVIDIA's asset runs `init` followed by the NVIDIADriver's args (manifests/state-driver/
        # 0500_daemonset.yaml:212-216), where the ClusterPolicy's args replace them.
        "args": ["init", *spec.args] if spec.args else None,
        # "always use runc for driver containers" (the same asset, :228-230): no GPU is injected even
        # where the toolkit made the nvidia runtime the default.
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, *_dump_list(spec.env)],
        "hostNetwork": spec.hostNetwork,
        "usePrecompiled": spec.usePrecompiled,
        "kernelModuleType": spec.kernelModuleType,
        "startupProbe": _dump(spec.startupProbe),
        "livenessProbe": _dump(spec.livenessProbe),
        "readinessProbe": _dump(spec.readinessProbe),
        "rdma": _dump(spec.rdma),
        "manager": manager or None,
        "repoConfig": {"configMapName": spec.repoConfig.name} if spec.repoConfig else None,
        "certConfig": _dump(spec.certConfig),
        "licensingConfig": (
            {
                "configMapName": spec.licensingConfig.name,
                "secretName": spec.licensingConfig.secretName,
                # IsNLSEnabled: nvidiadriver_types.go:784-790 (clusterpolicy_types.go:2462-2468: off).
                "nlsEnabled": spec.licensingConfig.nlsEnabled is not False,
            }
            if spec.licensingConfig
            else None
        ),
        "virtualTopology": (
            {"config": spec.virtualTopologyConfig.name} if spec.virtualTopologyConfig else None
        ),
        "kernelModuleConfig": _dump(spec.kernelModuleConfig),
        "secretEnv": spec.secretEnv,
    }
    daemonsets: dict[str, Any] = {
        "labels": spec.labels,
        "annotations": spec.annotations,
        "tolerations": [DEFAULT_TOLERATION, *_dump_list(spec.tolerations)] if spec.tolerations else None,
        "priorityClassName": spec.priorityClassName,
        "podSecurityContext": _dump(spec.podSecurityContext),
    }
    body = {
        "driver": _present(driver),
        "daemonsets": _present(daemonsets),
        "gds": _dump(spec.gds),
        "gdrcopy": _dump(spec.gdrcopy),
        "hostPaths": {"rootFS": host_root},
    }
    return ClusterPolicySpec.model_validate(_present(body))


def _dump_list(items: Iterable[Any] | None) -> list[Any]:
    return [_dump(item) if hasattr(item, "model_dump") else item for item in items or ()]


def _present(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def render_driver(
    driver: DriverObject, nodes: Iterable[NodeInfo], facts: ClusterFacts, host_root: str = "/"
) -> list[dict[str, Any]]:
    """The objects of one NVIDIADriver for its nodes (the GPU nodes it owns): per OS pool a
    ServiceAccount, its RBAC and a driver DaemonSet, and the startup-probe ConfigMap; nothing while it
    owns no node with NFD's OS labels (NVIDIA renders nothing then, driver.go:297-300)."""
    if driver.spec is None:
        return []
    return render_pools(driver.spec, pools(driver, nodes), facts, host_root)


def render_pools(
    spec: NVIDIADriverSpec, found: list[Variant], facts: ClusterFacts, host_root: str = "/"
) -> list[dict[str, Any]]:
    """The objects of an NVIDIADriver for the OS pools `found` (`pools`); none without a pool."""
    if not found:
        return []
    typed = [replace(variant, driver_type=spec.driverType) for variant in found]
    return render_variants(BY_NAME["driver"], policy_view(spec, host_root), facts, typed)
