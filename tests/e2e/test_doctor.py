"""`gpu-operator doctor` end to end: each symptom of the seed article's §5.3 checklist is produced on the
cluster (failure injection, taints, a selector, a quota, a missing RuntimeClass, fewer GPUs than GFD
counted, a failed driver upgrade) and doctor, logged in with a token of a ServiceAccount bound to
the chart's doctor ClusterRole, must name the cause and the node.

Doctor runs with `--log-lines 0`: reading a simulated pod's log would make the API server connect
to the kwok node's address, which nothing here may do (the log path is unit-tested).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.core.components import BY_NAME

from .kube_helpers import (
    Cluster,
    clear_failure,
    client,
    create_object,
    inject_failure,
    list_pods,
    pod_is_ready,
    wait_for,
)
from .operator_process import OPERATOR, OperatorProcess, chart_operator, sa_kubeconfig
from .test_operator import (
    CONVERGE,
    apply_policy,
    assert_cleaned_up,
    delete_policies,
    policy_from,
    wait_state,
)

DRIVER = BY_NAME["driver"].component_label
"""The driver pods' app.kubernetes.io/component label (NVIDIA's `nvidia-driver`)."""

NS = "gpu-operator"
POLICY = "cluster-policy"
DOCTOR_SA = "doctor"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def stack(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OperatorProcess, Path]]:
    """The operator as the chart's ServiceAccount, and a kubeconfig for doctor bound to the chart's
    doctor ClusterRole (doctor.rbac.subjects); the ClusterPolicy is removed at the end."""
    folder = tmp_path_factory.mktemp("doctor")
    subjects = json.dumps([{"kind": "ServiceAccount", "name": DOCTOR_SA, "namespace": NS}])
    with chart_operator(cluster, folder, NS, "--set-json", f"doctor.rbac.subjects={subjects}") as operator:
        core = client.CoreV1Api(cluster.api)
        try:
            core.create_namespaced_service_account(
                NS, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=DOCTOR_SA))
            )
        except ApiException as exc:
            if exc.status != 409:  # left by an interrupted run
                raise
        try:
            yield operator, sa_kubeconfig(cluster, NS, DOCTOR_SA, folder / "doctor-kubeconfig")
        finally:
            remove_policy(cluster, operator)
            core.delete_namespaced_service_account(DOCTOR_SA, NS)
            operator.assert_clean_log()


def remove_policy(cluster: Cluster, operator: OperatorProcess) -> None:
    delete_policies(cluster)
    if not operator.running:
        operator.start()
    wait_for(lambda: assert_cleaned_up(cluster), timeout=CONVERGE, what="ClusterPolicy and operands removed")


def ready_policy(cluster: Cluster) -> None:
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, POLICY, "ready")


def doctor(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    result = subprocess.run(
        [str(OPERATOR), "doctor", "--kubeconfig", str(kubeconfig), "--log-lines", "0", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


def diagnosis(kubeconfig: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = doctor(kubeconfig, "-o", "json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def finding(body: dict[str, Any], code: str, what: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in body["findings"] if f["code"] == code and f["object"] == what]
    assert len(found) == 1, f"no single {code} for {what}: " + json.dumps(
        [(f["code"], f["object"], f["cause"]) for f in body["findings"]], indent=1
    )
    return found[0]


def commands(found: dict[str, Any], level: str, where: str = "") -> list[str]:
    return [c["command"] for c in found["commands"] if c["level"] == level and c["where"] == where]


def gpu_pod(
    name: str, gpus: int = 1, *, tolerate: bool = True, selector: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    container.update(extra.pop("container", {}))
    spec: dict[str, Any] = {"containers": [container], **extra}
    if tolerate:
        spec["tolerations"] = [TOLERATION]
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def deployment_of(pod: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }


def scheduling_failed(cluster: Cluster, namespace: str, name: str) -> None:
    pod = client.CoreV1Api(cluster.api).read_namespaced_pod(name, namespace)
    conditions = {c.type: c for c in pod.status.conditions or []}
    scheduled = conditions.get("PodScheduled")
    assert scheduled is not None and scheduled.status == "False" and scheduled.message, f"{name}: {scheduled}"


def warning_event(cluster: Cluster, namespace: str, text: str) -> None:
    events = client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items
    assert any(text in (e.message or "") for e in events), [e.message for e in events]


# --- tests ---------------------------------------------------------------------------------------


def test_bad_input_exits_2_with_one_line(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], tmp_path: Path
) -> None:
    _, kubeconfig = stack
    for args, text in (
        (["--node", "no-such-node"], "--node no-such-node: no such node"),
        (["--pod", "default/no-such-pod"], "--pod default/no-such-pod: no such pod"),
        (["--pod", "no-slash"], "is not NAMESPACE/NAME"),
        (["--from-state", str(tmp_path / "missing.json")], "cannot read"),
    ):
        code, out, err = doctor(kubeconfig, *args)
        assert code == 2 and text in err and not out, (args, code, out, err)
    broken = tmp_path / "broken-kubeconfig"
    broken.write_text("clusters: [ {")
    code, _, err = doctor(broken)
    assert code == 2 and "cannot use the kubeconfig" in err and len(err.strip().splitlines()) == 1, err


def test_pending_gpu_pods_get_their_cause_and_node(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], namespace: str, failures: None
) -> None:
    operator, kubeconfig = stack
    remove_policy(cluster, operator)
    # The driver crash-loops on gpu-node-1, so nothing above it (toolkit, device plugin) gets there.
    inject_failure(cluster.api, DRIVER, "gpu-node-1", "CrashLoopBackOff")
    apply_policy(cluster, policy_from("empty"))

    healthy = {"gpu-node-0", "gpu-node-2", "gpu-node-3"}

    def others_converged() -> None:
        plugins = {
            p.spec.node_name
            for p in list_pods(cluster.api, NS, labels="app.kubernetes.io/component=device-plugin")
        }
        assert plugins == healthy, plugins
        # The doctor names the products the nodes have: GFD's labels, published once GFD runs (after
        # the device plugin under the realistic profile).
        core = client.CoreV1Api(cluster.api)
        unlabelled = {
            n for n in healthy if "nvidia.com/gpu.product" not in (core.read_node(n).metadata.labels or {})
        }
        assert not unlabelled, f"no GFD labels yet on {sorted(unlabelled)}"

    wait_for(others_converged, timeout=CONVERGE, what="device plugin and GFD labels on the healthy nodes")
    pods = [
        gpu_pod("wants-a100", selector={"nvidia.com/gpu.product": "A100-SXM4-40GB"}),
        gpu_pod("on-broken-node", selector={"kubernetes.io/hostname": "gpu-node-1"}),
        gpu_pod("no-toleration", tolerate=False, selector={"kubernetes.io/hostname": "gpu-node-3"}),
        gpu_pod("too-big", gpus=9),
        gpu_pod(
            "shares-gpus",
            gpus=0,
            selector={"kubernetes.io/hostname": "gpu-node-0"},
            container={"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
        ),
    ]
    for pod in pods:
        create_object(cluster.api, pod, namespace)

    def all_tried() -> None:
        for name in ("wants-a100", "on-broken-node", "no-toleration", "too-big"):
            scheduling_failed(cluster, namespace, name)

    wait_for(all_tried, timeout=60, what="the scheduler tried every pod")

    code, body = diagnosis(kubeconfig)
    assert code == 1 and not body["healthy"]
    a100 = finding(body, "GPUPodUnschedulable", f"pod {namespace}/wants-a100")["cause"]
    assert "its nodeSelector nvidia.com/gpu.product=A100-SXM4-40GB does not match" in a100, a100
    assert "NVIDIA-H100-80GB-HBM3" in a100 and "NVIDIA-L4" in a100, a100
    broken = finding(body, "GPUPodUnschedulable", f"pod {namespace}/on-broken-node")
    assert "on gpu-node-1: no allocatable nvidia.com/gpu" in broken["cause"], broken
    assert "driver pod nvidia-driver-daemonset-" in broken["cause"] and "CrashLoopBackOff" in broken["cause"]
    assert "kubectl describe node gpu-node-1 | grep -A20 Allocatable" in commands(broken, "kubernetes")
    assert "nvidia-smi" in commands(broken, "node", "gpu-node-1")
    untolerated = finding(body, "GPUPodUnschedulable", f"pod {namespace}/no-toleration")["cause"]
    # kube-scheduler's order: the taint decides before the selector does (gpu-node-1 fails both).
    taint = "the taint nvidia.com/gpu=true:NoSchedule is not tolerated (add a toleration for it)"
    assert untolerated.startswith(f"Pending: on gpu-node-1, gpu-node-3: {taint}"), untolerated
    big = finding(body, "GPUPodUnschedulable", f"pod {namespace}/too-big")["cause"]
    assert "it requests 9 GPUs, the node has 8" in big, big
    shares = finding(body, "VisibleDevicesOverride", f"pod {namespace}/shares-gpus")
    assert shares["severity"] == "warning" and "two pods on one GPU" in shares["cause"]
    node = finding(body, "NoAllocatableGPU", "node gpu-node-1")
    assert node["node"] == "gpu-node-1" and "CrashLoopBackOff" in node["cause"], node
    driver = next(f for f in body["findings"] if f["code"] == "OperandNotReady" and f["node"] == "gpu-node-1")
    assert driver["cause"].startswith("driver not ready on gpu-node-1: CrashLoopBackOff"), driver
    assert any(
        c.startswith("kubectl logs -n gpu-operator nvidia-driver-daemonset-")
        for c in commands(driver, "kubernetes")
    )
    assert finding(body, "ClusterPolicyNotReady", f"clusterpolicy {POLICY}")["severity"] == "error"

    # One pod: its own finding (and what every pod depends on), nothing about the other pods.
    code, one = diagnosis(kubeconfig, "--pod", f"{namespace}/on-broken-node")
    assert code == 1 and {f["object"] for f in one["findings"]} == {f"pod {namespace}/on-broken-node"}, one
    # One node: that node's findings.
    code, on_node = diagnosis(kubeconfig, "--node", "gpu-node-1")
    assert code == 1 and {f["node"] for f in on_node["findings"]} == {"gpu-node-1"}, on_node
    assert {f["code"] for f in on_node["findings"]} == {"NoAllocatableGPU", "OperandNotReady"}, on_node
    code, table, _ = doctor(kubeconfig)
    assert (
        code == 1 and "GPUPodUnschedulable" in table and "on node gpu-node-1 (ssh, or kubectl debug" in table
    )

    clear_failure(cluster.api, DRIVER, "gpu-node-1")
    wait_state(cluster, POLICY, "ready")


def test_quota_exhausted_names_the_quota(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], namespace: str
) -> None:
    _, kubeconfig = stack
    ready_policy(cluster)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota"},
        # The seed article's §6.2 quota; its limits.nvidia.com/gpu line has no effect.
        "spec": {"hard": {"requests.nvidia.com/gpu": "1", "limits.nvidia.com/gpu": "1"}},
    }
    create_object(cluster.api, quota, namespace)

    def quota_counted() -> None:
        status = client.CoreV1Api(cluster.api).read_namespaced_resource_quota("gpu-quota", namespace).status
        assert status.hard, "quota not counted yet"

    wait_for(quota_counted, timeout=60, what="quota status")
    deployment = deployment_of(gpu_pod("train"), replicas=2)
    create_object(cluster.api, deployment, namespace)
    wait_for(lambda: warning_event(cluster, namespace, "exceeded quota"), timeout=60, what="quota rejection")
    code, body = diagnosis(kubeconfig)
    assert code == 1
    (rejected,) = [f for f in body["findings"] if f["code"] == "GPUQuotaExceeded"]
    assert rejected["object"].startswith(f"replicaset {namespace}/train-"), rejected
    assert f"ResourceQuota gpu-quota in {namespace} allows requests.nvidia.com/gpu=1" in rejected["cause"]
    assert any(
        line.startswith(f"{namespace}/train-") and line.endswith("(Running) counts 1 against it")
        for line in rejected["details"]
    )
    assert f"kubectl describe resourcequota -n {namespace} gpu-quota" in commands(rejected, "kubernetes")
    ignored = finding(body, "GPUQuotaLimitIgnored", f"resourcequota {namespace}/gpu-quota")
    assert ignored["severity"] == "warning" and "limits.nvidia.com/gpu has no effect" in ignored["cause"]


def test_missing_runtime_class_is_found_and_restored(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], namespace: str
) -> None:
    operator, kubeconfig = stack
    ready_policy(cluster)
    # With the operator running the RuntimeClass is back within a second; stop it first.
    operator.stop()
    node_api = client.NodeV1Api(cluster.api)
    try:
        node_api.delete_runtime_class("nvidia")
        deployment = deployment_of(gpu_pod("inference", runtimeClassName="nvidia"))
        create_object(cluster.api, deployment, namespace)
        wait_for(
            lambda: warning_event(cluster, namespace, "RuntimeClass"),
            timeout=60,
            what="RuntimeClass rejection",
        )
        code, body = diagnosis(kubeconfig)
        assert code == 1
        missing = finding(body, "RuntimeClassMissing", "runtimeclass nvidia")
        assert "operator is not running" in missing["cause"], missing
        # The operand DaemonSets that use the RuntimeClass may be refused pods too: look at ours.
        (rejected,) = [
            f
            for f in body["findings"]
            if f["code"] == "RuntimeClassNotFound" and f["object"].startswith(f"replicaset {namespace}/")
        ]
        assert rejected["object"].startswith(f"replicaset {namespace}/inference-"), rejected
        assert "RuntimeClass nvidia, which does not exist" in rejected["cause"], rejected
    finally:
        operator.start()
    wait_for(lambda: node_api.read_runtime_class("nvidia"), timeout=60, what="RuntimeClass restored")
    _, body = diagnosis(kubeconfig)
    assert not [f for f in body["findings"] if f["code"] == "RuntimeClassMissing"], body


def test_fewer_gpus_than_installed_and_a_failed_upgrade(
    cluster: Cluster, stack: tuple[OperatorProcess, Path]
) -> None:
    _, kubeconfig = stack
    ready_policy(cluster)
    core = client.CoreV1Api(cluster.api)
    # GFD counted 8 GPUs; the (simulated) device plugin finds only 6 healthy ones.
    core.patch_node(
        "gpu-node-2",
        {
            "metadata": {
                "labels": {"nvidia.com/gpu.count": "8"},
                "annotations": {"gpu-operator.sim/gpu-count": "6"},
            }
        },
    )
    core.patch_node(
        "gpu-node-3", {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}}}
    )
    try:

        def advertises_six() -> None:
            allocatable = core.read_node("gpu-node-2").status.allocatable or {}
            assert allocatable.get("nvidia.com/gpu") == "6", allocatable

        wait_for(advertises_six, timeout=60, what="gpu-node-2 advertises 6 GPUs")
        code, body = diagnosis(kubeconfig, "--node", "gpu-node-2")
        assert code == 1
        assert [(f["code"], f["node"]) for f in body["findings"]] == [("GPUCountMismatch", "gpu-node-2")], (
            body
        )
        (mismatch,) = body["findings"]
        assert "advertises 6 nvidia.com/gpu, but GFD counted 8 GPUs" in mismatch["cause"]
        assert "dmesg | grep -i xid" in commands(mismatch, "node", "gpu-node-2")
        code, body = diagnosis(kubeconfig, "--node", "gpu-node-3")
        assert code == 1
        assert [(f["code"], f["node"]) for f in body["findings"]] == [
            ("DriverUpgradeFailed", "gpu-node-3")
        ], body
    finally:
        core.patch_node(
            "gpu-node-2",
            {
                "metadata": {
                    "labels": {"nvidia.com/gpu.count": None},
                    "annotations": {"gpu-operator.sim/gpu-count": "8"},
                }
            },
        )
        core.patch_node("gpu-node-3", {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": None}}})


def test_gpu_pod_that_cannot_start_blames_the_toolkit_on_its_node(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], namespace: str, failures: None
) -> None:
    _, kubeconfig = stack
    ready_policy(cluster)
    # The toolkit breaks on gpu-node-2 after the stack came up (the device plugin keeps running),
    # and the GPU pod scheduled there fails to start (simulated: kwok runs no containers).
    inject_failure(cluster.api, "container-toolkit", "gpu-node-2", "CrashLoopBackOff", recreate=True)
    inject_failure(cluster.api, "cuda-app", "gpu-node-2", "CrashLoopBackOff")
    pod = gpu_pod("cuda", selector={"kubernetes.io/hostname": "gpu-node-2"})
    pod["metadata"]["labels"] = {"app.kubernetes.io/component": "cuda-app"}
    create_object(cluster.api, pod, namespace)

    def crash_looping() -> None:
        found = client.CoreV1Api(cluster.api).read_namespaced_pod("cuda", namespace)
        waiting = [s.state.waiting.reason for s in found.status.container_statuses or [] if s.state.waiting]
        assert waiting == ["CrashLoopBackOff"], waiting
        toolkit = list_pods(
            cluster.api, NS, labels="app.kubernetes.io/component=container-toolkit", node="gpu-node-2"
        )
        assert toolkit and not pod_is_ready(toolkit[0]), "toolkit still ready"

    wait_for(crash_looping, timeout=60, what="GPU pod and toolkit failing on gpu-node-2")
    code, body = diagnosis(kubeconfig, "--pod", f"{namespace}/cuda")
    assert code == 1
    found = finding(body, "GPUPodNotStarting", f"pod {namespace}/cuda")
    assert found["node"] == "gpu-node-2"
    assert "on gpu-node-2, container-toolkit pod nvidia-container-toolkit-daemonset-" in found["cause"], found
    assert f"kubectl exec -n {namespace} cuda -c cuda -- nvidia-smi" in commands(
        found, "container", f"{namespace}/cuda"
    )
    assert "grep -n -A3 nvidia /etc/containerd/config.toml" in commands(found, "node", "gpu-node-2")
    clear_failure(cluster.api, "container-toolkit", "gpu-node-2")
    wait_state(cluster, POLICY, "ready")


def test_healthy_cluster_exits_0(
    cluster: Cluster, stack: tuple[OperatorProcess, Path], namespace: str
) -> None:
    _, kubeconfig = stack
    ready_policy(cluster)
    create_object(cluster.api, gpu_pod("cuda"), namespace)

    def running() -> None:
        assert pod_is_ready(client.CoreV1Api(cluster.api).read_namespaced_pod("cuda", namespace))

    wait_for(running, timeout=60, what="GPU pod running")
    code, body = diagnosis(kubeconfig)
    assert code == 0 and body["healthy"] and body["errors"] == 0, body["findings"]
    assert body["checked"]["gpuNodes"] == 4 and body["checked"]["gpuPods"] >= 1
    code, out, _ = doctor(kubeconfig, "--pod", f"{namespace}/cuda")
    assert code == 0 and out.startswith("healthy: nothing wrong found"), out
