"""The driver container: the ``nvidia-driver`` script of NVIDIA's driver images.

Read at NVIDIA/gpu-driver-container ``06a208c``, the main branch that builds the 595.91.07 images the
operator's defaults deploy (versions.mk:16). The image decides which script runs (images.py names the
images; a branch-only tag is a precompiled image):

* **driver** (ubuntu22.04/nvidia-driver), also the vGPU guest driver (the same Dockerfile built with
  ``DRIVER_TYPE=vgpu``). ``init`` (l.790-847): takes the PID-file lock, so a second driver container on
  a node exits (l.798-802); skips the module reload when the loaded driver recorded this
  ``DRIVER_CONFIG_DIGEST`` (l.738-744, 810-822); otherwise unloads the modules, which fails while the
  GPUs are in use (l.488-496, 825), installs, resolves the kernel module type from
  ``KERNEL_MODULE_TYPE`` (l.593-614; an invalid value exits 1), loads, starts the daemons (the vGPU
  guest's licensing, l.690-704), publishes its root under ``/run/nvidia/driver`` and records the digest.
* **precompiled** (ubuntu22.04/precompiled/nvidia-driver, tag ``<branch>-<kernel>-<os>``): resolves the
  kernel module type first (l.452-454), then as above without the reload shortcut or the digest
  (l.455-485).
* **vgpu-manager** (vgpu-manager/ubuntu22.04/nvidia-driver): the vGPU host driver; no lock, no digest,
  no module type choice (l.313-347); once loaded it enables the GPUs' SR-IOV virtual functions
  (``_enable_vfs``, l.216-233: ``sriov-manage -e ALL``), which its shutdown disables again before it
  unloads (l.236-247, 292-299), taking the vGPU devices on them along (pci.py). Its pod (the vGPU
  manager's, or an NVIDIADriver's of driverType vgpu-host-manager) has no startup probe, so it is Ready
  once it runs.

Each script parses its arguments with util-linux getopt under ``set -e``, so an option it does not know
exits 1 with getopt's message, and a command it does not know prints the usage and exits 1: the
NVIDIADriver's ``args`` follow ``init`` (NVIDIA's manifests/state-driver/0500_daemonset.yaml:212-216).
The container becomes Ready through its startup probe, whose script writes
``/run/nvidia/validations/.driver-ctr-ready`` once nvidia-smi works (ours:
driver/0300_configmap_startup_probe.yaml.j2; NVIDIA: assets/state-driver/0400_configmap.yaml); on
SIGTERM it unloads the modules unless the GPUs are in use; the preStop hook removes the file. The
loaded modules say what they are in ``/proc/driver/nvidia/version`` (open or proprietary), in the
node's mirror ConfigMap. The RDMA sidecar runs ``reload_nvidia_peermem``, which waits for MOFED;
emulated nodes have none, so it waits for good and its probe passes (l.913-958), as on a node whose
MOFED is not up.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import gpus, pci
from .common import NVIDIA_SMI, NVML_LIBRARY
from .driver import PID_FILE, READY_FILE, STATE_FILE, gpus_in_use
from .images import family
from .node import DRIVER_ROOT, MODULE_VERSION
from .process import ContainerExit, Proc, program

DAEMONS_STATUS_FILE = "/run/nvidia/validations/.driver-daemons-status"
MOFED_READY_FILE = "/run/mellanox/drivers/.driver-ready"
PEERMEM_POLL_S = 10.0


@dataclass(frozen=True)
class Script:
    """One image's ``nvidia-driver``: its commands with their getopt options (short, long)."""

    kind: str
    commands: Mapping[str, tuple[str, tuple[str, ...]]]
    checks_leftovers: bool = True
    """The script calls usage when arguments are left after the options (the precompiled one does not)."""

    def usage(self) -> str:
        return f"Usage: nvidia-driver COMMAND [ARG...]; commands: {', '.join(self.commands)}"


_NO_OPTIONS = ("", ())
SCRIPTS = {
    s.kind: s
    for s in (
        # ubuntu22.04/nvidia-driver:975-1005.
        Script(
            "driver",
            {
                "init": ("am:", ("accept-license", "max-threads:")),
                "update": ("k:s:t:m:", ("kernel:", "sign:", "tag:", "max-threads:")),
                "reload_nvidia_peermem": _NO_OPTIONS,
                "probe_nvidia_peermem": _NO_OPTIONS,
            },
        ),
        # ubuntu22.04/precompiled/nvidia-driver:549-563 (no `update`, no check of what is left).
        Script(
            "precompiled",
            {
                "init": ("a", ("accept-license",)),
                "reload_nvidia_peermem": _NO_OPTIONS,
                "probe_nvidia_peermem": _NO_OPTIONS,
            },
            checks_leftovers=False,
        ),
        # vgpu-manager/ubuntu22.04/nvidia-driver:363-395.
        Script(
            "vgpu-manager",
            {
                "init": ("a", ("accept-license",)),
                "build": ("a:t", ("accept-license", "tag:")),
                "load": _NO_OPTIONS,
                "update": ("k:s:t:", ("kernel:", "sign:", "tag:")),
            },
        ),
    )
}


def script_of(image: str) -> Script:
    """The script an image runs: vgpu-manager's, the precompiled one (its tag names a branch only:
    `595-5.15.0-105-generic-ubuntu22.04`) or the driver's."""
    found = family(image)
    if found is not None and found.name == "vgpu-manager":
        return SCRIPTS["vgpu-manager"]
    return SCRIPTS["precompiled" if re.match(r"\d+-", gpus.driver_tag(image)) else "driver"]


class GetoptError(Exception):
    """getopt's complaint (it exits non-zero, and the script with it under `set -e`)."""


def getopt(short: str, longs: Sequence[str], args: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """util-linux getopt as the scripts call it: the options (by name, with their values) and the
    arguments left; long options may be abbreviated, non-options are moved after the options."""
    takes_value = {m[0]: m.endswith(":") for m in re.findall(r"\w:?", short)}
    long_value = {name.rstrip(":"): name.endswith(":") for name in longs}
    found: list[tuple[str, str]] = []
    left: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            left += rest
            break
        if arg.startswith("--"):
            name, has_value, value = arg[2:].partition("=")
            matches = [n for n in long_value if n == name] or [n for n in long_value if n.startswith(name)]
            if len(matches) != 1:
                raise GetoptError(
                    f"option '{arg}' is ambiguous" if matches else f"unrecognized option '{arg}'"
                )
            option = matches[0]
            if long_value[option] and not has_value:
                if not rest:
                    raise GetoptError(f"option '--{option}' requires an argument")
                value = rest.pop(0)
            elif has_value and not long_value[option]:
                raise GetoptError(f"option '--{option}' doesn't allow an argument")
            found.append((option, value))
        elif arg.startswith("-") and arg != "-":
            letters = arg[1:]
            while letters:
                letter, letters = letters[0], letters[1:]
                if letter not in takes_value:
                    raise GetoptError(f"invalid option -- '{letter}'")
                if not takes_value[letter]:
                    found.append((letter, ""))
                    continue
                if not letters and not rest:
                    raise GetoptError(f"option requires an argument -- '{letter}'")
                found.append((letter, letters or rest.pop(0)))
                letters = ""
        else:
            left.append(arg)
    return found, left


def parse(script: Script, argv: Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    """The command and its options, or ContainerExit(1) as the script exits (usage or getopt's error)."""
    if not argv or argv[0] not in script.commands:
        raise ContainerExit(1, script.usage())
    short, longs = script.commands[argv[0]]
    try:
        options, left = getopt(short, longs, argv[1:])
    except GetoptError as exc:
        raise ContainerExit(1, f"getopt: {exc}") from exc
    if left and script.checks_leftovers:
        raise ContainerExit(1, script.usage())
    return argv[0], options


def kernel_type(module_type: str, branch: int) -> str:
    """_resolve_kernel_type (ubuntu22.04/nvidia-driver:593-614): `kernel-open` or `kernel`. For `auto`
    the installer recommends; emulated GPUs are Turing or newer, where it recommends what the
    fallback does: open modules from branch 560 on."""
    if module_type == "proprietary":
        return "kernel"
    if module_type == "open":
        return "kernel-open"
    if module_type == "auto":
        return "kernel-open" if branch >= 560 else "kernel"
    raise ContainerExit(1, f"invalid value for the KERNEL_MODULE_TYPE variable: {module_type}")


def module_version_line(version: str, modules: str | None) -> str:
    """/proc/driver/nvidia/version's first line, which says whether the open modules are loaded."""
    flavour = "Open Kernel Module for x86_64" if modules == "kernel-open" else "x86_64 Kernel Module"
    return f"NVRM version: NVIDIA UNIX {flavour}  {version}  Release Build\n"


ALREADY_RUNNING = "An instance of the NVIDIA driver is already running, aborting"
_LOCKS: dict[str, Proc] = {}
"""Per node, the driver container holding /run/nvidia/nvidia-driver.pid's flock."""


def take_lock(proc: Proc) -> None:
    """`exec 3> ${PID_FILE}; flock -n 3` (l.798-803): held while the container runs."""
    holder = _LOCKS.get(proc.node.name)
    if holder is not None and holder is not proc and holder.runner.procs.get(holder.spec.name) is holder:
        raise ContainerExit(1, ALREADY_RUNNING)
    _LOCKS[proc.node.name] = proc
    proc.fs.write(PID_FILE, "1\n")


class DriverContainer:
    """One run of ``nvidia-driver init``."""

    def __init__(self, proc: Proc, script: Script) -> None:
        self.proc = proc
        self.script = script
        self.version = gpus.driver_version(proc.spec.image)
        self.branch = int(self.version.split(".")[0])
        self.env = proc.env
        self.trapped = False
        """The EXIT trap (`_shutdown`) is set: from here on a failure unloads what it can."""

    def modules(self) -> str:
        return kernel_type(self.env.get("KERNEL_MODULE_TYPE", "auto"), self.branch)

    async def unload(self) -> None:
        """_unload_driver: rmmod fails while anything uses the GPUs (l.488-496)."""
        if self.proc.node.driver is None:
            return
        if await gpus_in_use(self.proc, exclude_driver=True):
            raise ContainerExit(
                1,
                "Previous NVIDIA driver installation cannot be removed. Exiting"
                if self.script.kind == "vgpu-manager"
                else "Could not unload NVIDIA driver kernel modules, driver is in use",
            )
        self.proc.out("Unloading NVIDIA driver kernel modules...")
        self.proc.node.set_driver(None)

    async def load(self, modules: str | None) -> None:
        """Build or install the modules (the profile's `driver` time) and load them."""
        await self.proc.work("driver")
        self.proc.node.set_driver(self.version)
        self.proc.node.write(MODULE_VERSION, module_version_line(self.version, modules))

    def mount_rootfs(self) -> None:
        """_mount_rootfs: the driver's root filesystem under /run/nvidia/driver."""
        for path in (NVML_LIBRARY, NVIDIA_SMI):
            self.proc.fs.write(f"{DRIVER_ROOT}/{path}", self.version)

    def reload_skippable(self) -> bool:
        """_should_skip_kernel_module_reload (l.738-744)."""
        digest = self.env.get("DRIVER_CONFIG_DIGEST", "")
        stored = self.proc.fs.read(STATE_FILE)
        return self.proc.node.driver is not None and bool(digest) and (stored or "").strip() == digest

    def store_digest(self) -> None:
        digest = self.env.get("DRIVER_CONFIG_DIGEST", "")
        self.proc.fs.write(STATE_FILE, digest + "\n")

    def start_daemons(self) -> None:
        """_start_daemons (l.686-734): the vGPU guest's licensing files are copied, failing softly (the
        function runs in a `||` list, where `set -e` does not apply), then the daemons report Ready."""
        if self.env.get("DRIVER_TYPE") == "vgpu":
            if not self.mounted("/drivers/gridd.conf"):
                self.proc.out("cp: cannot stat '/drivers/gridd.conf': No such file or directory")
            tokens = "/drivers/ClientConfigToken"
            if self.env.get("VGPU_LICENSE_SERVER_TYPE") == "NLS" and not self.mounted(tokens):
                self.proc.out(f"cp: cannot stat '{tokens}/*': No such file or directory")
            self.proc.out("Starting nvidia-gridd..")
        self.proc.fs.write(DAEMONS_STATUS_FILE, "Ready\n")

    def mounted(self, path: str) -> bool:
        """Whether the pod mounts it (a Secret's content is not emulated: mounted is enough)."""
        where = self.proc.fs.where(path)
        return self.proc.fs.exists(path) or (where.volume is not None and where.volume.kind == "secret")

    async def install(self) -> None:
        """init up to `_wait_for_signal`, per script."""
        if self.script.kind == "vgpu-manager":
            await self.install_vgpu_manager()
        elif self.script.kind == "precompiled":
            await self.install_precompiled()
        else:
            await self.install_driver()
        self.proc.out("Done, now waiting for signal")

    async def install_driver(self) -> None:
        """ubuntu22.04/nvidia-driver:790-847."""
        proc = self.proc
        if self.env.get("DRIVER_TYPE") == "vgpu" and self.env.get("DISABLE_VGPU_VERSION_CHECK") == "true":
            proc.out("vgpu version compatibility check is disabled")
        proc.out(f"Starting installation of NVIDIA driver version {self.version}")
        take_lock(proc)
        self.trapped = True
        proc.fs.write(DAEMONS_STATUS_FILE, "NotReady\n")
        if self.reload_skippable():
            proc.out(
                "The NVIDIA driver is already loaded with the desired configuration, performing "
                "userspace-only install"
            )
            self.modules()
            self.start_daemons()
            self.mount_rootfs()
            self.store_digest()
            return
        await self.unload()
        modules = self.modules()
        proc.out(f"Installing NVIDIA driver kernel modules ({modules})...")
        await self.load(modules)
        self.start_daemons()
        self.mount_rootfs()
        self.store_digest()

    async def install_precompiled(self) -> None:
        """ubuntu22.04/precompiled/nvidia-driver:452-485: no digest, no daemons status."""
        proc = self.proc
        modules = self.modules()
        proc.out(f"Starting installation of NVIDIA driver branch {self.branch}")
        take_lock(proc)
        self.trapped = True
        await self.unload()
        flavour = "Open" if modules == "kernel-open" else "Closed"
        proc.out(f"Installing {flavour} NVIDIA driver kernel modules...")
        await self.load(modules)
        self.mount_rootfs()

    async def install_vgpu_manager(self) -> None:
        """vgpu-manager/ubuntu22.04/nvidia-driver:313-347."""
        self.trapped = True
        await self.unload()
        await self.load(None)
        self.mount_rootfs()
        pci.set_vfs(self.proc.node, True)

    async def shutdown(self) -> None:
        """_shutdown (the EXIT trap and SIGTERM): unload unless the GPUs are in use, then unmount."""
        proc = self.proc
        if not self.trapped or await gpus_in_use(proc, exclude_driver=True):
            return
        if self.script.kind == "vgpu-manager":
            pci.set_vfs(proc.node, False)
        proc.node.set_driver(None)
        host = proc.fs.host_path(DRIVER_ROOT)
        if host:
            proc.node.remove_tree(host)
        if self.script.kind != "vgpu-manager":
            proc.fs.remove_glob(PID_FILE)


@program("nvidia-driver")
async def nvidia_driver(proc: Proc, argv: tuple[str, ...]) -> None:
    script = script_of(proc.spec.image)
    try:
        command, _ = parse(script, argv[1:])
    except ContainerExit as exc:
        proc.out(exc.message)
        raise
    if command == "reload_nvidia_peermem":
        await reload_peermem(proc, script)
    elif command == "probe_nvidia_peermem":
        proc.out("MOFED drivers are not ready, skipping probe to avoid container restarts...")
    elif command != "init":
        proc.out("Done" if script.kind == "driver" else f"{command}() not implemented")
    else:
        await init(proc, script)


async def init(proc: Proc, script: Script) -> None:
    container = DriverContainer(proc, script)
    probe = proc.spec.startup_probe
    proc.set_ready(probe is None)
    try:
        if not proc.resumed:
            await container.install()
        elif script.kind != "vgpu-manager":
            take_lock(proc)
        container.trapped = True
    except ContainerExit as exc:
        proc.out(exc.message)
        await container.shutdown()
        raise
    if probe is not None:
        await _startup_probe(proc)
    try:
        await proc.forever()
    finally:
        # SIGTERM: the TERM trap unloads the modules unless they are in use.
        if proc.sigterm:
            await container.shutdown()


async def reload_peermem(proc: Proc, script: Script) -> None:
    """reload_nvidia_peermem (l.913-945): waits for MOFED (and the driver), then loads nvidia-peermem."""
    host_mofed = proc.env.get("USE_HOST_MOFED", "false") == "true"

    async def mofed_and_driver() -> bool | None:
        # With the host's MOFED the script asks lsmod for mlx5_core, which no emulated node loads.
        mofed = not host_mofed and proc.fs.exists(MOFED_READY_FILE)
        # The precompiled script waits for the module (its /sys is the host's), the other for the probe.
        driver = proc.fs.exists(READY_FILE) if script.kind == "driver" else proc.node.driver is not None
        return True if mofed and driver else None

    proc.out("waiting for mellanox ofed and nvidia drivers to be installed")
    await proc.poll(mofed_and_driver, PEERMEM_POLL_S)
    proc.out("successfully loaded nvidia-peermem module, now waiting for signal")
    await proc.forever()


async def _startup_probe(proc: Proc) -> None:
    """The startup probe runs until the module is loaded, the daemons report Ready (if they report)
    and nvidia-smi works; its script writes .driver-ctr-ready."""
    probe = proc.spec.startup_probe
    assert probe is not None
    delay = proc.profile.probe_delay(probe.initial_delay)
    while True:
        wait = proc.started + delay - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
        daemons = (proc.fs.read(DAEMONS_STATUS_FILE) or "Ready").strip()
        if proc.node.driver is not None and daemons == "Ready":
            break
        await proc.wait_next(probe.period)
    script_path = next((a for a in probe.command if a.endswith(".sh")), "")
    script = proc.fs.read(script_path) if script_path else None
    if script and ".driver-ctr-ready" in script:
        flags = "".join(
            f"{k}: {proc.env.get(k, 'false')}\n"
            for k in ("GDRCOPY_ENABLED", "GDS_ENABLED", "GPU_DIRECT_RDMA_ENABLED")
        )
        proc.fs.write(READY_FILE, flags)
    proc.set_ready(True)
