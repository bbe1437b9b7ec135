"""k8s-device-plugin v0.20.0: ``nvidia-device-plugin`` and its ``config-manager``.

**nvidia-device-plugin** (cmd/nvidia-device-plugin/main.go ``start``/``startPlugins`` l.268-420):
loads its config (``CONFIG_FILE``; a missing file is fatal: *unable to load config: unable to finalize
config: unable to parse config file: error opening config file: open ...*, api/config/v1/config.go:45-54,
98-104, fidelity reference B9), initialises NVML from the driver root (``CONTAINER_DRIVER_ROOT`` /
``DRIVER_ROOT_CTR_PATH``, default ``/driver-root``; with ``FAIL_ON_INIT_ERROR`` a failure is fatal,
without it the plugin waits forever), then registers one resource per MIG strategy
(``MIG_STRATEGY``: ``none`` full GPUs as ``nvidia.com/gpu``; ``single`` every MIG device as
``nvidia.com/gpu`` when all GPUs carry one MIG profile; ``mixed`` ``nvidia.com/mig-<profile>`` per
profile plus non-MIG GPUs as ``nvidia.com/gpu``). Time-slicing (``sharing.timeSlicing.resources``)
advertises ``replicas`` devices per GPU, renamed ``<name>.shared`` with ``renameByDefault``
(api/config/v1/replicas.go:36-60). SIGHUP reloads everything (main.go:327-334). The kubelet then
reports the registered resources in the node's capacity, and ``0`` for a resource whose plugin went.

**config-manager** (cmd/config-manager/main.go l.230-480): watches the node label ``NODE_LABEL``,
picks the config named by it, else ``DEFAULT_CONFIG``, else ``FALLBACK_STRATEGIES`` (``named``: a config
called ``default``; ``single``: the only one; ``empty``), links ``CONFIG_FILE_DST`` to
``CONFIG_FILE_SRCDIR/<name>`` and, unless ``ONESHOT``, sends ``SIGNAL`` to the process named
``PROCESS_TO_SIGNAL``, found through ``/proc`` (it needs ``shareProcessNamespace``).
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from typing import Any

import yaml

from .common import flag, node_label, nvml_error
from .node import MigGpu, NodeState, Symlink
from .process import Proc, program

JSON = dict[str, Any]
GPU = "nvidia.com/gpu"


class InvalidMig(Exception):
    pass


def parse_config(text: str | None) -> JSON:
    if not text:
        return {}
    loaded = yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else {}


def load_config(proc: Proc, path: str, context: str = "") -> JSON:
    """spec.NewConfig: the config file, when one is given, must open (config.go:45-54, 98-104)."""
    if not path:
        return {}
    text = proc.fs.read(path)
    if text is None:
        proc.fail(
            f"{context}unable to load config: unable to finalize config: unable to parse config file: "
            f"error opening config file: open {path}: no such file or directory"
        )
    return parse_config(text)


def time_slicing(config: JSON) -> tuple[dict[str, int], bool]:
    """Replicas per resource name and renameByDefault, from a device-plugin config."""
    sharing = ((config.get("sharing") or {}).get("timeSlicing")) or {}
    replicas = {str(r.get("name")): int(r.get("replicas") or 1) for r in sharing.get("resources") or []}
    return replicas, bool(sharing.get("renameByDefault"))


def mig_strategy(env: dict[str, str], config: JSON) -> str:
    return str(((config.get("flags") or {}).get("migStrategy")) or env.get("MIG_STRATEGY") or "none")


def base_resources(node: NodeState, strategy: str) -> dict[str, int]:
    """Devices per resource name before sharing, for the node's healthy GPUs and their MIG layout: the
    host's GPUs as NVML enumerates them (node.mig), of which the first gpu-operator.sim/gpu-count are
    healthy (fewer: some fell off the bus or failed their health check; GFD still counts them all)."""
    layout = (node.mig or [MigGpu() for _ in range(node.gpu_count)])[: node.gpu_count]
    enabled = [g for g in layout if g.enabled]
    if strategy == "none" or not enabled:
        return {GPU: len(layout)} if layout else {}
    if strategy == "single":
        profiles = {p for g in enabled for p in g.devices}
        if len(enabled) != len(layout) or len(profiles) != 1 or any(not g.devices for g in enabled):
            raise InvalidMig(
                "invalid MIG configuration for mig-strategy=single: all GPUs must be MIG-enabled with one "
                "MIG device type"
            )
        return {GPU: sum(len(g.devices) for g in enabled)}
    counts: Counter[str] = Counter(f"nvidia.com/mig-{p}" for g in enabled for p in g.devices)
    full = len(layout) - len(enabled)
    resources = dict(counts)
    if full:
        resources[GPU] = full
    return resources


def advertised(node: NodeState, strategy: str, config: JSON) -> dict[str, int]:
    replicas, rename = time_slicing(config)
    result: dict[str, int] = {}
    for name, count in base_resources(node, strategy).items():
        factor = replicas.get(name, 1)
        result[f"{name}.shared" if rename and factor > 1 else name] = count * max(factor, 1)
    return result


async def _sighup_or_new_gpu_count(proc: Proc, count: int) -> bool:
    """True on SIGHUP (other signals are ignored); False once the node's GPU count is no longer `count`:
    the plugin's health check (internal/rm/health.go) withdraws GPUs that fall off the bus, and the
    emulated host's count (gpu-operator.sim/gpu-count) says how many are left."""
    signals = asyncio.ensure_future(proc.signals.get())
    try:
        while proc.node.gpu_count == count:
            change = asyncio.ensure_future(proc.node.wait_change())
            done, _ = await asyncio.wait({signals, change}, return_when=asyncio.FIRST_COMPLETED)
            change.cancel()
            if signals in done:
                if signals.result() == "SIGHUP":
                    return True
                signals = asyncio.ensure_future(proc.signals.get())
        return False
    finally:
        signals.cancel()


@program("nvidia-device-plugin")
async def device_plugin(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    try:
        while True:
            config = load_config(proc, env.get("CONFIG_FILE", ""), "error starting plugins: ")
            root = env.get("CONTAINER_DRIVER_ROOT") or env.get("DRIVER_ROOT_CTR_PATH") or "/driver-root"
            problem = nvml_error(proc, root)
            if problem:
                if flag(env, "FAIL_ON_INIT_ERROR", True):
                    proc.fail(
                        "error starting plugins: error getting plugins: failed to construct NVML resource "
                        f"managers: failed to initialize NVML: {problem}"
                    )
                proc.out(f"Failed to initialize NVML: {problem}. No devices found. Waiting indefinitely.")
                proc.node.set_resources({})
            else:
                try:
                    resources = advertised(proc.node, mig_strategy(env, config), config)
                except InvalidMig as exc:
                    proc.fail(f"error starting plugins: unable to add default resources to config: {exc}")
                proc.out(f"Registered with the kubelet: {resources}")
                proc.node.set_resources(resources)
            # SIGHUP (config-manager) restarts the plugins with the new config; a kubelet restart too.
            if await _sighup_or_new_gpu_count(proc, proc.node.gpu_count):
                proc.out("Received SIGHUP, restarting.")
            else:
                proc.out(f"GPU health changed: {proc.node.gpu_count} GPUs found, re-registering.")
    finally:
        # The plugin's gRPC socket goes away with the container (also on a crash), not with the emulators.
        if proc.sigterm or not proc.emu.stopping:
            proc.node.set_resources({})


FALLBACKS = ("named", "single", "empty")


def choose_config(label: str, default: str, fallbacks: list[str], files: list[str]) -> str:
    """updateConfigName (main.go:335-393); raises ValueError with the binary's message."""
    if not files:
        raise ValueError("no configuration files available")
    if label:
        if label not in files:
            raise ValueError(f"specified config {label} does not exist")
        return label
    if default:
        if default not in files:
            raise ValueError(f"specified config {label} does not exist")
        return default
    for fallback in fallbacks:
        if fallback == "named" and "default" in files:
            return "default"
        if fallback == "single" and len(files) == 1:
            return files[0]
        if fallback == "empty":
            return ""
        if fallback not in FALLBACKS:
            raise ValueError(f"unknown fallback strategy: {fallback}")
    raise ValueError("no config was set, no default was provided, and all fallbacks failed")


@program("config-manager")
async def config_manager(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    node_name, label_key = env.get("NODE_NAME", ""), env.get("NODE_LABEL", "")
    src, dst = env.get("CONFIG_FILE_SRCDIR", ""), env.get("CONFIG_FILE_DST", "")
    for flag_name, value in (
        ("node-name", node_name),
        ("node-label", label_key),
        ("config-file-srcdir", src),
        ("config-file-dst", dst),
    ):
        if not value:
            proc.fail(f"invalid <{flag_name}>: must not be empty string")
    oneshot = flag(env, "ONESHOT", False)
    send = flag(env, "SEND_SIGNAL", False)
    fallbacks = [f for f in env.get("FALLBACK_STRATEGIES", "named,single").split(",") if f]
    api = await proc.api()
    value = await node_label(proc, api, label_key)
    last: str | None = None
    while True:
        if value != last:
            proc.out(f"Label change detected: {label_key}={value}")
            files = proc.fs.listdir(src)
            if not proc.fs.is_dir(src):
                proc.fail(
                    f"error getting list of configuration files: error reading directory: open {src}: no "
                    "such file or directory"
                )
            try:
                name = choose_config(value, env.get("DEFAULT_CONFIG", ""), fallbacks, files)
            except ValueError as exc:
                proc.fail(str(exc))
            target = f"{src.rstrip('/')}/{name}" if name else "/dev/null"
            current = proc.fs.resolve(dst)
            if current != target or (proc.fs.read(dst) is None and target != "/dev/null"):
                proc.fs.write(dst, Symlink(target))
                proc.out(
                    f"Successfully updated to config: {name}"
                    if name
                    else "Successfully updated to empty config"
                )
                if send and last is not None:
                    _signal(
                        proc, env.get("PROCESS_TO_SIGNAL", "nvidia-device-plugin"), env.get("SIGNAL", "1")
                    )
            last = value
        if oneshot:
            return
        await proc.node.wait_change()
        value = proc.node.labels.get(label_key, "")


def _signal(proc: Proc, name: str, signum: str) -> None:
    """findPidToSignal through /proc: another container's processes are visible only with a shared
    PID namespace (shareProcessNamespace)."""
    candidates = [p for p in proc.runner.procs.values() if p is not proc]
    found = (
        next((p for p in candidates if p.name == name), None) if proc.pod.share_process_namespace else None
    )
    if found is None:
        proc.fail("error finding pid: no process found")
    number = int(signum) if signum.isdigit() else int(signal.SIGHUP)
    found.signals.put_nowait(signal.Signals(number).name)
