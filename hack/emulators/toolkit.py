"""The container toolkit installer, nvidia-container-toolkit v1.20.0 (``nvidia-toolkit``).

cmd/nvidia-ctk-installer/main.go ``Run`` (l.274-338):

1. writes the pid file ``TOOLKIT_PID_FILE`` (default ``/run/nvidia/toolkit/toolkit.pid``, whose base
   name must be ``toolkit.pid``, l.248-262, 340-382);
2. installs the toolkit into ``ROOT``/``TOOLKIT_INSTALL_DIR`` (default ``/usr/local/nvidia``) + ``/toolkit``;
   with ``CDI_ENABLED`` it generates the management CDI spec from the driver at ``DRIVER_ROOT_CTR_PATH``
   (default ``/driver-root``), which is fatal when no driver is there (toolkit/toolkit.go:355-361,
   pkg/nvcdi/management.go:40-52; fidelity reference B5);
3. configures the runtime ``RUNTIME`` (containerd: container/runtime/containerd/containerd.go:34-42):
   the ``nvidia`` runtime goes into the drop-in file ``RUNTIME_DROP_IN_CONFIG`` (default
   ``/etc/containerd/conf.d/99-nvidia.toml``, a path *in the container*) and the top-level config
   ``RUNTIME_CONFIG``/``CONTAINERD_CONFIG`` gets ``imports`` of ``/etc/containerd/conf.d/*.toml``
   (pkg/config/engine/containerd/config_drop_in.go:64-89); then it signals containerd through
   ``RUNTIME_SOCKET``/``CONTAINERD_SOCKET`` (restart mode ``signal``). containerd on the host loads the
   ``nvidia`` handler only if the drop-in landed in the host's ``conf.d`` and the runtime binary the
   drop-in names exists on the host (fidelity reference B4);
4. waits for SIGTERM, then removes the runtime configuration (signalling containerd again) and the
   pid file (l.327-336, 403-409).

Its container has no readiness probe: Ready once started, whatever it is doing.
"""

from __future__ import annotations

import posixpath

from .common import NVML_LIBRARY, flag
from .node import NodeState
from .process import Proc, program

CONF_D = "/etc/containerd/conf.d"
HANDLER_PREFIX = "handler="


def loaded_handlers(node: NodeState) -> set[str]:
    """The runtime handlers containerd loads from the host's configuration at (re)start."""
    if node.runtime != "containerd":
        return set()
    top = node.read("/etc/containerd/config.toml")
    if not isinstance(top, str) or f'"{CONF_D}/*.toml"' not in top:
        return set()
    handlers = set()
    for name in node.listdir(CONF_D):
        content = node.read(f"{CONF_D}/{name}")
        if not isinstance(content, str) or not name.endswith(".toml"):
            continue
        fields = dict(line.split("=", 1) for line in content.splitlines() if "=" in line)
        binary = fields.get("binary", "")
        if fields.get("handler") and binary and node.read(binary) is not None:
            handlers.add(fields["handler"])
    return handlers


@program("nvidia-toolkit", "nvidia-ctk-installer")
async def toolkit(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    fs = proc.fs
    pid_file = env.get("TOOLKIT_PID_FILE") or env.get("PID_FILE") or "/run/nvidia/toolkit/toolkit.pid"
    if posixpath.basename(pid_file) != "toolkit.pid":
        proc.fail(f"error running nvidia-toolkit: invalid toolkit.pid path {pid_file}")
    root = (
        env.get("TOOLKIT_INSTALL_DIR")
        or env.get("ROOT")
        or (argv[1] if len(argv) > 1 else "")
        or "/usr/local/nvidia"
    )
    runtime = env.get("RUNTIME") or "docker"
    config = env.get("RUNTIME_CONFIG") or env.get("CONTAINERD_CONFIG") or "/etc/containerd/config.toml"
    drop_in = env.get("RUNTIME_DROP_IN_CONFIG") or f"{CONF_D}/99-nvidia.toml"
    socket = env.get("RUNTIME_SOCKET") or env.get("CONTAINERD_SOCKET") or "/run/containerd/containerd.sock"
    handler = env.get("NVIDIA_RUNTIME_NAME") or env.get("CONTAINERD_RUNTIME_CLASS") or "nvidia"
    toolkit_dir = f"{root.rstrip('/')}/toolkit"
    fs.write(pid_file, "1\n")
    try:
        if not proc.resumed:
            await proc.work("toolkit")
            for binary in (
                "nvidia-container-runtime",
                "nvidia-container-runtime.cdi",
                "nvidia-cdi-hook",
                "nvidia-ctk",
            ):
                fs.write(f"{toolkit_dir}/{binary}", "")
            if flag(env, "CDI_ENABLED", True):
                driver_root = env.get("DRIVER_ROOT_CTR_PATH") or "/driver-root"
                if not fs.exists(f"{driver_root}/{NVML_LIBRARY}"):
                    proc.fail(
                        "error running nvidia-toolkit: unable to install toolkit: error generating CDI "
                        "specification: "
                        "failed to create management CDI spec: failed to get CDI spec: no NVIDIA device "
                        "nodes found"
                    )
                fs.write(
                    "/var/run/cdi/management.nvidia.com-gpu.yaml",
                    "cdiVersion: 0.5.0\nkind: management.nvidia.com/gpu\n",
                )
            if runtime != "containerd":
                # The emulated nodes run containerd: any other runtime's config is never read.
                proc.out(f"configured {runtime}; this node runs {proc.node.runtime}")
            else:
                # The binary path in the drop-in is the host's: ROOT is mounted at the same path on both.
                fs.write(
                    drop_in, f"{HANDLER_PREFIX}{handler}\nbinary={toolkit_dir}/nvidia-container-runtime\n"
                )
                top = fs.read(config) or "version = 2\n"
                if f'"{CONF_D}/*.toml"' not in top:
                    fs.write(config, f'imports = ["{CONF_D}/*.toml"]\n' + top)
                signal_runtime(proc, socket)
        proc.out("Completed 'setup' for containerd")
        await proc.forever()
    finally:
        # SIGTERM: revert the runtime configuration and remove the pid file (main.go:327-336, 403-409).
        if proc.sigterm and runtime == "containerd" and fs.read(drop_in) is not None:
            fs.remove_glob(drop_in)
            if fs.exists(socket):
                proc.node.set_handlers(loaded_handlers(proc.node))
        if proc.sigterm:
            fs.remove_glob(pid_file)


def signal_runtime(proc: Proc, socket: str) -> None:
    """Restart mode "signal": SIGHUP to containerd through its socket, which must be reachable."""
    if not proc.fs.exists(socket) or proc.fs.host_path(socket) != "/run/containerd/containerd.sock":
        proc.fail(
            "error running nvidia-toolkit: unable to setup runtime: unable to restart containerd: "
            f"unable to dial: dial unix {socket}: connect: no such file or directory"
        )
    proc.node.set_handlers(loaded_handlers(proc.node))
