"""The diagnosis of `gpu-operator doctor` on recorded cluster states (tests/data/doctor): a state
recorded from the local cluster broken as in docs/troubleshooting.md (demo-broken.json) and small
written ones, one per group of symptoms; plus the scheduler filters it re-runs."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from builders import gpu_request_pod, node_body

from gpu_operator.core.components import BY_NAME
from gpu_operator.doctor import scheduling
from gpu_operator.doctor.diagnosis import diagnose, summary
from gpu_operator.doctor.recording import load_state
from gpu_operator.doctor.state import ClusterState, Finding, Scope

DATA = Path(__file__).resolve().parents[1] / "data" / "doctor"


def state(name: str) -> ClusterState:
    return load_state(str(DATA / name))


def by(findings: list[Finding], code: str, what: str = "") -> Finding:
    found = [f for f in findings if f.code == code and (not what or f.object == what)]
    assert len(found) == 1, [(f.code, f.object, f.cause) for f in findings]
    return found[0]


def codes(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.code, f.object) for f in findings]


def commands(finding: Finding, level: str, where: str = "") -> list[str]:
    return [c.command for c in finding.commands if c.level == level and c.where == where]


# --- the recorded state: the broken demo cluster of docs/troubleshooting.md ---------------------


def test_recorded_broken_demo() -> None:
    findings = diagnose(state("demo-broken.json"))
    plugin = "gpu-operator/nvidia-device-plugin-daemonset-q8sw8"
    assert codes(findings) == [
        ("ClusterPolicyNotReady", "clusterpolicy gpu-cluster-policy"),
        ("NoAllocatableGPU", "node gpu-node-1"),
        ("OperandNotReady", f"pod {plugin}"),
        ("GPUPodUnschedulable", "pod tenant-a/llm-a100"),
        ("GPUPodUnschedulable", "pod tenant-a/notebook"),
        ("GPUQuotaExceeded", "replicaset tenant-a/train-98877df55"),
        ("GPUQuotaLimitIgnored", "resourcequota tenant-a/gpu-quota"),
    ]
    assert [f.severity for f in findings] == ["error"] * 6 + ["warning"]
    notebook = by(findings, "GPUPodUnschedulable", "pod tenant-a/notebook")
    assert notebook.cause.startswith(
        "Pending: on gpu-node-1: no allocatable nvidia.com/gpu (device-plugin pod "
        "nvidia-device-plugin-daemonset-q8sw8 is CrashLoopBackOff"
    )
    assert notebook.cause.endswith(
        "; on gpu-node-0, gpu-node-2, gpu-node-3: its nodeSelector kubernetes.io/hostname=gpu-node-1 "
        "does not match (they have kubernetes.io/hostname: gpu-node-0, gpu-node-2, gpu-node-3)"
    )
    assert notebook.details == (
        "scheduler: 0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's "
        "node affinity/selector. no new claims to deallocate, preemption: 0/5 nodes are available: "
        "5 Preemption is not helpful for scheduling.",
    )
    assert "kubectl describe node gpu-node-1 | grep -A20 Allocatable" in commands(notebook, "kubernetes")
    assert (
        "kubectl logs -n gpu-operator nvidia-device-plugin-daemonset-q8sw8 -c nvidia-device-plugin --previous"
        in commands(notebook, "kubernetes")
    )
    assert commands(notebook, "node", "gpu-node-1") == [
        "nvidia-smi -L",
        "ls /var/lib/kubelet/device-plugins/",
    ]
    a100 = by(findings, "GPUPodUnschedulable", "pod tenant-a/llm-a100")
    assert a100.cause == (
        "Pending: on gpu-node-0, gpu-node-1, gpu-node-2, gpu-node-3: its nodeSelector "
        "nvidia.com/gpu.product=A100-SXM4-80GB does not match (they have nvidia.com/gpu.product: "
        "NVIDIA-H100-80GB-HBM3, NVIDIA-L4)"
    )
    quota = by(findings, "GPUQuotaExceeded")
    assert quota.cause == (
        "cannot create pods: ResourceQuota gpu-quota in tenant-a allows requests.nvidia.com/gpu=8, 6 in use, "
        "4 more requested"
    )
    assert "tenant-a/train-98877df55-zh5kn (Running) counts 4 against it" in quota.details
    assert summary(state("demo-broken.json")) == {"nodes": 5, "gpuNodes": 4, "gpuPods": 3, "operandPods": 33}


def test_a_stale_scheduler_message_is_pointed_out() -> None:
    recorded = state("demo-broken.json")
    for pod in recorded.pods:
        if pod["metadata"]["name"] == "notebook":
            condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
            condition["message"] = (
                "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector."
            )
    notebook = by(diagnose(recorded), "GPUPodUnschedulable", "pod tenant-a/notebook")
    assert notebook.details[-1] == (
        "now: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector "
        "(the cluster changed since the scheduler's last attempt)"
    )


def test_a_quota_with_room_now_is_not_reported() -> None:
    recorded = state("demo-broken.json")
    (quota,) = recorded.quotas
    quota["status"]["used"]["requests.nvidia.com/gpu"] = "4"  # the refused 4 fit now
    assert not [f for f in diagnose(recorded) if f.code == "GPUQuotaExceeded"]


def test_recorded_broken_demo_scoped() -> None:
    recorded = state("demo-broken.json")
    node = diagnose(recorded, Scope(node="gpu-node-1"))
    assert {f.code for f in node} == {"NoAllocatableGPU", "OperandNotReady"}
    assert diagnose(recorded, Scope(node="gpu-node-2")) == []
    pod = diagnose(recorded, Scope(pod="tenant-a/notebook"))
    assert codes(pod) == [("GPUPodUnschedulable", "pod tenant-a/notebook")]


# --- written states, one per group of symptoms -----------------------------------------------------


def test_healthy() -> None:
    assert diagnose(state("healthy.yaml")) == []
    assert summary(state("healthy.yaml"))["gpuPods"] == 1


def test_no_gpu_nodes_and_no_crd() -> None:
    findings = diagnose(state("no-gpu-nodes.yaml"))
    assert codes(findings) == [
        ("NoClusterPolicyCRD", "crd clusterpolicies.nvidia.com"),
        ("GPUPodUnschedulable", "pod team/train"),
    ]
    assert "no node in the cluster has an NVIDIA GPU" in findings[1].cause
    assert "is NFD installed?" in findings[1].cause


def test_node_symptoms() -> None:
    findings = diagnose(state("node-symptoms.yaml"))
    mismatch = by(findings, "GPUCountMismatch")
    assert mismatch.node == "gpu-a", "gpu-b has 2 GPUs x 4 time-slicing replicas = 8: no mismatch"
    assert mismatch.cause.startswith("advertises 6 nvidia.com/gpu, but GFD counted 8 GPUs")
    assert "dmesg | grep -i xid" in commands(mismatch, "node", "gpu-a")
    stuck = by(findings, "DriverUpgradeStuck")
    assert stuck.node == "gpu-b" and stuck.severity == "error"
    assert stuck.cause.startswith("driver upgrade in state validation-required for 2h (the node is cordoned)")
    # What the operator's status.driverUpgrade says comes with it.
    assert "the operator says: validation gate: waiting for operator-validator pod" in stuck.cause
    failed = by(findings, "DriverUpgradeFailed")
    assert failed.node == "gpu-c" and "CrashLoopBackOff" in failed.cause
    assert "(failed at pod-restart-required: driver pod nvidia-driver-daemonset-ccccc is crash-looping)" in (
        failed.cause
    )
    paused = by(findings, "DriverUpgradePaused")
    assert paused.object == "clusterpolicy cluster-policy" and paused.severity == "error"
    assert paused.cause.startswith("the driver upgrade is paused: node gpu-c failed at pod-restart-required")
    assert paused.details == (
        "gpu-c: failed at pod-restart-required: driver pod nvidia-driver-daemonset-ccccc is crash-looping",
    )
    assert by(findings, "OperandsPaused").node == "gpu-d"
    assert "nvidia.com/gpu.deploy.dcgm=paused-for-driver-upgrade" in by(findings, "OperandsPaused").cause
    assert by(findings, "MigConfigFailed").cause.startswith("MIG reconfiguration to all-1g.10gb failed")
    assert by(findings, "NodeNotReady").node == "gpu-e"
    rejected = by(findings, "GPUPodRejectedByNode")
    assert rejected.cause.startswith(
        "rejected by the kubelet on gpu-a: UnexpectedAdmissionError: Allocate failed"
    )
    assert "kubectl delete pod -n gpu-operator nvidia-device-plugin-daemonset-aaaaa" in commands(
        rejected, "kubernetes"
    )
    sneaky = by(findings, "VisibleDevicesOverride", "pod team/sneaky")
    assert "two pods on one GPU" in sneaky.cause and sneaky.severity == "warning"
    assert "nvidia-smi in it sees no GPU" in by(findings, "VisibleDevicesOverride", "pod team/blind").cause
    assert "kubectl exec -n team blind -c main -- env | grep NVIDIA" in commands(
        by(findings, "VisibleDevicesOverride", "pod team/blind"), "container", "team/blind"
    )
    # The driver pod crash-looping on gpu-c is young (2 minutes) but failing: reported.
    assert by(findings, "OperandNotReady").node == "gpu-c"


def test_gpu_pods_that_cannot_start() -> None:
    findings = diagnose(state("toolkit-broken.yaml"))
    toolkit = by(findings, "OperandNotReady")
    assert toolkit.cause == (
        "container-toolkit not ready on gpu-a: CrashLoopBackOff: back-off 5m0s restarting failed container"
    )
    assert toolkit.details[0] == "log of nvidia-container-toolkit-ctr (last 2 lines):"
    assert "read-only file system" in toolkit.details[2]
    assert (
        "kubectl logs -n gpu-operator nvidia-container-toolkit-daemonset-bbbbb "
        "-c nvidia-container-toolkit-ctr --previous" in commands(toolkit, "kubernetes")
    )
    assert "grep -n -A3 nvidia /etc/containerd/config.toml" in commands(toolkit, "node", "gpu-a")
    cuda = by(findings, "GPUPodNotStarting", "pod team/cuda")
    assert cuda.cause == (
        "CrashLoopBackOff: back-off 2m40s restarting failed container=cuda; on gpu-a, container-toolkit pod "
        "nvidia-container-toolkit-daemonset-bbbbb is CrashLoopBackOff: back-off 5m0s restarting failed "
        "container"
    )
    assert commands(cuda, "container", "team/cuda") == [
        "kubectl exec -n team cuda -c cuda -- nvidia-smi",
        "kubectl exec -n team cuda -c cuda -- env | grep NVIDIA",
    ]
    stuck = by(findings, "GPUPodNotStarting", "pod team/stuck")
    assert stuck.cause.startswith("ContainerCreating for 20m; on gpu-a, container-toolkit pod")
    assert stuck.details == (
        'event FailedCreatePodSandBox: failed to create containerd task: error mounting "/dev/nvidia0": '
        "no such file or directory",
    )
    assert "ls -l /dev/nvidia*" in commands(stuck, "node", "gpu-a")
    sandboxed = by(findings, "GPUPodNotStarting", "pod team/sandboxed")
    assert "its RuntimeClass nvidia-legacy does not exist" in sandboxed.cause
    assert not [f for f in findings if f.object == "pod team/young"], "30 s in ContainerCreating is normal"
    assert not [f for f in findings if f.code == "RuntimeClassNotFound"], "the RuntimeClass is back"


def test_a_toolkit_waiting_in_init_points_at_its_driver() -> None:
    """The toolkit is deployed with the driver and waits in Init for it (Component.waits_for): what is
    wrong there is the driver, and every chain through the toolkit says so."""
    recorded = state("healthy.yaml")
    node = recorded.nodes[0]
    del node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    pods = {p["metadata"]["name"]: p for p in recorded.pods}
    del pods["nvidia-device-plugin-daemonset-aaaaa"]
    pods["nvidia-driver-daemonset-aaaaa"]["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"name": "nvidia-driver-ctr", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        ],
    }
    pods["nvidia-container-toolkit-daemonset-aaaaa"]["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False"}],
        "initContainerStatuses": [{"name": "driver-validation", "state": {"running": {"startedAt": "t"}}}],
        "containerStatuses": [
            {"name": "nvidia-container-toolkit-ctr", "state": {"waiting": {"reason": "PodInitializing"}}}
        ],
    }
    recorded.pods[:] = list(pods.values())
    findings = diagnose(recorded)
    toolkit = by(findings, "OperandNotReady", "pod gpu-operator/nvidia-container-toolkit-daemonset-aaaaa")
    assert toolkit.cause == (
        "container-toolkit not ready on gpu-a for 2h: container-toolkit waits for driver pod "
        "nvidia-driver-daemonset-aaaaa is CrashLoopBackOff"
    )
    assert "kubectl logs -n gpu-operator nvidia-driver-daemonset-aaaaa -c nvidia-driver-ctr --previous" in (
        commands(toolkit, "kubernetes")
    )
    gpus = by(findings, "NoAllocatableGPU", "node gpu-a")
    assert "device-plugin waits for container-toolkit waits for driver pod" in gpus.cause, gpus.cause


def test_nodes_the_driver_pools_give_no_driver() -> None:
    """With useNvidiaDriverCRD, a GPU node without a driver pod is explained by the pools' rules
    (core/driver_pools.py): the cause alone, not the symptoms it leads to."""
    findings = diagnose(state("driver-pools.yaml"))
    assert codes(findings) == [
        ("NoNVIDIADriverForNode", "node gpu-b"),
        ("NVIDIADriverConflict", "node gpu-c"),
        ("NVIDIADriverInvalid", "node gpu-d"),
        ("NoDriverPoolForNode", "node gpu-e"),
        ("DriverPoolNotLabelled", "node gpu-f"),
        ("VGPUManagerNotDeployed", "node gpu-g"),
        ("GPUPodUnschedulable", "pod team/train"),
    ]
    assert by(findings, "NoNVIDIADriverForNode").cause == (
        "no NVIDIADriver selects the node and none is default, so no driver is installed: label the node "
        "for one of h100 (pool=h100), l4 (pool=l4), l4-by-product (nvidia.com/gpu.product=NVIDIA-L4), "
        "vgpu-hosts (pool=vgpu), or make one default (what broken selects is not known: the spec does not "
        "parse)"
    )
    conflict = by(findings, "NVIDIADriverConflict")
    assert conflict.cause.startswith(
        "NVIDIADrivers l4 and l4-by-product both select the node (ConflictingNodeSelector)"
    )
    assert commands(conflict, "kubernetes")[:2] == [
        "kubectl describe nvidiadriver l4",
        "kubectl describe nvidiadriver l4-by-product",
    ]
    assert "spec.driverType: Input should be 'gpu', 'vgpu' or 'vgpu-host-manager'" in (
        by(findings, "NVIDIADriverInvalid").cause
    )
    assert "lacks NFD's labels feature.node.kubernetes.io/system-os_release.ID" in (
        by(findings, "NoDriverPoolForNode").cause
    )
    assert (
        "carries no nvidia.com/gpu-operator.driver.owner label" in by(findings, "DriverPoolNotLabelled").cause
    )
    assert by(findings, "VGPUManagerNotDeployed").cause.endswith(
        "select nodes labelled nvidia.com/gpu.deploy.vgpu-manager=true, and the node is not: NVIDIA's "
        "operator sets that label on the vm-vgpu nodes of sandboxWorkloads, which this operator does not "
        "deploy, so label the node yourself"
    )
    # Chains through the driver end at the same cause.
    assert "container-toolkit waits for NVIDIADrivers l4 and l4-by-product both select the node" in (
        by(findings, "GPUPodUnschedulable").cause
    )
    assert codes(diagnose(state("driver-pools.yaml"), Scope(node="gpu-c"))) == [
        ("NVIDIADriverConflict", "node gpu-c")
    ]
    labelled = state("driver-pools.yaml")
    gpu_g = next(n for n in labelled.nodes if n["metadata"]["name"] == "gpu-g")
    gpu_g["metadata"]["labels"]["nvidia.com/gpu.deploy.vgpu-manager"] = "true"
    assert "VGPUManagerNotDeployed" not in {f.code for f in diagnose(labelled)}


def test_two_default_nvidia_drivers_and_none_at_all() -> None:
    recorded = state("driver-pools.yaml")
    assert recorded.nvidia_drivers is not None
    recorded.nvidia_drivers[:] = [
        {"metadata": {"name": name, "uid": name}, "spec": {"default": True, "version": "595.91.07"}}
        for name in ("a", "b")
    ]
    conflict = by(diagnose(recorded), "NVIDIADriverConflict", "node gpu-b")
    assert conflict.cause.startswith(
        "no NVIDIADriver selects the node and several are default: a and b (ReconcileFailed)"
    )
    recorded.nvidia_drivers[:] = [{"metadata": {"name": "a", "uid": "a"}, "spec": {"default": True}}]
    unknown = by(diagnose(recorded), "NoNVIDIADriverForNode", "node gpu-b")
    assert unknown.cause == (
        "no NVIDIADriver selects the node and none is default, so no driver is installed (what a selects "
        "is not known: the spec does not parse)"
    )
    recorded.nvidia_drivers[:] = []
    none = by(diagnose(recorded), "NoNVIDIADriverForNode", "node gpu-b")
    assert none.cause.startswith("no NVIDIADriver exists, so no driver is installed")


def test_nvidia_drivers_mean_nothing_while_the_policy_runs_the_driver() -> None:
    recorded = state("driver-pools.yaml")
    assert recorded.policies is not None
    recorded.policies[0]["spec"]["driver"] = {"useNvidiaDriverCRD": False}
    findings = diagnose(recorded)
    assert not [f for f in findings if "NVIDIADriver" in f.code or "Pool" in f.code]
    assert by(findings, "NoAllocatableGPU", "node gpu-b")


def test_policy_stale_and_refused_creates() -> None:
    findings = diagnose(state("policy-stale.yaml"))
    assert by(findings, "ClusterPolicyStale", "clusterpolicy first").severity == "warning"
    assert "generation 4" in by(findings, "ClusterPolicyStale").cause
    assert by(findings, "ClusterPolicyIgnored", "clusterpolicy second").cause.startswith("ignored")
    missing = by(findings, "RuntimeClassMissing", "runtimeclass nvidia")
    assert missing.details == ("used by pod team/wants-runtime",)
    bert = by(findings, "GPURequestRejected", "trainingjob team/bert")
    assert "requests must equal limits" in bert.cause and bert.details[0].startswith("3 failed create(s)")
    assert "fractional nvidia.com/gpu" in by(findings, "GPURequestRejected", "trainingjob team/half").cause
    assert not [f for f in findings if "daemonset" in f.object], "the DaemonSet is gone"
    serve = by(findings, "RuntimeClassNotFound", "replicaset team/serve-5d8f")
    assert "RuntimeClass nvidia, which does not exist (the ClusterPolicy's" in serve.cause
    assert serve.details[0].startswith("5 failed create(s)")
    # One pod: the cluster-wide prerequisites (the missing RuntimeClass, the stale policy) come along.
    scoped = diagnose(state("policy-stale.yaml"), Scope(pod="team/wants-runtime"))
    assert {f.code for f in scoped} == {"RuntimeClassMissing", "ClusterPolicyStale"}


def test_invalid_policy() -> None:
    findings = diagnose(state("policy-invalid.yaml"))
    invalid = by(findings, "ClusterPolicyInvalid")
    assert "spec.daemonsets.labels" in invalid.cause
    assert [f.code for f in findings] == ["ClusterPolicyInvalid"], "nothing else can be said for sure"


# --- the scheduler's filters ------------------------------------------------------------------------


def node(
    labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None, **status: Any
) -> dict[str, Any]:
    """Node n as the scheduler's filters read it: 8 GPUs, 110 pods and 4 CPUs allocatable unless
    `status` says otherwise (a shorthand of builders.node_body for these tests' allocatable)."""
    allocatable = {"nvidia.com/gpu": "8", "pods": "110", "cpu": "4", **status}
    return node_body("n", labels, spec={"taints": taints or []}, status={"allocatable": allocatable})


TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "nvidia.com/gpu", "value": "true"}, True),
        ({"key": "nvidia.com/gpu", "value": "false"}, False),
        ({"operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerates(toleration: dict[str, str], tolerated: bool) -> None:
    assert scheduling.tolerates([toleration], TAINT) is tolerated


def test_verdicts_follow_the_scheduler_order() -> None:
    cordoned = node(taints=[TAINT])
    cordoned["spec"]["unschedulable"] = True
    assert scheduling.verdict(gpu_request_pod(), cordoned, {}).filter == "NodeUnschedulable"  # type: ignore[union-attr]
    found = scheduling.verdict(gpu_request_pod(nodeSelector={"x": "y"}), node(taints=[TAINT]), {})
    assert (
        found is not None
        and found.filter == "TaintToleration"
        and found.detail == "nvidia.com/gpu=true:NoSchedule"
    )
    assert found.reason == "node(s) had untolerated taint(s)"
    prefer = {"key": "k", "effect": "PreferNoSchedule"}
    found = scheduling.verdict(gpu_request_pod(nodeSelector={"x": "y"}), node(taints=[prefer]), {})
    assert found is not None and found.filter == "NodeAffinity" and found.label == "x"
    found = scheduling.verdict(gpu_request_pod(), node(), {"nvidia.com/gpu": "8"})
    assert found is not None and found.reason == "Insufficient nvidia.com/gpu"
    assert found.detail == "requests 1, allocatable 8, in use 8"
    found = scheduling.verdict(gpu_request_pod(resources={"requests": {"cpu": "5"}}), node(), {})
    assert found is not None and found.reason == "Insufficient cpu"
    assert scheduling.verdict(gpu_request_pod(), node(), {"nvidia.com/gpu": "7"}) is None


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        (
            {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["80000"]},
            {"nvidia.com/gpu.memory": "81559"},
            True,
        ),
        (
            {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["80000"]},
            {"nvidia.com/gpu.memory": "24000"},
            False,
        ),
        ({"key": "nvidia.com/gpu.memory", "operator": "Lt", "values": ["80000"]}, {}, False),
        ({"key": "p", "operator": "In", "values": ["a", "b"]}, {"p": "b"}, True),
        ({"key": "p", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "p", "operator": "Exists"}, {}, False),
        ({"key": "p", "operator": "DoesNotExist"}, {}, True),
    ],
)
def test_node_affinity(expression: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }
    result = scheduling.affinity_mismatch({"spec": {"affinity": affinity}}, node(labels))
    assert (result is None) is matches, result


def test_requests() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        "overhead": {"memory": "1Mi"},
    }
    assert scheduling.pod_requests({"spec": spec}) == {
        "nvidia.com/gpu": Decimal(2),
        "cpu": Decimal(4),
        "memory": Decimal(2**30 + 2**20),
    }
    pods = [
        {"spec": {"nodeName": "a", **spec}, "status": {"phase": "Running"}},
        {"spec": {"nodeName": "a", **spec}, "status": {"phase": "Succeeded"}},
        {"spec": spec, "status": {"phase": "Pending"}},
    ]
    assert scheduling.requested_by_node(pods) == {
        "a": {"pods": "1", "nvidia.com/gpu": "2", "cpu": "4", "memory": str(2**30 + 2**20)}
    }


@pytest.mark.parametrize(
    ("text", "value"), [("500m", "0.5"), ("2", "2"), ("1Ki", "1024"), ("1e3", "1000"), ("x", "0")]
)
def test_quantity(text: str, value: str) -> None:
    assert scheduling.quantity(text) == Decimal(value)


def test_scheduler_reasons() -> None:
    message = (
        "0/5 nodes are available: 2 node(s) had untolerated taint(s), 3 Insufficient nvidia.com/gpu. no "
        "new claims to deallocate, preemption: 0/5 nodes are available: 5 Preemption is not helpful."
    )
    assert scheduling.scheduler_reasons(message) == {
        "node(s) had untolerated taint(s)": 2,
        "Insufficient nvidia.com/gpu": 3,
    }
    assert scheduling.scheduler_reasons("0/1 nodes are available: 1 node(s) were unschedulable.") == {
        "node(s) were unschedulable": 1
    }
    assert scheduling.scheduler_reasons("") == {}


def test_a_host_driver_is_not_blamed() -> None:
    """With the driver opted out (pre-installed on the host) and no driver pod, a crashing GPU pod is
    the container's own problem once the toolkit and device plugin are ready."""
    recorded = state("healthy.yaml")
    recorded.nodes[0]["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] = "false"
    recorded.pods[:] = [p for p in recorded.pods if p["metadata"]["name"] != "nvidia-driver-daemonset-aaaaa"]
    train = next(p for p in recorded.pods if p["metadata"]["name"] == "train")
    train["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
    }
    (found,) = diagnose(recorded)
    assert found.code == "GPUPodNotStarting"
    assert found.cause == "CrashLoopBackOff; the GPU stack on gpu-a is ready, so look at the container itself"


def test_a_vm_node_is_not_blamed_for_advertising_no_nvidia_gpu() -> None:
    """A VM node's sandbox device plugin advertises its GPUs under their models' names."""
    healthy = state("healthy.yaml")
    gpu = healthy.nodes[0]
    vm = {
        "metadata": {**gpu["metadata"], "name": "gpu-vm", "labels": {**gpu["metadata"]["labels"]}},
        "status": {**gpu["status"], "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }
    vm["metadata"]["labels"]["nvidia.com/gpu.workload.config"] = "vm-passthrough"
    healthy.nodes.append(vm)
    assert healthy.policies is not None
    healthy.policies[0]["spec"]["sandboxWorkloads"] = {"enabled": True}
    assert "NoAllocatableGPU" not in [f.code for f in diagnose(healthy) if f.node == "gpu-vm"]
    # The same node running containers does lack its GPUs.
    vm["metadata"]["labels"]["nvidia.com/gpu.workload.config"] = "container"
    assert by(diagnose(healthy), "NoAllocatableGPU").node == "gpu-vm"


def vm_cluster(workload: str = "vm-passthrough", **sandbox: Any) -> tuple[ClusterState, dict[str, Any]]:
    """The healthy cluster with one more GPU node, of `workload`, in a sandbox-enabled policy."""
    healthy = state("healthy.yaml")
    gpu = healthy.nodes[0]
    vm = {
        "metadata": {**gpu["metadata"], "name": "gpu-vm", "labels": {**gpu["metadata"]["labels"]}},
        "status": {**gpu["status"], "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }
    vm["metadata"]["labels"]["nvidia.com/gpu.workload.config"] = workload
    healthy.nodes.append(vm)
    assert healthy.policies is not None
    healthy.policies[0]["spec"]["sandboxWorkloads"] = {"enabled": True, **sandbox}
    for section in ("vfioManager", "sandboxDevicePlugin", "vgpuDeviceManager"):
        healthy.policies[0]["spec"][section] = {"enabled": True}
    return healthy, vm


def test_a_passthrough_node_without_its_gpus_names_the_plugin_and_what_it_waits_for() -> None:
    recorded, vm = vm_cluster()
    found = by(diagnose(recorded), "NoVMGPUs")
    assert found.node == "gpu-vm" and found.severity == "error"
    assert found.cause == (
        "advertises no GPUs for VM passthrough (vm-passthrough node): sandbox-device-plugin waits for "
        "sandbox-validator waits for vfio-manager is not deployed to the node yet"
    )
    assert "lspci -nnk -d 10de:" in commands(found, "node", "gpu-vm")
    # Advertised under the GPU model's name (KubeVirt's resource): no finding.
    vm["status"]["allocatable"]["nvidia.com/GH100_H100_SXM5_80GB"] = "8"
    assert "NoVMGPUs" not in [f.code for f in diagnose(recorded)]


def test_a_ready_sandbox_plugin_that_found_no_gpu_is_told_to_start_again() -> None:
    recorded, _ = vm_cluster()
    pods = []
    for component in ("vfio-manager", "sandbox-validator", "sandbox-device-plugin"):
        label = BY_NAME[component].component_label
        pods.append(
            {
                "metadata": {
                    "name": f"{component}-x",
                    "namespace": recorded.namespace,
                    "uid": f"uid-{component}",
                    "labels": {
                        "app.kubernetes.io/component": label,
                        "app.kubernetes.io/managed-by": "gpu-operator",
                    },
                    "ownerReferences": [
                        {"kind": "DaemonSet", "name": BY_NAME[component].daemonset, "controller": True}
                    ],
                },
                "spec": {"nodeName": "gpu-vm", "containers": [{"name": "main", "image": "x"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    recorded.pods.extend(pods)
    found = by(diagnose(recorded), "NoVMGPUs")
    assert found.cause.startswith(
        "advertises no GPUs for VM passthrough (vm-passthrough node) although sandbox-device-plugin-x is "
        "ready: it found none when it started"
    ), found.cause


def test_a_vm_node_without_any_sandbox_plugin_says_so() -> None:
    recorded, _ = vm_cluster("vm-vgpu", mode="kata")
    found = by(diagnose(recorded), "NoVMGPUs")
    assert "advertises no vGPUs (vm-vgpu node): no sandbox device plugin runs on it" in found.cause
    assert "sandboxWorkloads.mode kata" in found.cause
