"""The simulated GPU hardware and drivers: what NVML would report on a node.

Each simulated GPU node carries two annotations written by hack/gen_nodes.py:
``gpu-operator.sim/gpu-model`` (a key of :data:`MODELS`) and ``gpu-operator.sim/gpu-count``.
Nothing else about the hardware is on the node: NFD's PCI label says an NVIDIA device is present,
and GFD (emulated) publishes product, memory, family and MIG capability once it runs, as on a real
cluster. Values are those NVML reports for these products (names as `nvidia-smi -L` prints them);
MIG attributes are those of the profiles' `nvidia-smi mig -lgip` output, rounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MODEL_ANNOTATION = "gpu-operator.sim/gpu-model"
COUNT_ANNOTATION = "gpu-operator.sim/gpu-count"


@dataclass(frozen=True)
class MigProfile:
    name: str
    """The profile as mig-parted and the device plugin name it: `1g.10gb`."""
    max_count: int
    """How many fit on one GPU when only this profile is used."""
    memory_mib: int
    multiprocessors: int
    slices: int
    copy_engines: int
    decoders: int
    jpeg: int
    ofa: int

    def attributes(self) -> dict[str, int]:
        """GFD's MIG attribute labels (k8s-device-plugin v0.20.0 nvml-mig-device.go:37-50)."""
        return {
            "memory": self.memory_mib,
            "multiprocessors": self.multiprocessors,
            "slices.gi": self.slices,
            "slices.ci": self.slices,
            "engines.copy": self.copy_engines,
            "engines.decoder": self.decoders,
            "engines.encoder": 0,
            "engines.jpeg": self.jpeg,
            "engines.ofa": self.ofa,
        }


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    """NVML device name; GFD's `gpu.product` is it sanitised (`NVIDIA-H100-80GB-HBM3`)."""
    memory_mib: int
    compute: tuple[int, int]
    pci_device_id: str
    """As mig-parted's device-filter writes it: 0x<device><vendor>."""
    machine: str
    """/sys/class/dmi/id/product_name of the simulated server."""
    pci_name: str = ""
    """The device's name in the PCI ID database (pci.ids, vendor 10de): what KubeVirt's device plugin
    names its resource after."""
    vgpu_prefix: str = ""
    """The prefix of its time-sliced vGPU types (`H100XM-40C`), as NVIDIA's vGPU configurations name
    them (vgpu-device-manager's default config, device-filter of this device ID)."""
    mig_profiles: tuple[MigProfile, ...] = field(default_factory=tuple)

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    @property
    def device_id(self) -> str:
        """The PCI device ID as sysfs `device` holds it, without 0x (`2330`)."""
        return self.pci_device_id[2:6].lower()

    @property
    def memory_gb(self) -> int:
        """The frame buffer its vGPU types divide (80 GB, 24 GB)."""
        return round(self.memory_mib / 1024 / 8) * 8


H100_80GB = GpuModel(
    key="H100-80GB-HBM3",
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    compute=(9, 0),
    pci_device_id="0x233010DE",
    machine="DGX H100",
    pci_name="GH100 [H100 SXM5 80GB]",
    vgpu_prefix="H100XM",
    mig_profiles=(
        MigProfile("1g.10gb", 7, 9856, 16, 1, 1, 1, 1, 0),
        MigProfile("1g.20gb", 4, 19968, 26, 1, 1, 1, 1, 0),
        MigProfile("2g.20gb", 3, 20096, 32, 2, 2, 2, 2, 0),
        MigProfile("3g.40gb", 2, 40320, 60, 3, 3, 3, 3, 0),
        MigProfile("4g.40gb", 1, 40320, 64, 4, 4, 4, 4, 0),
        MigProfile("7g.80gb", 1, 80896, 132, 7, 7, 7, 7, 1),
    ),
)
L4 = GpuModel(
    key="L4",
    name="NVIDIA L4",
    memory_mib=23034,
    compute=(8, 9),
    pci_device_id="0x27B810DE",
    machine="PowerEdge R760",
    pci_name="AD104GL [L4]",
    vgpu_prefix="L4",
)
MODELS: dict[str, GpuModel] = {m.key: m for m in (H100_80GB, L4)}

# What NVML's cudaDriverVersion reports per driver branch (the newest CUDA the branch supports).
CUDA_BY_BRANCH: dict[int, tuple[int, int]] = {
    525: (12, 0),
    535: (12, 2),
    545: (12, 3),
    550: (12, 4),
    560: (12, 6),
    565: (12, 7),
    570: (12, 8),
    575: (12, 9),
    580: (13, 0),
    590: (13, 1),
    595: (13, 2),
}
# A driver image tagged by branch only (precompiled style: `535-5.15.0-105-generic-ubuntu22.04`)
# installs that branch's newest driver (595 and 610: gpu-driver-container versions.mk:16).
NEWEST_IN_BRANCH: dict[int, str] = {
    535: "535.274.02",
    550: "550.163.01",
    570: "570.195.03",
    580: "580.95.05",
    595: "595.91.07",
    610: "610.57.04",
}
DEFAULT_DRIVER = "595.91.07"
"""What an image whose tag names no version installs (a digest, `latest`): the version the operator's
defaults deploy. A real image knows its own (its DRIVER_VERSION, ubuntu22.04/Dockerfile:50-51)."""


def driver_tag(image: str) -> str:
    """The image's tag ("" if it has none, e.g. only a digest)."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def driver_version(image: str) -> str:
    """The driver version a driver image installs: its tag's leading version (`595.91.07-ubuntu22.04`)."""
    found = re.match(r"(\d+(?:\.\d+)*)", driver_tag(image))
    if not found:
        return DEFAULT_DRIVER
    version = found.group(1)
    if "." not in version:
        branch = int(version)
        return NEWEST_IN_BRANCH.get(branch, f"{branch}.00.00")
    return version


def cuda_version(driver: str) -> tuple[int, int]:
    branch = int(driver.split(".")[0])
    known = [b for b in sorted(CUDA_BY_BRANCH) if b <= branch]
    return CUDA_BY_BRANCH[known[-1]] if known else (11, 0)


def arch_family(major: int, minor: int) -> str:
    """k8s-device-plugin v0.20.0 internal/lm/resource.go:285-316 (getArchFamily)."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 13: "rubin"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major in (10, 12):
        return "blackwell"
    return families.get(major, "undefined")


def sanitise(value: str) -> str:
    """k8s-device-plugin v0.20.0 internal/lm/resource.go:318-326."""
    kept = re.sub(r"[^A-Za-z0-9-_. ]", "", value)
    return "-".join(kept.split())
