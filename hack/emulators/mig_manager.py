"""nvidia-mig-manager of mig-parted v0.15.0: the ``nvidia.com/mig.config`` label protocol.

cmd/nvidia-mig-manager/main.go: the MIG config is ``CONFIG_FILE`` (which must exist) or one generated
from the hardware (``all-disabled``, ``all-enabled``, ``all-balanced``, ``all-<profile>``:
pkg/mig/builder/builder.go:43-146, balanced.go), published as the ConfigMap ``<node>-mig-config``
(l.286-343, a failure is a warning); with CDI the driver's libraries must be found under
``HOST_ROOT_MOUNT`` + ``NVIDIA_DRIVER_ROOT`` (l.449-483). Then, for every new value of the node's
``nvidia.com/mig.config`` label (an informer on the node, l.556-585), ``Reconfigure.Run``
(pkg/mig/reconfigure/reconfigure.go:127-240):

1. read the node's labels; check the selected config exists (else ``mig.config.state=failed``);
   an already-applied config is ``success`` at once;
2. ``mig.config.state=pending``; device-plugin, GFD, dcgm-exporter, dcgm and nvsm deploy labels to
   ``paused-for-mig-change`` (merge patch, l.370-386, 581-593);
3. wait for their pods to go from ``DEFAULT_GPU_CLIENTS_NAMESPACE`` (1 s polls, 5 min) and for any
   DaemonSet pod selecting ``nvidia.com/gpu.deploy.client`` **in every namespace** (a cluster-wide pod
   list, l.646-672: fidelity reference B8); delete the validation workload pods. An error here ends
   the run *without* setting a state: labels stay paused, the state stays ``pending`` (l.170-172);
4. apply the MIG mode and the MIG devices; with CDI, run ``nvidia-smi`` and ``nvidia-ctk cdi
   generate --driver-root=DRIVER_ROOT_CTR_PATH`` (l.211-221, 675-750): a driver root that is not
   there in the container fails the change (B8);
5. delete the validator pod (to re-validate), restore the labels (``true`` unless ``false``) and set
   ``success`` (or ``failed`` after any error of steps 1 and 4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import yaml

from .. import operand_managers
from . import gpus
from .api import Api, ApiError
from .common import NVIDIA_SMI, NVML_LIBRARY, controller_of, flag, list_pods, node_label, patch_node_labels
from .node import MigGpu
from .process import Proc, program

JSON = dict[str, Any]
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
WAITED_APPS = (
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
)
WAIT_TIMEOUT_S = 300.0
MAX_SLICES = 7


class Failed(Exception):
    """A step of Reconfigure.Run failed."""


def generated_config(model: gpus.GpuModel | None) -> JSON:
    """The config v0.15 builds from the discovered profiles (builder.go:43-146, balanced.go)."""
    configs: JSON = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    if model is None or not model.mig_profiles:
        return {"version": "v1", "mig-configs": configs}
    base: dict[int, str] = {}
    for profile in model.mig_profiles:
        base.setdefault(profile.slices, profile.name)
    if all(g in base for g in (1, 2, 3)):
        configs["all-balanced"] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": {base[1]: 2, base[2]: 1, base[3]: 1}}
        ]
    for profile in sorted(model.mig_profiles, key=lambda p: p.name):
        configs[f"all-{profile.name}"] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": {profile.name: profile.max_count}}
        ]
    return {"version": "v1", "mig-configs": configs}


def _filters(entry: JSON) -> list[str]:
    found = entry.get("device-filter")
    if found is None:
        return []
    return [str(f).lower() for f in ([found] if isinstance(found, str) else found)]


def desired_layout(
    config: JSON, selected: str, model: gpus.GpuModel | None, count: int, current: list[MigGpu]
) -> list[MigGpu]:
    """The layout `selected` asks for, as `nvidia-mig-parted apply` would set it; raises Failed."""
    entries = (config.get("mig-configs") or {}).get(selected)
    if entries is None:
        raise Failed(f"failed to validate MIG configuration: exit status 1 (config {selected!r} not found)")
    layout = [MigGpu(g.enabled, list(g.devices)) for g in current] or [MigGpu() for _ in range(count)]
    device_id = (model.pci_device_id if model else "").lower()
    for index in range(count):
        for entry in entries:
            devices = entry.get("devices", "all")
            if devices != "all" and index not in [int(d) for d in devices]:
                continue
            filters = _filters(entry)
            if filters and device_id not in filters:
                continue
            enabled = bool(entry.get("mig-enabled"))
            wanted: list[str] = []
            for name, number in (entry.get("mig-devices") or {}).items():
                if model is None or model.profile(str(name)) is None:
                    raise Failed(
                        f"failed to apply MIG configuration: exit status 1 (profile {name} not supported by "
                        f"device {index})"
                    )
                wanted += [str(name)] * int(number)
            if enabled and (model is None or not model.mig_capable):
                raise Failed("failed to apply MIG configuration: exit status 1 (MIG mode not supported)")
            if model is not None and sum(_slices(model, p) for p in wanted) > MAX_SLICES:
                raise Failed(
                    "failed to apply MIG configuration: exit status 1 (invalid MIG config for device "
                    f"{index})"
                )
            layout[index] = MigGpu(enabled, sorted(wanted) if enabled else [])
            break
    return layout


def _slices(model: gpus.GpuModel, profile: str) -> int:
    found = model.profile(profile)
    return found.slices if found else 0


class MigManager:
    def __init__(self, proc: Proc, api: Api, config: JSON) -> None:
        self.proc = proc
        self.api = api
        self.config = config
        env = proc.env
        self.node = env.get("NODE_NAME", "")
        self.namespace = env.get("DEFAULT_GPU_CLIENTS_NAMESPACE") or "default"
        self.cdi = flag(env, "CDI_ENABLED", False)
        self.driver_root_ctr = env.get("DRIVER_ROOT_CTR_PATH") or "/run/nvidia/driver"
        self.dev_root_ctr = env.get("DEV_ROOT_CTR_PATH", "")
        self.labels: dict[str, str] = {}
        # reconfigure.go:53-56: package globals, set once the clients were restarted, never reset.
        self.no_restart_on_exit = False

    async def set_labels(self, labels: dict[str, str]) -> None:
        await patch_node_labels(self.api, self.node, labels, strategic=False)

    def _clients(self, paused: bool) -> dict[str, str]:
        """shutdown/restartKubernetesGPUClients' patch (hack/operand_managers.py)."""
        if paused:
            return operand_managers.mig_manager_pause(self.labels)
        return operand_managers.mig_manager_restore(self.labels)

    async def set_state(self, state: str) -> None:
        if not self.no_restart_on_exit:
            self.proc.out(
                "Restarting any GPU clients previously shutdown in Kubernetes by reenabling their "
                "component-specific nodeSelector labels"
            )
            await self.set_labels(self._clients(paused=False))
        self.proc.out(f"Changing the '{MIG_STATE}' node label to '{state}'")
        await self.set_labels({MIG_STATE: state})

    async def wait_pods_gone(self, labels: str) -> None:
        async def gone() -> bool | None:
            return True if not await list_pods(self.api, self.namespace, self.node, labels) else None

        if await self.proc.poll(gone, 1.0, WAIT_TIMEOUT_S) is None:
            raise Failed(f"{labels} pod did not shutdown: context deadline exceeded")

    async def wait_client_pods_gone(self) -> None:
        async def gone() -> bool | None:
            pods = await list_pods(self.api, None, self.node)
            left = [p for p in pods if (controller_of(p) or {}).get("kind") == "DaemonSet"
                    and CLIENT_LABEL in ((p.get("spec") or {}).get("nodeSelector") or {})]  # fmt: skip
            return True if not left else None

        try:
            if await self.proc.poll(gone, 5.0, WAIT_TIMEOUT_S) is None:
                raise Failed("third-party gpu client pods did not shutdown: context deadline exceeded")
        except ApiError as exc:
            raise Failed(
                f"third-party gpu client pods did not shutdown: failed to list pods on node {self.node}: "
                f"{exc}"
            ) from exc

    async def delete_pods(self, labels: str) -> None:
        for pod in await list_pods(self.api, self.namespace, self.node, labels):
            try:
                await self.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}")
            except ApiError as exc:
                if not exc.not_found:
                    raise Failed(
                        f"failed to delete pod {self.namespace}/{pod['metadata']['name']}: {exc}"
                    ) from exc

    def cdi_step(self) -> None:
        """nvidia-smi from the driver root, then `nvidia-ctk cdi generate --driver-root=<ctr path>`."""
        fs = self.proc.fs
        if not fs.exists(f"{self.driver_root_ctr}/{NVIDIA_SMI}") and not fs.exists(f"/host/{NVIDIA_SMI}"):
            raise Failed("failed to run nvidia-smi: exit status 127")
        if not fs.exists(f"{self.driver_root_ctr}/{NVML_LIBRARY}"):
            raise Failed("failed to handle CDI: cmd.Wait error for cdiGenerateCommand: exit status 1")

    async def reconfigure(self, selected: str) -> None:
        proc = self.proc
        node = proc.node
        try:
            found = await self.api.get(f"/api/v1/nodes/{self.node}")
        except ApiError as exc:
            await self.set_state("failed")
            raise Failed(f"failed to get current node labels: failed to get node: {exc}") from exc
        self.labels = dict((found.get("metadata") or {}).get("labels") or {})
        try:
            layout = desired_layout(self.config, selected, node.model, node.gpu_count, node.mig)
        except Failed:
            await self.set_state("failed")
            raise
        current = node.mig or [MigGpu() for _ in range(node.gpu_count)]
        if [g.as_json() for g in layout] == [g.as_json() for g in current]:
            proc.out("Selected MIG config is already applied")
            await self.set_state("success")
            return
        await self.set_labels({MIG_STATE: "pending"})
        proc.out(
            "Shutting down all GPU clients in Kubernetes by disabling their component-specific nodeSelector "
            "labels"
        )
        await self.set_labels(self._clients(paused=True))
        try:
            for app in WAITED_APPS:
                await self.wait_pods_gone(f"app={app}")
            await self.wait_client_pods_gone()
            await self.delete_pods("app=nvidia-cuda-validator")
            await self.delete_pods("app=nvidia-device-plugin-validator")
        except ApiError as exc:
            raise Failed(f"failed to wait for pods to be deleted: {exc}") from exc
        mode_change = [g.enabled for g in layout] != [g.enabled for g in current]
        await proc.work("mig")
        if mode_change and flag(proc.env, "WITH_SHUTDOWN_HOST_GPU_CLIENTS", False):
            await proc.sleep(30)
        node.set_mig(layout)
        proc.out(f"Applied MIG config {selected}")
        if self.cdi:
            try:
                self.cdi_step()
            except Failed:
                await self.set_state("failed")
                raise
        try:
            await self.delete_pods("app=nvidia-operator-validator")
        except ApiError as exc:
            raise Failed(f"failed to restart validator pod: {exc}") from exc
        proc.out(
            "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
            "component-specific nodeSelector labels"
        )
        self.no_restart_on_exit = True
        await self.set_labels(self._clients(paused=False))
        await self.set_state("success")


def load_config(proc: Proc) -> JSON:
    """setupMigConfig (main.go:366-404)."""
    path = proc.env.get("CONFIG_FILE", "")
    if path:
        text = proc.fs.read(path)
        if text is None:
            proc.fail(
                f"Error: failed to setup MIG config: failed to read custom config {path}: stat {path}: no "
                "such file or directory"
            )
        proc.out(f"Using custom config: {path}")
        loaded = yaml.safe_load(text)
        return loaded if isinstance(loaded, dict) else {}
    proc.out("Generating MIG configuration from hardware...")
    return generated_config(proc.node.model)


async def publish_generated(proc: Proc, api: Api, config: JSON) -> None:
    """createNodeConfigMap (main.go:286-343): only a warning when it fails."""
    namespace, pod_name = proc.env.get("POD_NAMESPACE", ""), proc.env.get("POD_NAME", "")
    if not namespace or not pod_name:
        proc.out(
            f"Failed to create node ConfigMap: {'POD_NAMESPACE' if not namespace else 'POD_NAME'} "
            "environment variable not set"
        )
        return
    name = f"{proc.pod.node}-mig-config"
    try:
        pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
        body: JSON = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/component": "nvidia-mig-manager",
                    "nvidia.com/node-name": proc.pod.node,
                },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod["metadata"]["uid"]}
                ],
            },
            "data": {"config.yaml": yaml.safe_dump(config)},
        }
        try:
            await api.create(f"/api/v1/namespaces/{namespace}/configmaps", body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            existing = await api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            await api.update(f"/api/v1/namespaces/{namespace}/configmaps/{name}", body)
    except ApiError as exc:
        proc.out(f"Failed to create node ConfigMap: {exc}")


@program("nvidia-mig-manager")
async def mig_manager(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    if not env.get("NODE_NAME"):
        proc.fail("Error: invalid -n <node-name> flag: must not be empty string")
    api = await proc.api()
    config = load_config(proc)
    if not env.get("CONFIG_FILE"):
        await publish_generated(proc, api, config)
    driver_root = env.get("NVIDIA_DRIVER_ROOT") or env.get("DRIVER_ROOT") or "/run/nvidia/driver"
    if flag(env, "CDI_ENABLED", False) and driver_root != env.get("NVIDIA_DEV_ROOT", ""):
        host = (env.get("HOST_ROOT_MOUNT") or "/host").rstrip("/")
        if not proc.fs.exists(f"{host}{driver_root}/{NVML_LIBRARY}"):
            proc.fail(
                "Error: failed to get paths required for cdi: failed to locate driver libraries: "
                f"{host}{driver_root}: not found"
            )
    manager = MigManager(proc, api, config)
    await follow_mig_config(proc, await node_label(proc, api, MIG_CONFIG), manager.reconfigure)


async def follow_mig_config(proc: Proc, value: str, reconfigure: Callable[[str], Awaitable[None]]) -> None:
    """Apply the label's value, then each new one (cmd/nvidia-mig-manager/main.go:436-446).

    "Waiting for change" once per wait for a new value (l.437: before each, so at the start and
    after each change handled), not on every other change of the node that wakes the emulator.
    """
    last_read = ""
    proc.out(f"Waiting for change to '{MIG_CONFIG}' label")
    while True:
        if value and value != last_read:
            last_read = value
            proc.out(f"Updating to MIG config: {value}")
            try:
                await reconfigure(value)
                proc.out(f"Successfully updated to MIG config: {value}")
            except (Failed, ApiError) as exc:
                proc.out(f"Error: {exc}")
            proc.out(f"Waiting for change to '{MIG_CONFIG}' label")
        await proc.node.wait_change()
        value = proc.node.labels.get(MIG_CONFIG, "") or value
