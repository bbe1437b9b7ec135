"""The operator end to end: a real API server, kwok nodes and pods, the operator as its own process
logged in as the Helm chart's ServiceAccount. Each test starts from a cluster with no ClusterPolicy
and leaves it that way."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml

from gpu_operator.core.components import BY_LABEL, BY_NAME, COMPONENTS
from gpu_operator.core.node_labels import left_on_uninstall, node_info

from .kube_helpers import (
    Cluster,
    clear_failure,
    client,
    emulated_host,
    gpu_nodes,
    inject_failure,
    list_pods,
    pod_is_ready,
    wait_for,
    wait_timeout,
)
from .operator_process import ROOT, OperatorProcess

# The generated models type every field Optional; these tests read live objects whose fields are set,
# so they use the client untyped rather than assert on each attribute.

NS = "gpu-operator"
RELEASE = "gpu-operator"
GROUP, VERSION, PLURAL = "nvidia.com", "v1", "clusterpolicies"
MANAGED = "app.kubernetes.io/managed-by=gpu-operator"
COMPONENT = "app.kubernetes.io/component"
DRIVER = BY_NAME["driver"].component_label
"""The driver's pods carry NVIDIA's component label (the validator selects on it)."""
POLICIES = ROOT / "tests" / "data" / "policies"
SEED_DRIVERS = ROOT / "examples" / "nvidiadrivers.yaml"
NVIDIADRIVERS = ("nvidia.com", "v1alpha1", "nvidiadrivers")
SEED_CONFIG_MAPS = (ROOT / "examples" / "device-plugin-config.yaml", ROOT / "examples" / "mig-config.yaml")
"""The ConfigMaps the seed sample (seed-sample.yaml, examples/clusterpolicy.yaml) names."""
CONVERGE = wait_timeout(120.0)
"""Seconds a policy may take to converge: 120 under the instant profile, plus one operand start."""


@pytest.fixture
def seed_config_maps(cluster: Cluster, operator: OperatorProcess) -> Iterator[None]:
    """The ConfigMaps the seed article's policy names (devicePlugin.config, migManager.config): without
    them its device plugin, GFD and mig-manager pods wait to mount them, as on a real cluster."""
    apply_seed_config_maps(cluster)
    try:
        yield
    finally:
        for path in SEED_CONFIG_MAPS:
            cluster.kubectl("delete", "--ignore-not-found", "-f", str(path))


# --- helpers -------------------------------------------------------------------------------------


def apply_policy(cluster: Cluster, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body))


def apply_seed_config_maps(cluster: Cluster) -> None:
    """The seed sample names two ConfigMaps; a policy is not applied before what it names is there."""
    for path in SEED_CONFIG_MAPS:
        cluster.kubectl("apply", "--server-side", "-f", str(path))


def policy_from(name: str, policy_name: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((POLICIES / f"{name}.yaml").read_text())
    if policy_name:
        body["metadata"]["name"] = policy_name
    return body


def delete_policies(cluster: Cluster) -> None:
    """Delete every ClusterPolicy and NVIDIADriver (the operator then removes what they made)."""
    custom = client.CustomObjectsApi(cluster.api)
    for group, version, plural in ((GROUP, VERSION, PLURAL), NVIDIADRIVERS):
        for item in custom.list_cluster_custom_object(group, version, plural)["items"]:
            custom.delete_cluster_custom_object(group, version, plural, item["metadata"]["name"])


def seed_drivers() -> list[dict[str, Any]]:
    """The seed sample delegates its driver (`useNvidiaDriverCRD: true`): the default NVIDIADriver of
    examples/nvidiadrivers.yaml runs it, as `make demo` applies it."""
    found = [d for d in yaml.safe_load_all(SEED_DRIVERS.read_text()) if d and d["spec"].get("default")]
    return found


def apply_seed(cluster: Cluster, name: str | None = None) -> dict[str, Any]:
    """The seed sample (named `name`), its default NVIDIADriver first; the policy applied."""
    for driver in seed_drivers():
        apply_policy(cluster, driver)
    body = policy_from("seed-sample", name)
    apply_policy(cluster, body)
    return body


def get_policy(cluster: Cluster, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(
        GROUP, VERSION, PLURAL, name
    )
    return result


def condition(policy: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in policy.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def wait_state(cluster: Cluster, name: str, state: str, timeout: float = CONVERGE) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        policy = get_policy(cluster, name)
        status = policy.get("status", {})
        assert status.get("state") == state, json.dumps(status, indent=1)[:3000]
        assert status.get("observedGeneration") == policy["metadata"]["generation"], "status is stale"
        return policy

    return wait_for(check, timeout=timeout, what=f"ClusterPolicy {name} {state}")


def daemonsets(cluster: Cluster) -> dict[str, Any]:
    items = client.AppsV1Api(cluster.api).list_namespaced_daemon_set(NS, label_selector=MANAGED).items
    # Only operands: a user's DaemonSet may carry our managed-by label too.
    known = [ds for ds in items if (ds.metadata.labels or {}).get(COMPONENT) in BY_LABEL]
    return {BY_LABEL[ds.metadata.labels[COMPONENT]].name: ds for ds in known}


def node_labels(cluster: Cluster, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(cluster.api).read_node(node).metadata.labels or {})


def owners(cluster: Cluster, node: str, key: str) -> set[str]:
    """The field managers that own the node's label `key`."""
    found: Any = client.CoreV1Api(cluster.api).read_node(node)
    return {
        m.manager
        for m in found.metadata.managed_fields or []
        if f"f:{key}" in ((m.fields_v1 or {}).get("f:metadata", {}).get("f:labels", {}))
    }


def label_node(cluster: Cluster, node: str, **labels: str | None) -> None:
    client.CoreV1Api(cluster.api).patch_node(node, {"metadata": {"labels": labels}})


AFTER_TOOLKIT = [c for c in COMPONENTS if "container-toolkit" in c.depends_on]
"""The components deployed to a node only once its toolkit is ready."""


def waits_in_init(pod: Any, container: str) -> bool:
    """The pod has not started: `container`, one of its init containers, is still running."""
    statuses = {s.name: s for s in pod.status.init_container_statuses or []}
    status = statuses.get(container)
    return bool(pod.status.phase == "Pending" and status is not None and status.state.running)


def operator_labels(labels: dict[str, str]) -> set[str]:
    return {k for k in labels if k.startswith("nvidia.com/gpu.deploy.") or k == "nvidia.com/gpu.present"}


def assert_cleaned_up(cluster: Cluster) -> None:
    core = client.CoreV1Api(cluster.api)
    left = [ds.metadata.name for ds in daemonsets(cluster).values()]
    left += [cm.metadata.name for cm in core.list_namespaced_config_map(NS, label_selector=MANAGED).items]
    left += [
        r.metadata.name
        for r in client.RbacAuthorizationV1Api(cluster.api).list_cluster_role(label_selector=MANAGED).items
    ]
    assert not left, f"operator objects left: {left}"
    for node in core.list_node().items:
        # None the operator still owns may remain, nor a deploy label the operand managers wrote on its
        # behalf (core/node_labels.py `left_on_uninstall`). Values other tools wrote stay, as on a real
        # node: the tests' "false".
        left = left_on_uninstall(node_info(core.api_client.sanitize_for_serialization(node)))
        assert not left, f"{node.metadata.name} keeps operator labels {left}"


def assert_pods_exactly_on_gpu_nodes(cluster: Cluster, policy: dict[str, Any]) -> None:
    labels = {n: node_labels(cluster, n) for n in gpu_nodes(cluster.api)}
    for component, ds in daemonsets(cluster).items():
        pods = list_pods(cluster.api, NS, labels=f"app={ds.metadata.name}")
        nodes = {p.spec.node_name for p in pods if pod_is_ready(p)}
        # mig-manager: MIG-capable nodes only (gpu-node-0); the MPS control daemon: none is MPS-capable.
        expected = {n for n, node in labels.items() if BY_NAME[component].node_filter(node)}
        assert nodes == expected, f"{component}: ready pods on {sorted(nodes)}, expected {sorted(expected)}"


def gpu_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cuda-vectoradd", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def writes_by(
    cluster: Cluster, user: str, since: float, verbs: tuple[str, ...] = WRITE_VERBS, dry_runs: bool = False
) -> list[str]:
    """Requests by `user` with one of `verbs` (by default the mutating ones) in the API server's audit
    log since the unix time `since`; dry runs (dryRun=All: nothing stored) only with `dry_runs`."""
    assert cluster.audit_log is not None
    found = []
    for line in cluster.audit_log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("stage") != "ResponseComplete" or entry.get("user", {}).get("username") != user:
            continue
        if entry["verb"] not in verbs or ("dryRun=" in entry.get("requestURI", "")) != dry_runs:
            continue
        stamp = entry["requestReceivedTimestamp"]
        if datetime.fromisoformat(stamp).timestamp() >= since:
            ref = entry.get("objectRef", {})
            found.append(f"{entry['verb']} {ref.get('resource')}/{ref.get('name')} {stamp}")
    return found


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", ["seed-sample", "empty"])
@pytest.mark.usefixtures("seed_config_maps")
def test_policy_converges_on_exactly_the_gpu_nodes(
    cluster: Cluster, clean: OperatorProcess, namespace: str, sample: str
) -> None:
    if sample == "seed-sample":
        apply_seed_config_maps(cluster)
        body = apply_seed(cluster)
    else:
        body = policy_from(sample)
        apply_policy(cluster, body)
    name = body["metadata"]["name"]
    policy = wait_state(cluster, name, "ready")
    status = policy["status"]
    assert status["gpuNodes"] == 4
    assert condition(policy, "Ready")["reason"] == "Reconciled"
    if sample == "seed-sample":
        # The driver is the default NVIDIADriver's, on every GPU node.
        owned = {
            n: node_labels(cluster, n).get("nvidia.com/gpu-operator.driver.owner")
            for n in gpu_nodes(cluster.api)
        }
        assert set(owned.values()) == {"default"}, owned
    assert_pods_exactly_on_gpu_nodes(cluster, policy)
    expected = {c["name"] for c in status["components"] if c["enabled"] and c["state"] == "ready"}
    assert set(daemonsets(cluster)) == expected
    # The seed article's flow: a GPU pod now gets scheduled by kube-scheduler.
    client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, gpu_pod(namespace))

    def scheduled() -> str:
        pod = client.CoreV1Api(cluster.api).read_namespaced_pod("cuda-vectoradd", namespace)
        assert pod.spec.node_name, f"pending: {pod.status.conditions}"
        return str(pod.spec.node_name)

    assert wait_for(scheduled, timeout=60, what="GPU pod scheduled").startswith("gpu-node-")
    events = cluster.kubectl("describe", "clusterpolicy", name).split("Events:")[-1]
    assert "Ready" in events, events


def test_failing_driver_blocks_only_its_node(
    cluster: Cluster, clean: OperatorProcess, failures: None
) -> None:
    # A driver an earlier test left loaded on the emulated host (its pod was deleted under GPU clients).
    loaded = bool(emulated_host(cluster.api, "gpu-node-1").get("driver"))
    # The driver's main container crash-loops; its init containers (k8s-driver-manager) complete.
    inject_failure(cluster.api, DRIVER, "gpu-node-1", "CrashLoopBackOff")
    apply_policy(cluster, policy_from("empty"))

    def others_ready_and_reported() -> dict[str, Any]:
        policy = get_policy(cluster, "cluster-policy")
        status = policy.get("status", {})
        plugins = {
            p.spec.node_name
            for p in list_pods(cluster.api, NS, labels=f"{COMPONENT}=device-plugin")
            if pod_is_ready(p)
        }
        assert plugins == {"gpu-node-0", "gpu-node-2", "gpu-node-3"}, f"device plugin ready on {plugins}"
        assert status.get("state") == "notReady", status
        message = condition(policy, "Error").get("message", "")
        assert "CrashLoopBackOff on gpu-node-1" in message, message
        assert "waiting for driver on gpu-node-1" in message, message
        return policy

    policy = wait_for(others_ready_and_reported, timeout=CONVERGE, what="other nodes converge")
    driver = next(c for c in policy["status"]["components"] if c["name"] == "driver")
    assert driver["nodesFailing"] == 1 and driver["problems"][0]["node"] == "gpu-node-1"
    toolkit = next(c for c in policy["status"]["components"] if c["name"] == "container-toolkit")
    assert toolkit["nodesWaiting"] == 1 and toolkit["nodesFailing"] == 0, toolkit
    # The driver pod is past its init containers, so the toolkit is deployed there, and its pod waits
    # in Init for the driver (its driver-validation retries); nothing after the toolkit is deployed:
    # no label, or the "" that k8s-driver-manager writes on a node it first sees.
    labels = node_labels(cluster, "gpu-node-1")
    assert labels["nvidia.com/gpu.deploy.container-toolkit"] == "true"
    # The operator's alone: k8s-driver-manager never paused and restored it (it would own it then).
    assert owners(cluster, "gpu-node-1", "nvidia.com/gpu.deploy.container-toolkit") == {"gpu-operator"}
    later = [c.name for c in AFTER_TOOLKIT if labels.get(c.deploy_label, "") != ""]
    assert not later, f"deployed before the toolkit is ready: {later}"
    for component in AFTER_TOOLKIT:
        assert not list_pods(
            cluster.api, NS, labels=f"{COMPONENT}={component.component_label}", node="gpu-node-1"
        )

    def toolkit_pod() -> Any:
        pods = list_pods(cluster.api, NS, labels=f"{COMPONENT}=container-toolkit", node="gpu-node-1")
        assert len(pods) == 1, [p.metadata.name for p in pods]
        return pods[0]

    def toolkit_waits() -> Any:
        pod = toolkit_pod()
        assert waits_in_init(pod, "driver-validation"), pod.status
        return pod

    waiting = wait_for(toolkit_waits, timeout=CONVERGE, what="the toolkit pod waits in Init for the driver")
    clear_failure(cluster.api, DRIVER, "gpu-node-1")
    wait_state(cluster, "cluster-policy", "ready")
    assert_pods_exactly_on_gpu_nodes(cluster, get_policy(cluster, "cluster-policy"))
    # It went on once the driver was ready: it waited, it did not fail.
    ready = toolkit_pod()
    assert pod_is_ready(ready) and [s.restart_count for s in ready.status.init_container_statuses] == [0]
    if not loaded:
        # The very pod that waited. With a driver loaded, the driver pod that clear_failure re-creates
        # pauses and restores the (labelled) toolkit, as k8s-driver-manager does on every driver
        # restart (main.go:358-366); the first driver pod never did (the label's owners above).
        assert ready.metadata.uid == waiting.metadata.uid


def test_opt_out_labels_are_respected(cluster: Cluster, clean: OperatorProcess) -> None:
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    label_node(cluster, "gpu-node-2", **{"nvidia.com/gpu.deploy.dcgm-exporter": "false"})
    label_node(cluster, "gpu-node-3", **{"nvidia.com/gpu.deploy.operands": "false"})
    try:

        def opted_out() -> None:
            on2 = {
                p.metadata.labels[COMPONENT]
                for p in list_pods(cluster.api, NS, labels=MANAGED, node="gpu-node-2")
            }
            on3 = list_pods(cluster.api, NS, labels=MANAGED, node="gpu-node-3")
            assert "dcgm-exporter" not in on2 and DRIVER in on2, on2
            assert not on3, f"operands still on gpu-node-3: {[p.metadata.name for p in on3]}"

        wait_for(opted_out, timeout=CONVERGE, what="opt-outs honoured")
        wait_state(cluster, "cluster-policy", "ready")
        assert node_labels(cluster, "gpu-node-2")["nvidia.com/gpu.deploy.dcgm-exporter"] == "false"
        # The operator removed its deploy labels; the `""` ones k8s-driver-manager wrote for components
        # it does not run (nvsm, sandbox, DRA: maybeSetTrue(""), main.go:1075) stay, as on a real node.
        left = {
            k: v
            for k, v in node_labels(cluster, "gpu-node-3").items()
            if k.startswith("nvidia.com/gpu.deploy.") and k != "nvidia.com/gpu.deploy.operands" and v
        }
        assert not left, left
        label_node(cluster, "gpu-node-3", **{"nvidia.com/gpu.deploy.operands": None})

        def restored() -> None:
            ready = {
                p.metadata.labels[COMPONENT]
                for p in list_pods(cluster.api, NS, labels=MANAGED, node="gpu-node-3")
                if pod_is_ready(p)
            }
            assert {DRIVER, "device-plugin", "dcgm-exporter"} <= ready, ready

        wait_for(restored, timeout=CONVERGE, what="gpu-node-3 restored")
        wait_state(cluster, "cluster-policy", "ready")
    finally:
        label_node(cluster, "gpu-node-2", **{"nvidia.com/gpu.deploy.dcgm-exporter": None})
        label_node(cluster, "gpu-node-3", **{"nvidia.com/gpu.deploy.operands": None})


def test_disable_enable_and_version_change_touch_only_their_objects(
    cluster: Cluster, clean: OperatorProcess
) -> None:
    body = policy_from("empty")
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    core = client.CoreV1Api(cluster.api)
    body["spec"] = {"dcgmExporter": {"enabled": False}}
    apply_policy(cluster, body)

    def exporter_gone() -> None:
        assert "dcgm-exporter" not in daemonsets(cluster)
        services = [
            s.metadata.name
            for s in core.list_namespaced_service(NS, label_selector=f"{COMPONENT}=dcgm-exporter").items
        ]
        accounts = [
            s.metadata.name
            for s in core.list_namespaced_service_account(
                NS, label_selector=f"{COMPONENT}=dcgm-exporter"
            ).items
        ]
        assert not services and not accounts, (services, accounts)

    wait_for(exporter_gone, timeout=CONVERGE, what="dcgm-exporter objects deleted")
    wait_state(cluster, "cluster-policy", "ready")
    body["spec"] = {}
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    assert "dcgm-exporter" in daemonsets(cluster)
    before = {name: ds.metadata.generation for name, ds in daemonsets(cluster).items()}
    body["spec"] = {
        "devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin", "version": "v0.20.1"}
    }
    apply_policy(cluster, body)
    policy = wait_state(cluster, "cluster-policy", "ready")
    after = {name: ds.metadata.generation for name, ds in daemonsets(cluster).items()}
    changed = {name for name in before if before[name] != after[name]}
    # The MPS control daemon runs the device plugin's image (NVIDIA's TransformMPSControlDaemon).
    assert changed == {"device-plugin", "mps-control-daemon"}, f"generations before {before} after {after}"
    image = daemonsets(cluster)["device-plugin"].spec.template.spec.containers[0].image
    assert image == "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"
    assert (
        policy["status"]["componentsReady"].split("/")[0] == policy["status"]["componentsReady"].split("/")[1]
    )


def test_drift_is_repaired(cluster: Cluster, clean: OperatorProcess) -> None:
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    gfd = daemonsets(cluster)["gpu-feature-discovery"]
    apps.delete_namespaced_daemon_set(gfd.metadata.name, NS)

    def recreated() -> None:
        ds = daemonsets(cluster).get("gpu-feature-discovery")
        assert ds is not None and ds.metadata.uid != gfd.metadata.uid, "not recreated yet"

    wait_for(recreated, timeout=60, what="deleted DaemonSet restored")
    plugin = daemonsets(cluster)["device-plugin"]
    image = plugin.spec.template.spec.containers[0].image
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": plugin.spec.template.spec.containers[0].name, "image": "evil/image:latest"}
                    ]
                }
            }
        }
    }
    apps.patch_namespaced_daemon_set(plugin.metadata.name, NS, patch)

    def image_restored() -> None:
        current = daemonsets(cluster)["device-plugin"].spec.template.spec.containers[0].image
        assert current == image, current

    wait_for(image_restored, timeout=60, what="edited image restored")
    config_maps = core.list_namespaced_config_map(NS, label_selector=MANAGED).items
    assert config_maps, "the default policy renders ConfigMaps"
    victim = config_maps[0]
    core.delete_namespaced_config_map(victim.metadata.name, NS)

    def config_map_restored() -> None:
        current = core.read_namespaced_config_map(victim.metadata.name, NS)
        assert current.metadata.uid != victim.metadata.uid and current.data == victim.data

    wait_for(config_map_restored, timeout=60, what="deleted ConfigMap restored")
    wait_state(cluster, "cluster-policy", "ready")


def test_second_policy_is_ignored_until_the_first_goes(cluster: Cluster, clean: OperatorProcess) -> None:
    apply_policy(cluster, policy_from("empty", "first"))
    wait_state(cluster, "first", "ready")
    second = policy_from("empty", "second")
    second["spec"] = {"dcgmExporter": {"enabled": False}}
    apply_policy(cluster, second)
    ignored = wait_state(cluster, "second", "ignored")
    assert "'first' is active" in condition(ignored, "Ready")["message"]
    assert "dcgm-exporter" in daemonsets(cluster)
    client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, "first")
    wait_state(cluster, "second", "ready")
    wait_for(
        lambda: assert_no_component(cluster, "dcgm-exporter"), timeout=CONVERGE, what="second policy applied"
    )


def assert_no_component(cluster: Cluster, component: str) -> None:
    assert component not in daemonsets(cluster), f"{component} still deployed"


def test_invalid_update_keeps_operands_and_names_the_field(cluster: Cluster, clean: OperatorProcess) -> None:
    body = policy_from("empty")
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    before = {name: (ds.metadata.uid, ds.metadata.generation) for name, ds in daemonsets(cluster).items()}
    # The CRD schema cannot check label keys; the operator's model can.
    body["spec"] = {"daemonsets": {"labels": {"not a label key!": "x"}}, "dcgm": {"enabled": False}}
    apply_policy(cluster, body)
    policy = wait_state(cluster, "cluster-policy", "notReady")
    error = condition(policy, "Error")
    assert error["status"] == "True" and error["reason"] == "InvalidSpec"
    assert "spec.daemonsets.labels" in error["message"], error
    after = {name: (ds.metadata.uid, ds.metadata.generation) for name, ds in daemonsets(cluster).items()}
    assert after == before, "an invalid policy changed running operands"
    body["spec"] = {}
    apply_policy(cluster, body)
    policy = wait_state(cluster, "cluster-policy", "ready")
    assert condition(policy, "Error")["status"] == "False"


def test_deleting_the_policy_removes_everything_it_added(cluster: Cluster, clean: OperatorProcess) -> None:
    # The user opts one node out of dcgm-exporter (not of DCGM: the exporter there would then have no
    # host engine to connect to, and crash-loop as the real image does).
    label_node(cluster, "gpu-node-0", **{"nvidia.com/gpu.deploy.dcgm-exporter": "false"})
    try:
        apply_policy(cluster, policy_from("empty"))
        wait_state(cluster, "cluster-policy", "ready")
        assert node_labels(cluster, "gpu-node-1")["nvidia.com/gpu.deploy.driver"] == "true"
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            GROUP, VERSION, PLURAL, "cluster-policy"
        )
        wait_for(lambda: assert_cleaned_up(cluster), timeout=CONVERGE, what="everything removed")
        assert node_labels(cluster, "gpu-node-0")["nvidia.com/gpu.deploy.dcgm-exporter"] == "false", (
            "user label removed"
        )
    finally:
        label_node(cluster, "gpu-node-0", **{"nvidia.com/gpu.deploy.dcgm-exporter": None})


def test_driver_waits_for_the_config_map_it_mounts(cluster: Cluster, clean: OperatorProcess) -> None:
    """The driver mounts the files of driver.kernelModuleConfig one by one: until the ConfigMap exists
    there is no driver DaemonSet and the status names it; then the driver rolls out with its files."""
    body = policy_from("empty")
    body["spec"] = {"driver": {"kernelModuleConfig": {"name": "kernel-module-params"}}}
    apply_policy(cluster, body)
    core = client.CoreV1Api(cluster.api)

    def reported() -> None:
        components = get_policy(cluster, "cluster-policy").get("status", {}).get("components", [])
        driver = [c for c in components if c["name"] == "driver"]
        assert driver and "ConfigMap 'kernel-module-params' not found" in driver[0]["reason"], components

    wait_for(reported, timeout=CONVERGE, what="missing ConfigMap reported")
    assert "driver" not in daemonsets(cluster)
    config_map = {
        "metadata": {"name": "kernel-module-params"},
        "data": {"nvidia.conf": "NVreg_EnableGpuFirmware=0"},
    }
    core.create_namespaced_config_map(NS, config_map)
    try:
        wait_state(cluster, "cluster-policy", "ready")
        mounts = daemonsets(cluster)["driver"].spec.template.spec.containers[0].volume_mounts
        assert any(m.mount_path == "/drivers/nvidia.conf" and m.sub_path == "nvidia.conf" for m in mounts)
    finally:
        core.delete_namespaced_config_map("kernel-module-params", NS)


def test_operator_killed_mid_convergence_recovers(cluster: Cluster, clean: OperatorProcess) -> None:
    apply_policy(cluster, policy_from("empty"))
    wait_for(lambda: assert_has(daemonsets(cluster), "driver"), timeout=60, what="driver DaemonSet applied")
    clean.kill()
    clean.start()
    wait_state(cluster, "cluster-policy", "ready")
    names = [ds.metadata.name for ds in daemonsets(cluster).values()]
    assert len(names) == len(set(names)) == 9, names
    pods = list_pods(cluster.api, NS, labels=f"{COMPONENT}={DRIVER}")
    assert sorted(p.spec.node_name for p in pods) == gpu_nodes(cluster.api), (
        "duplicate or missing driver pods"
    )


def assert_has(found: dict[str, Any], key: str) -> None:
    assert key in found, sorted(found)


@pytest.mark.usefixtures("seed_config_maps")
def test_no_writes_at_rest(cluster: Cluster, clean: OperatorProcess) -> None:
    if cluster.audit_log is None:
        pytest.skip("needs the local cluster's audit log")
    apply_seed_config_maps(cluster)
    apply_seed(cluster)
    wait_state(cluster, "gpu-cluster-policy", "ready")
    start = time.time() + 1
    user = f"system:serviceaccount:{NS}:{RELEASE}"
    # A window of quiet, checked continuously: any write ends the test at once. The one request at rest
    # is the leader election's: its own Lease, renewed every retry period (2 s) without a read first.
    lease = f"leases/{RELEASE} "

    def not_lease(requests: list[str]) -> list[str]:
        return [r for r in requests if not r.startswith(f"update {lease}")]

    def requests_at_rest() -> list[str]:
        # Writes, and the questions a change is proven with (lookups, dry runs): none without a change.
        return not_lease(
            writes_by(cluster, user, start)
            + writes_by(cluster, user, start, dry_runs=True)
            + writes_by(cluster, user, start, verbs=("get",))
        )

    deadline = start + 60
    while time.time() < deadline:
        found = requests_at_rest()
        assert not found, f"requests at rest: {found}"
        time.sleep(5)
    assert not requests_at_rest()
    writes = writes_by(cluster, user, start)
    elapsed = time.time() - start  # the window plus the reading of the audit log, which takes a while
    assert len(writes) <= elapsed / 2 + 2, (
        f"the Lease is renewed once per retry period: {len(writes)} renewals"
    )
