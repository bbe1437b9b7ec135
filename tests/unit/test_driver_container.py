"""The emulated driver container (hack/emulators/driver_container.py) for every image an NVIDIADriver
can name: driver types, precompiled tags, digests, kernel module types and args, run as the pool
DaemonSets render them."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from builders import gpu_node, node_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_operator.api.nvidiadriver import NVIDIADriverSpec
from gpu_operator.core.driver_pool_render import render_driver
from gpu_operator.core.driver_pools import DriverObject
from gpu_operator.core.images import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.render import ClusterFacts
from hack.emulators import gpus, images, podspec, profile
from hack.emulators.cluster import IpPool
from hack.emulators.common import NVIDIA_SMI
from hack.emulators.driver import READY_FILE, STATE_FILE
from hack.emulators.driver_container import (
    DAEMONS_STATUS_FILE,
    GetoptError,
    getopt,
    kernel_type,
    parse,
    script_of,
)
from hack.emulators.emulator import Emulator
from hack.emulators.kubelet import PodRunner
from hack.emulators.node import MODULE_VERSION, NodeState
from hack.emulators.process import ContainerExit

KERNEL = "5.15.0-105-generic"
DIGEST = "sha256:" + "0123456789abcdef" * 4


# --- images ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "script", "version", "driver_type"),
    [
        ("nvcr.io/nvidia/driver:595.91.07-ubuntu22.04", "driver", "595.91.07", "passthrough"),
        ("nvcr.io/nvidia/driver:580.82.07-ubuntu24.04", "driver", "580.82.07", "passthrough"),
        (f"nvcr.io/nvidia/driver:595-{KERNEL}-ubuntu22.04", "precompiled", "595.91.07", "passthrough"),
        (f"registry.local:5000/mirror/driver@{DIGEST}", "driver", gpus.DEFAULT_DRIVER, "passthrough"),
        ("nvcr.io/nvidia/driver:latest", "driver", gpus.DEFAULT_DRIVER, "passthrough"),
        ("registry.local/nvidia/vgpu-guest-driver:580.82.07-ubuntu22.04", "driver", "580.82.07", "vgpu"),
        ("nvcr.io/nvaie/vgpu-guest-driver-5-0:550.54.15-ubuntu22.04", "driver", "550.54.15", "vgpu"),
        ("registry.local/nvidia/vgpu-manager:580.82.02-ubuntu22.04", "vgpu-manager", "580.82.02", None),
    ],
)
def test_every_driver_image_runs_the_driver_script(
    image: str, script: str, version: str, driver_type: str | None
) -> None:
    assert "/usr/bin/nvidia-driver" in images.files(image)
    assert images.entrypoint(image) == ("nvidia-driver", "init")
    assert script_of(image).kind == script
    assert gpus.driver_version(image) == version
    assert images.env(image).get("DRIVER_TYPE") == driver_type


# --- arguments -------------------------------------------------------------------------------


def test_getopt_as_util_linux_parses() -> None:
    # Checked against util-linux 2.38 `getopt -l accept-license,max-threads: -o am: -- ...`.
    longs = ("accept-license", "max-threads:")
    assert getopt("am:", longs, ["--acc", "-m4", "x"]) == ([("accept-license", ""), ("m", "4")], ["x"])
    assert getopt("am:", longs, ["--max-threads=2", "--", "-a"]) == ([("max-threads", "2")], ["-a"])
    for args, message in [
        (["--foo"], "unrecognized option '--foo'"),
        (["--max-threads"], "option '--max-threads' requires an argument"),
        (["-z"], "invalid option -- 'z'"),
        (["--accept-license=yes"], "option '--accept-license' doesn't allow an argument"),
    ]:
        with pytest.raises(GetoptError, match=message):
            getopt("am:", longs, args)


@pytest.mark.parametrize(
    ("script", "argv", "outcome"),
    [
        ("driver", ["init"], "init"),
        ("driver", ["init", "--accept-license", "--max-threads", "4"], "init"),
        ("driver", ["init", "--foo", "--bar"], "getopt: unrecognized option '--foo'"),
        ("driver", ["init", "extra"], "Usage"),
        ("driver", [], "Usage"),
        ("driver", ["start"], "Usage"),
        ("driver", ["reload_nvidia_peermem"], "reload_nvidia_peermem"),
        ("precompiled", ["init", "extra"], "init"),
        ("precompiled", ["init", "--max-threads", "4"], "getopt: unrecognized option '--max-threads'"),
        ("precompiled", ["update"], "Usage"),
        ("vgpu-manager", ["init", "-a"], "init"),
        ("vgpu-manager", ["reload_nvidia_peermem"], "Usage"),
    ],
)
def test_each_script_takes_its_own_commands_and_options(script: str, argv: list[str], outcome: str) -> None:
    image = {
        "driver": "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
        "precompiled": f"nvcr.io/nvidia/driver:595-{KERNEL}-ubuntu22.04",
        "vgpu-manager": "nvcr.io/nvidia/vgpu-manager:580.82.02-ubuntu22.04",
    }[script]
    try:
        command, _ = parse(script_of(image), argv)
    except ContainerExit as exc:
        assert exc.code == 1 and exc.message.startswith(outcome)
    else:
        assert command == outcome


def test_kernel_module_type() -> None:
    assert [kernel_type(t, 595) for t in ("auto", "open", "proprietary")] == [
        "kernel-open",
        "kernel-open",
        "kernel",
    ]
    assert kernel_type("auto", 550) == "kernel"
    with pytest.raises(ContainerExit, match="invalid value for the KERNEL_MODULE_TYPE variable: closed"):
        kernel_type("closed", 595)


# --- the pool's pod on an emulated node --------------------------------------------------------


class NodeEmulator:
    """What the driver pods' PodRunners ask of their Emulator, for one node (no API server)."""

    def __init__(self, config_maps: dict[str, dict[str, str]], gpu_user: bool) -> None:
        self.profile = profile.profile("instant")
        self.ips = IpPool()
        self.config_maps = config_maps
        self.runners: list[PodRunner] = []
        self.api = self
        # A running pod with the nvidia runtime holds the GPUs (driver.gpus_in_use).
        cuda = SimpleNamespace(runtime_class="nvidia", component="cuda")
        self.others = [SimpleNamespace(pod=cuda, sandbox=True, procs={"cuda": None})] if gpu_user else []

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        return {"items": []}

    def failures_for(self, pod: podspec.Pod) -> list[Any]:
        return []

    def status_changed(self, runner: PodRunner) -> None:
        return None

    def post_event(self, pod: podspec.Pod, kind: str, reason: str, message: str) -> None:
        return None

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.config_maps.get(name)

    def pods_on(self, node: str) -> list[Any]:
        return [*self.runners, *self.others]


def pool_objects(spec: dict[str, Any]) -> list[dict[str, Any]]:
    driver = DriverObject("pool", "uid-1", NVIDIADriverSpec.model_validate(spec))
    labels = {OS_ID_LABEL: "ubuntu", OS_VERSION_LABEL: "22.04", KERNEL_LABEL: KERNEL}
    return render_driver(driver, [gpu_node("n", labels)], ClusterFacts())


def driver_pod(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The pool DaemonSet's pod on node n, without its k8s-driver-manager init container (which
    talks to the API; test_emulators covers it)."""
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    spec = {**daemonset["spec"]["template"]["spec"], "nodeName": "n", "initContainers": []}
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels}, "spec": spec}


def emulated_node() -> NodeState:
    state = NodeState("n", lambda node: None)
    state.observe(node_body("n", uid="node-uid", annotations={gpus.COUNT_ANNOTATION: "1"}))
    return state


async def until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.01)


def run_pods(
    spec: dict[str, Any],
    pods: int = 1,
    node: NodeState | None = None,
    done: Callable[[list[PodRunner]], bool] | None = None,
    gpu_user: bool = False,
) -> tuple[NodeState, list[PodRunner]]:
    """Run `pods` driver pods of the pool on one node until `done` (default: the first is Ready)."""
    objects = pool_objects(spec)
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    state = node or emulated_node()

    def ready(runner: PodRunner) -> bool:
        return runner.states["nvidia-driver-ctr"].ready

    async def run() -> list[PodRunner]:
        emu = NodeEmulator(config_maps, gpu_user)
        for i in range(pods):
            body = driver_pod(objects, f"driver-{i}")
            runner = PodRunner(cast(Emulator, emu), podspec.parse(body), state, body)
            emu.runners.append(runner)
            runner.start()
            if i < pods - 1:  # the next pod comes to a node where this one runs
                await until(lambda: ready(emu.runners[-1]))
        await until(lambda: (done or (lambda runners: ready(runners[0])))(emu.runners))
        for runner in emu.runners:
            runner.stop()
        return emu.runners

    return state, asyncio.run(asyncio.wait_for(run(), 10))


def exited(runner: PodRunner) -> str:
    """The driver container's last exit message ("" while it has not exited)."""
    last = runner.states["nvidia-driver-ctr"].last or {}
    return str(last.get("message", ""))


def test_the_default_pool_installs_its_version_with_the_open_modules_and_records_its_digest() -> None:
    node, _ = run_pods({"version": "595.91.07"})
    assert node.driver == "595.91.07"
    assert "Open Kernel Module" in str(node.read(MODULE_VERSION))
    assert node.read(f"/run/nvidia/driver/{NVIDIA_SMI}") == "595.91.07"
    assert str(node.read(STATE_FILE)).strip().isdigit()  # the pod's DRIVER_CONFIG_DIGEST
    assert node.read(DAEMONS_STATUS_FILE) == "Ready\n"
    assert node.read(READY_FILE) is not None


def test_a_precompiled_pool_with_proprietary_modules() -> None:
    node, _ = run_pods({"version": "595", "usePrecompiled": True, "kernelModuleType": "proprietary"})
    assert node.driver == "595.91.07"
    assert "x86_64 Kernel Module" in str(node.read(MODULE_VERSION))
    assert node.read(STATE_FILE) is None, "the precompiled script records no digest"


@pytest.mark.parametrize(
    "spec",
    [
        {"driverType": "vgpu", "repository": "registry.local/nvidia", "image": "vgpu-guest-driver"},
        {"repository": "registry.local/nvidia", "version": DIGEST},
    ],
)
def test_vgpu_guest_pools_and_digests_run_the_driver(spec: dict[str, Any]) -> None:
    node, _ = run_pods({"version": "580.82.07", **spec})
    assert node.driver == (gpus.DEFAULT_DRIVER if spec.get("version") == DIGEST else "580.82.07")


def test_a_vgpu_host_manager_pool_runs_the_vgpu_manager_without_a_probe() -> None:
    spec = {"driverType": "vgpu-host-manager", "repository": "registry.local/nvidia", "image": "vgpu-manager"}
    node = emulated_node()
    _, (runner,) = run_pods(
        {"version": "580.82.02", **spec}, node=node, done=lambda rs: node.driver is not None
    )
    assert node.driver == "580.82.02"
    assert node.read(f"/run/nvidia/driver/{NVIDIA_SMI}") == "580.82.02"
    # NVIDIA's pod has no startup probe: Ready once running, and no .driver-ctr-ready is written.
    assert runner.states["nvidia-driver-ctr"].ready and not exited(runner)
    assert node.read(READY_FILE) is None
    assert node.read(STATE_FILE) is None, "the vgpu-manager script records no digest"


def test_args_the_script_does_not_know_crash_the_container() -> None:
    _, (runner,) = run_pods({"version": "595.91.07", "args": ["--foo"]}, done=lambda rs: bool(exited(rs[0])))
    assert exited(runner) == "getopt: unrecognized option '--foo'"


def test_a_second_driver_pod_on_the_node_finds_the_lock_taken() -> None:
    node, (_, second) = run_pods({"version": "595.91.07"}, pods=2, done=lambda rs: bool(exited(rs[1])))
    assert exited(second) == "An instance of the NVIDIA driver is already running, aborting"
    assert node.driver == "595.91.07"


def test_a_loaded_driver_of_another_configuration_is_not_unloaded_while_in_use() -> None:
    node = emulated_node()
    node.set_driver("580.82.07")
    node.write(STATE_FILE, "another digest\n")
    _, (runner,) = run_pods(
        {"version": "595.91.07"}, node=node, gpu_user=True, done=lambda rs: bool(exited(rs[0]))
    )
    assert exited(runner) == "Could not unload NVIDIA driver kernel modules, driver is in use"
    assert node.driver == "580.82.07"


def test_the_same_configuration_keeps_the_loaded_modules() -> None:
    node, _ = run_pods({"version": "595.91.07"})
    node.remove([READY_FILE])
    loaded = node.read(MODULE_VERSION)
    node, _ = run_pods({"version": "595.91.07"}, node=node, gpu_user=True)
    assert node.driver == "595.91.07" and node.read(MODULE_VERSION) == loaded
