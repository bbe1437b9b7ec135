"""The deploy-label writes of NVIDIA's operand managers, transcribed from their sources, for tests and
emulators: what each manager patches onto a node, given the node's current labels.

* k8s-driver-manager v0.12.0 (the driver pod's init container), cmd/driver-manager/main.go:
  `fetchCurrentLabels` reads absent labels as "" (l.560-604); `evictAllGPUOperatorComponents`
  (l.656-702) patches `maybeSetPaused` (l.728-740) of each; `rescheduleGPUOperatorComponents`
  (l.1037-1073) patches `maybeSetTrue` (l.1075-1086); `disableContainerizedDriver` (l.549-558) sets
  the driver label to `pre-installed` when the host has a driver. The DRA kubelet-plugin label is
  evicted separately, only when set (`evictKubeletPlugin`, l.704-726). Strategic-merge patches
  (internal/kubernetes/client.go:105-131).
* mig-manager v0.15.0, pkg/mig/reconfigure/reconfigure.go: `shutdownKubernetesGPUClients`
  (l.371-385) and `restartKubernetesGPUClients` (l.515-530) over five labels, `maybeSetPaused` /
  `maybeSetTrue` (l.581-593). JSON merge patches (l.597-611).

Both leave the GPU-client label (and k8s-driver-manager the mig-manager label) alone when it is empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

DEPLOY = "nvidia.com/gpu.deploy."
DRIVER_PAUSED = "paused-for-driver-upgrade"
MIG_PAUSED = "paused-for-mig-change"

_DRIVER_MANAGER_EVICTS = [
    DEPLOY + name
    for name in (
        "operator-validator",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "nvsm",
        "sandbox-validator",
        "sandbox-device-plugin",
        "vgpu-device-manager",
        "dra-validator",
        "dcgm-dra",
        "dcgm-exporter-dra",
    )
]
_DRIVER_MANAGER_RESCHEDULES = [*_DRIVER_MANAGER_EVICTS, DEPLOY + "dra-driver"]
# Written only when the label already has a value (main.go:676-688, reconfigure.go:381-383).
_DRIVER_MANAGER_WHEN_SET = [DEPLOY + "mig-manager", DEPLOY + "client"]
_MIG_MANAGER_WHEN_SET = [DEPLOY + "client"]
_MIG_MANAGER = [
    DEPLOY + n for n in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
]

DRIVER_MANAGER_HOST_DRIVER = {DEPLOY + "driver": "pre-installed"}
"""k8s-driver-manager's patch when it finds a driver installed on the host."""


def driver_manager_paused(value: str) -> str:
    if value in ("", "false") or DRIVER_PAUSED in value:
        return value
    return DRIVER_PAUSED if value == "true" else f"{value}_{DRIVER_PAUSED}"


def driver_manager_true(value: str) -> str:
    if value == "false":
        return "false"
    if value == DRIVER_PAUSED:
        return "true"
    return re.sub(DRIVER_PAUSED + "_?", "", value).strip("_")


def mig_manager_paused(value: str) -> str:
    return "false" if value == "false" else MIG_PAUSED


def mig_manager_true(value: str) -> str:
    return "false" if value == "false" else "true"


def _patch(
    labels: Mapping[str, str], keys: list[str], when_set: list[str], rule: Callable[[str], str]
) -> dict[str, str]:
    return {key: rule(labels.get(key, "")) for key in keys + [k for k in when_set if labels.get(k)]}


def driver_manager_evict(labels: Mapping[str, str]) -> dict[str, str]:
    """The patch k8s-driver-manager sends before it unloads the driver (a driver upgrade)."""
    return _patch(labels, _DRIVER_MANAGER_EVICTS, _DRIVER_MANAGER_WHEN_SET, driver_manager_paused)


def driver_manager_reschedule(labels: Mapping[str, str]) -> dict[str, str]:
    """The patch it sends once the node is ready for the new driver (also on a fresh node)."""
    return _patch(labels, _DRIVER_MANAGER_RESCHEDULES, _DRIVER_MANAGER_WHEN_SET, driver_manager_true)


def mig_manager_pause(labels: Mapping[str, str]) -> dict[str, str]:
    """The patch mig-manager sends before it changes the MIG layout."""
    return _patch(labels, _MIG_MANAGER, _MIG_MANAGER_WHEN_SET, mig_manager_paused)


def mig_manager_restore(labels: Mapping[str, str]) -> dict[str, str]:
    """The patch it sends once the layout is applied (or the change failed)."""
    return _patch(labels, _MIG_MANAGER, _MIG_MANAGER_WHEN_SET, mig_manager_true)
