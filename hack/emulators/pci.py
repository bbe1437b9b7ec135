"""The GPUs as PCI devices of the emulated host: the driver each is bound to, the vfio-pci module, SR-IOV
virtual functions and the mediated (vGPU) devices on them.

The hardware itself (how many GPUs of which model) is the node's annotations (gpus.py), as NVML's view
is for the container stack. What the sandbox images change is kept as sysfs files of the node's host
(node.py), mirrored and restored with the rest. sysfs is the kernel's: every container of the node sees
the same devices, with or without a /sys mount, so the images read and write it through the node.

* ``/sys/bus/pci/devices/<bdf>/driver``: a symlink to ``../../../bus/pci/drivers/<driver>`` for a GPU
  bound to a driver other than nvidia (vfio-pci); a GPU without one belongs to the nvidia driver while
  its module is loaded (``NodeState.driver``), since nvidia.ko binds every GPU no other driver holds when
  it loads, and to none otherwise. Left implicit so that a container node's mirror lists no symlinks.
* ``/sys/bus/pci/devices/<bdf>/driver_override``: what vfio-manage writes before it binds
  (k8s-driver-manager v0.12.0 internal/nvpassthrough/nvpassthrough.go:271-309).
* ``/sys/module/vfio_pci/refcnt``: the vfio-pci module is loaded, so ``/sys/bus/pci/drivers/vfio-pci``
  exists (nvpassthrough.go:164-196).
* ``/sys/bus/pci/devices/<bdf>/sriov_numvfs``: the virtual functions the vGPU manager enabled
  (``sriov-manage -e ALL``); every simulated GPU has :data:`TOTAL_VFS` of them (``sriov_totalvfs``).
* ``/sys/bus/mdev/devices/<uuid>``: a vGPU device, a symlink into its parent (a virtual function,
  ``../../../devices/pci0000:00/<vf>/<uuid>``), whose ``mdev_type/name`` says its type.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .node import NodeState, Symlink

DEVICES = "/sys/bus/pci/devices"
DRIVERS = "/sys/bus/pci/drivers"
MDEV_DEVICES = "/sys/bus/mdev/devices"
PCI_ROOT = "/sys/devices/pci0000:00"
VFIO_PCI = "vfio-pci"
VFIO_DRIVERS = (VFIO_PCI, "nvgrace_gpu_vfio_pci")
"""The drivers a GPU passed through to a VM is bound to (nvidia-validator main.go:1686-1702, KubeVirt's
plugin device_plugin.go supportedVfioDrivers)."""
VFIO_MODULE = "/sys/module/vfio_pci/refcnt"
NVIDIA = "nvidia"
TOTAL_VFS = 32
# The buses of a DGX H100's eight GPUs; further GPUs get buses after them.
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def addresses(node: NodeState) -> list[str]:
    """The PCI addresses of the node's GPUs, in NVML's order (by bus)."""
    buses = list(_BUSES[: node.gpu_count]) + [0xE0 + i for i in range(max(0, node.gpu_count - len(_BUSES)))]
    return [f"0000:{bus:02x}:00.0" for bus in buses]


def driver(node: NodeState, address: str) -> str:
    """The driver the device is bound to ('' for none)."""
    link = node.read(f"{DEVICES}/{address}/driver")
    if isinstance(link, Symlink):
        return posixpath.basename(link.target)
    return NVIDIA if node.driver is not None else ""


def vfio_loaded(node: NodeState) -> bool:
    return node.read(VFIO_MODULE) is not None


def load_vfio(node: NodeState) -> None:
    """modprobe vfio-pci (linuxutils.KernelModules.Load through the host root)."""
    if not vfio_loaded(node):
        node.write(VFIO_MODULE, "0\n")


def bind(node: NodeState, address: str, name: str) -> None:
    """nvpassthrough bind(): driver_override, then the driver's bind file."""
    node.write(f"{DEVICES}/{address}/driver_override", name)
    node.write(f"{DEVICES}/{address}/driver", Symlink(f"../../../bus/pci/drivers/{name}"))


def unbind(node: NodeState, address: str) -> None:
    """nvpassthrough unbind(): driver_override cleared, the device released by its driver. A GPU the
    nvidia module held goes back to it only when the module is loaded again (no override is left)."""
    node.remove([f"{DEVICES}/{address}/driver_override", f"{DEVICES}/{address}/driver"])


def numvfs(node: NodeState, address: str) -> int:
    value = node.read(f"{DEVICES}/{address}/sriov_numvfs")
    return int(value) if isinstance(value, str) and value.strip().isdigit() else 0


def set_vfs(node: NodeState, enabled: bool) -> None:
    """`sriov-manage -e ALL` / `-d ALL` (the vGPU host driver's /usr/lib/nvidia/sriov-manage): needs the
    nvidia module; disabling also removes the vGPU devices on the virtual functions."""
    for address in addresses(node):
        path = f"{DEVICES}/{address}/sriov_numvfs"
        if enabled:
            node.write(path, f"{TOTAL_VFS}\n")
        else:
            for device in vgpu_devices(node):
                if physical_function(device.parent) == address:
                    remove_vgpu(node, device.uuid)
            node.remove([path])


def virtual_functions(address: str, count: int) -> list[str]:
    """The VF addresses of a GPU: on its own bus, after function 0 (devices 0-3 are the PF's)."""
    domain_bus = address.rsplit(":", 1)[0]
    return [f"{domain_bus}:{(4 + i) // 8:02x}.{(4 + i) % 8}" for i in range(count)]


def physical_function(address: str) -> str:
    return address.rsplit(":", 1)[0] + ":00.0"


def mdev_parents(node: NodeState) -> list[str]:
    """The devices vGPUs can be created on: the enabled virtual functions (SR-IOV GPUs)."""
    return [vf for pf in addresses(node) for vf in virtual_functions(pf, numvfs(node, pf))]


@dataclass(frozen=True)
class VgpuDevice:
    uuid: str
    parent: str
    type_name: str
    """The type's `mdev_type/name` (`NVIDIA H100XM-40C`)."""

    @property
    def vgpu_type(self) -> str:
        return self.type_name.split(" ", 1)[-1]


def vgpu_devices(node: NodeState) -> list[VgpuDevice]:
    """nvmdev GetAllDevices: every entry of /sys/bus/mdev/devices."""
    found = []
    for uuid in node.listdir(MDEV_DEVICES):
        link = node.read(f"{MDEV_DEVICES}/{uuid}")
        if not isinstance(link, Symlink):
            continue
        parent = link.target.rstrip("/").split("/")[-2]
        name = node.read(f"{PCI_ROOT}/{parent}/{uuid}/mdev_type/name")
        found.append(VgpuDevice(uuid, parent, (name if isinstance(name, str) else "").strip()))
    return found


def create_vgpu(node: NodeState, parent: str, uuid: str, type_name: str) -> None:
    """Writing the uuid to the parent's mdev_supported_types/<type>/create."""
    node.write(f"{PCI_ROOT}/{parent}/{uuid}/mdev_type/name", type_name + "\n")
    node.write(f"{MDEV_DEVICES}/{uuid}", Symlink(f"../../../devices/pci0000:00/{parent}/{uuid}"))


def remove_vgpu(node: NodeState, uuid: str) -> None:
    """Writing 1 to the device's remove file."""
    link = node.read(f"{MDEV_DEVICES}/{uuid}")
    paths = [f"{MDEV_DEVICES}/{uuid}"]
    if isinstance(link, Symlink):
        parent = link.target.rstrip("/").split("/")[-2]
        paths.append(f"{PCI_ROOT}/{parent}/{uuid}/mdev_type/name")
    node.remove(paths)
