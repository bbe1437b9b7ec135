"""nvidia-validator of gpu-operator v26.7.0 (cmd/nvidia-validator/main.go), one COMPONENT at a time.

* ``driver`` (main.go:845-962): a pre-installed driver if ``/host`` has ``nvidia-smi`` (l.747-791);
  otherwise lists the DaemonSets labelled ``app.kubernetes.io/component=nvidia-driver`` in
  ``OPERATOR_NAMESPACE`` with the pod's ServiceAccount (``isDriverManagedByOperator`` l.712-741; an
  error ends the container at once: *error checking if driver is managed by GPU Operator: error
  listing daemonsets: ...*, fidelity reference B3); when one is owned by a ClusterPolicy, waits for
  ``.driver-ctr-ready`` (l.696-706); then runs ``nvidia-smi`` from the driver root
  (``DRIVER_INSTALL_DIR_CTR_PATH``, default ``/run/nvidia/driver``), retrying every 5 s with
  ``WITH_WAIT``, and writes ``driver-ready`` with the driver roots (l.950-961, driver.go:45-77).
* ``toolkit`` (l.1144-1170): ``nvidia-smi`` inside the container, which only exists when the nvidia
  runtime injected it; ``toolkit-ready``.
* ``cuda`` and ``plugin`` (l.1172-1213, 1300-1404, 1428-1506, 1521-1636): read the node (plugin: wait
  up to 30 x 5 s for ``nvidia.com/gpu`` or ``nvidia.com/mig-*`` in its capacity), and unless
  ``WITH_WORKLOAD=false`` read the ``nvidia-operator-validator`` DaemonSet, delete an old workload
  pod and create one from validator/manifests/{cuda,plugin}-workload-validation.yaml bound to the
  node (plugin: requesting one GPU), waiting up to 60 x 5 s for it to succeed; ``cuda-ready``,
  ``plugin-ready``. The emulators run those pods too (restartPolicy OnFailure: the kubelet emulator
  ends them Succeeded); their ``vectorAdd`` passes once the node's driver is loaded.
* ``metrics`` (node-status exporter): serves metrics until stopped.
* The sandbox validator's steps (l.1645-2004), each with the node read through the pod's ServiceAccount
  for its workload type (``getWorkloadConfig`` l.497-529: the node's ``nvidia.com/gpu.workload.config``
  if valid, else ``DEFAULT_GPU_WORKLOAD_CONFIG``, else ``vm-passthrough``), written to ``workload-type``
  (which the sandbox device plugins' gates read); a step for another workload type passes at once:

  - ``vfio-pci``: every GPU bound to ``vfio-pci`` (or ``nvgrace_gpu_vfio_pci``), checked once (no wait:
    the container exits 1 and the kubelet restarts it until they are); ``vfio-pci-ready``;
  - ``vgpu-manager``: ``nvidia-smi`` of the host, else ``chroot /run/nvidia/driver nvidia-smi`` (with
    ``WITH_WAIT`` retried every ``SLEEP_INTERVAL_SECONDS``), then the parent devices, up to 5 minutes
    (``waitForParentDevices``: every SR-IOV virtual function enabled, or mdev parents);
    ``vgpu-manager-ready``, or ``host-vgpu-manager-ready`` for a host driver;
  - ``vgpu-devices``: at least one vGPU (mdev) device, waited for with ``WITH_WAIT``; ``vgpu-devices-ready``;
  - ``cc-manager``: on a node labelled ``nvidia.com/cc.capable=true``, waits for the CC manager's
    ``.cc-manager-ctr-ready``; ``cc-manager-ready``.

Errors are printed as the binary does (``Error: <err>``, main.go:409-413) and exit 1.
"""

from __future__ import annotations

from typing import Any

from . import pci
from .api import Api, ApiError
from .common import NVIDIA_SMI, NVML_LIBRARY, flag, get_node, injected_by_runtime
from .node import NodeState
from .process import ContainerExit, Proc, program

VALIDATIONS = "/run/nvidia/validations"
DRIVER_CTR_READY = f"{VALIDATIONS}/.driver-ctr-ready"
SLEEP_S = 5.0
WORKLOAD_RETRIES = 60
RESOURCE_RETRIES = 30
JSON = dict[str, Any]
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
WORKLOAD_TYPES = ("container", "vm-passthrough", "vm-vgpu")
CC_CAPABLE_LABEL = "nvidia.com/cc.capable"
CC_MANAGER_CTR_READY = f"{VALIDATIONS}/.cc-manager-ctr-ready"
VGPU_READINESS_TIMEOUT_S = 300.0
DRIVER_ROOT_CTR = "/run/nvidia/driver"
HOST_NVIDIA_SMI = ("usr/bin/nvidia-smi", "usr/sbin/nvidia-smi", "usr/local/bin/nvidia-smi")


def _error(proc: Proc, message: str) -> ContainerExit:
    proc.out(f"Error: {message}")
    return ContainerExit(1, f"Error: {message}")


class Validator:
    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        env = proc.env
        self.node = env.get("NODE_NAME", "")
        self.namespace = env.get("OPERATOR_NAMESPACE", "")
        self.with_wait = flag(env, "WITH_WAIT", False)
        self.with_workload = flag(env, "WITH_WORKLOAD", True)
        self.output = env.get("OUTPUT_DIR") or VALIDATIONS
        self.sleep = float(env.get("SLEEP_INTERVAL_SECONDS") or SLEEP_S)

    def status_file(self, name: str) -> str:
        return f"{self.output.rstrip('/')}/{name}"

    def delete(self, name: str) -> None:
        self.proc.fs.remove_glob(self.status_file(name))

    def create(self, name: str, content: str = "") -> None:
        if not self.proc.fs.write(self.status_file(name), content):
            raise _error(
                self.proc, f"unable to create status file {self.status_file(name)}: read-only file system"
            )

    # --- driver ---------------------------------------------------------------------------------

    async def driver(self) -> None:
        self.delete("driver-ready")
        proc = self.proc
        host_root = proc.env.get("HOST_ROOT") or "/"
        if proc.fs.exists(f"/host/{NVIDIA_SMI}"):
            proc.out("Detected a pre-installed driver on the host")
            info = (True, host_root, "/host", host_root, "/host")
        else:
            proc.out(
                "No pre-installed driver detected on the host: failed to find an executable 'nvidia-smi' on "
                "the host"
            )
            managed = await self.driver_managed_by_operator()
            if managed:
                proc.out(
                    "Driver is not pre-installed on the host and is managed by GPU Operator. Checking "
                    "driver container status."
                )
                await self.retry(
                    lambda: proc.fs.exists(DRIVER_CTR_READY),
                    "error checking driver container status: exit status 1",
                )
            root = proc.env.get("DRIVER_INSTALL_DIR_CTR_PATH") or "/run/nvidia/driver"
            install_dir = proc.env.get("DRIVER_INSTALL_DIR") or "/run/nvidia/driver"

            def works() -> bool:
                return (
                    proc.fs.exists(f"{root}/{NVML_LIBRARY}") and proc.fs.exists(f"{root}/{NVIDIA_SMI}")
                    and proc.node.driver is not None
                )  # fmt: skip

            await self.retry(
                works, f"error validating driver: failed to locate driver libraries: {root}: not found"
            )
            # The driver container's /dev holds no device nodes: devRoot is the host (driver.go:58-66).
            info = (False, install_dir, "/driver-root", host_root, "/host")
        host, driver_root, driver_ctr, dev_root, dev_ctr = info
        self.create(
            "driver-ready",
            f"IS_HOST_DRIVER={'true' if host else 'false'}\nNVIDIA_DRIVER_ROOT={driver_root}\n"
            f"DRIVER_ROOT_CTR_PATH={driver_ctr}\nNVIDIA_DEV_ROOT={dev_root}\nDEV_ROOT_CTR_PATH={dev_ctr}\n",
        )

    async def driver_managed_by_operator(self) -> bool:
        try:
            api = await self.proc.api()
            found = await api.get(
                f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets",
                labelSelector="app.kubernetes.io/component=nvidia-driver",
            )
        except ApiError as exc:
            raise _error(
                self.proc,
                "error validating driver installation: error checking if driver is managed by GPU Operator: "
                f"error listing daemonsets: {exc}",
            ) from exc
        for ds in found.get("items") or []:
            for ref in (ds.get("metadata") or {}).get("ownerReferences") or []:
                if (
                    ref.get("controller")
                    and str(ref.get("apiVersion", "")).startswith("nvidia.com/")
                    and ref.get("kind") in ("ClusterPolicy", "NVIDIADriver")
                ):
                    return True
        return False

    async def retry(self, check: Any, message: str) -> None:
        """runCommandWithWait: every SLEEP_INTERVAL_SECONDS with WITH_WAIT, else once."""
        if check():
            return
        if not self.with_wait:
            raise _error(self.proc, f"error validating driver installation: {message}")

        async def ok() -> bool | None:
            return True if check() else None

        await self.proc.poll(ok, self.sleep)

    # --- toolkit --------------------------------------------------------------------------------

    async def toolkit(self) -> None:
        self.delete("toolkit-ready")

        async def smi() -> bool | None:
            return True if injected_by_runtime(self.proc) else None

        if await smi() is None:
            if not self.with_wait:
                self.proc.out("toolkit is not ready")
                raise _error(
                    self.proc,
                    'error validating toolkit installation: exec: "nvidia-smi": executable file not found '
                    "in $PATH",
                )
            await self.proc.poll(smi, self.sleep)
        self.create("toolkit-ready")

    # --- cuda and plugin ------------------------------------------------------------------------

    async def api(self, what: str) -> Api:
        try:
            return await self.proc.api()
        except ContainerExit as exc:
            raise _error(self.proc, f"error validating {what}: {exc.message}") from exc

    async def gpu_resource(self, api: Api, field: str) -> str | None:
        node = await get_node(api, self.node)
        resources = (node.get("status") or {}).get(field) or {}

        def count(value: Any) -> int:
            try:
                return int(str(value))
            except ValueError:
                return 0

        mig = next(
            (k for k, v in resources.items() if k.startswith("nvidia.com/mig-") and count(v) >= 1), None
        )
        return mig or next(
            (k for k, v in resources.items() if k.startswith("nvidia.com/gpu") and count(v) >= 1), None
        )

    async def plugin(self) -> None:
        self.delete("plugin-ready")
        api = await self.api("plugin installation")
        what = "error validating plugin installation"
        try:
            found = await self.proc.poll(
                lambda: self.gpu_resource(api, "capacity"), SLEEP_S, SLEEP_S * RESOURCE_RETRIES
            )
        except ApiError as exc:
            raise _error(
                self.proc,
                f"{what}: unable to fetch node by name {self.node} to check for GPU resources: {exc}",
            ) from exc
        if found is None:
            raise _error(self.proc, f"{what}: GPU resources are not discovered by the node")
        if self.with_workload:
            try:
                resource = await self.gpu_resource(api, "allocatable")
            except ApiError as exc:
                raise _error(self.proc, f"{what}: {exc}") from exc
            if resource is None:
                raise _error(self.proc, f"{what}: unable to find any allocatable GPU resource")
            await self.workload(api, plugin_workload(resource), "nvidia-device-plugin-validator", what)
        self.create("plugin-ready")

    async def cuda(self) -> None:
        self.delete("cuda-ready")
        api = await self.api("cuda workload")
        if self.with_workload:
            await self.workload(
                api, cuda_workload(), "nvidia-cuda-validator", "error validating cuda workload"
            )
        self.create("cuda-ready")

    async def workload(self, api: Api, pod: JSON, app: str, what: str) -> None:
        """runWorkload: the validator DaemonSet's owners and tolerations, bound to this node."""
        image = self.proc.env.get("VALIDATOR_IMAGE", "")
        policy = self.proc.env.get("VALIDATOR_IMAGE_PULL_POLICY", "")
        for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
            container["image"] = image
            if policy:
                container["imagePullPolicy"] = policy
        secrets = [s for s in self.proc.env.get("VALIDATOR_IMAGE_PULL_SECRETS", "").split(",") if s]
        if secrets:
            pod["spec"]["imagePullSecrets"] = [{"name": s} for s in secrets]
        if self.proc.env.get("VALIDATOR_RUNTIME_CLASS"):
            pod["spec"]["runtimeClassName"] = self.proc.env["VALIDATOR_RUNTIME_CLASS"]
        try:
            ds = await api.get(
                f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/nvidia-operator-validator"
            )
        except ApiError as exc:
            raise _error(
                self.proc, f"{what}: unable to retrieve the operator validator daemonset: {exc}"
            ) from exc
        pod["metadata"]["namespace"] = self.namespace
        pod["metadata"]["ownerReferences"] = (ds.get("metadata") or {}).get("ownerReferences") or []
        pod["spec"]["tolerations"] = ds["spec"]["template"]["spec"].get("tolerations") or []
        pod["spec"]["nodeName"] = self.node
        pods_path = f"/api/v1/namespaces/{self.namespace}/pods"
        try:
            old = await api.get(
                pods_path, labelSelector=f"app={app}", fieldSelector=f"spec.nodeName={self.node}"
            )
        except ApiError as exc:
            raise _error(self.proc, f"{what}: cannot list existing validation pods: {exc}") from exc
        if old.get("items"):
            name = old["items"][0]["metadata"]["name"]
            try:
                await api.delete(
                    f"{pods_path}/{name}", {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
                )
            except ApiError as exc:
                if not exc.not_found:
                    raise _error(self.proc, f"{what}: cannot delete previous validation pod: {exc}") from exc
        try:
            created = await api.create(pods_path, pod)
        except ApiError as exc:
            raise _error(
                self.proc,
                f"{what}: failed to create {app.removeprefix('nvidia-')} pod "
                f"{pod['metadata']['generateName']}, err {exc}",
            ) from exc
        name = created["metadata"]["name"]

        async def succeeded() -> bool | None:
            try:
                found = await api.get(f"{pods_path}/{name}")
            except ApiError as exc:
                raise _error(self.proc, f"{what}: failed to get pod {name}, err {exc}") from exc
            phase = (found.get("status") or {}).get("phase", "")
            if phase == "Succeeded":
                return True
            self.proc.out(f"pod {name} is curently in {phase} phase")
            return None

        if await self.proc.poll(succeeded, SLEEP_S, SLEEP_S * WORKLOAD_RETRIES) is None:
            raise _error(self.proc, f"{what}: gave up waiting for pod {name} to be available")


class SandboxValidator(Validator):
    """The sandbox validator's steps (main.go:1645-2004)."""

    async def workload_config(self, what: str) -> str:
        """getWorkloadConfig (l.497-529), written to workload-type by the steps that read it."""
        default = self.proc.env.get("DEFAULT_GPU_WORKLOAD_CONFIG", "")
        default = default if default in WORKLOAD_TYPES else "vm-passthrough"
        try:
            api = await self.proc.api()
            node = await get_node(api, self.node)
        except (ApiError, ContainerExit) as exc:
            detail = exc.message if isinstance(exc, ContainerExit) else str(exc)
            raise _error(
                self.proc, f"{what}: error getting gpu workload config: error getting node labels - {detail}"
            ) from exc
        value = ((node.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL)
        config = value if value in WORKLOAD_TYPES else default
        self.proc.out(f"GPU workload configuration: {config}")
        self.create("workload-type", config + "\n")
        return config

    async def vfio_pci(self) -> None:
        what = "error validating vfio-pci driver installation"
        if await self.workload_config(what) != "vm-passthrough":
            self.proc.out("vfio-pci not required on the node. Skipping validation.")
            return
        self.delete("vfio-pci-ready")
        node = self.proc.node
        for address in pci.addresses(node):
            bound = pci.driver(node, address)
            if bound not in pci.VFIO_DRIVERS:
                raise _error(
                    self.proc, f"{what}: device not bound to 'vfio-pci'; device: {address} driver: '{bound}'"
                )
        self.proc.out("Validation completed successfully - all devices are bound to vfio-pci")
        self.create("vfio-pci-ready")

    def host_nvidia_smi(self) -> bool:
        return any(self.proc.fs.read(f"/host/{path}") is not None for path in HOST_NVIDIA_SMI)

    async def vgpu_manager(self) -> None:
        what = "error validating vGPU Manager installation"
        if await self.workload_config(what) != "vm-vgpu":
            self.proc.out("vGPU Manager not required on the node. Skipping validation.")
            return
        self.delete("vgpu-manager-ready")
        self.delete("host-vgpu-manager-ready")
        host = self.host_nvidia_smi()

        async def smi() -> bool | None:
            # `chroot /run/nvidia/driver nvidia-smi` (or the host's): the binary and a loaded module.
            found = host or self.proc.fs.exists(f"{DRIVER_ROOT_CTR}/{NVIDIA_SMI}")
            return True if found and self.proc.node.driver is not None else None

        if await smi() is None:
            if not self.with_wait:
                self.proc.out("vGPU Manager is not ready")
                raise _error(self.proc, f"{what}: exit status 1")
            await self.proc.poll(smi, self.sleep)
        self.proc.out("Waiting for parent devices to be available...")

        async def parents() -> bool | None:
            return True if parent_devices_ready(self.proc.node) else None

        if await self.proc.poll(parents, self.sleep, VGPU_READINESS_TIMEOUT_S) is None:
            raise _error(
                self.proc, f"{what}: vGPU Manager parent devices not ready: context deadline exceeded"
            )
        self.create("host-vgpu-manager-ready" if host else "vgpu-manager-ready")

    async def vgpu_devices(self) -> None:
        what = "error validating vGPU devices"
        if await self.workload_config(what) != "vm-vgpu":
            self.proc.out("vgpu devices not required on the node. Skipping validation.")
            return
        self.delete("vgpu-devices-ready")

        async def devices() -> int | None:
            return len(pci.vgpu_devices(self.proc.node)) or None

        found = await devices()
        if found is None:
            if not self.with_wait:
                raise _error(self.proc, f"{what}: no vGPU devices found")
            found = await self.proc.poll(devices, self.sleep)
        self.proc.out(f"Found {found} vGPU devices")
        self.create("vgpu-devices-ready")

    async def cc_manager(self) -> None:
        what = "error validating CC Manager installation"
        self.delete("cc-manager-ready")
        try:
            api = await self.proc.api()
            node = await get_node(api, self.node)
        except (ApiError, ContainerExit) as exc:
            detail = exc.message if isinstance(exc, ContainerExit) else str(exc)
            raise _error(
                self.proc,
                f"{what}: unable to fetch node by name {self.node} to check for {CC_CAPABLE_LABEL} "
                f"label: {detail}",
            ) from exc
        if ((node.get("metadata") or {}).get("labels") or {}).get(CC_CAPABLE_LABEL) != "true":
            self.proc.out("Not a CC capable node, skipping CC Manager validation")
        elif not self.proc.fs.exists(CC_MANAGER_CTR_READY):
            if not self.with_wait:
                self.proc.out("CC Manager is not ready")
                raise _error(self.proc, f"{what}: exit status 1")

            async def ready() -> bool | None:
                return True if self.proc.fs.exists(CC_MANAGER_CTR_READY) else None

            await self.proc.poll(ready, self.sleep)
        self.create("cc-manager-ready")


def parent_devices_ready(node: NodeState) -> bool:
    """waitForParentDevices' test (main.go:1788-1850): with SR-IOV in use (a GPU with virtual functions
    enabled), all of them enabled on every GPU; else mdev parent devices, which SR-IOV GPUs such as the
    simulated ones have only as virtual functions."""
    addresses = pci.addresses(node)
    if any(pci.numvfs(node, a) for a in addresses):
        return all(pci.numvfs(node, a) == pci.TOTAL_VFS for a in addresses)
    return bool(pci.mdev_parents(node))


def cuda_workload() -> JSON:
    """validator/manifests/cuda-workload-validation.yaml (gpu-operator v26.7.0)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "nvidia-cuda-validator-",
            "labels": {"app": "nvidia-cuda-validator"},
            "annotations": {"nvidia.cdi.k8s.io/container.cuda-validation": "management.nvidia.com/gpu=all"},
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "serviceAccountName": "nvidia-operator-validator",
            "initContainers": [
                {"name": "cuda-validation", "command": ["sh", "-c"], "args": ["vectorAdd"],
                 "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                 "securityContext": {"privileged": True}},
            ],
            "containers": [
                {"name": "nvidia-cuda-validator", "command": ["sh", "-c"],
                 "args": ["echo cuda workload validation is successful"],
                 "securityContext": {"privileged": True, "readOnlyRootFilesystem": True}},
            ],
        },
    }  # fmt: skip


def plugin_workload(resource: str) -> JSON:
    """validator/manifests/plugin-workload-validation.yaml with the node's GPU resource (main.go:1339-49)."""
    limits = {resource: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "nvidia-device-plugin-validator-",
            "labels": {"app": "nvidia-device-plugin-validator"},
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "serviceAccountName": "nvidia-operator-validator",
            "initContainers": [
                {"name": "plugin-validation", "command": ["sh", "-c"], "args": ["vectorAdd"],
                 "securityContext": {"allowPrivilegeEscalation": False},
                 "resources": {"limits": limits, "requests": limits}},
            ],
            "containers": [
                {"name": "nvidia-device-plugin-validator", "command": ["sh", "-c"],
                 "args": ["echo device-plugin workload validation is successful"],
                 "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}},
            ],
        },
    }  # fmt: skip


@program("vectorAdd")
async def vector_add(proc: Proc, argv: tuple[str, ...]) -> None:
    """cuda-samples' vectorAdd, which the validator image ships for its workload pods: it adds two
    vectors on the GPU, so it needs the driver loaded on the node (cudaMalloc fails first without it,
    and the sample exits EXIT_FAILURE)."""
    proc.out("[Vector addition of 50000 elements]")
    if proc.node.driver is None:
        proc.fail(
            "Failed to allocate device vector A (error code CUDA driver version is insufficient for "
            "CUDA runtime version)!"
        )
    proc.out("Copy input data from the host memory to the CUDA device")
    proc.out("CUDA kernel launch with 196 blocks of 256 threads")
    proc.out("Copy output data from the CUDA device to the host memory")
    proc.out("Test PASSED")
    proc.out("Done")


@program("nvidia-validator")
async def nvidia_validator(proc: Proc, argv: tuple[str, ...]) -> None:
    component = proc.env.get("COMPONENT", "")
    if not component:
        raise _error(proc, "invalid -c <component-name> flag: must not be empty string")
    if component in ("plugin", "metrics") and not proc.env.get("NODE_NAME"):
        raise _error(
            proc, f"invalid -n <node-name> flag: must not be empty string for {component} validation"
        )
    if component in ("vfio-pci", "vgpu-manager", "vgpu-devices") and not proc.env.get("NODE_NAME"):
        raise _error(
            proc, f"invalid -n <node-name> flag: must not be empty string for {component} validation"
        )
    if component in ("plugin", "cuda") and not proc.env.get("OPERATOR_NAMESPACE"):
        raise _error(
            proc, f"invalid -ns <namespace> flag: must not be empty string for {component} validation"
        )
    validator = SandboxValidator(proc)
    steps = {
        "driver": validator.driver,
        "toolkit": validator.toolkit,
        "plugin": validator.plugin,
        "cuda": validator.cuda,
        "vfio-pci": validator.vfio_pci,
        "vgpu-manager": validator.vgpu_manager,
        "vgpu-devices": validator.vgpu_devices,
        "cc-manager": validator.cc_manager,
    }
    if component == "metrics":
        await proc.forever()
    if component not in steps:
        raise _error(proc, f"invalid -c <component-name> flag value: {component}")
    await steps[component]()
