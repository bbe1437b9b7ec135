"""The seed article's troubleshooting commands (§5.3), filled in with real node, pod and namespace names.

Three levels, as the article runs them: on the node (`nvidia-smi`, `/dev/nvidia*`, the driver
version, containerd's runtimes, the kubelet), in Kubernetes (`kubectl describe node ... | grep -A20
Allocatable`, the operand DaemonSets and logs, `kubectl describe pod`), and in the container
(`nvidia-smi`, `env | grep NVIDIA`). Each finding of `gpu-operator doctor` carries the ones that
narrow its cause down next.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

Level = Literal["node", "kubernetes", "container"]


@dataclass(frozen=True)
class Command:
    level: Level
    where: str
    """The node (level node), the pod as NAMESPACE/NAME (level container), or '' (kubectl)."""
    command: str


def node_access(node: str) -> str:
    """How to get a shell on a node without ssh access."""
    return f"kubectl debug node/{node} -it --profile=sysadmin --image=ubuntu -- chroot /host"


# What to look at on the node, by what is suspected.
_ON_NODE = {
    "driver": (
        "nvidia-smi",
        "cat /proc/driver/nvidia/version",
        "lsmod | grep nvidia",
        "dmesg | grep -i -E 'nvrm|xid'",
    ),
    "container-toolkit": (
        "grep -n -A3 nvidia /etc/containerd/config.toml",
        "ls /usr/local/nvidia/toolkit",
    ),
    "device-plugin": ("nvidia-smi -L", "ls /var/lib/kubelet/device-plugins/"),
    "devices": ("ls -l /dev/nvidia*", "journalctl -u kubelet --since -30m | grep -i -E 'nvidia|device'"),
    "count": ("nvidia-smi -L", "lspci | grep -i nvidia", "dmesg | grep -i xid"),
    "general": ("nvidia-smi", "ls /dev/nvidia*", "cat /proc/driver/nvidia/version"),
}


def on_node(node: str, focus: str = "general") -> list[Command]:
    return [Command("node", node, command) for command in _ON_NODE.get(focus, _ON_NODE["general"])]


def kubectl(*words: str) -> Command:
    return Command("kubernetes", "", "kubectl " + " ".join(shlex.quote(w) for w in words))


def describe_node(node: str) -> Command:
    return Command("kubernetes", "", f"kubectl describe node {shlex.quote(node)} | grep -A20 Allocatable")


def describe_pod(namespace: str, name: str) -> Command:
    return kubectl("describe", "pod", "-n", namespace, name)


def operand_daemonsets(namespace: str) -> Command:
    return kubectl("get", "daemonsets", "-n", namespace)


def logs(namespace: str, pod: str, container: str = "", previous: bool = False) -> Command:
    words = ["logs", "-n", namespace, pod]
    if container:
        words += ["-c", container]
    if previous:
        words.append("--previous")
    return kubectl(*words)


def in_container(namespace: str, pod: str, container: str = "") -> list[Command]:
    """§5.3's container level: does the container see GPUs, and which ones was it given."""
    target = f"-n {shlex.quote(namespace)} {shlex.quote(pod)}" + (
        f" -c {shlex.quote(container)}" if container else ""
    )
    where = f"{namespace}/{pod}"
    return [
        Command("container", where, f"kubectl exec {target} -- nvidia-smi"),
        Command("container", where, f"kubectl exec {target} -- env | grep NVIDIA"),
    ]


def driver_smi(namespace: str, pod: str, container: str) -> Command:
    """nvidia-smi where a containerized driver has it (not on the host's PATH)."""
    return Command(
        "kubernetes",
        "",
        f"kubectl exec -n {shlex.quote(namespace)} {shlex.quote(pod)} -c {shlex.quote(container)} "
        "-- nvidia-smi",
    )
