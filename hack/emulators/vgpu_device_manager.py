"""``nvidia-k8s-vgpu-dm`` of vgpu-device-manager v0.5.0 (vgpuDeviceManager.image in NVIDIA's chart
values.yaml:489-490; ours gpu_operator/core/components.py "vgpu-device-manager"): the
``nvidia.com/vgpu.config`` label protocol.

cmd/nvidia-k8s-vgpu-dm/main.go:

* flags from env (l.134-230): ``NODE_NAME``, ``NAMESPACE``, ``CONFIG_FILE`` and ``DEFAULT_VGPU_CONFIG``
  must not be empty (``validateFlags`` l.232-246), else ``Error: invalid <...> flag`` and exit 1;
* ``start`` (l.248-297): the config the node's ``nvidia.com/vgpu.config`` names, else the default, is
  applied; then each later non-empty value of the label (an informer on the node, l.299-330; ``Set``
  wakes nobody for an empty value, l.92-99). After each, ``nvidia.com/vgpu.config.state`` is
  ``success`` or ``failed``, written with a GET and an Update of the whole node whose error is ignored
  (l.288-297, 574-589);
* ``updateConfig`` (l.332-377): the selected config must be in ``CONFIG_FILE``
  (``nvidia-vgpu-dm assert --valid-config``); a config already applied is a success at once; otherwise
  the state goes ``pending``, the sandbox device plugin's and sandbox validator's deploy labels are
  paused (``paused-for-vgpu-change`` over a set value, l.436-478, 546-558) and their pods waited for
  (1 s polls, 120 s, l.480-500), the MIG layout the config needs is set (``handleMIGConfiguration``,
  l.560-580: skipped when the driver's library is not under ``DRIVER_ROOT_CTR_PATH``; the vGPU types
  of the simulated GPUs are time-sliced, which needs MIG off), the devices are created
  (``nvidia-vgpu-dm apply``), and the two labels restored (``maybeSetTrue`` of the values read before:
  ``true`` over a pause, an absent or empty one written back empty).

``nvidia-vgpu-dm apply`` (pkg/vgpu/config.go:72-185): per GPU, the first entry of the config that
selects it (``devices``, ``device-filter``), each type checked against the GPU's supported types, the
GPU's existing vGPU devices deleted and the new ones created on its parent devices (an SR-IOV virtual
function holds one each); more than fit is an error. The simulated GPUs support their time-sliced
types, ``<prefix>-<GB><letter>`` with a frame buffer that divides theirs (``H100XM-40C``: 2 per H100,
``L4-12Q``: 2 per L4); MIG-backed types (``H100XM-1-10C``) need MIG mode and are refused. The devices
are mdev devices (pci.py), named ``NVIDIA <type>``.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from typing import Any

import yaml

from . import gpus, pci
from .api import Api, ApiError
from .node import MigGpu, NodeState
from .process import Proc, program

JSON = dict[str, Any]
CONFIG_LABEL = "nvidia.com/vgpu.config"
STATE_LABEL = "nvidia.com/vgpu.config.state"
PLUGIN_LABEL = "nvidia.com/gpu.deploy.sandbox-device-plugin"
VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
PAUSED = "paused-for-vgpu-change"
WAITED_APPS = ("nvidia-sandbox-device-plugin-daemonset", "nvidia-sandbox-validator")
WAIT_TIMEOUT_S = 120.0
DEFAULT_DRIVER_ROOT = "/driver-root"
LIBRARY = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


class Failed(Exception):
    """A step of updateConfig failed: the state becomes `failed`."""


def maybe_paused(value: str) -> str:
    """maybeSetPaused (main.go:546-551)."""
    return value if value in ("", "false") else PAUSED


def maybe_true(value: str) -> str:
    """maybeSetTrue (main.go:553-558)."""
    return value if value in ("", "false") else "true"


def load(text: str | None) -> JSON:
    loaded = yaml.safe_load(text or "") if text else None
    return loaded if isinstance(loaded, dict) else {}


def supported(model: gpus.GpuModel | None, vgpu_type: str) -> int:
    """How many devices of a type one GPU holds (0: not a type of this GPU)."""
    if model is None or not model.vgpu_prefix:
        return 0
    found = re.fullmatch(re.escape(model.vgpu_prefix) + r"-(\d+)([ABCQ])", vgpu_type)
    if not found or int(found.group(1)) <= 0 or model.memory_gb % int(found.group(1)):
        return 0
    return model.memory_gb // int(found.group(1))


def _selects(entry: JSON, index: int, model: gpus.GpuModel | None) -> bool:
    devices = entry.get("devices", "all")
    if devices != "all" and index not in [int(d) for d in devices or []]:
        return False
    found = entry.get("device-filter")
    if found is None:
        return True
    filters = [str(f).lower() for f in ([found] if isinstance(found, str) else found)]
    return model is not None and model.pci_device_id.lower() in filters


def wanted(config: JSON, selected: str, model: gpus.GpuModel | None, count: int) -> list[dict[str, int]]:
    """The vGPU devices each GPU gets under `selected` (none where no entry selects it)."""
    entries = (config.get("vgpu-configs") or {}).get(selected)
    if entries is None:
        raise Failed(f"selected vgpu-config not present: {selected}")
    result: list[dict[str, int]] = []
    for index in range(count):
        entry = next((e for e in entries if _selects(e, index, model)), None)
        devices = (entry or {}).get("vgpu-devices") or {}
        result.append({str(k): int(v) for k, v in devices.items()})
    return result


def applied(node: NodeState) -> list[dict[str, int]]:
    """The vGPU devices on each GPU now (GetVGPUConfig, config.go:49-69)."""
    per_gpu: list[Counter[str]] = [Counter() for _ in pci.addresses(node)]
    index = {address: i for i, address in enumerate(pci.addresses(node))}
    for device in pci.vgpu_devices(node):
        gpu = index.get(pci.physical_function(device.parent))
        if gpu is not None:
            per_gpu[gpu][device.vgpu_type] += 1
    return [dict(c) for c in per_gpu]


def apply(node: NodeState, target: list[dict[str, int]]) -> None:
    """`nvidia-vgpu-dm apply` (config.go:72-160); raises Failed with its message."""
    existing = pci.vgpu_devices(node)
    for index, address in enumerate(pci.addresses(node)):
        parents = pci.virtual_functions(address, pci.numvfs(node, address))
        if not parents:
            raise Failed(f"unable to apply config: no parent devices found for GPU at index '{index}'")
        for vgpu_type in target[index]:
            if not supported(node.model, vgpu_type):
                raise Failed(
                    f"unable to apply config: vGPU type {vgpu_type} is not supported on GPU "
                    f"(index={index}, address={address})"
                )
        for device in existing:
            if pci.physical_function(device.parent) == address:
                pci.remove_vgpu(node, device.uuid)
        free = list(parents)
        for vgpu_type, count in target[index].items():
            room = min(supported(node.model, vgpu_type), len(free))
            if count > room:
                raise Failed(
                    f"unable to apply config: failed to create {count} {vgpu_type} vGPU devices on the GPU. "
                    f"ensure '{count}' does not exceed the maximum supported instances for '{vgpu_type}'"
                )
            for _ in range(count):
                pci.create_vgpu(node, free.pop(0), str(uuid.uuid4()), f"NVIDIA {vgpu_type}")


class VgpuDeviceManager:
    def __init__(self, proc: Proc, api: Api) -> None:
        self.proc = proc
        self.api = api
        env = proc.env
        self.node = env.get("NODE_NAME", "")
        self.namespace = env.get("NAMESPACE", "")
        self.config_file = env.get("CONFIG_FILE", "")
        self.driver_root = env.get("DRIVER_ROOT_CTR_PATH") or DEFAULT_DRIVER_ROOT
        self.plugin = ""
        self.validator = ""

    async def set_labels(self, labels: dict[str, str]) -> None:
        """A GET and an Update of the whole node (setNodeLabelValue, shutdown/rescheduleGPUOperands)."""
        path = f"/api/v1/nodes/{self.node}"
        node = await self.api.get(path)
        node.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        await self.api.update(path, node)

    async def wait_gone(self, app: str) -> None:
        async def gone() -> bool | None:
            found = await self.api.get(
                f"/api/v1/namespaces/{self.namespace}/pods",
                fieldSelector=f"spec.nodeName={self.node}",
                labelSelector=f"app={app}",
            )
            return True if not found.get("items") else None

        name = app.removeprefix("nvidia-").removesuffix("-daemonset")
        self.proc.out(f"Waiting for {name} to shutdown")
        try:
            if await self.proc.poll(gone, 1.0, WAIT_TIMEOUT_S) is None:
                raise Failed(
                    f"unable to shutdown gpu operands: error shutting down {name}: error deleting pod"
                )
        except ApiError as exc:
            raise Failed(f"unable to shutdown gpu operands: error shutting down {name}: {exc}") from exc

    def config(self) -> JSON:
        return load(self.proc.fs.read(self.config_file))

    async def update(self, selected: str) -> None:
        """updateConfig (main.go:332-377)."""
        proc = self.proc
        proc.out("Asserting that the requested configuration is present in the configuration file")
        config = self.config()
        node = proc.node
        try:
            target = wanted(config, selected, node.model, node.gpu_count)
        except Failed as exc:
            proc.out(f"Error: {exc}")
            raise Failed("unable to validate the selected vGPU configuration") from exc
        proc.out("Checking if the selected vGPU device configuration is currently applied or not")
        if applied(node) == target:
            return
        try:
            found = await self.api.get(f"/api/v1/nodes/{self.node}")
        except ApiError as exc:
            raise Failed(f"unable to get node state labels: unable to get node object: {exc}") from exc
        labels = (found.get("metadata") or {}).get("labels") or {}
        self.plugin, self.validator = labels.get(PLUGIN_LABEL, ""), labels.get(VALIDATOR_LABEL, "")
        proc.out(f"Setting node label: {STATE_LABEL}=pending")
        try:
            await self.set_labels({STATE_LABEL: "pending"})
        except ApiError as exc:
            raise Failed(f"error setting vGPU config state label: {exc}") from exc
        proc.out(
            "Shutting down all GPU operands in Kubernetes by disabling their component-specific nodeSelector "
            "labels"
        )
        try:
            await self.set_labels(
                {PLUGIN_LABEL: maybe_paused(self.plugin), VALIDATOR_LABEL: maybe_paused(self.validator)}
            )
        except ApiError as exc:
            raise Failed(f"unable to shutdown gpu operands: unable to update node object: {exc}") from exc
        try:
            for app in WAITED_APPS:
                await self.wait_gone(app)
            self.mig_layout()
            proc.out("Applying the selected vGPU device configuration to the node")
            await proc.work("vgpu")
            try:
                apply(node, target)
            except Failed as exc:
                raise Failed(f"unable to apply config '{selected}': exit status 1 ({exc})") from exc
        finally:
            proc.out(
                "Restarting all GPU operands previously shutdown in Kubernetes by enabling their "
                "component-specific nodeSelector labels"
            )
            try:
                await self.set_labels(
                    {PLUGIN_LABEL: maybe_true(self.plugin), VALIDATOR_LABEL: maybe_true(self.validator)}
                )
            except ApiError as exc:
                proc.out(f"Unable to reschedule gpu operands: unable to update node object: {exc}")

    def mig_layout(self) -> None:
        """handleMIGConfiguration: time-sliced vGPU types need MIG mode off on every GPU."""
        node = self.proc.node
        if not self.proc.fs.exists(f"{self.driver_root}/{LIBRARY}"):
            self.proc.out("Skipping MIG configuration: unable to find the driver library path")
            return
        if any(g.enabled for g in node.mig):
            node.set_mig([MigGpu() for _ in range(node.gpu_count)])
            self.proc.out("Disabled MIG mode for the selected vGPU configuration")

    async def run_update(self, selected: str) -> None:
        self.proc.out(f"Updating to vGPU config: {selected}")
        state = "success"
        try:
            await self.update(selected)
            self.proc.out(f"Successfully updated to vGPU config: {selected}")
        except (Failed, ApiError) as exc:
            self.proc.out(f"Failed to apply vGPU config: {exc}")
            state = "failed"
        self.proc.out(f"Setting node label: {STATE_LABEL}={state}")
        try:
            await self.set_labels({STATE_LABEL: state})
        except ApiError as exc:
            self.proc.out(f"unable to update node object: {exc}")  # ignored, as the binary does


@program("nvidia-k8s-vgpu-dm")
async def vgpu_device_manager(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    for flag_name, key in (
        ("node-name", "NODE_NAME"),
        ("namespace", "NAMESPACE"),
        ("config-file", "CONFIG_FILE"),
        ("default-vgpu-config", "DEFAULT_VGPU_CONFIG"),
    ):
        if not env.get(key):
            proc.fail(f"Error: invalid <{flag_name}> flag: must not be empty string")
    api = await proc.api()
    manager = VgpuDeviceManager(proc, api)
    try:
        node = await api.get(f"/api/v1/nodes/{manager.node}")
    except ApiError as exc:
        proc.fail(f"Error: unable to get vGPU config label: unable to get node object: {exc}")
    label = ((node.get("metadata") or {}).get("labels") or {}).get(CONFIG_LABEL, "")
    if not label:
        default = env["DEFAULT_VGPU_CONFIG"]
        proc.out(f"No vGPU config specified for node. Proceeding with default config: {default}")
    current = label or env["DEFAULT_VGPU_CONFIG"]
    last_seen = label
    await manager.run_update(current)
    while True:
        proc.out(f"Waiting for change to '{CONFIG_LABEL}' label")
        while True:
            await proc.node.wait_change()
            value = proc.node.labels.get(CONFIG_LABEL, "")
            if value != last_seen:
                last_seen = value
                if value:
                    break
        await manager.run_update(value)
