"""The operand emulators' pure parts (hack/emulators): shell, files, images, timing, status, protocols."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import builders
import pytest
from builders import node_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hack.emulators import (
    device_plugin,
    gfd,
    gpus,
    images,
    mig_manager,
    podspec,
    profile,
    shell,
    validator,
)
from hack.emulators.cluster import IpPool
from hack.emulators.emulator import (
    FAILURE_COMPONENT_LABEL,
    FAILURE_CONTAINER_ANNOTATION,
    FAILURE_NODE_LABEL,
    FAILURE_REASON_LABEL,
    FAILURE_RESTARTS_ANNOTATION,
    Emulator,
    failure_of,
)
from hack.emulators.kubelet import ContainerState, Failure, PodRunner, render_status
from hack.emulators.node import HOSTS_NAMESPACE, MigGpu, NodeState, SavedHost, Symlink, mirror_config_map
from hack.emulators.process import Proc
from hack.emulators.vfs import ContainerFS

# --- shell -----------------------------------------------------------------------------------


def test_until_loop_waits_for_the_file_at_the_loops_own_interval() -> None:
    script = shell.parse(
        "until [ -f /run/nvidia/validations/toolkit-ready ]; do echo waiting for nvidia container stack; "
        "sleep 7; done"
    )
    assert script.steps == (shell.Step("wait", path="/run/nvidia/validations/toolkit-ready", seconds=7.0),)


def test_entrypoint_script_waits_sources_sleeps_and_hands_over() -> None:
    text = """#!/bin/sh
until [ -f /run/nvidia/validations/driver-ready ]
do
  echo "waiting for the driver validations to be ready..."
  sleep 5
done

set -o allexport
cat /run/nvidia/validations/driver-ready
. /run/nvidia/validations/driver-ready
export WITH_SHUTDOWN_HOST_GPU_CLIENTS=$IS_HOST_DRIVER
for module in ${extra_modules}; do
    if lsmod | grep -q "^$module "; then echo found; fi
done
sleep 5
exec nvidia-mig-manager --flag "${ROOT:-/usr/local/nvidia}"
"""
    script = shell.parse(text, {"IS_HOST_DRIVER": "false"})
    assert script.interpreter == "/bin/sh"
    assert [s.kind for s in script.steps] == ["wait", "source", "env", "sleep", "run"]
    assert script.steps[2] == shell.Step("env", name="WITH_SHUTDOWN_HOST_GPU_CLIENTS", value="false")
    assert script.steps[4].argv == ("nvidia-mig-manager", "--flag", "/usr/local/nvidia")


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("echo all validations are successful; sleep infinity", ["forever"]),
        ("while true; do sleep 86400; done", ["forever"]),
        ("rm -f /run/nvidia/validations/*-ready", ["remove"]),
        ("exit 3", ["exit"]),
        ("nvidia-validator", ["run"]),
    ],
)
def test_shell_idioms(text: str, kinds: list[str]) -> None:
    assert [s.kind for s in shell.parse(text).steps] == kinds


def test_nvidias_device_plugin_entrypoint_hands_over_to_the_plugin() -> None:
    """NVIDIA's v26.7.0 entrypoint (assets/state-device-plugin, its ConfigMap): a bare redirection, a
    for/case block over lsmod, then exec; the side-by-side bench runs it."""
    text = (
        "#!/bin/sh\nuntil [ -f /run/nvidia/validations/driver-ready ]\ndo\n  sleep 5\ndone\n"
        "set -o allexport\n. /run/nvidia/validations/driver-ready\n"
        'extra_modules="gdrdrv nvidia_fs"\n> feature-flags.env\n'
        'for module in ${extra_modules}; do\n  if lsmod | grep -q "^$module "; then\n'
        '    case "$module" in\n      "gdrdrv")\n        echo GDRCOPY_ENABLED=true >> feature-flags.env\n'
        "      ;;\n    esac\n  fi\ndone\n"
        'if [ -s "feature-flags.env" ]; then\n  . ./feature-flags.env\nfi\nexec nvidia-device-plugin'
    )
    script = shell.parse(text)
    assert [s.kind for s in script.steps] == ["wait", "source", "env", "run"]
    assert script.steps[-1].argv == ("nvidia-device-plugin",)


def test_shell_invocations() -> None:
    assert shell.shell_script(("/bin/sh", "-c", "/bin/entrypoint.sh")) == ("exec-file", "/bin/entrypoint.sh")
    assert shell.shell_script(("sh", "/usr/local/bin/startup-probe.sh")) == (
        "file",
        "/usr/local/bin/startup-probe.sh",
    )
    assert shell.shell_script(("sh", "-c", "nvidia-validator")) == ("inline", "nvidia-validator")
    assert shell.shell_script(("nvidia-validator",)) is None


# --- images ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "bash"),
    [
        ("nvcr.io/nvidia/k8s/container-toolkit:v1.20.0", False),
        ("nvcr.io/nvidia/container-toolkit:1.15.0-ubuntu22.04", True),
        ("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", False),
        ("nvcr.io/nvidia/k8s-device-plugin:v0.14.5", True),
        ("nvcr.io/nvidia/gpu-operator:v26.7.0", False),
        ("nvcr.io/nvidia/driver:595.91.07-ubuntu22.04", True),
    ],
)
def test_distroless_images_have_sh_but_no_bash(image: str, bash: bool) -> None:
    files = images.files(image)
    assert "/bin/sh" in files
    assert ("/bin/bash" in files) is bash


# --- timing ----------------------------------------------------------------------------------


def test_profiles() -> None:
    instant = profile.profile("instant")
    assert instant.sleep_time(5) == 0 and instant.startup_delay("driver") == 0
    real = profile.profile("realistic", 0.5)
    assert [real.backoff(n) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 150.0]
    assert 15.0 <= real.startup_delay("driver") <= 30.0
    assert real.sleep_time(5) == 2.5
    with pytest.raises(ValueError, match="SIM_PROFILE"):
        profile.profile("slow")


# --- files -----------------------------------------------------------------------------------


def pod_body(containers: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod the emulated kubelet runs on node n: a shorthand of builders.pod_body."""
    return builders.pod_body(
        "p", "n", namespace="ns", uid="u1", labels={}, containers=containers, volumes=volumes
    )


def node_state() -> NodeState:
    state = NodeState("n", lambda node: None)
    annotations = {gpus.COUNT_ANNOTATION: "2", gpus.MODEL_ANNOTATION: "L4"}
    state.observe(node_body("n", uid="uid-1", annotations=annotations))
    return state


def test_paths_resolve_through_mounts_subpaths_and_symlinks() -> None:
    async def run() -> None:
        volumes = [
            {"name": "validations", "hostPath": {"path": "/run/nvidia/validations"}},
            {"name": "entry", "configMap": {"name": "entry"}},
            {"name": "configs", "configMap": {"name": "configs"}},
            {"name": "config", "emptyDir": {}},
        ]
        sidecar = {
            "name": "config-manager",
            "image": "x",
            "volumeMounts": [
                {"name": "configs", "mountPath": "/available-configs"},
                {"name": "config", "mountPath": "/config"},
            ],
        }
        main = {
            "name": "plugin",
            "image": "x",
            "volumeMounts": [
                {"name": "validations", "mountPath": "/run/nvidia/validations"},
                {"name": "entry", "mountPath": "/bin/entrypoint.sh", "subPath": "entrypoint.sh"},
                {"name": "config", "mountPath": "/config"},
            ],
        }
        pod = podspec.parse(pod_body([main, sidecar], volumes))
        node = node_state()
        cms = {"entry": {"entrypoint.sh": "#!/bin/sh\n"}, "configs": {"default": "version: v1\n"}}
        shared: dict[str, dict[str, Any]] = {}
        fs_main = ContainerFS(pod, pod.containers[0], node, shared, lambda ns, name: cms.get(name), {})
        fs_side = ContainerFS(pod, pod.containers[1], node, shared, lambda ns, name: cms.get(name), {})
        assert fs_main.read("/bin/entrypoint.sh") == "#!/bin/sh\n"
        assert fs_main.write("/run/nvidia/validations/driver-ready", "IS_HOST_DRIVER=false\n")
        assert node.read("/run/nvidia/validations/driver-ready") == "IS_HOST_DRIVER=false\n"
        assert not fs_main.write("/bin/entrypoint.sh", "changed"), "ConfigMap mounts are read-only"
        # config-manager links /config/config.yaml into its own ConfigMap mount: the link resolves
        # there, and dangles in a container without that mount (fidelity reference B9).
        assert fs_side.listdir("/available-configs") == ["default"]
        fs_side.write("/config/config.yaml", Symlink("/available-configs/default"))
        assert fs_side.read("/config/config.yaml") == "version: v1\n"
        assert fs_main.read("/config/config.yaml") is None
        fs_main.write("/run/nvidia/validations/.driver-ctr-ready", "")
        fs_main.remove_glob("/run/nvidia/validations/*-ready")
        assert node.read("/run/nvidia/validations/driver-ready") is None
        assert node.read("/run/nvidia/validations/.driver-ctr-ready") == "", "sh's * skips dot files"

    asyncio.run(run())


# --- pod status ------------------------------------------------------------------------------


def test_status_of_a_pod_waiting_in_an_init_container() -> None:
    init = ContainerState(
        "toolkit-validation", "img", init=True, state={"running": {"startedAt": "t"}}, started=True
    )
    main = ContainerState("plugin", "img", init=False)
    status = render_status(
        [init, main], sandbox=True, host_ip="127.1.0.1", pod_ip="127.3.0.1", start_time="t", transitions={}
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Pending"
    assert conditions["Initialized"]["status"] == "False"
    assert conditions["Initialized"]["message"] == "containers with incomplete status: [toolkit-validation]"
    assert (
        conditions["Ready"]["status"] == "False"
        and conditions["PodReadyToStartContainers"]["status"] == "True"
    )
    assert status["initContainerStatuses"][0]["state"] == {"running": {"startedAt": "t"}}
    assert status["podIP"] == "127.3.0.1"


def test_status_of_a_ready_and_of_a_crash_looping_pod() -> None:
    done = ContainerState(
        "init", "img", init=True, state={"terminated": {"exitCode": 0, "reason": "Completed"}}
    )
    running = ContainerState(
        "main", "img", init=False, state={"running": {"startedAt": "t"}}, ready=True, started=True
    )
    ready = render_status(
        [done, running], sandbox=True, host_ip="h", pod_ip="p", start_time="t", transitions={}
    )
    assert ready["phase"] == "Running"
    assert all(c["status"] == "True" for c in ready["conditions"])
    crashing = ContainerState(
        "main",
        "img",
        init=False,
        restarts=2,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        last={"exitCode": 1},
    )
    status = render_status(
        [done, crashing], sandbox=True, host_ip="h", pod_ip="p", start_time="t", transitions={}
    )
    assert status["containerStatuses"][0]["restartCount"] == 2
    assert status["containerStatuses"][0]["lastState"] == {"terminated": {"exitCode": 1}}
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"


class FailingPodEmulator:
    """What a PodRunner asks of its Emulator, for one pod with an injected failure (no API)."""

    def __init__(self, failure: Failure, timing: profile.Profile) -> None:
        self.failure = failure
        self.profile = timing
        self.ips = IpPool()
        self.statuses: list[dict[str, Any]] = []

    def failures_for(self, pod: podspec.Pod) -> list[Failure]:
        return [self.failure]

    def status_changed(self, runner: PodRunner) -> None:
        self.statuses.append(runner.status())

    def post_event(self, pod: podspec.Pod, kind: str, reason: str, message: str) -> None:
        return None

    def config_map(self, namespace: str, name: str) -> None:
        return None


def test_an_injected_crash_loop_starts_at_its_restart_count_and_backs_off_from_there() -> None:
    # The Stage as tests/e2e/kube_helpers.py inject_failure(..., restarts=11) creates it.
    labels = {FAILURE_COMPONENT_LABEL: "nvidia-driver", FAILURE_NODE_LABEL: "n"}
    annotations = {FAILURE_CONTAINER_ANNOTATION: "", FAILURE_RESTARTS_ANNOTATION: "11"}
    stage = {
        "metadata": {
            "labels": {**labels, FAILURE_REASON_LABEL: "CrashLoopBackOff"},
            "annotations": annotations,
        }
    }
    _, node, failure = failure_of(stage)
    assert (node, failure) == ("n", Failure("CrashLoopBackOff", "", 11))
    timing = profile.realistic(0.2)
    main = {"name": "driver", "image": "x"}
    body = pod_body([main], [])
    body["spec"]["initContainers"] = [{"name": "init", "image": "x", "command": ["sh", "-c", "exit 0"]}]

    async def run() -> list[dict[str, Any]]:
        emu = FailingPodEmulator(failure, timing)
        runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node_state(), body)
        runner.start()
        while not any(c["restartCount"] == 12 for s in emu.statuses for c in s["containerStatuses"]):
            await asyncio.sleep(0.01)
        assert runner.task is not None
        runner.task.cancel()
        return emu.statuses

    statuses = asyncio.run(asyncio.wait_for(run(), 10))
    first = statuses[0]
    assert first["containerStatuses"][0]["restartCount"] == 11
    assert first["initContainerStatuses"][0]["restartCount"] == 0  # the failure is the containers'
    crashed = next(c for s in statuses for c in s["containerStatuses"] if c["restartCount"] == 12)
    assert crashed["lastState"]["terminated"]["exitCode"] == 1
    # The kubelet's back-off for a 12th restart: the 5 min maximum (x0.2), not the first 10 s.
    assert crashed["state"]["waiting"]["message"].startswith("back-off 1m0s restarting failed container")
    assert timing.backoff(12) == 60.0 and timing.backoff(1) == 2.0


def test_a_program_that_dies_of_an_unhandled_error_exits_1_and_is_restarted() -> None:
    """A request the loaded API server drops raises inside the emulated image: the container exits 1
    and is restarted with the back-off, as a Go image exiting on the error would be; the pod never
    stays in its init container for good."""
    body = pod_body([{"name": "main", "image": "x", "command": ["sh", "-c", "exit 0"]}], [])
    body["spec"]["initContainers"] = [{"name": "init", "image": "x", "command": ["sh", "-c", "exit 0"]}]
    calls: list[str] = []

    async def run() -> list[dict[str, Any]]:
        emu = FailingPodEmulator(Failure("CrashLoopBackOff", container="elsewhere"), profile.realistic(0.01))
        runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node_state(), body)
        original = runner.execute

        async def flaky(proc: Proc, argv: tuple[str, ...], *, top: bool = False) -> None:
            calls.append(proc.spec.name)
            if len(calls) == 1:
                raise aiohttp.ServerDisconnectedError()
            await original(proc, argv, top=top)

        runner.execute = flaky  # type: ignore[method-assign]
        runner.start()
        while "main" not in calls:  # the init container ran again, and then the main one
            await asyncio.sleep(0.01)
        assert runner.task is not None
        runner.task.cancel()
        return emu.statuses

    statuses = asyncio.run(asyncio.wait_for(run(), 10))
    assert calls[:3] == ["init", "init", "main"]
    crashed = next(
        s["initContainerStatuses"][0] for s in statuses if s["initContainerStatuses"][0]["restartCount"]
    )
    assert crashed["lastState"]["terminated"]["exitCode"] == 1
    assert "ServerDisconnectedError" in crashed["lastState"]["terminated"]["message"]


def test_the_validators_cuda_workload_pod_succeeds_once_the_driver_is_loaded() -> None:
    """The validator's workload pods (restartPolicy OnFailure) end Succeeded, which the validator waits
    for; their vectorAdd fails, and the kubelet restarts it, while the node has no driver loaded."""
    body = validator.cuda_workload()
    for container in body["spec"]["initContainers"] + body["spec"]["containers"]:
        container["image"] = "nvcr.io/nvidia/gpu-operator:v26.7.0"
    body["metadata"].update(name="nvidia-cuda-validator-x", namespace="ns", uid="u1")
    body["spec"]["nodeName"] = "n"
    assert podspec.emulated(body)

    async def run() -> list[dict[str, Any]]:
        emu = FailingPodEmulator(Failure("CrashLoopBackOff", container="elsewhere"), profile.realistic(0.01))
        node = node_state()
        runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node, body)
        runner.start()
        while not any(s["initContainerStatuses"][0]["restartCount"] for s in emu.statuses):
            await asyncio.sleep(0.01)
        node.set_driver("580.95.05")
        assert runner.task is not None
        await runner.task
        return emu.statuses

    statuses = asyncio.run(asyncio.wait_for(run(), 10))
    failed = next(s for s in statuses if s["initContainerStatuses"][0]["restartCount"])
    assert failed["phase"] == "Pending"
    assert (
        "CUDA driver version is insufficient"
        in (failed["initContainerStatuses"][0]["lastState"]["terminated"]["message"])
    )
    done = statuses[-1]
    assert done["phase"] == "Succeeded"
    assert done["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "PodCompleted"
    assert conditions["Initialized"]["status"] == "True"
    phases = [s["phase"] for s in statuses]
    assert set(phases[phases.index("Succeeded") :]) == {"Succeeded"}, "and so it stays"


def test_a_pod_that_ran_to_its_end_is_left_as_it_ended_after_an_emulator_restart() -> None:
    body = pod_body([{"name": "main", "image": "x", "command": ["sh", "-c", "exit 0"]}], [])
    body["spec"]["restartPolicy"] = "OnFailure"
    terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    body["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "main", "state": terminated}]}

    async def run() -> list[dict[str, Any]]:
        emu = FailingPodEmulator(Failure("CrashLoopBackOff", container="elsewhere"), profile.realistic(0.01))
        runner = PodRunner(cast(Emulator, emu), podspec.parse(body), node_state(), body)
        runner.start()
        assert runner.task is not None
        await runner.task
        assert runner.status()["phase"] == "Succeeded"
        return emu.statuses

    assert asyncio.run(asyncio.wait_for(run(), 10)) == [], "nothing ran, nothing written"


def test_no_sandbox_no_pod_ip() -> None:
    main = ContainerState("main", "img", init=False, state={"waiting": {"reason": "ContainerCreating"}})
    status = render_status([main], sandbox=False, host_ip="h", pod_ip="p", start_time="t", transitions={})
    assert "podIP" not in status and status["phase"] == "Pending"


# --- node state ------------------------------------------------------------------------------


def test_node_state_survives_a_restart_through_its_mirror() -> None:
    async def run() -> None:
        node = node_state()
        node.write("/run/nvidia/validations/toolkit-ready", "")
        node.write("/etc/containerd/conf.d/99-nvidia.toml", "handler=nvidia\n")
        node.set_driver("595.91.07")
        node.set_handlers({"nvidia"})
        node.set_mig([MigGpu(True, ["1g.10gb"] * 7), MigGpu()])
        mirror = node.mirror()
        assert mirror["validations"] == "toolkit-ready"
        assert mirror["driver"] == "595.91.07"
        assert "/etc/os-release" not in json.loads(mirror["host-files"])
        written = mirror_config_map(node, mirror)
        assert written["metadata"]["namespace"] == HOSTS_NAMESPACE
        assert written["metadata"]["ownerReferences"][0]["uid"] == "uid-1"

        def restarted(uid: str) -> NodeState:
            state = NodeState("n", lambda n: None, SavedHost.of(written))
            annotations = {gpus.COUNT_ANNOTATION: "2", gpus.MODEL_ANNOTATION: "L4"}
            state.observe(node_body("n", uid=uid, annotations=annotations))
            return state

        same = restarted("uid-1")
        assert same.validation("toolkit-ready") and same.driver == "595.91.07"
        assert same.runtime_handlers == {"nvidia"}
        assert same.mig[0].devices == ["1g.10gb"] * 7
        assert same.read("/sys/module/nvidia/refcnt") is not None
        assert same.mirror() == same.mirrored  # nothing to write again
        # A Node deleted and created again under the same name is a fresh host.
        fresh = restarted("uid-2")
        assert fresh.driver is None and not fresh.validation("toolkit-ready") and fresh.mirror() == {}
        assert fresh.mirrored == mirror  # the earlier Node's: its first flush writes the fresh host over it

    asyncio.run(run())


# --- image protocols -------------------------------------------------------------------------


def h100_node(layout: list[MigGpu] | None = None) -> NodeState:
    node = NodeState("n", lambda n: None)
    node.observe(
        node_body("n", annotations={gpus.COUNT_ANNOTATION: "2", gpus.MODEL_ANNOTATION: "H100-80GB-HBM3"})
    )
    node.driver = "595.91.07"
    if layout is not None:
        node.mig = layout
    return node


def test_device_plugin_resources_per_strategy_and_time_slicing() -> None:
    sliced = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert device_plugin.advertised(h100_node(), "single", {}) == {"nvidia.com/gpu": 2}
    assert device_plugin.advertised(h100_node(), "none", sliced) == {"nvidia.com/gpu": 8}
    renamed = {"sharing": {"timeSlicing": {**sliced["sharing"]["timeSlicing"], "renameByDefault": True}}}
    assert device_plugin.advertised(h100_node(), "none", renamed) == {"nvidia.com/gpu.shared": 8}
    mixed = h100_node([MigGpu(True, ["1g.10gb"] * 7), MigGpu()])
    assert device_plugin.advertised(mixed, "mixed", {}) == {"nvidia.com/mig-1g.10gb": 7, "nvidia.com/gpu": 1}
    with pytest.raises(device_plugin.InvalidMig):
        device_plugin.advertised(mixed, "single", {})
    all_mig = h100_node([MigGpu(True, ["1g.10gb"] * 7), MigGpu(True, ["1g.10gb"] * 7)])
    assert device_plugin.advertised(all_mig, "single", {}) == {"nvidia.com/gpu": 14}


@pytest.mark.parametrize(
    ("label", "default", "fallbacks", "files", "chosen"),
    [
        ("a100", "", ["named"], ["a100", "default"], "a100"),
        ("", "default", [], ["default", "x"], "default"),
        ("", "", ["named", "single"], ["default", "x"], "default"),
        ("", "", ["named", "single"], ["only"], "only"),
        ("", "", ["empty"], ["a", "b"], ""),
    ],
)
def test_config_manager_selection(
    label: str, default: str, fallbacks: list[str], files: list[str], chosen: str
) -> None:
    assert device_plugin.choose_config(label, default, fallbacks, files) == chosen


def test_config_manager_without_default_or_fallback_fails_as_the_binary_does() -> None:
    with pytest.raises(ValueError, match="all fallbacks failed"):
        device_plugin.choose_config("", "", ["named", "single"], ["a", "b"])


def test_gfd_labels_of_an_h100_node() -> None:
    labels = gfd.labels_for(h100_node(), "single", {}, "DGX H100")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/cuda.driver.major"] == "595"
    assert labels["nvidia.com/cuda.runtime.major"] == "13"
    assert labels["nvidia.com/gpu.machine"] == "DGX-H100"
    mig = gfd.labels_for(h100_node([MigGpu(True, ["1g.10gb"] * 7)] * 2), "single", {}, "DGX H100")
    assert mig["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert mig["nvidia.com/gpu.count"] == "14" and mig["nvidia.com/gpu.memory"] == "9856"
    sliced = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    shared = gfd.labels_for(h100_node(), "none", sliced, "")
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert (
        shared["nvidia.com/gpu.replicas"] == "4"
        and shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    )


def test_mig_layouts() -> None:
    model = gpus.MODELS["H100-80GB-HBM3"]
    config = mig_manager.generated_config(model)
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-7g.80gb"} <= set(
        config["mig-configs"]
    )
    layout = mig_manager.desired_layout(config, "all-1g.10gb", model, 2, [])
    assert [g.devices for g in layout] == [["1g.10gb"] * 7] * 2 and all(g.enabled for g in layout)
    balanced = mig_manager.desired_layout(config, "all-balanced", model, 1, [])
    assert sorted(balanced[0].devices) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    with pytest.raises(mig_manager.Failed, match="not found"):
        mig_manager.desired_layout(config, "all-1g.18gb", model, 2, [])
    # A device-filter for other GPUs leaves these as they are (ours' A100-only layouts on an L4).
    filtered = {
        "mig-configs": {"x": [{"devices": "all", "device-filter": ["0x20B010DE"], "mig-enabled": True}]}
    }
    assert not any(g.enabled for g in mig_manager.desired_layout(filtered, "x", model, 2, []))


def test_driver_version_from_the_image_tag() -> None:
    assert gpus.driver_version("nvcr.io/nvidia/driver:595.91.07-ubuntu22.04") == "595.91.07"
    assert gpus.driver_version("nvcr.io/nvidia/driver:535-5.4.0-ubuntu22.04").startswith("535.")
    assert gpus.cuda_version("535.274.02") == (12, 2)


class LoggingProc:
    """What follow_mig_config asks of its Proc: the node and the log."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.log: list[str] = []

    def out(self, message: str) -> None:
        self.log.append(message)


def test_mig_manager_logs_waiting_once_per_change_not_per_node_update() -> None:
    waiting = "Waiting for change to 'nvidia.com/mig.config' label"
    proc = LoggingProc(node_state())
    applied: list[str] = []

    async def reconfigure(value: str) -> None:
        applied.append(value)

    async def until(done: Callable[[], bool]) -> None:
        while not done():
            await asyncio.sleep(0)

    async def run() -> None:
        task = asyncio.create_task(
            mig_manager.follow_mig_config(cast(Proc, proc), "all-disabled", reconfigure)
        )
        await until(lambda: proc.log[-1:] == [waiting] and applied == ["all-disabled"])
        for i in range(3):  # other changes of the node (files, other labels): no new value
            proc.node.labels["other"] = str(i)
            proc.node.notify()
            await asyncio.sleep(0)
        proc.node.labels[mig_manager.MIG_CONFIG] = "all-1g.10gb"
        proc.node.notify()
        await until(lambda: len(applied) == 2 and proc.log[-1] == waiting)
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 10))
    assert proc.log == [
        waiting,
        "Updating to MIG config: all-disabled",
        "Successfully updated to MIG config: all-disabled",
        waiting,
        "Updating to MIG config: all-1g.10gb",
        "Successfully updated to MIG config: all-1g.10gb",
        waiting,
    ]


def test_nvidias_operand_pods_are_emulated_and_left_out_of_kwoks_stages() -> None:
    """The side-by-side bench runs NVIDIA's operator: its operand pods carry neither our managed-by
    label nor our component label, only their DaemonSet's name in `app`."""
    import yaml

    from gpu_operator.core.components import COMPONENTS

    ours = {c.daemonset: c.component_label for c in COMPONENTS}
    assert all(ours[app] == component for app, component in podspec.NVIDIA_OPERANDS.items())
    nvidia = {"metadata": {"labels": {"app": "nvidia-dcgm", "pod-template-generation": "1"}}}
    assert podspec.emulated(nvidia)
    assert podspec.emulated({"metadata": {"labels": {"app": "nvidia-cuda-validator"}}}), "the validator's"
    assert not podspec.emulated({"metadata": {"labels": {"app": "cuda-vectoradd"}}}), "kwok runs it"
    body = builders.pod_body("d", "n", namespace="ns", uid="u2", labels={"app": "nvidia-dcgm"}, containers=[])
    assert podspec.parse(body).component == "dcgm", "what the DCGM exporter's emulator waits for"
    stages = Path(__file__).parents[2] / "hack" / "kwok" / "stages.yaml"
    for name in ("pod-ready", "pod-delete"):
        stage = next(s for s in yaml.safe_load_all(stages.read_text()) if s["metadata"]["name"] == name)
        left_out = {
            v
            for e in stage["spec"]["selector"]["matchExpressions"]
            if e["key"] == ".metadata.labels.app" and e["operator"] == "NotIn"
            for v in e["values"]
        }
        assert left_out == set(podspec.NVIDIA_OPERANDS) | set(podspec.VALIDATION_WORKLOADS), name
