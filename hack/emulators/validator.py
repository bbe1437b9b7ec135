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
  ``plugin-ready``. kwok completes those pods (hack/kwok/stages.yaml).
* ``metrics`` (node-status exporter): serves metrics until stopped.

Errors are printed as the binary does (``Error: <err>``, main.go:409-413) and exit 1.
"""

from __future__ import annotations

from typing import Any

from .api import Api, ApiError
from .common import NVIDIA_SMI, NVML_LIBRARY, flag, get_node, injected_by_runtime
from .process import ContainerExit, Proc, program

VALIDATIONS = "/run/nvidia/validations"
DRIVER_CTR_READY = f"{VALIDATIONS}/.driver-ctr-ready"
SLEEP_S = 5.0
WORKLOAD_RETRIES = 60
RESOURCE_RETRIES = 30
JSON = dict[str, Any]


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


@program("nvidia-validator")
async def nvidia_validator(proc: Proc, argv: tuple[str, ...]) -> None:
    component = proc.env.get("COMPONENT", "")
    if not component:
        raise _error(proc, "invalid -c <component-name> flag: must not be empty string")
    if component in ("plugin", "metrics") and not proc.env.get("NODE_NAME"):
        raise _error(
            proc, f"invalid -n <node-name> flag: must not be empty string for {component} validation"
        )
    if component in ("plugin", "cuda") and not proc.env.get("OPERATOR_NAMESPACE"):
        raise _error(
            proc, f"invalid -ns <namespace> flag: must not be empty string for {component} validation"
        )
    validator = Validator(proc)
    steps = {
        "driver": validator.driver,
        "toolkit": validator.toolkit,
        "plugin": validator.plugin,
        "cuda": validator.cuda,
    }
    if component == "metrics":
        await proc.forever()
    if component not in steps:
        raise _error(proc, f"invalid -c <component-name> flag value: {component}")
    await steps[component]()
