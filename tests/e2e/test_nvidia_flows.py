"""NVIDIA's own end-to-end flows, run as a user of NVIDIA's chart would run them against this one.

NVIDIA's operator is tested by the scripts in `tests/scripts/` of NVIDIA/gpu-operator (v26.7.0):
`install-operator.sh` (the chart installed with `--generate-name` and the operator's and validator's
repository and version set), `verify-operator.sh` and `verify-operand-restarts.sh`,
`update-clusterpolicy.sh` (JSON patches of the ClusterPolicy the chart wrote: driver version with a
driver pod deleted by hand, device-plugin env, MIG strategy, standalone DCGM, time-slicing, GFD and
DCGM exporter off and on, custom labels), the operator restarted (`checks.sh` test_restart_operator),
`disable-operands.sh` / `enable-operands.sh` (the `nvidia.com/gpu.deploy.operands` node label) and
`uninstall-operator.sh`. Each test below follows one of them, step by step, with the same commands
and the same checks, written here rather than copied: the scripts poll a single-node cluster with
fixed sleeps; these wait on the same conditions, for every GPU node.

The chart is installed as `install-operator.sh` installs NVIDIA's, plus `operator.replicas=0` (kwok
runs no operator container): the operator runs as a local process logged in as the chart's
ServiceAccount, so its RBAC is the chart's. The tests run in file order on one release.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from .kube_helpers import Cluster, assert_true, client, wait_for, wait_timeout
from .operator_process import ROOT, OperatorProcess, helm, run_cleanup_hook, sa_kubeconfig

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "gpu-operator"
NS = "test-operator"
"""TEST_NAMESPACE of NVIDIA's tests/scripts/.definitions.sh."""
POLICY = "clusterpolicy/cluster-policy"
OPERATOR_IMAGE = "nvcr.io/nvidia/gpu-operator"
OPERATOR_VERSION = "v26.7.0"
TARGET_DRIVER_VERSION = "580.178.04"
"""The defaults of .definitions.sh."""
OPERATOR_REPOSITORY = posixpath.dirname(OPERATOR_IMAGE)
INSTALL_FLAGS = [
    # install-operator.sh, the --set flags approach (no VALUES_FILE), as it builds OPERATOR_OPTIONS.
    *("--set", f"operator.repository={OPERATOR_REPOSITORY}"),
    *("--set", f"validator.repository={OPERATOR_REPOSITORY}"),
    *("--set", f"operator.version={OPERATOR_VERSION}"),
    *("--set", f"validator.version={OPERATOR_VERSION}"),
]
OPERANDS = [
    # verify-operator.sh, in its order.
    "nvidia-driver-daemonset",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-operator-validator",
]
PLUGIN_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
"""tests/plugin-config.yaml of NVIDIA/gpu-operator v26.7.0."""
CONVERGE = wait_timeout(120.0)
UPGRADE = wait_timeout(180.0, node_starts=4)


@dataclass
class Release:
    name: str
    operator: OperatorProcess
    kubeconfig: Path
    log: Path

    def restart(self) -> None:
        """Kill the operator (SIGKILL, as the script's `crictl rm --force`) and start it again."""
        self.operator.kill()
        self.operator = operator_process(self.name, self.kubeconfig, self.log).start()


def operator_process(release: str, kubeconfig: Path, log: Path) -> OperatorProcess:
    """The operator as the chart's Deployment runs it: its Lease named after the release (the Role
    allows just that name)."""
    return OperatorProcess(kubeconfig, NS, log, args=(f"--lease-name={release}",))


@pytest.fixture(scope="module")
def release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """install-operator.sh: the namespace, then `helm install <chart> --generate-name` with its flags."""
    cluster.kubectl("create", "namespace", NS)
    name = ""
    started: Release | None = None
    try:
        out = helm(
            cluster,
            "install",
            str(CHART),
            "--generate-name",
            *("-n", NS),
            *INSTALL_FLAGS,
            *("--set", "operator.replicas=0"),
            "--wait",
            *("--timeout", "2m"),
            *("-o", "json"),
        )
        name = json.loads(out)["name"]
        folder = tmp_path_factory.mktemp("nvidia-flows")
        kubeconfig = sa_kubeconfig(cluster, NS, name, folder / "kubeconfig")
        log = folder / "operator.log"
        started = Release(name, operator_process(name, kubeconfig, log).start(), kubeconfig, log)
        yield started
    finally:
        if started is not None:
            started.operator.stop()
            print(started.operator.log()[-6000:])
        if name and name in helm(cluster, "list", "-n", NS, "--short"):
            helm(cluster, "uninstall", name, "-n", NS, "--wait")
        # The flows' own NVIDIADrivers (cluster-scoped: neither the release nor the namespace has them).
        cluster.kubectl("delete", "nvidiadrivers", "--all", "--ignore-not-found")
        cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")


# --- checks.sh, for every GPU node -------------------------------------------------------------


def patch(cluster: Cluster, *ops: dict[str, Any]) -> None:
    """`kubectl patch clusterpolicy/cluster-policy --type=json`: fails the test as the script fails."""
    cluster.kubectl("patch", POLICY, "--type=json", "-p", json.dumps(list(ops)))


def pods(cluster: Cluster, app: str, selector: str = "") -> list[Any]:
    """The pods labelled app=`app` (or those `selector` selects)."""
    core: Any = client.CoreV1Api(cluster.api)
    found: list[Any] = core.list_namespaced_pod(NS, label_selector=selector or f"app={app}").items
    return found


def gpu_nodes(cluster: Cluster) -> list[Any]:
    core: Any = client.CoreV1Api(cluster.api)
    found: list[Any] = core.list_node(label_selector="nvidia.com/gpu.present=true").items
    return found


def check_pod_ready(cluster: Cluster, app: str, timeout: float = CONVERGE, selector: str = "") -> None:
    """Every pod of `app` (or of `selector`) Ready and none terminating, one on each GPU node."""

    def check() -> None:
        found = pods(cluster, app, selector)
        want = len(gpu_nodes(cluster))
        assert len(found) == want, f"{len(found)} {app} pods for {want} GPU nodes"
        for pod in found:
            assert pod.metadata.deletion_timestamp is None, f"{pod.metadata.name} is terminating"
            ready = {c.type: c.status for c in pod.status.conditions or []}.get("Ready")
            assert ready == "True", f"{pod.metadata.name} not ready"

    wait_for(check, timeout=timeout, what=f"{app} pods ready")


def check_pod_deleted(cluster: Cluster, app: str) -> None:
    def check() -> None:
        assert not pods(cluster, app), f"{app} pods still there"

    wait_for(check, timeout=CONVERGE, what=f"{app} pods deleted")


def check_no_restarts(cluster: Cluster, app: str) -> None:
    for pod in pods(cluster, app):
        restarts = pod.status.container_statuses[0].restart_count
        assert restarts <= 1, f"{pod.metadata.name} restarted {restarts} times"


def wait_for_driver_upgrade_done(cluster: Cluster) -> None:
    def check() -> None:
        states = {
            n.metadata.name: (n.metadata.labels or {}).get("nvidia.com/gpu-driver-upgrade-state")
            for n in gpu_nodes(cluster)
        }
        assert states and all(s == "upgrade-done" for s in states.values()), states

    wait_for(check, timeout=UPGRADE, what="upgrade-done on every GPU node")


def daemonset(cluster: Cluster, app: str) -> Any:
    apps: Any = client.AppsV1Api(cluster.api)
    items = apps.list_namespaced_daemon_set(NS, label_selector=f"app={app}").items
    assert items, f"no DaemonSet app={app}"
    return items[0]


def container_env(cluster: Cluster, app: str) -> dict[str, str]:
    containers = daemonset(cluster, app).spec.template.spec.containers
    return {e.name: e.value for c in containers for e in c.env or []}


def verify_operator(cluster: Cluster) -> None:
    for app in OPERANDS:
        check_pod_ready(cluster, app)


# --- the flows, in end-to-end.sh's order ------------------------------------------------------------


def test_install_verify_and_no_restarts(cluster: Cluster, release: Release) -> None:
    """install-operator.sh, verify-operator.sh, verify-operand-restarts.sh."""
    verify_operator(cluster)
    for app in [*OPERANDS[:3], "gpu-feature-discovery"]:
        check_no_restarts(cluster, app)
    release.operator.assert_clean_log()


def test_image_updates(cluster: Cluster, release: Release) -> None:
    """update-clusterpolicy.sh test_image_updates: a new driver version, then the driver pods deleted
    by hand (OnDelete), and every node upgrade-done."""
    patch(cluster, {"op": "replace", "path": "/spec/driver/version", "value": TARGET_DRIVER_VERSION})

    def updated() -> None:
        image = daemonset(cluster, "nvidia-driver-daemonset").spec.template.spec.containers[0].image
        assert TARGET_DRIVER_VERSION in image, image

    wait_for(updated, timeout=CONVERGE, what="the driver DaemonSet's new image")
    cluster.kubectl("delete", "pod", "-l", "app=nvidia-driver-daemonset", "-n", NS)
    wait_for_driver_upgrade_done(cluster)
    check_pod_ready(cluster, "nvidia-driver-daemonset", UPGRADE)


def test_env_updates(cluster: Cluster, release: Release) -> None:
    """test_env_updates: `add /spec/devicePlugin/env []`, then `add .../env/0`."""
    patch(cluster, {"op": "add", "path": "/spec/devicePlugin/env", "value": []})
    patch(
        cluster,
        {
            "op": "add",
            "path": "/spec/devicePlugin/env/0",
            "value": {"name": "MY_TEST_ENV_NAME", "value": "test"},
        },
    )

    def updated() -> None:
        env = container_env(cluster, "nvidia-device-plugin-daemonset")
        assert env.get("MY_TEST_ENV_NAME") == "test", env

    wait_for(updated, timeout=CONVERGE, what="the device plugin's new env")
    check_pod_ready(cluster, "nvidia-device-plugin-daemonset")


def test_mig_strategy_updates(cluster: Cluster, release: Release) -> None:
    patch(cluster, {"op": "replace", "path": "/spec/mig/strategy", "value": "mixed"})

    def updated() -> None:
        for app in ("gpu-feature-discovery", "nvidia-device-plugin-daemonset"):
            assert container_env(cluster, app).get("MIG_STRATEGY") == "mixed", app

    wait_for(updated, timeout=CONVERGE, what="MIG_STRATEGY=mixed in GFD and the device plugin")


def test_enable_dcgm(cluster: Cluster, release: Release) -> None:
    """test_enable_dcgm: the standalone DCGM and its Service with internalTrafficPolicy Local."""
    patch(cluster, {"op": "replace", "path": "/spec/dcgm/enabled", "value": True})
    check_pod_ready(cluster, "nvidia-dcgm")
    check_pod_ready(cluster, "nvidia-dcgm-exporter")
    core: Any = client.CoreV1Api(cluster.api)
    assert core.read_namespaced_service("nvidia-dcgm", NS).spec.internal_traffic_policy == "Local"


def test_gpu_sharing(cluster: Cluster, release: Release) -> None:
    """test_gpu_sharing: NVIDIA's time-slicing config, then its plugin-test Deployment (5 pods running
    vectorAdd on shared GPUs), and GFD's labels for 10 replicas."""
    cluster.kubectl(
        "create",
        "configmap",
        "plugin-config",
        "-n",
        NS,
        "--from-file=plugin-config.yaml=/dev/stdin",
        input=PLUGIN_CONFIG,
    )
    patch(
        cluster,
        {
            "op": "add",
            "path": "/spec/devicePlugin/config",
            "value": {"name": "plugin-config", "default": "plugin-config.yaml"},
        },
    )
    check_pod_ready(cluster, "nvidia-device-plugin-daemonset")
    check_pod_ready(cluster, "gpu-feature-discovery")

    def shared() -> str:
        node = gpu_nodes(cluster)[0]
        labels = node.metadata.labels
        assert labels.get("nvidia.com/gpu.replicas") == "10", labels.get("nvidia.com/gpu.replicas")
        product: str = labels["nvidia.com/gpu.product"]
        assert product.endswith("-SHARED"), product
        return product

    product = wait_for(shared, timeout=CONVERGE, what="GFD's time-slicing labels")
    validator = json.loads(cluster.kubectl("get", POLICY, "-o", "json"))["spec"]["validator"]
    image = f"{validator['repository']}/{validator['image']}:{validator['version']}"
    test_pods = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nvidia-plugin-test", "labels": {"app": "nvidia-plugin-test"}},
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": {"app": "nvidia-plugin-test"}},
            "template": {
                "metadata": {"labels": {"app": "nvidia-plugin-test"}},
                "spec": {
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "serviceAccountName": "nvidia-device-plugin",
                    "containers": [
                        {
                            "name": "nvidia-plugin-test-ctr",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c"],
                            "args": ["while true;  do vectorAdd; sleep 30; done"],
                            "securityContext": {"allowPrivilegeEscalation": False},
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                },
            },
        },
    }
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(test_pods))
    try:
        cluster.kubectl(
            "wait",
            "--for=condition=available",
            f"--timeout={int(CONVERGE)}s",
            "deployment/nvidia-plugin-test",
            "-n",
            NS,
        )
    finally:
        cluster.kubectl("delete", "deployment", "nvidia-plugin-test", "-n", NS, "--ignore-not-found")


def test_disable_enable_gfd(cluster: Cluster, release: Release) -> None:
    patch(cluster, {"op": "replace", "path": "/spec/gfd/enabled", "value": False})
    check_pod_deleted(cluster, "gpu-feature-discovery")
    patch(cluster, {"op": "replace", "path": "/spec/gfd/enabled", "value": True})
    check_pod_ready(cluster, "gpu-feature-discovery")


def test_disable_enable_dcgm_exporter(cluster: Cluster, release: Release) -> None:
    patch(cluster, {"op": "replace", "path": "/spec/dcgmExporter/enabled", "value": False})
    check_pod_deleted(cluster, "nvidia-dcgm-exporter")
    patch(cluster, {"op": "replace", "path": "/spec/dcgmExporter/enabled", "value": True})
    check_pod_ready(cluster, "nvidia-dcgm-exporter")


def test_custom_labels_override(cluster: Cluster, release: Release) -> None:
    """test_custom_labels_override: `add /spec/daemonsets/labels`, a rollout of every operand."""
    labels = {"cloudprovider": "aws", "platform": "kubernetes"}
    patch(cluster, {"op": "add", "path": "/spec/daemonsets/labels", "value": labels})
    wait_for_driver_upgrade_done(cluster)

    def labelled() -> None:
        for app in OPERANDS:
            for pod in pods(cluster, app):
                have = pod.metadata.labels or {}
                assert {k: have.get(k) for k in labels} == labels, f"{pod.metadata.name}: {have}"

    wait_for(labelled, timeout=UPGRADE, what="the custom labels on every operand pod")
    for app in OPERANDS:
        check_pod_ready(cluster, app, UPGRADE)


def test_restart_operator(cluster: Cluster, release: Release) -> None:
    """checks.sh test_restart_operator: the operator killed, back and running; nothing of the stack
    restarts because of it."""
    before = {app: {p.metadata.uid for p in pods(cluster, app)} for app in OPERANDS}
    release.restart()
    verify_operator(cluster)
    after = {app: {p.metadata.uid for p in pods(cluster, app)} for app in OPERANDS}
    assert after == before, "the operator's restart replaced operand pods"


def test_disable_and_enable_operands(cluster: Cluster, release: Release) -> None:
    """disable-operands.sh, verify-disable-operands.sh, enable-operands.sh, verify-operator.sh."""
    try:
        cluster.kubectl("label", "nodes", "--all", "nvidia.com/gpu.deploy.operands=false", "--overwrite")
        for app in OPERANDS:
            check_pod_deleted(cluster, app)
        cluster.kubectl("label", "nodes", "--all", "nvidia.com/gpu.deploy.operands=true", "--overwrite")
        verify_operator(cluster)
    finally:
        # The person's label, not the operator's: the later tests start without it.
        cluster.kubectl("label", "nodes", "--all", "nvidia.com/gpu.deploy.operands-")


# --- migrate-clusterpolicy-to-nvidiadriver.sh and update-nvidiadriver.sh ----------------------------

OWNER = "nvidia.com/gpu-operator.driver.owner"
DRIVER_PODS = "app.kubernetes.io/component=nvidia-driver"
NVIDIADRIVERS = ("nvidia.com", "v1alpha1", "nvidiadrivers")
E2E_DRIVER, E2E_DEFAULT, E2E_DUPLICATE = "e2e-driver", "e2e-default-driver", "e2e-duplicate-default-driver"
"""update-nvidiadriver.sh's NVIDIA_DRIVER_NAME, DEFAULT_NVIDIA_DRIVER_NAME and
DUPLICATE_DEFAULT_NVIDIA_DRIVER_NAME."""


def nvidiadrivers(cluster: Cluster) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.CustomObjectsApi(cluster.api).list_cluster_custom_object(
        *NVIDIADRIVERS
    )["items"]
    return found


def defaults(cluster: Cluster) -> list[str]:
    return [d["metadata"]["name"] for d in nvidiadrivers(cluster) if d["spec"].get("default") is True]


def wait_for_owner(cluster: Cluster, name: str) -> None:
    """wait_for_nvidiadriver_owner(_labels): every GPU node labelled as `name`'s."""

    def check() -> None:
        owners = {n.metadata.name: (n.metadata.labels or {}).get(OWNER) for n in gpu_nodes(cluster)}
        assert owners and all(o == name for o in owners.values()), owners

    wait_for(check, timeout=UPGRADE, what=f"every GPU node owned by NVIDIADriver {name}")


def driver_daemonsets(cluster: Cluster, name: str) -> list[Any]:
    """get_nvidiadriver_daemonsets: the driver DaemonSets whose pods select `name`'s nodes."""
    apps: Any = client.AppsV1Api(cluster.api)
    items = apps.list_namespaced_daemon_set(NS, label_selector=DRIVER_PODS).items
    return [d for d in items if (d.spec.template.spec.node_selector or {}).get(OWNER) == name]


def wait_for_driver_daemonsets(cluster: Cluster, name: str) -> None:
    wait_for(
        lambda: assert_true(driver_daemonsets(cluster, name)), timeout=CONVERGE, what=f"{name}'s DaemonSets"
    )


def check_driver_pods_ready(cluster: Cluster) -> None:
    """check_nvidia_driver_pods_ready, for every GPU node: one Ready driver pod each, none terminating."""
    check_pod_ready(cluster, "driver", UPGRADE, DRIVER_PODS)


def driver_message(cluster: Cluster, name: str, text: str) -> None:
    """wait_for_nvidiadriver_condition_message: notReady, a condition's message containing `text`."""

    def check() -> None:
        found = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(*NVIDIADRIVERS, name)
        status = found.get("status") or {}
        said = [c.get("message", "") for c in status.get("conditions", [])]
        assert status.get("state") == "notReady" and any(text in m for m in said), status

    wait_for(check, timeout=CONVERGE, what=f"NVIDIADriver {name}: {text}")


def driver_ready(cluster: Cluster, name: str) -> None:
    """wait_for_nvidiadriver_ready: ready, Ready=True and no Error=True."""

    def check() -> None:
        found = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(*NVIDIADRIVERS, name)
        status = found.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        assert status.get("state") == "ready" and conditions.get("Ready") == "True", status
        assert conditions.get("Error") != "True", status

    wait_for(check, timeout=CONVERGE, what=f"NVIDIADriver {name} ready")


def copy_driver(cluster: Cluster, source: str, target: str, default: bool) -> None:
    """create_nvidiadriver_from: `source`'s spec with `default` set, applied as `target`."""
    found = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(*NVIDIADRIVERS, source)
    body = {
        "apiVersion": found["apiVersion"],
        "kind": found["kind"],
        "metadata": {"name": target},
        "spec": {**found["spec"], "default": default},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))


def set_default(cluster: Cluster, name: str, default: bool) -> None:
    body = json.dumps({"spec": {"default": default}})
    cluster.kubectl("patch", f"nvidiadriver/{name}", "--type=merge", "-p", body)


def test_migrate_clusterpolicy_to_nvidiadriver(cluster: Cluster, release: Release) -> None:
    """migrate-clusterpolicy-to-nvidiadriver.sh: `helm upgrade --reuse-values` with the NVIDIADriver CRD
    enabled and the default NVIDIADriver deployed; the ClusterPolicy's driver DaemonSet goes, the
    legacy driver pod is orphaned or gone and then deleted, every GPU node is owned by `default`, its
    DaemonSet selects them, the upgrade is done on every node and the driver pods are ready."""
    legacy = pods(cluster, "nvidia-driver-daemonset")
    assert legacy, "legacy ClusterPolicy driver pod not found"
    legacy_pod = legacy[0].metadata.name
    assert release.name in helm(cluster, "list", "-n", NS, "--short")
    helm(
        cluster,
        "upgrade",
        release.name,
        str(CHART),
        *("-n", NS),
        "--reuse-values",
        *INSTALL_FLAGS,
        *("--set", "operator.defaultRuntime=docker"),
        *("--set", "driver.nvidiaDriverCRD.enabled=true"),
        *("--set", "driver.nvidiaDriverCRD.deployDefaultCR=true"),
        "--wait",
    )
    apps: Any = client.AppsV1Api(cluster.api)
    core: Any = client.CoreV1Api(cluster.api)

    def legacy_daemonset_deleted() -> None:
        left = apps.list_namespaced_daemon_set(NS, label_selector="app=nvidia-driver-daemonset").items
        assert not left, [d.metadata.name for d in left]

    wait_for(legacy_daemonset_deleted, timeout=UPGRADE, what="the ClusterPolicy's driver DaemonSet deleted")

    def legacy_pod_orphaned() -> None:
        # The script reads `.metadata.ownerReferences | length` of `kubectl get pod`: 0 also when the pod
        # is gone (jq reads nothing).
        try:
            pod = core.read_namespaced_pod(legacy_pod, NS)
        except ApiException as exc:
            assert exc.status == 404, exc
            return
        assert not pod.metadata.owner_references, pod.metadata.owner_references

    wait_for(legacy_pod_orphaned, timeout=UPGRADE, what=f"legacy driver pod {legacy_pod} orphaned")
    wait_for(
        lambda: assert_true(defaults(cluster) == ["default"]),
        timeout=CONVERGE,
        what="the default NVIDIADriver",
    )
    wait_for_owner(cluster, "default")
    wait_for_driver_daemonsets(cluster, "default")

    def legacy_pod_deleted() -> None:
        names = [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=DRIVER_PODS).items]
        assert legacy_pod not in names, names

    wait_for(legacy_pod_deleted, timeout=UPGRADE, what=f"legacy driver pod {legacy_pod} deleted")
    wait_for_driver_upgrade_done(cluster)
    check_driver_pods_ready(cluster)


def test_arbitrary_name_default_nvidiadriver(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh test_arbitrary_name_default_nvidiadriver: the default moves from the
    chart's `default` to a copy under another name, and `default` is deleted."""
    current = defaults(cluster)[0]
    set_default(cluster, current, False)
    copy_driver(cluster, current, E2E_DEFAULT, True)
    cluster.kubectl("delete", f"nvidiadriver/{current}")
    wait_for(lambda: assert_true(defaults(cluster) == [E2E_DEFAULT]), timeout=CONVERGE, what="one default")
    wait_for_owner(cluster, E2E_DEFAULT)
    wait_for_driver_daemonsets(cluster, E2E_DEFAULT)


def test_user_nvidiadriver_takes_the_nodes(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh create_nvidiadriver: a copy of the default that is not the default (no
    nodeSelector: every GPU node) takes every node from it."""
    copy_driver(cluster, defaults(cluster)[0], E2E_DRIVER, False)
    wait_for_owner(cluster, E2E_DRIVER)
    wait_for_driver_daemonsets(cluster, E2E_DRIVER)
    check_driver_pods_ready(cluster)


def test_nvidiadriver_image_updates(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh test_driver_image_updates: a JSON patch of the version reaches its
    DaemonSets, the driver pods are deleted by hand (OnDelete), the upgrade is done."""
    ops = [{"op": "replace", "path": "/spec/version", "value": TARGET_DRIVER_VERSION}]
    cluster.kubectl("patch", f"nvidiadriver/{E2E_DRIVER}", "--type=json", "-p", json.dumps(ops))

    def updated() -> None:
        found = driver_daemonsets(cluster, E2E_DRIVER)
        images = [d.spec.template.spec.containers[0].image for d in found]
        assert images and all(TARGET_DRIVER_VERSION in i for i in images), images

    wait_for(updated, timeout=CONVERGE, what="the driver DaemonSets at the target version")
    cluster.kubectl("delete", "pod", "-l", DRIVER_PODS, "-n", NS)
    wait_for_driver_upgrade_done(cluster)
    check_driver_pods_ready(cluster)


def test_nvidiadriver_custom_labels_override(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh test_custom_labels_override: labels on the NVIDIADriver reach its pods
    once they are deleted by hand."""
    labels = {"cloudprovider": "aws", "platform": "kubernetes"}
    ops = [{"op": "add", "path": "/spec/labels", "value": labels}]
    cluster.kubectl("patch", f"nvidiadriver/{E2E_DRIVER}", "--type=json", "-p", json.dumps(ops))

    def templated() -> None:
        found = driver_daemonsets(cluster, E2E_DRIVER)
        have = [d.spec.template.metadata.labels or {} for d in found]
        assert have and all({k: h.get(k) for k in labels} == labels for h in have), have

    wait_for(templated, timeout=CONVERGE, what="the labels in the driver pod template")
    cluster.kubectl("delete", "pod", "-l", DRIVER_PODS, "-n", NS)
    wait_for_driver_upgrade_done(cluster)
    check_driver_pods_ready(cluster)
    core: Any = client.CoreV1Api(cluster.api)
    selector = f"{DRIVER_PODS},cloudprovider=aws,platform=kubernetes"
    assert len(core.list_namespaced_pod(NS, label_selector=selector).items) == len(gpu_nodes(cluster))


def owner_count(cluster: Cluster, name: str) -> None:
    """assert_nvidiadriver_owner_count: every GPU node still owned by `name`."""
    owners = {n.metadata.name: (n.metadata.labels or {}).get(OWNER) for n in gpu_nodes(cluster)}
    assert all(o == name for o in owners.values()), owners


def test_removed_default_field_conflict_preserves_owners(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh: the default's `default` cleared makes two NVIDIADrivers that select every
    node; both report it, and no node changes owner."""
    set_default(cluster, E2E_DEFAULT, False)
    for name in (E2E_DRIVER, E2E_DEFAULT):
        driver_message(cluster, name, "multiple NVIDIADrivers match the same node")
    owner_count(cluster, E2E_DRIVER)
    set_default(cluster, E2E_DEFAULT, True)
    wait_for(lambda: assert_true(defaults(cluster) == [E2E_DEFAULT]), timeout=CONVERGE, what="one default")
    wait_for_owner(cluster, E2E_DRIVER)


def test_multiple_default_drivers_are_not_ready(cluster: Cluster, release: Release) -> None:
    """update-nvidiadriver.sh: a second default; both report it, no node changes owner; once it is
    deleted the default is ready again."""
    copy_driver(cluster, E2E_DEFAULT, E2E_DUPLICATE, True)
    for name in (E2E_DEFAULT, E2E_DUPLICATE):
        driver_message(cluster, name, "multiple default NVIDIADrivers found")
    owner_count(cluster, E2E_DRIVER)
    cluster.kubectl("delete", f"nvidiadriver/{E2E_DUPLICATE}")
    wait_for(lambda: assert_true(defaults(cluster) == [E2E_DEFAULT]), timeout=CONVERGE, what="one default")
    driver_ready(cluster, E2E_DEFAULT)
    wait_for_owner(cluster, E2E_DRIVER)


def test_uninstall(cluster: Cluster, release: Release) -> None:
    """uninstall-operator.sh: `helm uninstall`, then the namespace; no operand and no label of the
    operator's or its operands' is left (the chart's pre-delete hook runs `gpu-operator cleanup`)."""
    run_cleanup_hook(cluster, "cluster-policy")
    # `helm uninstall` deletes the operator's Deployment with its RBAC: its pods stop there.
    release.operator.stop()
    release.operator.assert_clean_log()
    helm(cluster, "uninstall", "-n", NS, release.name)
    cluster.kubectl("delete", "namespace", NS)
    for app in OPERANDS:
        assert not pods(cluster, app)
    left = {
        n.metadata.name: sorted(
            k for k in n.metadata.labels or {} if k.startswith("nvidia.com/gpu.deploy.") or k == OWNER
        )
        for n in gpu_nodes(cluster)
    }
    assert not any(left.values()), f"deploy and owner labels left behind: {left}"
