"""Where the container toolkit finds the container runtime's configuration and socket (pure).

The toolkit installer (nvidia-ctk-installer) adds the `nvidia` runtime to a drop-in file, makes the
runtime's top-level config import it and signals the runtime through its socket. It works with paths
inside its container, so the host directories holding those files are mounted at fixed places.
NVIDIA's operator derives both from the toolkit's env, which is where its docs tell k3s, RKE2 and
MicroK8s users to name their paths (`CONTAINERD_CONFIG`, `CONTAINERD_SOCKET`, `RUNTIME_CONFIG_SOURCE`;
controllers/object_controls.go:1378-1525 and 2589-2651). This module does the same, so a policy written
for NVIDIA's operator configures the same host files.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CONFIG_DIR = "/runtime/config-dir/"
DROP_IN_DIR = "/runtime/config-dir.d/"
SOCKET_DIR = "/runtime/sock-dir/"
NRI_SOCKET_DIR = "/runtime/nri-sock-dir/"
HOST_ROOT_CTR_PATH = "/host"
"""The toolkit container has the host's root filesystem mounted here (read-only)."""
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"


@dataclass(frozen=True)
class _Runtime:
    config: str
    """Host path of the top-level config."""
    config_env: str
    """The runtime-specific variable naming the top-level config (read before RUNTIME_CONFIG)."""
    drop_in: str | None = None
    """Host path of the drop-in file the `nvidia` runtime is written to (docker has none)."""
    socket: str | None = None
    """Host path of the socket the installer signals (CRI-O is restarted through systemd instead)."""
    socket_env: str | None = None


_RUNTIMES = {
    "containerd": _Runtime(
        "/etc/containerd/config.toml",
        "CONTAINERD_CONFIG",
        "/etc/containerd/conf.d/99-nvidia.toml",
        "/run/containerd/containerd.sock",
        "CONTAINERD_SOCKET",
    ),
    "crio": _Runtime("/etc/crio/config.toml", "CRIO_CONFIG", "/etc/crio/crio.conf.d/99-nvidia.conf"),
    "docker": _Runtime(
        "/etc/docker/daemon.json", "DOCKER_CONFIG", None, "/var/run/docker.sock", "DOCKER_SOCKET"
    ),
}

PATH_ENV = tuple(
    sorted(
        {"RUNTIME_CONFIG", "RUNTIME_DROP_IN_CONFIG", "NRI_SOCKET"}
        | {known.config_env for known in _RUNTIMES.values()}
        | {known.socket_env for known in _RUNTIMES.values() if known.socket_env}
    )
)
"""The toolkit's env variables that name host files (`runtime_setup` mounts their directories): the
user's, so the chart's admission policy pins only those volumes' names (hack/operand_pods.py)."""


@dataclass
class RuntimeSetup:
    """Env (set after the user's, which it was derived from), mounts and volumes of the toolkit."""

    env: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def set(self, name: str, value: str) -> None:
        self.env = [e for e in self.env if e["name"] != name] + [{"name": name, "value": value}]

    def mount(self, name: str, container_dir: str, host_dir: str, create: bool) -> None:
        self.mounts.append({"name": name, "mountPath": container_dir})
        host_path: dict[str, str] = {"path": host_dir}
        if create:
            host_path["type"] = "DirectoryOrCreate"
        self.volumes.append({"name": name, "hostPath": host_path})


def runtime_setup(runtime: str, user_env: Mapping[str, str], runtime_class: str, nri: bool) -> RuntimeSetup:
    """The toolkit's runtime env and mounts for one runtime, given the env the user set on it."""
    setup = RuntimeSetup()
    setup.set("RUNTIME", runtime)
    if nri:
        # The installer then runs its no-op runtime configurer and only talks to the NRI socket
        # (object_controls.go:1386-1422): no runtime config or socket is mounted.
        socket = user_env.get("NRI_SOCKET") or DEFAULT_NRI_SOCKET
        setup.set("NRI_SOCKET", NRI_SOCKET_DIR + posixpath.basename(socket))
        setup.mount("nri-socket", NRI_SOCKET_DIR, posixpath.dirname(socket), create=True)
        return setup
    known = _RUNTIMES[runtime]
    if runtime == "containerd":
        setup.set("CONTAINERD_RUNTIME_CLASS", runtime_class)
    config = user_env.get(known.config_env) or user_env.get("RUNTIME_CONFIG") or known.config
    in_container = CONFIG_DIR + posixpath.basename(config)
    setup.set("RUNTIME_CONFIG", in_container)
    setup.set(known.config_env, in_container)
    setup.mount(f"{runtime}-config", CONFIG_DIR, posixpath.dirname(config), create=True)
    drop_in = user_env.get("RUNTIME_DROP_IN_CONFIG") or known.drop_in
    if drop_in and known.drop_in:
        setup.set("RUNTIME_DROP_IN_CONFIG", DROP_IN_DIR + posixpath.basename(drop_in))
        setup.set("RUNTIME_DROP_IN_CONFIG_HOST_PATH", drop_in)
        setup.mount(f"{runtime}-drop-in-config", DROP_IN_DIR, posixpath.dirname(drop_in), create=True)
    sources = user_env.get("RUNTIME_CONFIG_SOURCE")
    if sources:
        setup.set("RUNTIME_CONFIG_SOURCE", ",".join(_in_container(source) for source in sources.split(",")))
    if known.socket and known.socket_env:
        socket = user_env.get(known.socket_env) or known.socket
        in_container = SOCKET_DIR + posixpath.basename(socket)
        setup.set("RUNTIME_SOCKET", in_container)
        setup.set(known.socket_env, in_container)
        setup.mount(f"{runtime}-socket", SOCKET_DIR, posixpath.dirname(socket), create=False)
    return setup


def _in_container(source: str) -> str:
    """`file=/var/snap/.../containerd.toml` is read through the host root mount; `command` stays."""
    kind, _, path = source.partition("=")
    if kind != "file" or not path:
        return source
    return f"file={posixpath.join(HOST_ROOT_CTR_PATH, path.lstrip('/'))}"
