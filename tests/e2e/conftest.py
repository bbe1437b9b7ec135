"""End-to-end fixtures: one cluster per session, a fresh namespace per test.

The cluster is the one in ``$KUBECONFIG`` when that is set (kind, a real cluster); otherwise the
local kwok cluster, started with ``make cluster-up`` and stopped with ``make cluster-down`` at
the end, unless it was already up before the session or ``GPU_OPERATOR_KEEP_CLUSTER=1``.
The ClusterPolicy CRD (``crds/clusterpolicy.yaml``) is applied when the file exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from gpu_operator.runtime.sync_client import SyncKube

from .kube_helpers import (
    Cluster,
    clear_all_failures,
    client,
    emulator_profile,
    failure_injection_supported,
    wait_for,
)
from .operator_process import OperatorProcess, chart_operator
from .test_operator import CONVERGE, NS, SEED_CONFIG_MAPS, assert_cleaned_up, delete_policies

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "clusterpolicy.yaml"
E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e carries the ``e2e`` marker (select with -m e2e / -m 'not e2e')."""
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], text=True, check=False)


def _make_output(*args: str) -> str:
    out = subprocess.run(
        ["make", "--no-print-directory", "-s", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _kubectl_path() -> str:
    """The pinned kubectl from `make tools`; a kubectl on PATH for clusters without it."""
    bin_dir = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "bin-dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    built = Path(bin_dir) / "kubectl"
    if bin_dir and built.is_file():
        return str(built)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("no kubectl: run `make tools` or put kubectl on PATH")
    return found


def install_crds(cluster: Cluster, path: Path) -> None:
    """Server-side apply the CRDs in ``path`` and wait until the API server serves them."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    names = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") == "CustomResourceDefinition"
    ]
    ext = client.ApiextensionsV1Api(cluster.api)

    def established() -> None:
        for name in names:
            crd: Any = ext.read_custom_resource_definition(name)
            conditions = {c.type: c.status for c in (crd.status.conditions if crd.status else None) or []}
            assert conditions.get("Established") == "True", f"CRD {name}: {conditions}"

    # Not `kubectl wait`: it fails instead of waiting while a new CRD has no conditions yet.
    wait_for(established, timeout=60, what=f"CRDs {names} established")


def check_emulator_profile(settings_file: Path) -> None:
    """The emulators run with the profile the tests scale their timeouts by (kube_helpers.wait_timeout).

    hack/cluster.sh restarts a kept cluster's emulators when SIM_PROFILE/SIM_TIME_SCALE changed and
    records what they run with in ``emulators.settings`` (``profile=NAME scale=FACTOR``).
    """
    recorded = dict(item.split("=", 1) for item in settings_file.read_text().split())
    want = emulator_profile()
    if recorded.get("profile") != want.name or float(recorded.get("scale", "nan")) != want.scale:
        expected = f"profile={want.name} scale={want.scale:g}"
        pytest.fail(f"the emulators run with {recorded}, the tests expect {expected}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = os.environ.get("KUBECONFIG", "").strip()
    started_here = False
    if external:
        # Like kubectl, take the first file of a KUBECONFIG list.
        kubeconfig = Path(external.split(os.pathsep)[0])
        audit_log = None
    else:
        status = ["make", "--no-print-directory", "-s", "-C", str(ROOT), "cluster-status"]
        was_up = subprocess.run(status, capture_output=True, check=False).returncode == 0
        if _make("cluster-up").returncode != 0:
            pytest.fail("`make cluster-up` failed (output above)")
        started_here = not was_up
        kubeconfig = Path(_make_output("kubeconfig"))
        audit_log = Path(_make_output("audit-log"))
        check_emulator_profile(kubeconfig.parent / "emulators.settings")
    api = SyncKube.connect(kubeconfig)
    found = Cluster(
        kubeconfig=kubeconfig, api=api, kubectl_path=_kubectl_path(), local=not external, audit_log=audit_log
    )
    if CRD_FILE.is_file():
        install_crds(found, CRD_FILE)
    try:
        yield found
    finally:
        api.close()
        if started_here and os.environ.get("GPU_OPERATOR_KEEP_CLUSTER") != "1":
            _make("cluster-down")


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The chart's ServiceAccount and RBAC (no in-cluster Deployment) and the operator running as it,
    one per test module (a module that needs another defines its own `operator`)."""
    with chart_operator(cluster, tmp_path_factory.mktemp("operator"), NS) as process:
        yield process


@pytest.fixture
def clean(cluster: Cluster, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """Every test ends with no ClusterPolicy, no operand object and no operator-set node label."""
    try:
        yield operator
    finally:
        delete_policies(cluster)
        for path in SEED_CONFIG_MAPS:
            cluster.kubectl("delete", "-f", str(path), "--ignore-not-found")
        if not operator.running:
            operator.start()
        wait_for(lambda: assert_cleaned_up(cluster), timeout=CONVERGE, what="cleanup after the test")
        operator.assert_clean_log()


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> SyncKube:
    return cluster.api


@pytest.fixture(scope="session")
def kubeconfig(cluster: Cluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture
def namespace(api: SyncKube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted (and waited for) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"gpu-operator-e2e": "true"}))
    )
    try:
        yield name
    finally:
        # Workloads and pods first: the namespace controller takes ~5 s to get to them.
        apps = client.AppsV1Api(api)
        apps.delete_collection_namespaced_daemon_set(name)
        apps.delete_collection_namespaced_deployment(name)
        core.delete_collection_namespaced_pod(name)
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def no_pods_left() -> None:
            pods: list[Any] = core.list_namespaced_pod(name).items
            assert not pods, f"{len(pods)} pods left in {name}: {[p.metadata.name for p in pods]}"

        # Waiting for the pods (not for the namespace, which the namespace controller finalizes
        # some seconds later) keeps tests independent: the next test sees none of this test's
        # pods, e.g. no device plugin still advertising GPUs.
        wait_for(no_pods_left, timeout=120, what=f"pods of namespace {name} deleted")


@pytest.fixture
def failures(api: SyncKube) -> Iterator[None]:
    """Skip without kwok's Stage API; remove every injected failure after the test."""
    if not failure_injection_supported(api):
        pytest.skip("failure injection needs kwok with --enable-crds=Stage (the local kwok cluster)")
    try:
        yield
    finally:
        clear_all_failures(api)
