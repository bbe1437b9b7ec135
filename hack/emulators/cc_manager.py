"""k8s-cc-manager v0.4.3 (ccManager.image in NVIDIA's chart values.yaml:556-557; ours
gpu_operator/core/components.py "cc-manager"): ``python3 /app/main.py`` (the image's ENTRYPOINT,
deployments/container/Dockerfile.distroless:81), and the image's own ``/bin/rm`` (l.46, the CC manager's
preStop removes its readiness file with it).

main.py:

* ``main`` (l.698-760): ``NODE_NAME`` must be set (else exit 1); the default mode is ``DEFAULT_CC_MODE``
  (``on`` when unset), ``off`` on a host without CC (``is_host_cc_enabled`` l.80-103: Intel TDX
  ``/sys/module/kvm_intel/parameters/tdx`` or AMD SEV-SNP ``/sys/module/kvm_amd/parameters/sev_snp``
  ``Y``/``1``; the emulated hosts have neither unless a test writes one);
* ``watch_and_apply`` (l.600-684): the mode the node's ``nvidia.com/cc.mode`` label names (else the
  default) is set, the readiness file ``CC_READINESS_FILE`` (``/run/nvidia/validations/
  .cc-manager-ctr-ready``) created (the sandbox validator's cc-manager step waits for it), and every
  later change of the label set again;
* ``set_cc_mode`` (l.214-263): with a mode other than ``off`` every GPU must support CC (Hopper; the
  simulated L4 does not: exit 1), no CC-capable GPU is state ``off``; a mode already set is only
  reported; otherwise, with ``EVICT_OPERATOR_COMPONENTS`` (default true), the sandbox operands' deploy
  labels are paused (``paused-for-cc-mode-change``, gpu_operator_eviction.py:22-96) and their pods
  waited for (2 s polls, 300 s, then it goes on anyway), the mode set and the GPUs reset, the labels
  restored. The state is ``nvidia.com/cc.mode.state`` and ``nvidia.com/cc.ready.state`` (``true`` for
  on and ppcie, ``false`` for off; gpu_operator_eviction.py:262-296), patched.

A GPU's CC mode lives in the GPU (gpu-admin-tools reads it through its registers); here it is the file
``/sys/bus/pci/devices/<bdf>/cc_mode`` of the emulated host, ``off`` when absent.
"""

from __future__ import annotations

from . import pci
from .api import STRATEGIC_MERGE_PATCH, Api, ApiError
from .node import NodeState
from .process import Proc, program

MODE_LABEL = "nvidia.com/cc.mode"
STATE_LABEL = "nvidia.com/cc.mode.state"
READY_LABEL = "nvidia.com/cc.ready.state"
READINESS_FILE = "/run/nvidia/validations/.cc-manager-ctr-ready"
PAUSED = "paused-for-cc-mode-change"
COMPONENTS = {
    "nvidia.com/gpu.deploy.vfio-manager": "nvidia-vfio-manager",
    "nvidia.com/gpu.deploy.vgpu-manager": "nvidia-vgpu-manager",
    "nvidia.com/gpu.deploy.sandbox-validator": "nvidia-sandbox-validator",
    "nvidia.com/gpu.deploy.sandbox-device-plugin": "nvidia-sandbox-device-plugin-daemonset",
    "nvidia.com/gpu.deploy.vgpu-device-manager": "nvidia-vgpu-device-manager",
}
EVICTION_TIMEOUT_S = 300.0
USER_AGENT = "OpenAPI-Generator/28.1.0/python"
"""The Kubernetes Python client's (requirements.txt: kubernetes>=28.1.0): its writes' field manager is
`OpenAPI-Generator`, not a program's name."""


def host_cc(node: NodeState) -> bool:
    for path in ("/sys/module/kvm_intel/parameters/tdx", "/sys/module/kvm_amd/parameters/sev_snp"):
        value = node.read(path)
        if isinstance(value, str) and value.strip().lower() in ("y", "1"):
            return True
    return False


def cc_capable(node: NodeState) -> bool:
    """gpu-admin-tools' is_cc_query_supported: Hopper and later."""
    return node.model is not None and node.model.compute[0] >= 9


def mode_of(node: NodeState, address: str) -> str:
    value = node.read(f"{pci.DEVICES}/{address}/cc_mode")
    return value.strip() if isinstance(value, str) else "off"


def paused(value: str) -> str:
    """_maybe_set_paused (gpu_operator_eviction.py:43-69)."""
    if value in ("", "false") or PAUSED in value:
        return value
    return PAUSED if value == "true" else f"{value}_{PAUSED}"


def unpaused(value: str) -> str:
    """_maybe_set_unpaused (gpu_operator_eviction.py:72-95)."""
    if value == PAUSED:
        return "true"
    if value and PAUSED in value:
        return value.replace(f"_{PAUSED}", "").replace(PAUSED, "").strip("_")
    return value


def ready_value(state: str) -> str:
    return "true" if state in ("on", "ppcie") else "false" if state == "off" else ""


class CCManager:
    def __init__(self, proc: Proc, api: Api, default_mode: str) -> None:
        self.proc = proc
        self.api = api
        self.node = proc.env.get("NODE_NAME", "")
        self.namespace = proc.env.get("OPERATOR_NAMESPACE") or "gpu-operator"
        self.evict = (proc.env.get("EVICT_OPERATOR_COMPONENTS") or "true").lower() == "true"
        self.default_mode = default_mode

    async def patch(self, labels: dict[str, str]) -> None:
        body = {"metadata": {"labels": labels}}
        await self.api.patch(f"/api/v1/nodes/{self.node}", body, STRATEGIC_MERGE_PATCH)

    async def set_state(self, state: str) -> None:
        try:
            await self.patch({STATE_LABEL: state, READY_LABEL: ready_value(state)})
            self.proc.out(f"Set {STATE_LABEL}={state}, {READY_LABEL}={ready_value(state)}")
        except ApiError as exc:
            self.proc.out(f"Failed to set cc.mode.state label: {exc}")

    async def set_mode(self, mode: str) -> None:
        proc, node = self.proc, self.proc.node
        gpus = pci.addresses(node)
        capable = gpus if cc_capable(node) else []
        if mode != "off" and len(gpus) != len(capable):
            proc.fail(f"Some GPUs are not cc-capable: {set(gpus) - set(capable)}")
        if not gpus:
            proc.out("No GPUs to configure")
            return
        if not mode:
            proc.out("No CC mode specified, skipping")
            return
        if not capable:
            await self.set_state("off")
            return
        if all(mode_of(node, a) == mode for a in capable):
            proc.out(f"All gpus already set to cc {mode}, skipping")
            await self.set_state(mode)
            return
        original: dict[str, str] = {}
        if self.evict:
            found = await self.api.get(f"/api/v1/nodes/{self.node}")
            labels = (found.get("metadata") or {}).get("labels") or {}
            original = {key: labels.get(key, "") for key in COMPONENTS}
            proc.out("Evicting GPU operator components before CC mode change")
            await self.patch({key: paused(value) for key, value in original.items()})
            for key, app in COMPONENTS.items():
                if original[key]:
                    await self.wait_gone(app)
        await proc.work("cc")
        for address in capable:
            node.write(f"{pci.DEVICES}/{address}/cc_mode", mode + "\n")
        proc.out(f"Set CC mode to {mode} on {len(capable)} GPU(s)")
        if self.evict:
            proc.out("Rescheduling GPU operator components")
            await self.patch({key: unpaused(value) for key, value in original.items()})
        await self.set_state(mode)

    async def wait_gone(self, app: str) -> None:
        async def gone() -> bool | None:
            found = await self.api.get(
                f"/api/v1/namespaces/{self.namespace}/pods",
                fieldSelector=f"spec.nodeName={self.node}",
                labelSelector=f"app={app}",
            )
            return True if not found.get("items") else None

        proc = self.proc
        proc.out(f"Waiting for {app} pods to be deleted...")
        if await proc.poll(gone, 2.0, EVICTION_TIMEOUT_S) is None:
            proc.out(f"Timeout waiting for {app} pods to be deleted")

    def with_default(self, label: str) -> str:
        return label or self.default_mode


async def cc_manager(proc: Proc) -> None:
    env = proc.env
    if not env.get("NODE_NAME"):
        proc.fail("NODE_NAME environment variable must be set for k8s-cc-manager")
    default_mode = env.get("DEFAULT_CC_MODE") or "on"
    if not host_cc(proc.node):
        if default_mode != "off":
            proc.out(
                f"Overriding default CC mode: {default_mode} to off because the host does not support CC"
            )
        default_mode = "off"
    api = await proc.api(USER_AGENT)
    manager = CCManager(proc, api, default_mode)
    try:
        found = await api.get(f"/api/v1/nodes/{manager.node}")
    except ApiError as exc:
        proc.fail(f"Fatal error: {exc}")
    label = ((found.get("metadata") or {}).get("labels") or {}).get(MODE_LABEL, "")
    await manager.set_mode(manager.with_default(label))
    readiness = env.get("CC_READINESS_FILE") or READINESS_FILE
    if not proc.fs.write(readiness, ""):
        proc.out(f"Failed to create readiness file {readiness}")
    else:
        proc.out(f"Created readiness file: {readiness}")
    last = label
    while True:
        await proc.node.wait_change()
        label = proc.node.labels.get(MODE_LABEL, "")
        if label != last:
            proc.out(f"Label changed: '{last}' -> '{label}'")
            last = label
            await manager.set_mode(manager.with_default(label))


@program("python3")
async def python3(proc: Proc, argv: tuple[str, ...]) -> None:
    """The CC manager's interpreter: only its own script is emulated."""
    script = argv[1] if len(argv) > 1 else ""
    if script != "/app/main.py":
        proc.fail(f"python3: can't open file '{script}': [Errno 2] No such file or directory", code=2)
    await cc_manager(proc)


@program("rm")
async def rm(proc: Proc, argv: tuple[str, ...]) -> None:
    """`rm [-f] PATH...` (an exec'd rm, as the CC manager's preStop runs it; scripts' rm is shell.py's)."""
    for pattern in (a for a in argv[1:] if not a.startswith("-")):
        proc.fs.remove_glob(pattern)
