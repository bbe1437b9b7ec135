"""What is inside the images the operator deploys: shells, binaries and default entrypoints.

The emulators run a container's command only if the image has it, so a pod whose command is not in
its image fails the way containerd fails it (fidelity reference B2: `/bin/bash` in the toolkit
image). NVIDIA's current operand images are distroless with a static busybox that provides
`/bin/sh` and the usual applets, but no bash:

* container-toolkit v1.20.0: deployments/container/Dockerfile:170-176 (distroless since v1.18);
* k8s-device-plugin v0.20.0 (also GFD and config-manager): deployments/container/Dockerfile:54-60,91-94
  (distroless since v0.18.0, Dockerfile:46-47 there);
* k8s-mig-manager v0.15.0: mig-parted deployments/container/Dockerfile:69-74;
* k8s-driver-manager v0.12.0: deployments/container/Dockerfile.distroless:58-70;
* gpu-operator v26.7.0 (operator and validator in one image): docker/Dockerfile:86-124;
* kubevirt-gpu-device-plugin v1.6.0: deployments/container/Dockerfile.distroless:58-84 (NVIDIA's
  distroless Go base; its binary is the CMD);
* vgpu-device-manager v0.5.0: deployments/container/Dockerfile.distroless:33-77 (busybox copied in);
* k8s-cc-manager v0.4.3: deployments/container/Dockerfile.distroless:32-81 (distroless Python with its
  own /bin/rm; ENTRYPOINT python3 /app/main.py);
* nvidia-sandbox-device-plugin v0.0.5 (Kata): deployments/container/Dockerfile.distroless:73-107
  (busybox copied in).

Older tags and the `-ubuntu*`/`-ubi*` flavours are full distributions with bash. The driver and
DCGM images are Ubuntu-based.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .node import Entry

BUSYBOX_APPLETS = (
    "sh", "ash", "cat", "echo", "sleep", "rm", "ls", "stat", "grep", "mkdir", "mv", "ln", "cp",
    "test", "[", "true", "false", "lsmod", "chroot", "touch", "env", "id", "kill", "ps",
)  # fmt: skip
OS_TOOLS = (*BUSYBOX_APPLETS, "bash")


@dataclass(frozen=True)
class Family:
    name: str
    binaries: tuple[str, ...]
    """Executables the image adds (found through PATH)."""
    entrypoint: tuple[str, ...] = ()
    """The image's ENTRYPOINT/CMD, run when the pod gives no command."""
    distroless_since: tuple[int, ...] | None = None
    """First version built distroless + busybox (no bash); None: always a full distribution."""
    env: tuple[tuple[str, str], ...] = ()
    """The image's ENV (a container's env overrides it); what the nvidia runtime reads."""


_CUDA_ENV = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
_DRIVER_INIT = ("nvidia-driver", "init")
_DRIVER_ENV = (
    ("VGPU_LICENSE_SERVER_TYPE", "NLS"),
    ("DISABLE_VGPU_VERSION_CHECK", "true"),
    ("NVIDIA_VISIBLE_DEVICES", "void"),
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # NVIDIA/gpu-driver-container (06a208c, which builds 595.91.07: versions.mk:16): one Dockerfile
        # per OS (ubuntu22.04/Dockerfile:55-65,78,120; precompiled/Dockerfile:20,58,83) gives `driver`;
        # built with DRIVER_TYPE=vgpu it is the vGPU guest driver, which NVIDIA's scripts name
        # `vgpu-guest-driver` (NVAIE: `vgpu-guest-driver-<version>`, gpu-operator
        # scripts/gpu-operator-nvaie.sh:35,47-49); vgpu-manager/ubuntu22.04/Dockerfile:1,48,69 gives
        # the vGPU host driver, `vgpu-manager` in NVIDIA's chart (values.yaml:467).
        Family(
            "driver", ("nvidia-driver",), _DRIVER_INIT, None, (*_DRIVER_ENV, ("DRIVER_TYPE", "passthrough"))
        ),
        Family(
            "vgpu-guest-driver",
            ("nvidia-driver", "vgpu-util"),
            _DRIVER_INIT,
            None,
            (*_DRIVER_ENV, ("DRIVER_TYPE", "vgpu")),
        ),
        Family(
            "vgpu-manager",
            ("nvidia-driver", "nvidia-vgpud", "nvidia-vgpu-mgr"),
            _DRIVER_INIT,
            None,
            _CUDA_ENV,
        ),
        Family("k8s-driver-manager", ("driver-manager", "vfio-manage"), ("driver-manager",), (0, 12, 0)),
        Family(
            "container-toolkit",
            ("nvidia-toolkit", "nvidia-ctk-installer", "nvidia-ctk", "nvidia-container-runtime"),
            ("nvidia-toolkit",),
            (1, 18, 0),
            # deployments/container/Dockerfile:178-180.
            (("NVIDIA_VISIBLE_DEVICES", "void"), ("NVIDIA_DRIVER_CAPABILITIES", "utility")),
        ),
        Family(
            "k8s-device-plugin",
            ("nvidia-device-plugin", "gpu-feature-discovery", "config-manager", "mps-control-daemon"),
            ("nvidia-device-plugin",),
            (0, 18, 0),
            # deployments/container/Dockerfile:62-64.
            (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")),
        ),
        # docker/Dockerfile:88.
        Family(
            "gpu-operator",
            ("gpu-operator", "nvidia-validator", "vectorAdd"),
            ("gpu-operator",),
            (0,),
            (("NVIDIA_VISIBLE_DEVICES", "void"),),
        ),
        Family("gpu-operator-validator", ("nvidia-validator", "vectorAdd"), ("nvidia-validator",)),
        Family(
            "k8s-mig-manager",
            ("nvidia-mig-manager", "nvidia-mig-parted", "nvidia-ctk"),
            ("nvidia-mig-manager",),
            (0, 15, 0),
            # deployments/container/Dockerfile:85-88.
            (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_MIG_CONFIG_DEVICES", "all")),
        ),
        Family(
            "kubevirt-gpu-device-plugin",
            ("nvidia-kubevirt-gpu-device-plugin",),
            ("nvidia-kubevirt-gpu-device-plugin",),
            (0,),
        ),
        Family(
            "vgpu-device-manager",
            ("nvidia-k8s-vgpu-dm", "nvidia-vgpu-dm", "nvidia-mig-parted"),
            ("nvidia-k8s-vgpu-dm",),
            (0,),
        ),
        Family("k8s-cc-manager", ("python3",), ("python3", "/app/main.py"), (0,)),
        Family(
            "nvidia-sandbox-device-plugin",
            ("nvidia-sandbox-device-plugin", "gpu-feature-discovery"),
            ("/usr/bin/nvidia-sandbox-device-plugin",),
            (0,),
        ),
        # CUDA base images: NVIDIA_VISIBLE_DEVICES=all (dcgm-exporter docker/Dockerfile:163-165).
        Family("dcgm", ("nv-hostengine", "dcgmi"), ("nv-hostengine", "-n", "-b", "ALL"), None, _CUDA_ENV),
        Family("dcgm-exporter", ("dcgm-exporter",), ("dcgm-exporter",), None, _CUDA_ENV),
        # NVIDIA's DRA driver image (k8s-dra-driver-gpu): its kubelet plugins and ComputeDomain programs,
        # on a full distribution (its DaemonSet runs `bash -c`).
        Family(
            "dra-driver-nvidia-gpu",
            (
                "gpu-kubelet-plugin",
                "compute-domain-kubelet-plugin",
                "compute-domain-controller",
                "compute-domain-daemon",
            ),
            ("gpu-kubelet-plugin",),
        ),
    )
}
# The seed article's sample names its validator image `k8s-logical-edge-validator`.
ALIASES = {"k8s-logical-edge-validator": "gpu-operator-validator"}
_NVAIE_GUEST_DRIVER = re.compile(r"vgpu-guest-driver(-\d+)+")


def name_of(image: str) -> str:
    """The image's name: the last part of its repository, without tag or digest."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def family(image: str) -> Family | None:
    name = name_of(image)
    if _NVAIE_GUEST_DRIVER.fullmatch(name):
        name = "vgpu-guest-driver"
    return FAMILIES.get(ALIASES.get(name, name))


def _version(image: str) -> tuple[int, ...] | None:
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    found = re.match(r"v?(\d+(?:\.\d+)*)", tag)
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def distroless(image: str) -> bool:
    found = family(image)
    if found is None or found.distroless_since is None:
        return False
    last = image.rsplit("/", 1)[-1]
    if re.search(r"-(ubuntu|ubi|centos|rhel)", last):
        return False
    version = _version(image)
    return version is None or version >= found.distroless_since


def files(image: str) -> dict[str, Entry]:
    """The image's executables as files (content is irrelevant; only existence matters)."""
    found = family(image)
    tools = BUSYBOX_APPLETS if distroless(image) else OS_TOOLS
    result: dict[str, Entry] = {f"/bin/{t}": "" for t in tools}
    for binary in found.binaries if found else ():
        result[f"/usr/bin/{binary}"] = ""
    return result


def env(image: str) -> dict[str, str]:
    found = family(image)
    return dict(found.env) if found else {}


def entrypoint(image: str) -> tuple[str, ...]:
    found = family(image)
    return found.entrypoint if found else ()
