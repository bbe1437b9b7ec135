"""``nvidia-kubevirt-gpu-device-plugin`` of kubevirt-gpu-device-plugin v1.6.0 (the sandbox device plugin's
image, sandboxDevicePlugin.image in NVIDIA's chart values.yaml:530-531; ours
gpu_operator/core/components.py "sandbox-device-plugin").

pkg/device_plugin/device_plugin.go ``InitiateDevicePlugin`` (l.90-97), once at start:

* ``createIommuDeviceMap`` (l.197-262): every PCI device of vendor 10de bound to a VFIO driver
  (``vfio-pci`` or ``nvgrace_gpu_vfio_pci``, l.78-81) is grouped by its device ID;
* ``createVgpuIDMap`` (l.270-305): every mediated device under /sys/bus/mdev/devices is grouped by its
  type's name, whitespace replaced by ``_`` (l.346-357);
* ``createDevicePlugins`` (l.100-178): one plugin per group, registered with the kubelet as
  ``nvidia.com/<name>`` (generic_device_plugin.go:52, 300). A GPU's name is its device's line in the
  image's pci.ids (``getDeviceName`` l.380-425: upper case, ``/`` and ``.`` to ``_``, whitespace to
  ``_``, anything but ``[A-Za-z0-9_.]`` dropped: ``GH100 [H100 SXM5 80GB]`` is
  ``GH100_H100_SXM5_80GB``), else the device ID itself; a vGPU type's name is looked up the same way
  and, never found there, stays as it is (``NVIDIA_H100XM-40C``).

Nothing is rediscovered later: GPUs bound or vGPUs created after it started are advertised only by its
next start (the sandbox device plugin comes after the sandbox validator found them ready). The
plugins' sockets go with the container, and their resources with them.
"""

from __future__ import annotations

import re
from collections import Counter

from . import gpus, pci
from .node import NodeState
from .process import Proc, program

NAMESPACE = "nvidia.com"
PLUGIN = "kubevirt-gpu-device-plugin"


def device_name(pci_name: str) -> str:
    """getDeviceName's transform of a pci.ids device name (device_plugin.go:408-418)."""
    name = pci_name.strip().upper().replace("/", "_").replace(".", "_")
    name = re.sub(r"\s+", "_", name)
    return re.sub(r"[^a-zA-Z0-9_.]+", "", name)


def _pci_ids_name(device_id: str) -> str:
    """The device's name in pci.ids, '' when the database has no such NVIDIA device."""
    model = next((m for m in gpus.MODELS.values() if m.device_id == device_id), None)
    return device_name(model.pci_name) if model and model.pci_name else ""


def advertised(node: NodeState) -> dict[str, int]:
    """The resources the plugin registers for the node's devices as they are now."""
    passthrough: Counter[str] = Counter()
    if node.model is not None:
        for address in pci.addresses(node):
            if pci.driver(node, address) in pci.VFIO_DRIVERS:
                passthrough[node.model.device_id] += 1
    resources = {
        f"{NAMESPACE}/{_pci_ids_name(device) or device}": count for device, count in passthrough.items()
    }
    vgpus = Counter(re.sub(r"\s+", "_", d.type_name) for d in pci.vgpu_devices(node))
    for name, count in vgpus.items():
        resources[f"{NAMESPACE}/{name}"] = resources.get(f"{NAMESPACE}/{name}", 0) + count
    return resources


@program("nvidia-kubevirt-gpu-device-plugin")
async def kubevirt_device_plugin(proc: Proc, argv: tuple[str, ...]) -> None:
    resources = advertised(proc.node)
    for name, count in sorted(resources.items()):
        proc.out(f"DP Name {name.removeprefix(NAMESPACE + '/')}: {count} devices")
        proc.out(f"{name.removeprefix(NAMESPACE + '/')} Device plugin server ready")
    proc.node.set_resources(resources, PLUGIN)
    try:
        await proc.forever()
    finally:
        if proc.sigterm or not proc.emu.stopping:
            proc.node.set_resources({}, PLUGIN)
