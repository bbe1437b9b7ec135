"""``nvidia-sandbox-device-plugin`` v0.0.5 (the Kata sandbox device plugin's image,
kataSandboxDevicePlugin.image in NVIDIA's chart values.yaml:543-544; ours
gpu_operator/core/components.py "kata-sandbox-device-plugin"; ENTRYPOINT
deployments/container/Dockerfile.distroless:107).

cmd/main.go: ``P_GPU_ALIAS`` (unset: ``pgpu``) names the GPUs' resource, ``NVSWITCH_ALIAS`` the
NVSwitches' (the simulated nodes have none). pkg/device_plugin/device_plugin.go, once at start:

* ``createIommuDeviceMap`` (l.153-223): every GPU bound to ``vfio-pci`` (that driver only), one device
  per IOMMU group (each simulated GPU has its own);
* ``GenerateCDISpec`` (cdi.go:60-229): a CDI spec of kind ``nvidia.com/<alias>`` (cdiVersion 0.5.0) in
  ``/var/run/cdi`` (``nvidia.com-<alias>.yaml``), each device ``/dev/vfio/vfio`` and ``/dev/vfio/<group>``
  (the simulated hosts have no ``/dev/iommu``, so no IOMMUFD);
* ``createDevicePlugins`` (l.81-146): ``nvidia.com/<alias>``, or with an empty alias the device's name
  (``formatDeviceName`` l.255-272: as KubeVirt's plugin, but hyphens kept and dots dropped).

Like KubeVirt's, it discovers nothing later; its resources go with its container.
"""

from __future__ import annotations

import re

import yaml

from . import pci
from .kubevirt_device_plugin import NAMESPACE
from .node import NodeState
from .process import Proc, program

PLUGIN = "nvidia-sandbox-device-plugin"
CDI_ROOT = "/var/run/cdi"
CDI_VERSION = "0.5.0"


def format_name(name: str) -> str:
    """formatDeviceName (device_plugin.go:255-272)."""
    name = name.upper().replace("/", "_").replace(".", "_")
    name = re.sub(r"\s+", "_", name)
    return re.sub(r"[^a-zA-Z0-9_-]+", "", name)


def groups(node: NodeState) -> list[str]:
    """The IOMMU groups of the GPUs bound to vfio-pci (a GPU's group: its index)."""
    return [str(i) for i, a in enumerate(pci.addresses(node)) if pci.driver(node, a) == pci.VFIO_PCI]


def advertised(node: NodeState, alias: str) -> dict[str, int]:
    found = groups(node)
    if not found or node.model is None:
        return {}
    name = alias or format_name(node.model.name) or node.model.device_id
    return {f"{NAMESPACE}/{name}": len(found)}


def cdi_spec(node: NodeState, alias: str) -> dict[str, object]:
    devices = [
        {
            "name": g,
            "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/vfio"}, {"path": f"/dev/vfio/{g}"}]},
        }
        for g in groups(node)
    ]
    return {"cdiVersion": CDI_VERSION, "kind": f"{NAMESPACE}/{alias}", "devices": devices}


@program("nvidia-sandbox-device-plugin")
async def kata_device_plugin(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    alias = env.get("P_GPU_ALIAS", "pgpu")  # set but empty: the devices' own names
    node = proc.node
    if not groups(node):
        proc.out("No devices discovered, skipping CDI spec generation")
    elif alias:
        path = f"{CDI_ROOT}/{NAMESPACE}-{alias}.yaml"
        if not proc.fs.write(path, yaml.safe_dump(cdi_spec(node, alias), sort_keys=False)):
            proc.out(f"failed to generate GPU CDI spec: failed to save CDI spec {NAMESPACE}-{alias}")
        else:
            proc.out(f"Generated CDI spec: {NAMESPACE}-{alias} with {len(groups(node))} devices")
    resources = advertised(node, alias)
    for name, count in resources.items():
        proc.out(f'Registering device plugin "{name.removeprefix(NAMESPACE + "/")}" with {count} device(s)')
    node.set_resources(resources, PLUGIN)
    try:
        await proc.forever()
    finally:
        if proc.sigterm or not proc.emu.stopping:
            node.set_resources({}, PLUGIN)
