"""`gpu-operator doctor` as a command: what it records through runtime/client.py (against a fake API), exit
codes, table and JSON output, saved and loaded states, and bad input that must never give a traceback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from gpu_operator import cli, doctor
from gpu_operator.doctor import recording
from gpu_operator.doctor.state import ClusterState
from gpu_operator.runtime.client import ApiError
from gpu_operator.runtime.sync_client import SyncKube

DATA = Path(__file__).resolve().parents[1] / "data" / "doctor"
HEALTHY = str(DATA / "healthy.yaml")
BROKEN = str(DATA / "demo-broken.json")


def healthy() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(Path(HEALTHY).read_text())
    return loaded


class FakeKube:
    """SyncKube's reads: answers list() from a recorded state's objects; `fail` maps a kind to the
    ApiError it raises."""

    def __init__(
        self, objects: Mapping[str, list[dict[str, Any]]], fail: Mapping[str, ApiError] | None = None
    ):
        self.objects = objects
        self.fail = dict(fail or {})
        self.logs: list[tuple[str, str, str, int, bool]] = []
        self.listed: list[tuple[str, str, str]] = []
        self.closed = False

    def list(self, api_version: str, kind: str, namespace: str = "", label_selector: str = "") -> list[Any]:
        self.listed.append((kind, namespace, label_selector))
        if kind in self.fail:
            raise self.fail[kind]
        return [
            o
            for o in self.objects.get(kind, [])
            if not namespace or o["metadata"].get("namespace") == namespace
        ]

    def pod_log(self, namespace: str, name: str, container: str, lines: int, previous: bool = False) -> str:
        self.logs.append((namespace, name, container, lines, previous))
        if name.endswith("-nolog"):
            raise ApiError(500, "InternalError", "dial tcp 10.0.0.1:10250: connect: connection refused")
        return "line 1\nline 2\n"

    def close(self) -> None:
        self.closed = True


def cluster_objects() -> dict[str, list[dict[str, Any]]]:
    """The healthy state's objects as the API would list them, plus what doctor must leave out."""
    data = healthy()
    managed = [{"manager": "kubelet", "operation": "Update"}]
    crashing = {
        "metadata": {
            "name": "nvidia-dcgm-exporter-nolog",
            "namespace": "gpu-operator",
            "uid": "u-dcgm",
            "managedFields": managed,
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "labels": {
                "app.kubernetes.io/managed-by": "gpu-operator",
                "app.kubernetes.io/component": "dcgm-exporter",
            },
        },
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "exporter", "image": "x", "env": [{"name": "A"}]}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "exporter",
                    "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1}},
                }
            ],
        },
    }
    failing_plugin = json.loads(json.dumps(crashing).replace("nvidia-dcgm-exporter-nolog", "plugin-2"))
    web = {
        "metadata": {"name": "web", "namespace": "team", "uid": "u-web"},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
        "status": {"phase": "Running"},
    }
    finished = {
        "metadata": {"name": "done", "namespace": "team", "uid": "u-done"},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Succeeded"},
    }
    events = [
        {
            "metadata": {"name": "e1"},
            "type": "Normal",
            "reason": "Scheduled",
            "involvedObject": {"uid": "u-train"},
        },
        {
            "metadata": {"name": "e2"},
            "type": "Warning",
            "reason": "BackOff",
            "message": "Back-off",
            "involvedObject": {"uid": "u-dcgm", "kind": "Pod"},
        },
        {
            "metadata": {"name": "e3"},
            "type": "Warning",
            "reason": "Unhealthy",
            "involvedObject": {"uid": "u-web"},
        },
        {
            "metadata": {"name": "e4"},
            "type": "Warning",
            "reason": "FailedCreate",
            "involvedObject": {"kind": "ReplicaSet", "namespace": "team", "name": "rs", "uid": "u-rs"},
            "message": "exceeded quota: q, requested: requests.nvidia.com/gpu=1, "
            "used: requests.nvidia.com/gpu=1, "
            "limited: requests.nvidia.com/gpu=1",
        },
    ]
    quotas = [
        {"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}},
        {"metadata": {"name": "cpu", "namespace": "team"}, "spec": {"hard": {"requests.cpu": "10"}}},
    ]
    nodes = [{**n, "metadata": {**n["metadata"], "managedFields": managed}} for n in data["nodes"]]
    return {
        "ClusterPolicy": data["policies"],
        "Node": nodes,
        "Pod": [*data["pods"], crashing, failing_plugin, web, finished],
        "Event": events,
        "ResourceQuota": quotas,
        "RuntimeClass": data["runtime_classes"],
        "DaemonSet": [],
    }


def record(fake: FakeKube, **kwargs: Any) -> ClusterState:
    return recording.record(cast(SyncKube, fake), **kwargs)


def test_record_keeps_what_the_diagnosis_needs() -> None:
    fake = FakeKube(cluster_objects())
    state = record(fake)
    assert state.namespace == "gpu-operator", "from the ClusterPolicy's status"
    names = [p["metadata"]["name"] for p in state.pods]
    assert "web" not in names and "done" not in names
    assert "train" in names and "nvidia-dcgm-exporter-nolog" in names
    assert state.requested["gpu-a"] == {"pods": "7", "nvidia.com/gpu": "2", "cpu": "2"}, "every pod counts"
    assert sorted(e["metadata"]["name"] for e in state.events) == ["e2", "e4"]
    assert [q["metadata"]["name"] for q in state.quotas] == ["q"]
    assert not any("managedFields" in n["metadata"] for n in state.nodes)
    operand = next(p for p in state.pods if p["metadata"]["name"] == "nvidia-dcgm-exporter-nolog")
    assert operand["spec"]["containers"] == [{"name": "exporter", "image": "x"}], "operand env is not kept"
    assert ("DaemonSet", "gpu-operator", "app.kubernetes.io/managed-by=gpu-operator") in fake.listed
    # Logs of failing operand containers, of their previous run when they crashed.
    assert fake.logs == [
        ("gpu-operator", "nvidia-dcgm-exporter-nolog", "exporter", 10, True),
        ("gpu-operator", "plugin-2", "exporter", 10, True),
    ]
    assert state.logs["gpu-operator/plugin-2/exporter"] == "line 1\nline 2\n"
    assert state.logs["gpu-operator/nvidia-dcgm-exporter-nolog/exporter"].startswith("(log unavailable: 500")


def test_record_without_logs_and_with_a_pod() -> None:
    fake = FakeKube(cluster_objects())
    state = record(fake, log_lines=0, pod="team/web", namespace="elsewhere")
    assert fake.logs == [] and state.logs == {}
    assert state.namespace == "elsewhere"
    assert "web" in [p["metadata"]["name"] for p in state.pods], "--pod is recorded whatever it is"


def test_record_without_the_crd() -> None:
    fake = FakeKube(
        cluster_objects(), {"ClusterPolicy": ApiError(404, "NotFound", "the server could not find")}
    )
    state = record(fake)
    assert state.policies is None and state.namespace == "gpu-operator"


def test_record_reads_nvidia_drivers_only_where_a_policy_delegates_its_driver() -> None:
    objects = cluster_objects()
    drivers = [{"metadata": {"name": "h100", "uid": "u-h100"}, "spec": {"nodeSelector": {"pool": "h100"}}}]
    objects["NVIDIADriver"] = drivers
    fake = FakeKube(objects)
    assert record(fake).nvidia_drivers is None
    assert "NVIDIADriver" not in [kind for kind, _, _ in fake.listed], "no access needed without pools"
    objects["ClusterPolicy"][0]["spec"]["driver"] = {"useNvidiaDriverCRD": True}
    assert record(FakeKube(objects)).nvidia_drivers == drivers
    missing = {"NVIDIADriver": ApiError(404, "NotFound", "the server could not find")}
    assert record(FakeKube(objects, missing)).nvidia_drivers is None, "the CRD is not installed"
    with pytest.raises(doctor.DoctorError, match="not allowed to read NVIDIADrivers"):
        record(FakeKube(objects, {"NVIDIADriver": ApiError(403, "Forbidden", "x")}))


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("Node", ApiError(403, "Forbidden", "nodes is forbidden"), "not allowed to read nodes"),
        ("ClusterPolicy", ApiError(403, "Forbidden", "x"), "gpu-operator-doctor ClusterRole"),
        ("Pod", ApiError(0, "ConnectionError", "refused"), "cannot reach the API server"),
        ("Event", ApiError(500, "InternalError", "etcd"), "cannot read events"),
    ],
)
def test_record_failures_are_one_clear_error(kind: str, error: ApiError, message: str) -> None:
    with pytest.raises(doctor.DoctorError, match=message):
        record(FakeKube(cluster_objects(), {kind: error}))


# --- the command ----------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["doctor", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_healthy_state_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--from-state", HEALTHY)
    assert code == 0
    assert (
        out == "healthy: nothing wrong found (2 nodes (1 with GPUs), 1 GPU pods, 3 operand pods in "
        "gpu-operator)\n"
    )
    code, out, _ = run(capsys, "--from-state", HEALTHY, "-o", "json")
    body = json.loads(out)
    assert code == 0 and body["healthy"] and body["findings"] == [] and body["checked"]["gpuNodes"] == 1


def test_problems_exit_1_with_a_table_and_next_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--from-state", BROKEN)
    assert code == 1
    lines = out.splitlines()
    assert (
        lines[0] == "6 errors, 1 warning (5 nodes (4 with GPUs), 3 GPU pods, 33 operand pods in gpu-operator)"
    )
    assert lines[2].split() == ["#", "SEVERITY", "OBJECT", "NODE", "FINDING"]
    assert lines[3].split()[:5] == ["1", "error", "clusterpolicy", "gpu-cluster-policy", "-"]
    assert "[5] error GPUPodUnschedulable  pod tenant-a/notebook" in lines
    assert (
        "      on node gpu-node-1 (ssh, or kubectl debug node/gpu-node-1 -it --profile=sysadmin "
        "--image=ubuntu "
        "-- chroot /host):" in lines
    )
    assert "        nvidia-smi -L" in lines
    code, out, _ = run(capsys, "--from-state", BROKEN, "-o", "json", "--node", "gpu-node-1")
    body = json.loads(out)
    assert code == 1 and body["errors"] == 2 and {f["node"] for f in body["findings"]} == {"gpu-node-1"}
    command = body["findings"][0]["commands"][0]
    assert command == {
        "level": "kubernetes",
        "where": "",
        "command": "kubectl describe node gpu-node-1 | grep -A20 Allocatable",
    }


def test_warnings_alone_exit_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = healthy()
    data["pods"][-1]["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}]
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, _ = run(capsys, "--from-state", str(path))
    assert code == 0 and out.startswith("0 errors, 1 warning") and "VisibleDevicesOverride" in out


def test_live_run_and_saved_state(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[str | None, str | None]] = []

    made: list[FakeKube] = []

    def fake_kube(path: str | None, context: str | None) -> FakeKube:
        seen.append((path, context))
        made.append(FakeKube(cluster_objects()))
        return made[-1]

    monkeypatch.setattr(doctor, "kube_from_kubeconfig", fake_kube)
    saved = tmp_path / "state.json"
    code, out, _ = run(capsys, "--kubeconfig", "k.yaml", "--context", "c", "--save-state", str(saved))
    assert seen == [("k.yaml", "c")]
    assert made[0].closed, "the client is closed once the cluster is recorded"
    assert code == 1 and "OperandNotReady" in out
    again, replay, _ = run(capsys, "--from-state", str(saved))
    assert (again, replay) == (code, out), "a saved state diagnoses the same"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-state", BROKEN, "--node", "nope"], "--node nope: no such node"),
        (["--from-state", BROKEN, "--pod", "tenant-a/nope"], "--pod tenant-a/nope: no such pod"),
        (["--from-state", "/nonexistent/state.json"], "cannot read"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot use the kubeconfig (/nonexistent/kubeconfig)"),
    ],
)
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and not out
    assert err.startswith("gpu-operator doctor: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON or YAML"),
        ("[1, 2]", "not a doctor state"),
        ("namespace: x\nnow: y\nnodes: {}\n", "nodes must be a list"),
        ("namespace: x\nnow: y\nsurprise: 1\n", "unknown keys surprise"),
        ("namespace: x\nnow: y\nlogs: []\n", "logs must be a dict"),
    ],
)
def test_bad_state_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    code, _, err = run(capsys, "--from-state", str(path))
    assert code == 2 and message in err, err


@pytest.mark.parametrize(
    "args", [["--pod", "no-slash"], ["--log-lines", "-1"], ["--node", "a", "--pod", "b/c"]]
)
def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2 and "usage:" in err
