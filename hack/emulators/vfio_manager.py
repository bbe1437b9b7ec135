"""``vfio-manage`` of k8s-driver-manager v0.12.0 (the VFIO manager's image, vfioManager.image in NVIDIA's
chart values.yaml:502-503; ours gpu_operator/core/components.py `_DRIVER_MANAGER`).

The VFIO manager's container runs ``vfio-manage bind --all`` and then sleeps; its preStop runs
``vfio-manage unbind --all`` (manifests/templates/vfio-manager/0500_daemonset.yaml.j2, NVIDIA's
assets/state-vfio-manager/0500_daemonset.yaml). cmd/vfio-manage:

* flags (bind.go:64-99, unbind.go:62-73): ``--all`` or ``--device-id``, not both, else the urfave/cli
  error and exit 1 (logrus Fatal, main.go:45-47); ``--host-root`` / ``HOST_ROOT`` (default ``/``);
* ``bind --all`` (bind.go:125-149): every NVIDIA GPU (nvpci GetGPUs), each bound to its best VFIO
  driver (internal/nvpassthrough/nvpassthrough.go:147-229): the emulated hosts' modules.alias names no
  variant driver for these GPUs, so ``vfio-pci``, loaded first with ``chroot <host-root> modprobe``
  (internal/linuxutils/kmod.go:113-122), then unbound from its driver and bound (driver_override, the
  driver's bind file). A device that fails is a warning, the command still exits 0;
* ``unbind --all`` (unbind.go:114-135): every GPU released by its driver, driver_override cleared.

The kernel side is :mod:`.pci` (sysfs through the node).
"""

from __future__ import annotations

from . import pci
from .process import Proc, program


def _options(proc: Proc, argv: tuple[str, ...]) -> tuple[str, bool, str]:
    """(command, --all, --device-id) as urfave/cli parses them; exits 1 as the binary does."""
    if len(argv) < 2 or argv[1] not in ("bind", "unbind"):
        proc.fail(f"No help topic for '{argv[1] if len(argv) > 1 else ''}'", code=3)
    command, rest = argv[1], list(argv[2:])
    every, device = False, ""
    while rest:
        word = rest.pop(0)
        if word in ("--all", "-a"):
            every = True
        elif word in ("--device-id", "-d") and rest:
            device = rest.pop(0)
        elif word.startswith("--device-id="):
            device = word.split("=", 1)[1]
    if not every and not device:
        proc.fail("level=fatal msg=either --all or --device-id must be specified")
    if every and device:
        proc.fail("level=fatal msg=cannot specify both --all and --device-id")
    return command, every, device


@program("vfio-manage")
async def vfio_manage(proc: Proc, argv: tuple[str, ...]) -> None:
    command, every, device = _options(proc, argv)
    node = proc.node
    devices = pci.addresses(node) if every else [device]
    if device and device not in pci.addresses(node):
        proc.out(f"level=info msg=Device {device} is not an NVIDIA device")
        return
    if command == "unbind":
        for address in devices:
            proc.out(f"level=info msg=Unbinding device {address}")
            pci.unbind(node, address)
        return
    host_root = proc.env.get("HOST_ROOT") or "/"
    for address in devices:
        proc.out(f"level=info msg=Binding device {address}")
        if host_root != "/" and not proc.fs.is_dir(host_root):
            proc.out(
                f'level=warning msg=Failed to bind device {address}: failed to load "vfio-pci" driver: '
                f"chroot: cannot change root directory to '{host_root}': No such file or directory"
            )
            continue
        pci.load_vfio(node)
        proc.out(f"level=info msg=Binding device {address} to driver: {pci.VFIO_PCI}")
        if pci.driver(node, address) != pci.VFIO_PCI:
            pci.bind(node, address, pci.VFIO_PCI)
