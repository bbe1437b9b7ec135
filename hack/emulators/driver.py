"""The driver DaemonSet's init container, k8s-driver-manager v0.12.0 (the driver container itself is
driver_container.py).

**k8s-driver-manager** (``driver-manager uninstall_driver``, cmd/driver-manager/main.go at v0.12.0):

* reads the operand deploy labels of its node (``fetchCurrentLabels`` l.560-610; an absent label
  reads as ``""``) and the ``nvidia.com/gpu-driver-upgrade-enabled`` annotation (l.639-651);
* **no driver loaded** (fresh node, l.307-354): unmounts a stale driver root, uncordons if eviction
  or drain is enabled, and writes every operand label back as ``maybeSetTrue(current)``
  (l.1037-1086: ``""`` stays ``""``, ``paused-for-driver-upgrade`` becomes ``true``): fidelity
  reference B1;
* **driver loaded** (the driver pod restarted, l.359-486): pauses every operand label with
  ``maybeSetPaused`` (l.653-697, 728-740: ``true`` → ``paused-for-driver-upgrade``) and waits for their
  pods to go, polling every 5 s for up to 5 min each (l.742-792, ``WaitForPodTermination``
  internal/kubernetes/client.go:175-190); skips the reinstall when ``DRIVER_CONFIG_DIGEST`` equals the
  digest the running driver recorded (l.846-883); otherwise, with ``ENABLE_GPU_POD_EVICTION``,
  cordons the node and deletes the pods that use GPUs (``DeleteOrEvictPods`` client.go:270-347:
  only device-plugin resources count, DaemonSet pods are ignored, bare pods need
  ``DRAIN_USE_FORCE``, emptyDir pods ``DRAIN_DELETE_EMPTYDIR_DATA``, waiting up to
  ``DRAIN_TIMEOUT_SECONDS``), falling back to a full drain with ``ENABLE_AUTO_DRAIN``; unloads the
  modules (fails while GPUs are in use) and restores the labels;
* every API call with the driver's ServiceAccount; ``UpdateNodeLabels`` retries 7 times with
  exponential back-off (client.go:105-133).
"""

from __future__ import annotations

from .. import operand_managers
from .api import Api, ApiError
from .common import (
    JSON,
    NVIDIA_SMI,
    controller_of,
    duration,
    flag,
    get_node,
    list_pods,
    patch_node_labels,
    uses_gpu,
)
from .node import DRIVER_ROOT
from .process import ContainerExit, Proc, program

DOMAIN = "nvidia.com"
DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
UPGRADE_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
# fetchCurrentLabels (main.go:563-580), in order; mig-manager and the custom/client labels are optional.
OPERAND_LABELS = tuple(
    f"{DOMAIN}/gpu.deploy.{name}"
    for name in (
        "operator-validator", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter",
        "dcgm", "mig-manager", "nvsm", "sandbox-validator", "sandbox-device-plugin", "vgpu-device-manager",
        "client", "dra-driver", "dra-validator", "dcgm-dra", "dcgm-exporter-dra",
    )
)  # fmt: skip
# waitForPodsToTerminate (main.go:742-759): app labels, each waited for up to defaultGracePeriod.
WAITED_APPS = (
    "nvidia-operator-validator", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-dcgm", "nvidia-dcgm-exporter-dra",
    "nvidia-dcgm-dra",
)  # fmt: skip
GRACE_S = 300.0
POLL_S = 5.0
PID_FILE = "/run/nvidia/nvidia-driver.pid"
STATE_FILE = "/run/nvidia/nvidia-driver.state"
READY_FILE = "/run/nvidia/validations/.driver-ctr-ready"


class DriverManager:
    def __init__(self, proc: Proc, api: Api) -> None:
        self.proc = proc
        self.api = api
        env = proc.env
        self.node = env.get("NODE_NAME", "")
        self.namespace = env.get("OPERATOR_NAMESPACE") or "gpu-operator"
        self.eviction = flag(env, "ENABLE_GPU_POD_EVICTION", True)
        self.auto_drain = flag(env, "ENABLE_AUTO_DRAIN", True)
        self.force = flag(env, "DRAIN_USE_FORCE", False)
        self.delete_empty_dir = flag(env, "DRAIN_DELETE_EMPTYDIR_DATA", False)
        self.drain_timeout = duration(env.get("DRAIN_TIMEOUT_SECONDS", ""), 0.0)
        self.pod_selector = env.get("DRAIN_POD_SELECTOR_LABEL", "")
        self.labels: dict[str, str] = {}
        self.policy_enabled = False

    # --- labels ---------------------------------------------------------------------------------

    async def fetch_labels(self) -> None:
        try:
            node = await get_node(self.api, self.node)
        except ApiError as exc:
            raise self.error(
                f"failed to fetch current labels: failed to get label {OPERAND_LABELS[0]}: "
                f"failed to get node {self.node}: {exc}"
            ) from exc
        labels = (node.get("metadata") or {}).get("labels") or {}
        self.labels = {key: labels.get(key, "") for key in OPERAND_LABELS}
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        self.policy_enabled = annotations.get(UPGRADE_ANNOTATION) == "true"
        self.unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        for key, value in self.labels.items():
            self.proc.out(f'Current value of "{key}"={value}')

    def _label_set(self, transform: str) -> dict[str, str]:
        """The manager's patch, as hack/operand_managers.py transcribes it from main.go."""
        if transform == "paused":
            return operand_managers.driver_manager_evict(self.labels)
        return operand_managers.driver_manager_reschedule(self.labels)

    async def update_labels(self, labels: dict[str, str]) -> None:
        """UpdateNodeLabels: a strategic-merge patch, retried 7 times (1 s, doubling, 20% jitter)."""
        delay = 1.0
        for attempt in range(7):
            try:
                await patch_node_labels(self.api, self.node, labels)
                return
            except ApiError as exc:
                self.proc.out(f"Failed to update labels on node {self.node}, retrying: {exc}")
                if attempt == 6:
                    raise
                await self.proc.sleep(delay)
                delay *= 2

    async def set_operand_labels(self, transform: str, error: str) -> None:
        """rescheduleGPUOperatorComponents (`true`) / evictAllGPUOperatorComponents (`paused`)."""
        action = "Rescheduling" if transform == "true" else "Shutting down"
        verb = "enabling" if transform == "true" else "disabling"
        self.proc.out(
            f"{action} all GPU clients on the current node by {verb} their component-specific "
            "nodeSelector labels"
        )
        try:
            await self.update_labels(self._label_set(transform))
        except ApiError as exc:
            raise self.error(f"{error}: {exc}") from exc

    async def reschedule(self) -> None:
        await self.set_operand_labels("true", "failed to reschedule GPU operator components")

    # --- eviction -------------------------------------------------------------------------------

    def can_evict(self) -> bool:
        return not self.policy_enabled and self.eviction

    def can_drain(self) -> bool:
        return not self.policy_enabled and self.auto_drain

    async def cordon(self, on: bool) -> None:
        """drain.RunCordonOrUncordon: a patch of spec.unschedulable unless it is already so."""
        node = await get_node(self.api, self.node)
        if bool((node.get("spec") or {}).get("unschedulable")) != on:
            await self.api.patch(f"/api/v1/nodes/{self.node}", {"spec": {"unschedulable": on}})

    async def wait_gone(self, labels: str) -> None:
        async def gone() -> bool | None:
            pods = await list_pods(self.api, self.namespace, self.node, labels)
            return True if not pods else None

        self.proc.out(f"Waiting for {labels.split('=', 1)[1]} to shutdown")
        try:
            if await self.proc.poll(gone, POLL_S, GRACE_S) is None:
                raise self.error(
                    f"failed to evict GPU operator components: context deadline exceeded ({labels})"
                )
        except ApiError as exc:
            raise self.error(f"failed to evict GPU operator components: {exc}") from exc

    async def evict_operands(self) -> None:
        await self.set_operand_labels("paused", "failed to evict GPU operator components")
        for app in WAITED_APPS:
            await self.wait_gone(f"app={app}")
        if self.labels[f"{DOMAIN}/gpu.deploy.mig-manager"]:
            await self.wait_gone("app=nvidia-mig-manager")

    async def delete_gpu_pods(self) -> str | None:
        """DeleteOrEvictPods (client.go:270-347); returns the error, None on success."""
        pods = await list_pods(self.api, None, self.node)
        gpu_pods = [
            p
            for p in pods
            if uses_gpu(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        if not gpu_pods:
            self.proc.out("No GPU pods to delete. Exiting.")
            return None
        deletable = []
        for pod in gpu_pods:
            owner = controller_of(pod)
            if owner and owner.get("kind") == "DaemonSet":
                continue  # IgnoreAllDaemonSets
            if owner is None and not self.force:
                continue
            volumes = (pod.get("spec") or {}).get("volumes") or []
            if any("emptyDir" in v for v in volumes) and not self.delete_empty_dir:
                continue
            deletable.append(pod)
        if len(deletable) != len(gpu_pods):
            self.proc.out("Cannot delete all GPU pods")
            return "failed to delete all GPU pods"
        for pod in deletable:
            self.proc.out(f"GPU pod - {pod['metadata']['namespace']}/{pod['metadata']['name']}")
        problem = await self.evict(deletable)
        return f"failed to delete all GPU pods: {problem}" if problem else None

    async def evict(self, pods: list[JSON]) -> str | None:
        """Evict the pods (policy/v1 Eviction) and wait until they are gone; the error, or None."""
        for pod in pods:
            meta = pod["metadata"]
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            }
            try:
                await self.api.create(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", body
                )
            except ApiError as exc:
                if not exc.not_found:
                    return str(exc)
        return await self._wait_deleted(pods)

    async def _wait_deleted(self, pods: list[JSON]) -> str | None:
        """The drain helper waits for each pod to be gone (its Timeout; 0 = forever), every second."""
        names = {(p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"]) for p in pods}

        async def all_gone() -> bool | None:
            left = []
            for namespace, name, uid in names:
                try:
                    found = await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
                except ApiError as exc:
                    if exc.not_found:
                        continue
                    raise
                if found["metadata"]["uid"] == uid:
                    left.append(name)
            return True if not left else None

        timeout = self.drain_timeout or None
        if await self.proc.poll(all_gone, 1.0, timeout) is None:
            return "global timeout reached"
        return None

    async def drain(self) -> None:
        """DrainNode: every pod but DaemonSet pods (kubectl drain semantics)."""
        self.proc.out(f"Draining node {self.node}")
        pods = await list_pods(self.api, None, self.node, self.pod_selector)
        victims = [p for p in pods if (controller_of(p) or {}).get("kind") != "DaemonSet"
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]  # fmt: skip
        for pod in victims:
            if controller_of(pod) is None and not self.force:
                raise self.error(
                    "failed to drain node: cannot delete Pods that declare no controller (use --force to "
                    "override): "
                    f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
                )
        problem = await self.evict(victims)
        if problem:
            raise self.error(f"failed to drain node: {problem}")

    async def cleanup_on_failure(self) -> None:
        self.proc.out("Performing cleanup on failure")
        if not self.policy_enabled and (self.eviction or self.auto_drain):
            try:
                await self.cordon(False)
            except ApiError as exc:
                self.proc.out(f"Failed to uncordon node during cleanup: {exc}")
        try:
            await self.update_labels(self._label_set("true"))
        except ApiError as exc:
            self.proc.out(f"Failed to reschedule GPU operator components during cleanup: {exc}")

    # --- the driver -----------------------------------------------------------------------------

    def skip_uninstall(self) -> bool:
        """shouldSkipUninstall (main.go:846-883): the same digest as the running driver recorded."""
        if flag(self.proc.env, "FORCE_REINSTALL", False):
            return False
        digest = self.proc.env.get("DRIVER_CONFIG_DIGEST", "")
        if not digest:
            self.proc.out("DRIVER_CONFIG_DIGEST env var not set, assuming config changed")
            return False
        stored = self.proc.fs.read(STATE_FILE)
        return stored is not None and stored.strip() == digest

    def unmount_rootfs(self) -> None:
        host = self.proc.fs.host_path(DRIVER_ROOT)
        if host:
            self.proc.node.remove_tree(host)
        self.proc.fs.remove_glob(PID_FILE)

    async def unload(self) -> str | None:
        """unloadDriver: rmmod fails while anything on the node uses the GPUs."""
        if await gpus_in_use(self.proc, exclude_driver=True):
            self.proc.out("Could not unload NVIDIA driver kernel modules, driver is in use")
            return "failed to unload driver: resource temporarily unavailable"
        self.proc.node.set_driver(None)
        self.unmount_rootfs()
        return None

    def error(self, message: str) -> ContainerExit:
        self.proc.out(message)
        return ContainerExit(1, message)

    async def run(self) -> None:
        self.proc.out("Starting driver uninstallation process")
        host_smi = (
            self.proc.fs.where("/host").kind == "host" and self.proc.node.read(f"/{NVIDIA_SMI}") is not None
        )
        if host_smi:
            self.proc.out(
                "NVIDIA GPU driver is already pre-installed on the node, disabling the containerized driver"
            )
            await self.update_labels({DRIVER_LABEL: "pre-installed"})
            await self.proc.sleep(60)
            raise self.error("driver is pre-installed on host")
        await self.fetch_labels()
        if self.proc.node.driver is None:
            self.proc.out("No NVIDIA driver loaded, skipping eviction of GPU clients and workloads")
            self.unmount_rootfs()
            await self.uncordon_and_reschedule()
            return
        try:
            await self.evict_operands()
        except ContainerExit:
            await self.cleanup_on_failure()
            raise
        if self.skip_uninstall():
            self.proc.out(
                "The NVIDIA driver is already loaded with the desired version and configuration, skipping "
                "the uninstallation of the driver in an attempt to not disrupt running workloads"
            )
            self.unmount_rootfs()
            await self.reschedule()
            return
        if self.can_evict():
            try:
                await self.cordon(True)
            except ApiError as exc:
                raise self.error(f"failed to cordon node: {exc}") from exc
            problem = await self.delete_gpu_pods()
            if problem:
                self.proc.out("Failed to drain node of GPU pods")
                if not self.can_drain():
                    await self.cleanup_on_failure()
                    raise self.error("cannot proceed until all GPU pods are drained from the node")
                await self.drain()
        if self.proc.node.driver is not None:
            problem = await self.unload()
            if problem and self.can_drain():
                self.proc.out("Unable to cleanup driver modules, attempting again with node drain...")
                await self.drain()
                problem = await self.unload()
            if problem:
                await self.cleanup_on_failure()
                raise self.error(f"failed to uninstall nvidia driver components: {problem}")
            self.proc.out("Successfully uninstalled nvidia driver components")
        else:
            self.unmount_rootfs()
        await self.uncordon_and_reschedule()
        self.proc.out("Driver uninstallation completed successfully")

    async def uncordon_and_reschedule(self) -> None:
        if self.can_evict() or self.can_drain():
            try:
                await self.cordon(False)
            except ApiError as exc:
                self.proc.out(f"Failed to uncordon node: {exc}")
        await self.reschedule()


async def gpus_in_use(proc: Proc, exclude_driver: bool) -> bool:
    """Whether anything on the node holds the GPUs: operand pods that open the devices, or GPU pods.

    The kubelet knows its pods, so this reads them as the node does (admin), not with the image's token.
    """
    for runner in proc.emu.pods_on(proc.node.name):
        if runner is proc.runner or (exclude_driver and runner.pod.component == "nvidia-driver"):
            continue
        if runner.pod.runtime_class and runner.sandbox and runner.procs:
            return True
    try:
        pods = await list_pods(proc.emu.api, None, proc.node.name)
    except ApiError:
        return False
    return any(
        uses_gpu(p)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        for p in pods
    )


@program("driver-manager")
async def driver_manager(proc: Proc, argv: tuple[str, ...]) -> None:
    command = argv[1] if len(argv) > 1 else ""
    if not proc.env.get("NODE_NAME"):
        proc.fail('Required flag "node-name" not set')
    if command == "preflight_check":
        proc.out("Preflight checks completed")
        return
    if command != "uninstall_driver":
        proc.fail(f"No help topic for '{command}'", code=3)
    await DriverManager(proc, await proc.api()).run()
