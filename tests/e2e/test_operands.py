"""The operator with operand pods that behave like NVIDIA's images (hack/emulators): GFD labels, a MIG
reconfiguration, time-slicing, and a driver restart that evicts GPU pods.

Each test applies a ClusterPolicy, lets the operator and the emulated images converge, and checks
what a user of a real GPU cluster would see: node labels, advertised resources, pods. They need the
local kwok cluster (the emulators) and skip elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from .kube_helpers import (
    SIMULATED_NODE_LABEL,
    UNSCHEDULABLE,
    Cluster,
    LabelHistory,
    client,
    emulated_host,
    gpu_nodes,
    list_pods,
    pod_is_ready,
    wait_for,
)
from .test_operator import (
    COMPONENT,
    CONVERGE,
    DRIVER,
    MANAGED,
    NS,
    apply_policy,
    node_labels,
    policy_from,
    wait_state,
)

# What GFD v0.20 publishes for the simulated GPUs (hack/emulators/gpus.py, hack/gen_nodes.py).
PRODUCTS = {"H100-80GB-HBM3": ("NVIDIA-H100-80GB-HBM3", "81559", "hopper", "true"),
            "L4": ("NVIDIA-L4", "23034", "ada-lovelace", "false")}  # fmt: skip
MIG_NODE = "gpu-node-0"
PAUSED_FOR_DRIVER = "paused-for-driver-upgrade"


@pytest.fixture(autouse=True)
def emulated(cluster: Cluster) -> None:
    nodes: Any = client.CoreV1Api(cluster.api).list_node(label_selector=f"{SIMULATED_NODE_LABEL}=true")
    if not nodes.items:
        pytest.skip("needs the local kwok cluster and its emulators (hack/cluster.sh)")


def policy(name: str = "cluster-policy", **spec: Any) -> dict[str, Any]:
    body = policy_from("empty", name)
    body["spec"] = spec
    return body


def allocatable(cluster: Cluster, node: str) -> dict[str, str]:
    found: Any = client.CoreV1Api(cluster.api).read_node(node)
    return {k: v for k, v in (found.status.allocatable or {}).items() if k.startswith("nvidia.com/")}


def ready_pods(cluster: Cluster, node: str) -> dict[str, Any]:
    """component → the Ready operand pod on the node."""
    pods = list_pods(cluster.api, NS, labels=MANAGED, node=node)
    return {p.metadata.labels[COMPONENT]: p for p in pods if pod_is_ready(p)}


@pytest.mark.usefixtures("clean")
def test_gfd_labels_every_gpu_node_and_pods_select_them(cluster: Cluster, namespace: str) -> None:
    apply_policy(cluster, policy())
    wait_state(cluster, "cluster-policy", "ready")
    core = client.CoreV1Api(cluster.api)

    def labelled() -> None:
        for node in gpu_nodes(cluster.api):
            labels = node_labels(cluster, node)
            product, memory, family, mig = PRODUCTS[emulated_host(cluster.api, node)["gpu-model"]]
            seen = {
                k: labels.get(f"nvidia.com/{k}")
                for k in ("gpu.product", "gpu.memory", "gpu.family", "mig.capable")
            }
            want = {"gpu.product": product, "gpu.memory": memory, "gpu.family": family, "mig.capable": mig}
            assert seen == want, (node, seen)
            assert labels.get("nvidia.com/gpu.count") == "8", (node, labels)
            assert labels.get("nvidia.com/cuda.driver.major") == "595", (node, labels)
            assert labels.get("nvidia.com/cuda.runtime.major"), (node, labels)
        return None

    wait_for(labelled, timeout=CONVERGE, what="GFD labels on every GPU node")
    # Published the way GFD v0.20 does by default: one NodeFeature per node, in the operand namespace.
    features = client.CustomObjectsApi(cluster.api).list_namespaced_custom_object(
        "nfd.k8s-sigs.io", "v1alpha1", NS, "nodefeatures"
    )["items"]
    assert sorted(f["metadata"]["name"] for f in features) == sorted(
        f"nvidia-features-for-{n}" for n in gpu_nodes(cluster.api)
    )
    # A workload that selects the product lands on a node of that product.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wants-h100"},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "containers": [{"name": "cuda", "image": "example.invalid/cuda:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)

    def scheduled() -> None:
        found = core.read_namespaced_pod("wants-h100", namespace)
        assert found.spec.node_name == MIG_NODE, f"not on {MIG_NODE}: {found.status.conditions}"

    wait_for(scheduled, timeout=60, what="pod selecting gpu.product scheduled")


@pytest.mark.usefixtures("clean")
def test_mig_reconfiguration_end_to_end(cluster: Cluster) -> None:
    apply_policy(cluster, policy(mig={"strategy": "mixed"}))
    wait_state(cluster, "cluster-policy", "ready")
    wait_for(
        lambda: _assert_allocatable(cluster, MIG_NODE, {"nvidia.com/gpu": "8"}),
        timeout=CONVERGE,
        what=f"{MIG_NODE} advertises 8 full GPUs",
    )
    before = ready_pods(cluster, MIG_NODE)
    history = LabelHistory(cluster.api, MIG_NODE)
    try:
        set_mig_config(cluster, "all-1g.10gb")

        def reconfigured() -> None:
            labels = node_labels(cluster, MIG_NODE)
            state = labels.get("nvidia.com/mig.config.state")
            assert state == "success", state
            _assert_allocatable(cluster, MIG_NODE, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"})
            pods = ready_pods(cluster, MIG_NODE)
            for component in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter"):
                assert component in pods, f"{component} not back on {MIG_NODE}: {sorted(pods)}"
                restarted = pods[component].metadata.uid != before[component].metadata.uid
                assert restarted, f"{component} was not restarted"
            assert labels.get("nvidia.com/mig-1g.10gb.count") == "56", "GFD has not relabelled the node"

        wait_for(reconfigured, timeout=CONVERGE, what="MIG layout all-1g.10gb applied")
        values = history.stop()
        assert "pending" in values["nvidia.com/mig.config.state"], values["nvidia.com/mig.config.state"]
        for key in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter"):
            seen = values[f"nvidia.com/gpu.deploy.{key}"]
            assert "paused-for-mig-change" in seen and seen[-1] == "true", (key, seen)
        assert json.loads(emulated_host(cluster.api, MIG_NODE)["mig"])[0]["devices"] == ["1g.10gb"] * 7
        wait_state(cluster, "cluster-policy", "ready")
    finally:
        history.stop()
        # Back to full GPUs while mig-manager still runs: a MIG layout outlives the policy, as on a node.
        set_mig_config(cluster, "all-disabled")
        full = {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "0"}
        wait_for(
            lambda: _assert_allocatable(cluster, MIG_NODE, full), timeout=CONVERGE, what="MIG disabled again"
        )
    wait_state(cluster, "cluster-policy", "ready")


def set_mig_config(cluster: Cluster, layout: str) -> None:
    body = {"metadata": {"labels": {"nvidia.com/mig.config": layout}}}
    client.CoreV1Api(cluster.api).patch_node(MIG_NODE, body)


def _assert_allocatable(cluster: Cluster, node: str, want: dict[str, str]) -> None:
    found = allocatable(cluster, node)
    assert {k: found.get(k) for k in want} == want, found


def time_slicing(replicas: int) -> str:
    """A device-plugin config (k8s-device-plugin api/config/v1) sharing each GPU `replicas` ways."""
    resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
    return json.dumps({"version": "v1", "sharing": {"timeSlicing": {"resources": resources}}})


TIME_SLICING = {"any": time_slicing(4), "two": time_slicing(2)}


@pytest.fixture
def time_slicing_config(cluster: Cluster) -> Iterator[str]:
    core = client.CoreV1Api(cluster.api)
    body = {"metadata": {"name": "time-slicing-config"}, "data": TIME_SLICING}
    core.create_namespaced_config_map(NS, body)
    try:
        yield "time-slicing-config"
    finally:
        core.delete_namespaced_config_map("time-slicing-config", NS)


@pytest.mark.usefixtures("clean")
def test_time_slicing_raises_the_advertised_count(cluster: Cluster, time_slicing_config: str) -> None:
    apply_policy(cluster, policy(devicePlugin={"config": {"name": time_slicing_config, "default": "any"}}))
    wait_state(cluster, "cluster-policy", "ready")
    nodes = gpu_nodes(cluster.api)

    def shared() -> None:
        for node in nodes:
            _assert_allocatable(cluster, node, {"nvidia.com/gpu": "32"})
            labels = node_labels(cluster, node)
            assert labels.get("nvidia.com/gpu.replicas") == "4", (node, labels.get("nvidia.com/gpu.replicas"))
            assert labels.get("nvidia.com/gpu.sharing-strategy") == "time-slicing", node

    wait_for(shared, timeout=CONVERGE, what="8 GPUs x 4 replicas on every node")
    # Per-node choice: config-manager follows the node label and restarts the plugin with SIGHUP.
    target = nodes[-1]
    client.CoreV1Api(cluster.api).patch_node(
        target, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "two"}}}
    )
    try:
        wait_for(lambda: _assert_allocatable(cluster, target, {"nvidia.com/gpu": "16"}), timeout=CONVERGE,
                 what=f"{target} switched to 2 replicas")  # fmt: skip
    finally:
        client.CoreV1Api(cluster.api).patch_node(
            target, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}}
        )


def gpu_deployment(node: str) -> dict[str, Any]:
    labels = {"app": "gpu-job"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-job", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "cuda", "image": "example.invalid/cuda:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
            },
        },
    }  # fmt: skip


@pytest.mark.usefixtures("clean")
def test_driver_restart_evicts_gpu_pods_and_pauses_the_operands(cluster: Cluster, namespace: str) -> None:
    node = "gpu-node-1"
    # A new driver pod with the digest the loaded driver recorded keeps it and its GPU pods
    # (k8s-driver-manager v0.12.0 shouldSkipUninstall, cmd/driver-manager/main.go:368,872-883);
    # FORCE_REINSTALL (main.go:226) makes a restart reinstall it, as a changed config would.
    force = {"manager": {"env": [{"name": "FORCE_REINSTALL", "value": "true"}]}}
    apply_policy(cluster, policy(driver=force))
    wait_state(cluster, "cluster-policy", "ready")
    client.AppsV1Api(cluster.api).create_namespaced_deployment(namespace, gpu_deployment(node))

    def job_running() -> Any:
        pods = [p for p in list_pods(cluster.api, namespace, labels="app=gpu-job") if pod_is_ready(p)]
        assert pods and pods[0].spec.node_name == node, [p.spec.node_name for p in pods]
        return pods[0]

    job = wait_for(job_running, timeout=60, what=f"GPU job running on {node}")
    before = ready_pods(cluster, node)
    history = LabelHistory(cluster.api, node)
    try:
        client.CoreV1Api(cluster.api).delete_namespaced_pod(before[DRIVER].metadata.name, NS)

        def recovered() -> None:
            pods = ready_pods(cluster, node)
            for component in (DRIVER, "container-toolkit", "operator-validator", "device-plugin"):
                assert component in pods, f"{component} not Ready on {node}: {sorted(pods)}"
                assert pods[component].metadata.uid != before[component].metadata.uid, (
                    f"{component} not restarted"
                )
            found: Any = client.CoreV1Api(cluster.api).read_node(node)
            assert not found.spec.unschedulable, f"{node} still cordoned"
            assert job_running().metadata.uid != job.metadata.uid, "the GPU job was not evicted"
            _assert_allocatable(cluster, node, {"nvidia.com/gpu": "8"})

        wait_for(recovered, timeout=CONVERGE, what=f"{node} back after its driver restarted")
    finally:
        values = history.stop()
    for component in (
        "container-toolkit",
        "operator-validator",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
    ):
        seen = values[f"nvidia.com/gpu.deploy.{component}"]
        assert PAUSED_FOR_DRIVER in seen and seen[-1] == "true", (component, seen)
    # k8s-driver-manager cordoned the node to evict the GPU job, and uncordoned it afterwards.
    assert values[UNSCHEDULABLE] == ["false", "true", "false"], values[UNSCHEDULABLE]
    wait_state(cluster, "cluster-policy", "ready")


HOLD = "e2e.gpu-operator/hold"
"""A finalizer that keeps an operand pod terminating, and so k8s-driver-manager waiting with the
operands paused, for as long as a test needs."""


def restart_driver_holding_the_device_plugin(cluster: Cluster, node: str, pods: dict[str, Any]) -> str:
    """The node's driver pod deleted while a driver is loaded: its k8s-driver-manager pauses the
    operands and waits for their pods to go, the device plugin's among them, which HOLD keeps
    terminating. Returns that pod's name (`release` it)."""
    core = client.CoreV1Api(cluster.api)
    held: str = pods["device-plugin"].metadata.name
    core.patch_namespaced_pod(held, NS, {"metadata": {"finalizers": [HOLD]}})
    core.delete_namespaced_pod(pods[DRIVER].metadata.name, NS)
    paused = "nvidia.com/gpu.deploy.device-plugin"

    def holding() -> None:
        value, managers = deploy_labels(cluster)[node].get(paused, ("", set()))
        assert (value, managers) == (PAUSED_FOR_DRIVER, {"driver-manager"}), (value, managers)

    try:
        wait_for(holding, timeout=CONVERGE, what=f"k8s-driver-manager pausing the operands on {node}")
    except BaseException:
        release(core, held)
        raise
    return held


def release(core: Any, pod: str) -> None:
    """Remove the HOLD finalizer (the pod may be gone already)."""
    try:
        core.patch_namespaced_pod(pod, NS, {"metadata": {"finalizers": None}})
    except ApiException as exc:
        if exc.status != 404:
            raise


def deploy_labels(cluster: Cluster) -> dict[str, dict[str, tuple[str, set[str]]]]:
    """GPU node → its `nvidia.com/gpu.deploy.*` labels, each with its value and the managers owning it."""
    found: dict[str, dict[str, tuple[str, set[str]]]] = {}
    for node in client.CoreV1Api(cluster.api).list_node().items:
        managers: dict[str, set[str]] = {}
        for entry in node.metadata.managed_fields or []:
            for key in ((entry.fields_v1 or {}).get("f:metadata") or {}).get("f:labels") or {}:
                managers.setdefault(key.removeprefix("f:"), set()).add(entry.manager)
        labels = node.metadata.labels or {}
        found[node.metadata.name] = {
            k: (v, managers.get(k, set()))
            for k, v in labels.items()
            if k.startswith("nvidia.com/gpu.deploy.")
        }
    return found


def test_deleting_the_policy_mid_driver_upgrade_removes_every_deploy_label_but_a_persons(
    cluster: Cluster,
    clean: Any,
) -> None:
    """NVIDIA/gpu-operator#1391: the policy deleted while k8s-driver-manager holds the operands paused
    on a node, and the operator killed as it starts cleaning up. The restarted operator removes every
    deploy label it or the operand managers wrote (k8s-driver-manager's pauses and `""` marks, its
    restored `true`s, mig-manager's), and keeps the opt-outs a person set with kubectl."""
    node = "gpu-node-1"
    mine = {"nvidia.com/gpu.deploy.dcgm": "false", "nvidia.com/gpu.deploy.dcgm-exporter": "false"}
    # The exporter too: without DCGM on the node it would crash-loop, as the real image does.
    cluster.kubectl("label", "node", node, *(f"{k}={v}" for k, v in mine.items()))
    core = client.CoreV1Api(cluster.api)
    held = None
    try:
        force = {"manager": {"env": [{"name": "FORCE_REINSTALL", "value": "true"}]}}
        apply_policy(cluster, policy(driver=force))
        wait_state(cluster, "cluster-policy", "ready")
        held = restart_driver_holding_the_device_plugin(cluster, node, ready_pods(cluster, node))
        left = deploy_labels(cluster)
        # What a cleanup has to remove besides the operator's own labels: the managers' marks for the
        # operands nobody runs (k8s-driver-manager's "", mig-manager's `true`), on every GPU node.
        nvsm = {n: left[n].get("nvidia.com/gpu.deploy.nvsm") for n in gpu_nodes(cluster.api)}
        managers = {"driver-manager", "nvidia-mig-manager"}
        assert all(found and found[1] <= managers for found in nvsm.values()), nvsm
        custom = client.CustomObjectsApi(cluster.api)
        custom.delete_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")
        clean.kill()
        clean.start()

        def only_mine_left() -> None:
            found = {n: labels for n, labels in deploy_labels(cluster).items() if labels}
            assert found == {node: {k: (v, {"kubectl-label"}) for k, v in mine.items()}}, found

        wait_for(
            only_mine_left, timeout=CONVERGE, what="every deploy label of the operator and operands gone"
        )
        # The device plugin's pod was held all along: k8s-driver-manager never lifted its pause itself.
        assert core.read_namespaced_pod(held, NS).metadata.deletion_timestamp is not None
    finally:
        if held is not None:
            release(core, held)
        cluster.kubectl("label", "node", node, *(f"{k}-" for k in mine))


@pytest.mark.usefixtures("clean")
def test_a_mig_manager_restore_during_a_driver_restart_is_paused_again(cluster: Cluster) -> None:
    """k8s-driver-manager pauses the operands and waits for their pods; mig-manager, its pod starting
    meanwhile, writes `true` back over four of those pauses (mig-parted v0.15.0 reconfigure.go:550-568,
    even with the MIG layout already applied). The operator writes the pause again, so that the
    driver manager's wait ends once its pods go, instead of after its 5 minutes."""
    node = "gpu-node-1"
    core = client.CoreV1Api(cluster.api)
    held = None
    force = {"manager": {"env": [{"name": "FORCE_REINSTALL", "value": "true"}]}}
    apply_policy(cluster, policy(driver=force))
    wait_state(cluster, "cluster-policy", "ready")
    before = ready_pods(cluster, node)
    restored = {
        f"nvidia.com/gpu.deploy.{c}": "true"
        for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")
    }
    try:
        held = restart_driver_holding_the_device_plugin(cluster, node, before)
        # mig-manager's restartKubernetesGPUClients: a JSON merge patch under its own field manager.
        core.patch_node(node, {"metadata": {"labels": restored}}, field_manager="nvidia-mig-manager")

        def paused_again() -> None:
            labels = deploy_labels(cluster)[node]
            found = {key: labels.get(key) for key in restored}
            assert all(
                value is not None and value[0] == PAUSED_FOR_DRIVER and "gpu-operator" in value[1]
                for value in found.values()
            ), found

        wait_for(paused_again, timeout=60, what="the operator pausing the restored labels again")
    finally:
        if held is not None:
            release(core, held)

    def recovered() -> None:
        pods = ready_pods(cluster, node)
        for component in (DRIVER, "container-toolkit", "operator-validator", "device-plugin"):
            assert component in pods, f"{component} not Ready on {node}: {sorted(pods)}"
            restarted = pods[component].metadata.uid != before[component].metadata.uid
            assert restarted, f"{component} not restarted"
        labels = deploy_labels(cluster)[node]
        for key in ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery"):
            assert labels[key][0] == "true", (key, labels[key])

    # Well within k8s-driver-manager's 5 minutes of waiting for a pod that would not go.
    wait_for(recovered, timeout=120, what=f"{node} back after its driver restarted")
    wait_state(cluster, "cluster-policy", "ready")
