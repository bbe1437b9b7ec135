"""The Helm chart end to end: install, converge, upgrade, CRD upgrade, uninstall.

The chart is installed with `operator.replicas=0` (its ServiceAccount, RBAC, CRD and ClusterPolicy,
no in-cluster Deployment: kwok runs no containers) and the operator runs as a local process logged
in as the chart's ServiceAccount, so every call it makes is checked against the chart's RBAC. The
tests run in file order on one release; each leaves the release in a converged state for the next.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from gpu_operator.core.components import BY_LABEL
from gpu_operator.core.node_labels import left_on_uninstall, node_info

from .kube_helpers import Cluster, client, wait_for, wait_timeout
from .operator_process import ROOT, OperatorProcess, helm, run_cleanup_hook, sa_kubeconfig

pytestmark = pytest.mark.e2e

NS = "gpu-operator"
RELEASE = "gpu-operator"
POLICY = "cluster-policy"
CHART = ROOT / "charts" / "gpu-operator"
CRD_NAME = "clusterpolicies.nvidia.com"
GROUP, VERSION, PLURAL = "nvidia.com", "v1", "clusterpolicies"
MANAGED = "app.kubernetes.io/managed-by=gpu-operator"
COMPONENT = "app.kubernetes.io/component"
CONVERGE = wait_timeout(120.0)
"""Seconds a policy may take to converge: 120 under the instant profile, plus one operand start."""


def test_chart_passes_a_server_side_dry_run(cluster: Cluster) -> None:
    """Every object the chart renders (hooks included) is accepted by the real API server."""
    rendered = helm(
        cluster, "template", RELEASE, str(CHART), "--namespace", "default", "--kube-version", "1.36.0"
    )
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)


def release_args(chart: Path = CHART) -> list[str]:
    return [RELEASE, str(chart), "--namespace", NS, "--wait", "--timeout", "2m"]


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The release (no in-cluster operator) and the operator running locally as its ServiceAccount."""
    installed = False
    process: OperatorProcess | None = None
    try:
        helm(cluster, "install", *release_args(), "--create-namespace", "--set", "operator.replicas=0")
        installed = True
        folder = tmp_path_factory.mktemp("helm-operator")
        kubeconfig = sa_kubeconfig(cluster, NS, RELEASE, folder / "kubeconfig")
        process = OperatorProcess(kubeconfig, NS, folder / "operator.log").start()
        yield process
    finally:
        if process is not None:
            process.stop()
            print(process.log()[-6000:])
        if installed and RELEASE in helm(cluster, "list", "--namespace", NS, "--short"):
            helm(cluster, "uninstall", RELEASE, "--namespace", NS, "--wait")


# --- helpers -------------------------------------------------------------------------------------


def get_policy(cluster: Cluster) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(cluster.api)
    result: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, POLICY)
    return result


def wait_ready(cluster: Cluster, generation: int | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        policy = get_policy(cluster)
        status = policy.get("status", {})
        if generation is not None:
            assert policy["metadata"]["generation"] == generation, "the upgrade did not change the spec"
        assert status.get("state") == "ready", json.dumps(status, indent=1)[:3000]
        assert status.get("observedGeneration") == policy["metadata"]["generation"], "status is stale"
        return policy

    return wait_for(check, timeout=CONVERGE, what=f"ClusterPolicy {POLICY} ready")


def daemonsets(cluster: Cluster) -> dict[str, Any]:
    apps: Any = client.AppsV1Api(cluster.api)
    items = apps.list_namespaced_daemon_set(NS, label_selector=MANAGED).items
    return {BY_LABEL[ds.metadata.labels[COMPONENT]].name: ds for ds in items}


def container_env(ds: Any) -> dict[str, str]:
    return {e.name: e.value for e in ds.spec.template.spec.containers[0].env or []}


def crd(cluster: Cluster) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json"))
    return body


def chart_crd() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((CHART / "crds" / "clusterpolicy.yaml").read_text())
    return body


def leftovers(cluster: Cluster) -> list[str]:
    """Objects the operator created and node labels it set that still exist."""
    core: Any = client.CoreV1Api(cluster.api)
    rbac: Any = client.RbacAuthorizationV1Api(cluster.api)
    found: list[str] = []
    namespaced = [
        ("DaemonSet", client.AppsV1Api(cluster.api).list_namespaced_daemon_set),
        ("ConfigMap", core.list_namespaced_config_map),
        ("Service", core.list_namespaced_service),
        ("ServiceAccount", core.list_namespaced_service_account),
        ("Pod", core.list_namespaced_pod),
        ("Role", rbac.list_namespaced_role),
        ("RoleBinding", rbac.list_namespaced_role_binding),
    ]
    for kind, list_namespaced in namespaced:
        found += [f"{kind} {o.metadata.name}" for o in list_namespaced(NS, label_selector=MANAGED).items]
    cluster_wide = [
        ("ClusterRole", rbac.list_cluster_role),
        ("ClusterRoleBinding", rbac.list_cluster_role_binding),
        ("RuntimeClass", client.NodeV1Api(cluster.api).list_runtime_class),
    ]
    for kind, list_all in cluster_wide:
        found += [f"{kind} {o.metadata.name}" for o in list_all(label_selector=MANAGED).items]
    for node in core.list_node().items:
        # What the operator set, and what its operands' managers wrote on its behalf (the driver
        # manager's "" marks for the components nobody runs, k8s-driver-manager v0.12.0); a person's
        # labels stay.
        labels = left_on_uninstall(node_info(core.api_client.sanitize_for_serialization(node)))
        if labels:
            found.append(f"node {node.metadata.name} labels {sorted(labels)}")
    return found


# --- the tests, in order -------------------------------------------------------------------------


def rendered_spec(cluster: Cluster) -> dict[str, Any]:
    """The ClusterPolicy spec the chart renders with the fixture's values (`helm template`)."""
    rendered = helm(cluster, "template", RELEASE, str(CHART), "-n", NS, "--set", "operator.replicas=0")
    policy = next(d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "ClusterPolicy")
    spec: dict[str, Any] = policy["spec"]
    return spec


def missing_from(stored: Any, written: Any, at: str = "spec") -> list[str]:
    """The paths of `written` that `stored` does not hold as written (what the API server adds, the
    CRD's defaults, is not missing)."""
    if isinstance(written, dict) and isinstance(stored, dict):
        return [p for k, v in written.items() for p in missing_from(stored.get(k), v, f"{at}.{k}")]
    return [] if stored == written else [f"{at}: {written!r} stored as {stored!r}"]


def test_sample_policy_converges(cluster: Cluster, operator: OperatorProcess) -> None:
    policy = wait_ready(cluster)
    assert not missing_from(policy["spec"], rendered_spec(cluster)), (
        "the chart's ClusterPolicy is kept as written"
    )
    assert set(daemonsets(cluster)) >= {"driver", "container-toolkit", "device-plugin", "operator-validator"}
    operator.assert_clean_log()


def test_upgrade_changes_only_the_device_plugin(cluster: Cluster, operator: OperatorProcess) -> None:
    before = {name: ds.metadata.generation for name, ds in daemonsets(cluster).items()}
    old = get_policy(cluster)
    generation = old["metadata"]["generation"]
    env = [{"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}]
    helm(
        cluster,
        "upgrade",
        *release_args(),
        "--reuse-values",
        "--set-json",
        f"devicePlugin.env={json.dumps(env)}",
    )
    policy = wait_ready(cluster, generation=generation + 1)
    assert policy["spec"]["devicePlugin"].pop("env") == env
    assert policy["spec"] == old["spec"], "the upgrade changed only the device plugin's env"

    def rolled() -> dict[str, Any]:
        found = daemonsets(cluster)
        assert container_env(found["device-plugin"]).get("DEVICE_LIST_STRATEGY") == "envvar"
        return found

    after = wait_for(rolled, timeout=CONVERGE, what="device plugin DaemonSet updated")
    assert after["device-plugin"].metadata.generation > before["device-plugin"]
    unchanged = {name: ds.metadata.generation for name, ds in after.items() if name != "device-plugin"}
    assert unchanged == {name: gen for name, gen in before.items() if name != "device-plugin"}
    operator.assert_clean_log()


def test_upgrade_brings_the_new_crd(cluster: Cluster, operator: OperatorProcess, tmp_path: Path) -> None:
    """Helm never upgrades CRDs; the operator server-side applies its own when it starts.

    The cluster gets an older CRD (another description, another hash annotation: what an older release
    left behind); then the release is upgraded and the operator restarted, as a new image would be.
    """
    from gpu_operator.runtime.reconciler import CRD_HASH_ANNOTATION

    new = chart_crd()
    old = copy.deepcopy(new)
    old["metadata"].setdefault("annotations", {})[CRD_HASH_ANNOTATION] = "older-release"
    schema = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["description"] = "ClusterPolicy (an older release's CRD)"
    operator.stop()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(old))
    assert (
        crd(cluster)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
        == schema["description"]
    )

    chart = tmp_path / "gpu-operator"
    shutil.copytree(CHART, chart)
    helm(cluster, "upgrade", *release_args(chart), "--reuse-values")
    operator.start()

    def current() -> None:
        found = crd(cluster)["spec"]["versions"]
        assert [v["schema"] for v in found] == [v["schema"] for v in new["spec"]["versions"]], "CRD still old"

    wait_for(current, timeout=60, what="the operator applied the new CRD")
    wait_ready(cluster)
    operator.assert_clean_log()


def test_uninstall_leaves_nothing_behind(cluster: Cluster, operator: OperatorProcess) -> None:
    """Helm deletes the operator's RBAC before the ClusterPolicy; the chart's pre-delete hook
    (`gpu-operator cleanup`) deletes the policy first and waits for the operator to remove its labels."""
    assert leftovers(cluster), "the release should have created operands before this test"
    run_cleanup_hook(cluster, POLICY)
    helm(cluster, "uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "2m")

    def policy_gone() -> None:
        try:
            get_policy(cluster)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        raise AssertionError(f"ClusterPolicy {POLICY} still there")

    wait_for(policy_gone, timeout=60, what="ClusterPolicy deleted")

    def nothing_left() -> None:
        left = leftovers(cluster)
        assert not left, f"left behind: {left}"

    wait_for(nothing_left, timeout=CONVERGE, what="operands and node labels removed")
