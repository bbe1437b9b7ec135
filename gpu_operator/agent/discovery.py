"""Built-in GPU node discovery: which NVIDIA GPUs a node's sysfs shows, and the NFD labels that says.

`gpu-operator discover` (gpu_operator/agent/node_agent.py) runs this on every node when Node Feature Discovery
is not installed. It sets the labels NFD's `pci` feature source would set for NVIDIA GPUs, under the
same names, so the operator, NVIDIA's tooling and users' node selectors need not know which of the
two found the GPU:

- `feature.node.kubernetes.io/pci-10de.present=true`: NFD as NVIDIA's chart configures it
  (`deviceLabelFields: [vendor]`, NVIDIA gpu-operator deployments/gpu-operator/values.yaml);
- `feature.node.kubernetes.io/pci-<class>_10de.present=true`: NFD's default configuration
  (`deviceLabelFields: [class, vendor]`, node-feature-discovery source/pci/pci.go newDefaultConfig),
  for class 0300 (VGA compatible controller) and 0302 (3D controller). NVIDIA's operator reads all
  three (controllers/state_manager.go gpuNodeLabels).

Like NFD (source/pci/utils.go), a device is what `/sys/bus/pci/devices/<address>/{vendor,class}`
say, the class cut to its first four hex digits; the bound driver does not matter. Other NVIDIA
functions (the HDMI audio function of a graphics card, class 0403; NVSwitch, class 0680) are not
GPUs and set nothing. A GPU bound to `vfio-pci` is passthrough (for a virtual machine): NFD labels
it like any other, and so does this, because NVIDIA's sandbox workflow binds GPUs to vfio-pci
itself (vfio-manager) on nodes that must stay GPU nodes while it does; the agent only logs it.

Pure functions and plain file reads; no API calls (those are the agent's, through kube.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.core.node_labels import NFD_PREFIX

FIELD_MANAGER = "gpu-operator-discovery"
"""The agent's own field manager: its labels are told apart from NFD's and the operator's by it."""
NVIDIA_VENDOR = "10de"
GPU_CLASSES = {"0300": "VGA compatible controller", "0302": "3D controller"}
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci"})
PCI_DEVICES = Path("bus", "pci", "devices")
NFD_FEATURE_LABELS = "nfd.node.kubernetes.io/feature-labels"
"""NFD's master records on each node it labels the labels it manages (an `<instance>.` prefix is
possible, nfd-master -instance)."""
NFD_CRD = "nodefeatures.nfd.k8s-sigs.io"
"""The CRD every NFD release since v0.16 installs (its workers report features through it)."""


class ScanError(Exception):
    """sysfs could not be read at all: nothing may be concluded about the node's devices."""


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor: str
    """Four lowercase hex digits, as NFD labels them (`10de`)."""
    device: str
    pci_class: str
    """Class and subclass, four lowercase hex digits (`0302`); the programming interface is cut."""
    driver: str | None
    """The bound kernel driver (`nvidia`, `vfio-pci`, `nouveau`), None when unbound."""

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class in GPU_CLASSES

    @property
    def passthrough(self) -> bool:
        return self.driver in PASSTHROUGH_DRIVERS

    def describe(self) -> str:
        what = GPU_CLASSES.get(self.pci_class, f"class {self.pci_class}")
        driver = self.driver or "no driver"
        if self.passthrough:
            driver += ": passthrough"
        return f"{self.address} {self.vendor}:{self.device} {what} ({driver})"


def _attribute(device: Path, name: str) -> str:
    return (device / name).read_text().strip().lower().removeprefix("0x")


def read_devices(sysfs: Path) -> list[PciDevice]:
    """Every PCI device under `<sysfs>/bus/pci/devices`, by address.

    A device whose vendor or class cannot be read is left out (NFD does the same); a directory that
    cannot be listed raises ScanError, so that an unmounted or unreadable sysfs never reads as
    "the GPUs are gone".
    """
    root = sysfs / PCI_DEVICES
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise ScanError(f"cannot list {root}: {exc.strerror or exc}") from None
    devices: list[PciDevice] = []
    for name in names:
        path = root / name
        try:
            vendor, device, pci_class = (_attribute(path, a) for a in ("vendor", "device", "class"))
        except OSError:
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(path / "driver"))
        except OSError:
            driver = None
        devices.append(PciDevice(name, vendor, device, pci_class[:4], driver))
    return devices


def gpus(devices: Iterable[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.is_nvidia_gpu]


def pci_labels(devices: Iterable[PciDevice]) -> dict[str, str]:
    """The NVIDIA GPU labels NFD would set for these devices (see the module docstring)."""
    classes = sorted({d.pci_class for d in gpus(devices)})
    if not classes:
        return {}
    keys = [f"{NFD_PREFIX}pci-{NVIDIA_VENDOR}.present"]
    keys += [f"{NFD_PREFIX}pci-{c}_{NVIDIA_VENDOR}.present" for c in classes]
    return dict.fromkeys(keys, "true")


def labels_to_apply(
    found: Mapping[str, str], labels: Mapping[str, str], owned: frozenset[str]
) -> dict[str, str]:
    """The complete label set to apply under FIELD_MANAGER (server-side apply removes what it owned and
    leaves out).

    Add if absent: a label NFD, a person or another tool set is never overwritten, whatever its value,
    and never taken over; the agent keeps and later removes only the labels it added itself.
    """
    return {key: value for key, value in found.items() if key not in labels or key in owned}


def in_place(wanted: Mapping[str, str], labels: Mapping[str, str], owned: frozenset[str]) -> bool:
    """Whether the node already carries exactly `wanted` as the agent's own labels (nothing to write)."""
    return {key: labels[key] for key in owned if key in labels} == dict(wanted)


def labelled_by_nfd(annotations: Mapping[str, str]) -> bool:
    """NFD's master labels this node (it then owns the node's feature labels)."""
    return any(k == NFD_FEATURE_LABELS or k.endswith("." + NFD_FEATURE_LABELS) for k in annotations)
