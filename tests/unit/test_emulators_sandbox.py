"""The emulated sandbox images (hack/emulators): vfio-manage, KubeVirt's GPU device plugin, the vGPU
manager's virtual functions, vgpu-device-manager, the CC manager and the sandbox validator's steps, run
as programs on an emulated node against an in-memory API."""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import builders
import pytest
import yaml
from builders import node_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_operator.core.components import BY_NAME
from hack.emulators import (
    cc_manager,
    gpus,
    images,
    kata_device_plugin,
    kubevirt_device_plugin,
    operands,
    pci,
    podspec,
    profile,
    shell,
    validator,
    vgpu_device_manager,
)
from hack.emulators.cluster import IpPool
from hack.emulators.emulator import Emulator
from hack.emulators.kubelet import PodRunner
from hack.emulators.node import NodeState
from hack.emulators.process import PROGRAMS, ContainerExit, Proc
from hack.emulators.vfs import ContainerFS

ROOT = Path(__file__).resolve().parents[2]
assert "vfio-manage" in operands.NAMES
DEFAULT_VGPU_CONFIG = ROOT / "manifests/templates/vgpu-device-manager/default-vgpu-devices-config.yaml"
JSON = dict[str, Any]


class MemoryApi:
    """The node and the (empty) pod lists, as the API server answers an image's calls."""

    def __init__(self, node: JSON) -> None:
        self.node = node
        self.writes: list[dict[str, str]] = []

    async def get(self, path: str, **params: str) -> JSON:
        if path.startswith("/api/v1/nodes/"):
            return copy.deepcopy(self.node)
        return {"items": []}

    def _labels(self, labels: dict[str, str]) -> None:
        self.node["metadata"]["labels"].update(labels)
        self.writes.append(dict(labels))

    async def update(self, path: str, body: JSON) -> JSON:
        before = self.node["metadata"]["labels"]
        changed = {k: v for k, v in body["metadata"]["labels"].items() if before.get(k) != v}
        self._labels(changed)
        return copy.deepcopy(self.node)

    async def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        self._labels(body["metadata"]["labels"])
        return copy.deepcopy(self.node)


class Tokens:
    def __init__(self, api: MemoryApi) -> None:
        self.api = api

    async def api_for(self, pod: podspec.Pod, name: str) -> MemoryApi:
        return self.api


class Emu:
    def __init__(self, api: MemoryApi) -> None:
        self.tokens = Tokens(api)
        self.profile = profile.profile("instant")
        self.stopping = False


class Runner:
    """What a Proc asks of its PodRunner."""

    def __init__(self, pod: podspec.Pod, node: NodeState, emu: Emu) -> None:
        self.pod, self.node, self.emu = pod, node, emu
        self.procs: dict[str, Proc] = {}

    def container_changed(self, name: str) -> None:
        return None


def host(model: str = "H100-80GB-HBM3", count: int = 8, labels: dict[str, str] | None = None) -> NodeState:
    state = NodeState("n", lambda node: None)
    annotations = {gpus.COUNT_ANNOTATION: str(count), gpus.MODEL_ANNOTATION: model}
    state.observe(node_body("n", labels or {}, uid="uid-1", annotations=annotations))
    return state


def run(
    node: NodeState,
    image: str,
    env: dict[str, str],
    program: Callable[[Proc], Awaitable[None]],
    *,
    mounts: list[tuple[str, str, str]] | None = None,
    config_maps: dict[str, dict[str, str]] | None = None,
    exits: bool = False,
) -> tuple[MemoryApi, list[str]]:
    """Run `program` in a container of `image` on `node` (mounts: volume, host path, container path);
    with `exits`, the container may exit non-zero (its message is the log's last line)."""
    mounts = mounts or []
    api = MemoryApi(node_body("n", node.labels))
    volumes = [{"name": v, "hostPath": {"path": h}} for v, h, _ in mounts]
    volumes += [{"name": name, "configMap": {"name": name}} for name in config_maps or {}]
    container = {
        "name": "main",
        "image": image,
        "volumeMounts": [{"name": v, "mountPath": c} for v, _, c in mounts]
        + [{"name": name, "mountPath": f"/{name}"} for name in config_maps or {}],
    }
    body = builders.pod_body("p", "n", namespace="gpu-operator", uid="u", labels={}, containers=[container])
    body["spec"]["volumes"] = volumes
    pod = podspec.parse(body)
    log: list[str] = []

    async def main() -> None:
        runner = Runner(pod, node, Emu(api))
        cms = config_maps or {}
        fs = ContainerFS(
            pod, pod.containers[0], node, {}, lambda ns, name: cms.get(name), images.files(image)
        )
        proc = Proc(cast(Any, runner), pod.containers[0], {"NODE_NAME": "n", **env}, fs)
        proc.out = log.append  # type: ignore[method-assign,assignment]
        try:
            await program(proc)
        except ContainerExit:
            if not exits:
                raise

    asyncio.run(asyncio.wait_for(main(), 10))
    node.observe(node_body("n", api.node["metadata"]["labels"], uid="uid-1", annotations=node.annotations))
    return api, log


def argv_program(*argv: str) -> Callable[[Proc], Awaitable[None]]:
    async def go(proc: Proc) -> None:
        await PROGRAMS[argv[0]](proc, argv)

    return go


VALIDATOR = "nvcr.io/nvidia/gpu-operator:v26.7.0"
DRIVER_MANAGER = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
VALIDATIONS = ("validations", "/run/nvidia/validations", "/run/nvidia/validations")


def validate(node: NodeState, component: str, **env: str) -> list[str]:
    mounts = [VALIDATIONS, ("driver", "/run/nvidia/driver", "/run/nvidia/driver"), ("host", "/", "/host")]
    _, log = run(
        node,
        VALIDATOR,
        {"COMPONENT": component, **env},
        argv_program("nvidia-validator"),
        mounts=mounts,
        exits=True,
    )
    return log


# --- KubeVirt's resource names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pci_name", "resource"),
    [
        ("GH100 [H100 SXM5 80GB]", "GH100_H100_SXM5_80GB"),
        ("AD104GL [L4]", "AD104GL_L4"),
        ("GA100 [A100 PCIe 40GB]", "GA100_A100_PCIE_40GB"),
        ("TU104GL [Tesla T4]", "TU104GL_TESLA_T4"),
        ("GP102GL [Tesla P40]", "GP102GL_TESLA_P40"),  # KubeVirt's example (examples/vmi-gpu.yaml)
        ("GA102GL [RTX A6000/A40]", "GA102GL_RTX_A6000_A40"),
    ],
)
def test_kubevirt_names_a_gpu_after_its_pci_ids_entry(pci_name: str, resource: str) -> None:
    assert kubevirt_device_plugin.device_name(pci_name) == resource


# --- VM passthrough ----------------------------------------------------------------------------


def test_vfio_manage_binds_every_gpu_and_the_sandbox_stack_sees_them() -> None:
    node = host(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"})
    assert kubevirt_device_plugin.advertised(node) == {}
    log = validate(node, "vfio-pci")
    assert node.read("/run/nvidia/validations/workload-type") == "vm-passthrough\n"
    assert (
        "Error: error validating vfio-pci driver installation: device not bound to 'vfio-pci'; device: "
        in (log[-1])
    )
    assert not node.validation("vfio-pci-ready")

    mounts = [("host-sys", "/sys", "/sys"), ("host-root", "/", "/host")]
    run(
        node,
        DRIVER_MANAGER,
        {"HOST_ROOT": "/host"},
        argv_program("vfio-manage", "bind", "--all"),
        mounts=mounts,
    )
    assert pci.vfio_loaded(node)
    assert {pci.driver(node, a) for a in pci.addresses(node)} == {"vfio-pci"}
    validate(node, "vfio-pci")
    assert node.validation("vfio-pci-ready")
    assert kubevirt_device_plugin.advertised(node) == {"nvidia.com/GH100_H100_SXM5_80GB": 8}

    run(node, DRIVER_MANAGER, {}, argv_program("vfio-manage", "unbind", "--all"), mounts=mounts)
    assert {pci.driver(node, a) for a in pci.addresses(node)} == {""}
    assert kubevirt_device_plugin.advertised(node) == {}


def test_vfio_manage_needs_all_or_a_device() -> None:
    with pytest.raises(ContainerExit, match="either --all or --device-id must be specified"):
        run(host(), DRIVER_MANAGER, {}, argv_program("vfio-manage", "bind"))


def test_a_gpu_of_the_loaded_nvidia_driver_is_not_passed_through() -> None:
    node = host("L4", 2)
    node.set_driver("595.91.07")
    assert [pci.driver(node, a) for a in pci.addresses(node)] == ["nvidia", "nvidia"]
    assert kubevirt_device_plugin.advertised(node) == {}


def test_the_sandbox_steps_pass_at_once_for_another_workload_type() -> None:
    node = host(labels={"nvidia.com/gpu.workload.config": "container"})
    for step in ("vfio-pci", "vgpu-manager", "vgpu-devices"):
        validate(node, step, DEFAULT_GPU_WORKLOAD_CONFIG="vm-vgpu")
    assert node.read("/run/nvidia/validations/workload-type") == "container\n"
    assert not any(node.validation(f"{s}-ready") for s in ("vfio-pci", "vgpu-manager", "vgpu-devices"))
    unlabelled = host()
    validate(unlabelled, "vgpu-devices", DEFAULT_GPU_WORKLOAD_CONFIG="bogus")
    assert unlabelled.read("/run/nvidia/validations/workload-type") == "vm-passthrough\n"


def test_the_sandbox_gate_reads_the_workload_type() -> None:
    """The sandbox device plugin's init container (manifests/templates/_macros/containers.j2
    sandbox_gate): wait for workload-type; another type exits 0; else wait for the step's file."""
    text = (
        "until [ -f /run/nvidia/validations/workload-type ]; do echo waiting for workload type status file; "
        'sleep 5; done; if [ "$(cat /run/nvidia/validations/workload-type)" != "vm-passthrough" ]; then echo '
        "vfio-pci not needed, skipping validation; exit 0; fi; "
        "until [ -f /run/nvidia/validations/vfio-pci-ready ]; do echo waiting for vfio-pci driver ...; "
        "sleep 5; done;"
    )
    steps = shell.parse(text).steps
    assert [s.kind for s in steps] == ["wait", "if", "wait"]
    assert (steps[1].path, steps[1].name, steps[1].value) == (
        "/run/nvidia/validations/workload-type",
        "!=",
        "vm-passthrough",
    )
    assert [s.kind for s in steps[1].body] == ["exit"]
    chained = shell.parse("vfio-manage bind --all && while true; do sleep 86400; done").steps
    assert [(s.kind, s.chained) for s in chained] == [("run", True), ("forever", False)]
    assert chained[0].argv == ("vfio-manage", "bind", "--all")


# --- vGPU ----------------------------------------------------------------------------------------


def vgpu_host(model: str = "L4", count: int = 2) -> NodeState:
    """A vm-vgpu node whose vGPU manager loaded and enabled the virtual functions."""
    node = host(model, count, labels={"nvidia.com/gpu.workload.config": "vm-vgpu"})
    node.set_driver("595.91.07")
    node.write("/run/nvidia/driver/usr/bin/nvidia-smi", "595.91.07")
    node.write("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "595.91.07")
    pci.set_vfs(node, True)
    return node


def test_the_vgpu_manager_step_waits_for_the_virtual_functions() -> None:
    node = vgpu_host()
    assert validator.parent_devices_ready(node)
    validate(node, "vgpu-manager", WITH_WAIT="true")
    assert node.validation("vgpu-manager-ready")
    pci.set_vfs(node, False)
    assert not validator.parent_devices_ready(node)


def run_device_manager(node: NodeState, **env: str) -> tuple[MemoryApi, list[str]]:
    config = {"default-vgpu-devices-config": {"config.yaml": DEFAULT_VGPU_CONFIG.read_text()}}
    mounts = [("driver", "/run/nvidia/driver", "/driver-root")]

    async def once(proc: Proc) -> None:
        manager = vgpu_device_manager.VgpuDeviceManager(proc, cast(Any, await proc.api()))
        await manager.run_update(node.labels.get("nvidia.com/vgpu.config") or env.get("DEFAULT", "default"))

    return run(
        node,
        "nvcr.io/nvidia/cloud-native/vgpu-device-manager:v0.5.0",
        {"NAMESPACE": "gpu-operator", "CONFIG_FILE": "/default-vgpu-devices-config/config.yaml"},
        once,
        mounts=mounts,
        config_maps=config,
    )


def test_the_vgpu_device_manager_creates_the_default_devices_and_pauses_the_sandbox_operands() -> None:
    node = vgpu_host()
    node.labels["nvidia.com/gpu.deploy.sandbox-validator"] = "true"
    api, _ = run_device_manager(node)
    assert vgpu_device_manager.applied(node) == [{"L4-12Q": 2}, {"L4-12Q": 2}]
    assert api.writes == [
        {"nvidia.com/vgpu.config.state": "pending"},
        {
            "nvidia.com/gpu.deploy.sandbox-device-plugin": "",
            "nvidia.com/gpu.deploy.sandbox-validator": "paused-for-vgpu-change",
        },
        {"nvidia.com/gpu.deploy.sandbox-validator": "true"},
        {"nvidia.com/vgpu.config.state": "success"},
    ]
    assert kubevirt_device_plugin.advertised(node) == {"nvidia.com/NVIDIA_L4-12Q": 4}
    validate(node, "vgpu-devices")
    assert node.validation("vgpu-devices-ready")
    # Applied already: no pause, the state stays.
    api, _ = run_device_manager(node)
    assert not any("pending" in w.values() for w in api.writes)
    assert api.node["metadata"]["labels"]["nvidia.com/vgpu.config.state"] == "success"


def test_the_vgpu_device_manager_follows_the_label_and_fails_what_the_gpu_cannot_hold() -> None:
    node = vgpu_host("H100-80GB-HBM3", 1)
    node.labels["nvidia.com/vgpu.config"] = "H100XM-20C"
    run_device_manager(node)
    assert vgpu_device_manager.applied(node) == [{"H100XM-20C": 4}]
    node.labels["nvidia.com/vgpu.config"] = "H100XM-1-10C"  # MIG-backed
    api, log = run_device_manager(node)
    assert api.node["metadata"]["labels"]["nvidia.com/vgpu.config.state"] == "failed"
    assert any("vGPU type H100XM-1-10C is not supported on GPU" in line for line in log)
    assert vgpu_device_manager.applied(node) == [{"H100XM-20C": 4}], "a refused config leaves the devices"
    node.labels["nvidia.com/vgpu.config"] = "no-such-config"
    api, _ = run_device_manager(node)
    assert api.node["metadata"]["labels"]["nvidia.com/vgpu.config.state"] == "failed"


def test_disabling_the_virtual_functions_removes_their_vgpus() -> None:
    node = vgpu_host()
    run_device_manager(node)
    assert pci.vgpu_devices(node)
    pci.set_vfs(node, False)
    assert pci.vgpu_devices(node) == [] and kubevirt_device_plugin.advertised(node) == {}


def test_the_default_vgpu_config_selects_each_simulated_gpu() -> None:
    config = yaml.safe_load(DEFAULT_VGPU_CONFIG.read_text())
    assert vgpu_device_manager.wanted(config, "default", gpus.H100_80GB, 1) == [{"H100XM-40C": 2}]
    assert vgpu_device_manager.wanted(config, "default", gpus.L4, 1) == [{"L4-12Q": 2}]
    assert vgpu_device_manager.supported(gpus.L4, "L4-24Q") == 1
    assert vgpu_device_manager.supported(gpus.L4, "L4-5Q") == 0


# --- confidential computing ----------------------------------------------------------------------


def test_the_cc_manager_sets_the_mode_and_marks_itself_ready() -> None:
    mounts = [("run-nvidia", "/run/nvidia", "/run/nvidia")]
    image = "nvcr.io/nvidia/cloud-native/k8s-cc-manager:v0.4.3"
    l4 = host("L4", 2)

    async def until_ready(proc: Proc) -> None:
        task = asyncio.ensure_future(cc_manager.cc_manager(proc))
        while not proc.node.validation(".cc-manager-ctr-ready") and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        task.cancel()

    api, log = run(l4, image, {}, until_ready, mounts=mounts)
    assert api.node["metadata"]["labels"]["nvidia.com/cc.mode.state"] == "off"
    assert "Overriding default CC mode: on to off because the host does not support CC" in log

    h100 = host(labels={"nvidia.com/cc.mode": "on"})
    api, log = run(h100, image, {}, until_ready, mounts=mounts)
    assert api.node["metadata"]["labels"]["nvidia.com/cc.mode.state"] == "on"
    assert api.node["metadata"]["labels"]["nvidia.com/cc.ready.state"] == "true"
    assert {cc_manager.mode_of(h100, a) for a in pci.addresses(h100)} == {"on"}

    with pytest.raises(ContainerExit, match="Some GPUs are not cc-capable"):
        run(host("L4", 2, labels={"nvidia.com/cc.mode": "on"}), image, {}, until_ready, mounts=mounts)


def test_the_cc_step_waits_only_on_cc_capable_nodes() -> None:
    node = host()
    validate(node, "cc-manager")
    assert node.validation("cc-manager-ready")
    capable = host(labels={"nvidia.com/cc.capable": "true"})
    log = validate(capable, "cc-manager")
    assert log[-1] == "Error: error validating CC Manager installation: exit status 1"
    capable.write("/run/nvidia/validations/.cc-manager-ctr-ready", "")
    validate(capable, "cc-manager")
    assert capable.validation("cc-manager-ready")


# --- the operator's sandbox pods on the emulated kubelet -----------------------------------------


class KubeletEmu(Emu):
    """What PodRunner and the images ask of the Emulator, for pods on one node, with the operator's
    ConfigMaps (no runtime classes: the sandbox pods use none)."""

    def __init__(self, api: MemoryApi, config_maps: dict[str, dict[str, str]]) -> None:
        super().__init__(api)
        self.api = api
        self.ips = IpPool()
        self.config_maps = config_maps
        self.runners: list[PodRunner] = []

    def failures_for(self, pod: podspec.Pod) -> list[Any]:
        return []

    def status_changed(self, runner: PodRunner) -> None:
        return None

    def post_event(self, pod: podspec.Pod, kind: str, reason: str, message: str) -> None:
        return None

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.config_maps.get(name)

    def runtime_handler(self, runtime_class: str) -> str | None:
        return None

    def pods_on(self, node: str) -> list[PodRunner]:
        return [r for r in self.runners if not r.terminating]

    async def delete_pod(self, pod: podspec.Pod) -> None:
        return None


class NodeApi(MemoryApi):
    """MemoryApi, also answering node lists (informers) and spec patches (cordon)."""

    async def get(self, path: str, **params: str) -> JSON:
        if path == "/api/v1/nodes":
            return {"items": [copy.deepcopy(self.node)]}
        return await super().get(path, **params)

    async def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        if "spec" in body:
            self.node.setdefault("spec", {}).update(body["spec"])
        if (body.get("metadata") or {}).get("labels"):
            self._labels(body["metadata"]["labels"])
        return copy.deepcopy(self.node)


SANDBOX_POLICY: JSON = {
    "sandboxWorkloads": {"enabled": True, "mode": "kubevirt"},
    "vfioManager": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "vgpuManager": {
        "enabled": True,
        "repository": "nvcr.io/nvidia",
        "image": "vgpu-manager",
        "version": "595.91.07",
    },
    "vgpuDeviceManager": {"enabled": True},
}


KATA_POLICY: JSON = {
    "sandboxWorkloads": {"enabled": True, "mode": "kata"},
    "vfioManager": {"enabled": True},
    "kataSandboxDevicePlugin": {"enabled": True},
    "ccManager": {"enabled": True},
}


def rendered(policy: JSON = SANDBOX_POLICY) -> list[JSON]:
    from gpu_operator.api import parse_spec
    from gpu_operator.core.render import ClusterFacts, render

    return render(parse_spec(policy), ClusterFacts(namespace="gpu-operator", os_tag="ubuntu22.04"))


def pod_of(objects: list[JSON], component: str) -> JSON:
    """The pod the DaemonSet of `component` creates on node n."""
    name = BY_NAME[component].daemonset
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith(name)]
    template = ds["spec"]["template"]
    return {
        "metadata": {
            "name": f"{ds['metadata']['name']}-x",
            "namespace": "gpu-operator",
            "uid": f"uid-{component}",
            "labels": template["metadata"]["labels"],
        },
        "spec": {**template["spec"], "nodeName": "n"},
        "status": {},
    }


def ready(runner: PodRunner) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in runner.status()["conditions"])


def run_stack(
    node: NodeState,
    components: list[list[str]],
    until: Callable[[NodeState], bool],
    policy: JSON = SANDBOX_POLICY,
) -> NodeApi:
    """Start the components' pods on `node`, each group once the previous one is Ready, until `until`."""
    objects = rendered(policy)
    config_maps = {
        o["metadata"]["name"]: dict(o.get("data") or {}) for o in objects if o["kind"] == "ConfigMap"
    }
    api = NodeApi(node_body("n", node.labels))

    async def main() -> None:
        emu = KubeletEmu(api, config_maps)
        try:
            for group in components:
                runners = []
                for component in group:
                    body = pod_of(objects, component)
                    runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node, body)
                    emu.runners.append(runner)
                    runners.append(runner)
                    runner.start()
                while not all(ready(r) for r in runners):
                    await asyncio.sleep(0.01)
                    # The API's label writes reach the node as its watch would bring them.
                    node.observe(
                        node_body(
                            "n", api.node["metadata"]["labels"], uid="uid-1", annotations=node.annotations
                        )
                    )
            while not until(node):
                await asyncio.sleep(0.01)
        finally:
            emu.stopping = True  # the emulators stop; what the pods did stays on the node
            for runner in emu.runners:
                runner.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    return api


def test_the_rendered_passthrough_stack_runs_on_the_emulated_kubelet() -> None:
    """vfio-manager, sandbox validator and KubeVirt's plugin as the operator renders them: the GPUs are
    bound, validated and advertised under the model's name."""
    node = host(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"})
    run_stack(
        node,
        [["vfio-manager"], ["sandbox-validator"], ["sandbox-device-plugin"]],
        lambda n: bool(n.resources),
    )
    assert node.resources == {"nvidia.com/GH100_H100_SXM5_80GB": 8}
    assert node.read("/run/nvidia/validations/workload-type") == "vm-passthrough\n"
    assert node.validation("vfio-pci-ready")


def test_the_rendered_vgpu_stack_runs_on_the_emulated_kubelet() -> None:
    """The vGPU manager (the user's image), the vGPU device manager with NVIDIA's default configuration,
    the sandbox validator and KubeVirt's plugin: the vGPUs are created and advertised."""
    node = host("L4", 8, labels={"nvidia.com/gpu.workload.config": "vm-vgpu"})
    api = run_stack(
        node,
        [["vgpu-manager"], ["vgpu-device-manager", "sandbox-validator"], ["sandbox-device-plugin"]],
        lambda n: bool(n.resources),
    )
    assert node.resources == {"nvidia.com/NVIDIA_L4-12Q": 16}
    assert api.node["metadata"]["labels"]["nvidia.com/vgpu.config.state"] == "success"
    assert node.validation("vgpu-manager-ready") and node.validation("vgpu-devices-ready")


def test_deleted_sandbox_pods_give_the_gpus_back() -> None:
    """The VFIO manager's preStop unbinds the GPUs, the vGPU manager's shutdown disables the virtual
    functions (their vGPUs with them) and unloads its driver, the plugin's resources go with its pod:
    a node changing type back to containers starts from GPUs no driver holds."""
    objects = rendered()
    config_maps = {
        o["metadata"]["name"]: dict(o.get("data") or {}) for o in objects if o["kind"] == "ConfigMap"
    }

    def stack(node: NodeState, groups: list[list[str]]) -> None:
        api = NodeApi(node_body("n", node.labels))

        async def main() -> None:
            emu = KubeletEmu(api, config_maps)
            for group in groups:
                runners = []
                for component in group:
                    body = pod_of(objects, component)
                    runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node, body)
                    emu.runners.append(runner)
                    runners.append(runner)
                    runner.start()
                while not all(ready(r) for r in runners):
                    await asyncio.sleep(0.01)
            assert node.resources
            for runner in reversed(emu.runners):
                await runner.terminate()

        asyncio.run(asyncio.wait_for(main(), 20))

    passthrough = host(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"})
    stack(passthrough, [["vfio-manager"], ["sandbox-validator"], ["sandbox-device-plugin"]])
    assert {pci.driver(passthrough, a) for a in pci.addresses(passthrough)} == {""}
    assert passthrough.resources == {} and not passthrough.validation("vfio-pci-ready")

    vgpu = host("L4", 2, labels={"nvidia.com/gpu.workload.config": "vm-vgpu"})
    stack(vgpu, [["vgpu-manager"], ["vgpu-device-manager", "sandbox-validator"], ["sandbox-device-plugin"]])
    assert vgpu.driver is None and pci.vgpu_devices(vgpu) == [] and pci.mdev_parents(vgpu) == []
    assert vgpu.resources == {}


def test_the_rendered_kata_stack_runs_on_the_emulated_kubelet() -> None:
    """Kata mode: the VFIO manager, the CC manager (the host has no TDX or SEV-SNP: mode off), the
    sandbox validator with its CC step, and Kata's plugin: the GPUs as nvidia.com/pgpu, with their CDI
    spec."""
    node = host(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"})
    api = run_stack(
        node,
        [["vfio-manager", "cc-manager"], ["sandbox-validator"], ["kata-sandbox-device-plugin"]],
        lambda n: bool(n.resources),
        KATA_POLICY,
    )
    assert node.resources == {"nvidia.com/pgpu": 8}
    assert api.node["metadata"]["labels"]["nvidia.com/cc.mode.state"] == "off"
    assert node.validation("cc-manager-ready") and node.validation(".cc-manager-ctr-ready")
    spec = yaml.safe_load(str(node.read("/var/run/cdi/nvidia.com-pgpu.yaml")))
    assert spec["kind"] == "nvidia.com/pgpu" and len(spec["devices"]) == 8
    assert kata_device_plugin.format_name("GH100 [H100 SXM5 80GB]") == "GH100_H100_SXM5_80GB"
    assert kata_device_plugin.format_name("GA100 [A100-PCIE-40GB]") == "GA100_A100-PCIE-40GB"
