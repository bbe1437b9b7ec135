"""Driver upgrades end to end (issue 11): a driver version change rolls node by node within
maxParallelUpgrades, GPU pods are evicted and rescheduled, a PodDisruptionBudget holds until the
timeout, a canary failure pauses the rest, a rollback, an operator killed mid-way, autoUpgrade off.

The operator runs as its own process logged in as the chart's ServiceAccount; kwok runs the pods: a
deleted driver pod is replaced by the DaemonSet controller at the new revision and is Ready at once,
an evicted pod goes away at once. What the test sees comes from watches (`Observer`), so a limit is
checked on every change the API server made, not on samples.

On a real node the new driver pod's k8s-driver-manager pauses the operands and lets them back once
the driver is loaded, so the node's operator-validator pod is a new one, started after the driver
pod (what the validation gate waits for). kwok has no driver manager: `ValidatorRestarts` plays that
part, deleting the validator pod of a node whenever a new driver pod appears there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.core.components import BY_NAME
from gpu_operator.core.upgrade.states import (
    ANNOTATION_PREFIX,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_START_ANNOTATION,
)

from .kube_helpers import (
    Cluster,
    Watch,
    clear_failure,
    client,
    inject_failure,
    list_pods,
    pod_is_ready,
    wait_for,
    wait_timeout,
)
from .operator_process import OperatorProcess, chart_operator
from .test_doctor import doctor
from .test_metrics import scrape, value
from .test_operator import apply_policy, assert_cleaned_up, get_policy, wait_state

NS = "gpu-operator"
NAME = "cluster-policy"
NODES = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
V1, V2, V3 = "595.91.07", "595.58.03", "580.95.05"
DRIVER = BY_NAME["driver"].component_label
VALIDATOR = BY_NAME["operator-validator"].component_label
CANARY_LABEL = "e2e.gpu-operator/pool"
IDLE = ("", "upgrade-done", "upgrade-required")
ORDER = (
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
)
GAUGES = (
    "gpu_operator_driver_auto_upgrade_enabled",
    "gpu_operator_nodes_upgrades_in_progress",
    "gpu_operator_nodes_upgrades_done",
    "gpu_operator_nodes_upgrades_failed",
    "gpu_operator_nodes_upgrades_available",
    "gpu_operator_nodes_upgrades_pending",
)
UPGRADE = wait_timeout(120.0, node_starts=4)
"""Seconds an upgrade of the 4 nodes may take (a few under the instant profile, the CI machine is
slower; one driver restart after the other under the realistic one)."""


def upgrade_policy(version: str, **upgrade: Any) -> dict[str, Any]:
    """The driver at `version` with autoUpgrade and a short validation gate; operands the upgrade does
    not involve are off, to keep the cluster small."""
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "driver": {
                "repository": "nvcr.io/nvidia",
                "image": "driver",
                "version": version,
                "upgradePolicy": {"autoUpgrade": True, "validation": {"timeoutSeconds": 60}, **upgrade},
            },
            "dcgm": {"enabled": False},
            "dcgmExporter": {"enabled": False},
            "gfd": {"enabled": False},
            "migManager": {"enabled": False},
            "nodeStatusExporter": {"enabled": False},
        },
    }


# --- watching the cluster ------------------------------------------------------------------------


def _rv(obj: Any) -> int:
    return int(obj.metadata.resource_version)


@dataclass(frozen=True)
class NodeChange:
    version: int
    """The node's resourceVersion: etcd's revision, an order shared with the pods' changes."""
    node: str
    state: str
    unschedulable: bool
    started: str
    """The state-start annotation (the clock of the node's timeouts)."""


@dataclass(frozen=True)
class PodGone:
    version: int
    at: float
    name: str
    uid: str
    node: str


@dataclass
class Observer:
    """Every change of the nodes' upgrade state and cordon, and every pod of the workload namespace
    that starts to go (deletionTimestamp set, or deleted), from two watches."""

    api: Any
    namespace: str
    nodes: list[NodeChange] = field(default_factory=list)
    gone: list[PodGone] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: threading.Barrier = field(default_factory=lambda: threading.Barrier(3))

    def start(self) -> Observer:
        core = client.CoreV1Api(self.api)
        for target in (self._watch_nodes, self._watch_pods):
            threading.Thread(target=target, args=(core,), daemon=True).start()
        self.ready.wait(timeout=30)
        return self

    def _stream(
        self, core: Any, lister: Callable[..., Any], record: Callable[[Any], None], **kw: Any
    ) -> None:
        listed = lister(**kw)
        for item in listed.items:
            record(item)
        self.ready.wait(timeout=30)
        version = listed.metadata.resource_version
        while not self.stop.is_set():
            watch = Watch()
            for event in watch.stream(lister, resource_version=version, timeout_seconds=5, **kw):
                version = event["object"].metadata.resource_version
                record(event["object"] if event["type"] != "DELETED" else _deleted(event["object"]))
                if self.stop.is_set():
                    watch.stop()

    def _watch_nodes(self, core: Any) -> None:
        def record(node: Any) -> None:
            labels = node.metadata.labels or {}
            annotations = node.metadata.annotations or {}
            change = NodeChange(
                _rv(node),
                node.metadata.name,
                labels.get(STATE_LABEL, ""),
                bool(node.spec.unschedulable),
                annotations.get(STATE_START_ANNOTATION, ""),
            )
            with self.lock:
                if not self.nodes or self.nodes[-1] != change:
                    self.nodes.append(change)

        self._stream(core, core.list_node, record, label_selector="gpu-operator.sim/simulated=true")

    def _watch_pods(self, core: Any) -> None:
        def record(pod: Any) -> None:
            if pod.metadata.deletion_timestamp is None:
                return
            with self.lock:
                if any(g.uid == pod.metadata.uid for g in self.gone):
                    return
                gone = PodGone(
                    _rv(pod), time.time(), pod.metadata.name, pod.metadata.uid, pod.spec.node_name or ""
                )
                self.gone.append(gone)

        self._stream(core, core.list_namespaced_pod, record, namespace=self.namespace)

    # --- what it saw ---------------------------------------------------------------------------

    def mark(self) -> int:
        with self.lock:
            return self.nodes[-1].version if self.nodes else 0

    def states(self, since: int = 0) -> list[dict[str, NodeChange]]:
        """The nodes after each change (since the resourceVersion `since`), in the API server's order."""
        with self.lock:
            changes = sorted(self.nodes, key=lambda c: c.version)
        current: dict[str, NodeChange] = {}
        found = []
        for change in changes:
            current[change.node] = change
            if change.version > since:
                found.append(dict(current))
        return found

    def most_in_progress(self, since: int = 0) -> int:
        return max((sum(c.state not in IDLE for c in s.values()) for s in self.states(since)), default=0)

    def most_cordoned(self, since: int = 0) -> int:
        return max((sum(c.unschedulable for c in s.values()) for s in self.states(since)), default=0)

    def node_when(self, version: int) -> dict[str, NodeChange]:
        """The nodes as they were when the change with this resourceVersion happened."""
        before = [s for s in self.states() if max(c.version for c in s.values()) < version]
        return before[-1] if before else {}

    def path(self, node: str, since: int = 0) -> list[str]:
        """The node's successive states since `since`."""
        found: list[str] = []
        for states in self.states(since):
            state = states[node].state if node in states else ""
            if not found or found[-1] != state:
                found.append(state)
        return found

    def pods_gone(self, since: int = 0) -> list[PodGone]:
        with self.lock:
            return [g for g in self.gone if g.version > since]


def _deleted(obj: Any) -> Any:
    """A DELETED event's object, marked as going (a pod deleted without a grace period has no
    deletionTimestamp in its last state)."""
    if obj.metadata.deletion_timestamp is None:
        obj.metadata.deletion_timestamp = "deleted"
    return obj


class ValidatorRestarts:
    """k8s-driver-manager's part: a new driver pod on a node means a new validator pod there."""

    def __init__(self, api: Any) -> None:
        self.core = client.CoreV1Api(api)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        listed = self.core.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/component={DRIVER}")
        self.version = listed.metadata.resource_version

    def _run(self) -> None:
        placed: set[str] = set()
        """Driver pods seen on their node (DaemonSet pods are bound by the scheduler after creation)."""
        while not self.stop.is_set():
            watch = Watch()
            for event in watch.stream(
                self.core.list_namespaced_pod,
                NS,
                label_selector=f"app.kubernetes.io/component={DRIVER}",
                resource_version=self.version,
                timeout_seconds=5,
            ):
                pod = event["object"]
                self.version = pod.metadata.resource_version
                if event["type"] != "DELETED" and pod.spec.node_name and pod.metadata.uid not in placed:
                    placed.add(pod.metadata.uid)
                    self._restart_validator(pod.spec.node_name)
                if self.stop.is_set():
                    watch.stop()

    def _restart_validator(self, node: str) -> None:
        selector = f"app.kubernetes.io/component={VALIDATOR}"
        for pod in self.core.list_namespaced_pod(
            NS, label_selector=selector, field_selector=f"spec.nodeName={node}"
        ).items:
            try:
                self.core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    restarts = ValidatorRestarts(cluster.api)
    restarts.thread.start()
    try:
        with chart_operator(cluster, tmp_path_factory.mktemp("upgrade"), NS) as process:
            yield process
    finally:
        restarts.stop.set()


@pytest.fixture
def upgrades(cluster: Cluster, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """Each test ends with no ClusterPolicy, and nodes without upgrade labels, annotations or cordon."""
    try:
        yield operator
    finally:
        custom = client.CustomObjectsApi(cluster.api)
        try:
            custom.delete_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise
        if not operator.running:
            operator.start()
        wait_for(lambda: assert_cleaned_up(cluster), timeout=UPGRADE, what="cleanup after the test")
        reset_upgrade_state(cluster, CANARY_LABEL)
        operator.assert_clean_log()


def reset_upgrade_state(cluster: Cluster, *labels: str) -> None:
    """Every simulated node without upgrade labels (and `labels`), upgrade annotations or cordon, as a
    test found it: NVIDIA's operator, and this one, leave a node's last upgrade state on it."""
    core = client.CoreV1Api(cluster.api)
    for node in core.list_node(label_selector="gpu-operator.sim/simulated=true").items:
        annotations = {k: None for k in node.metadata.annotations or {} if k.startswith(ANNOTATION_PREFIX)}
        found = {k: None for k in (STATE_LABEL, SKIP_LABEL, *labels) if k in (node.metadata.labels or {})}
        core.patch_node(
            node.metadata.name,
            {"metadata": {"labels": found, "annotations": annotations}, "spec": {"unschedulable": None}},
        )


@pytest.fixture
def observer(cluster: Cluster, namespace: str) -> Iterator[Observer]:
    watching = Observer(cluster.api, namespace).start()
    try:
        yield watching
    finally:
        watching.stop.set()


# --- helpers -------------------------------------------------------------------------------------


def driver_pods(cluster: Cluster) -> dict[str, Any]:
    """Node → its live driver pod."""
    return {
        p.spec.node_name: p
        for p in list_pods(cluster.api, NS, labels=f"app.kubernetes.io/component={DRIVER}")
    }


def upgrade_status(cluster: Cluster) -> dict[str, Any]:
    return dict(get_policy(cluster, NAME).get("status", {}).get("driverUpgrade") or {})


def wait_upgraded(cluster: Cluster, version: str, cordoned: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every node done at `version`: its driver pod Ready at that version, its state upgrade-done, not
    cordoned (but those in `cordoned`), and the status saying so."""

    def check() -> dict[str, Any]:
        status = upgrade_status(cluster)
        pods = driver_pods(cluster)
        images = {
            n: p.spec.containers[0].image.rsplit(":", 1)[-1] for n, p in pods.items() if pod_is_ready(p)
        }
        assert all(images.get(n, "").startswith(version) for n in NODES), f"driver images {images}"
        for node in (
            client.CoreV1Api(cluster.api).list_node(label_selector="gpu-operator.sim/simulated=true").items
        ):
            name = node.metadata.name
            if name not in NODES:
                continue
            assert (node.metadata.labels or {}).get(STATE_LABEL) == "upgrade-done", (
                f"{name}: {node.metadata.labels}"
            )
            assert bool(node.spec.unschedulable) == (name in cordoned), (
                f"{name} unschedulable {node.spec.unschedulable}"
            )
        assert status.get("targetVersion", "").startswith(version), status
        assert status.get("summary") == "up to date" and status.get("nodesDone") == len(NODES), status
        return status

    return wait_for(check, timeout=UPGRADE, what=f"driver {version} on every node")


def gpu_deployment(namespace: str, name: str, replicas: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def run_gpu_pods(
    cluster: Cluster, namespace: str, name: str, replicas: int, node: str | None = None
) -> list[Any]:
    client.AppsV1Api(cluster.api).create_namespaced_deployment(
        namespace, gpu_deployment(namespace, name, replicas, node)
    )
    return wait_gpu_pods(cluster, namespace, name, replicas)


def wait_gpu_pods(cluster: Cluster, namespace: str, name: str, replicas: int) -> list[Any]:
    def running() -> list[Any]:
        pods = [p for p in list_pods(cluster.api, namespace, labels=f"app={name}") if pod_is_ready(p)]
        assert len(pods) == replicas, f"{len(pods)}/{replicas} pods of {name} running"
        return pods

    return wait_for(running, timeout=UPGRADE, what=f"{replicas} GPU pods of {name}")


def guard(cluster: Cluster, namespace: str, name: str) -> None:
    """A PodDisruptionBudget that refuses every eviction of the Deployment's pods."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
    }
    client.PolicyV1Api(cluster.api).create_namespaced_pod_disruption_budget(namespace, body)

    def counted() -> None:
        pdb = client.PolicyV1Api(cluster.api).read_namespaced_pod_disruption_budget(name, namespace)
        assert pdb.status and pdb.status.current_healthy == 1 and pdb.status.disruptions_allowed == 0, (
            pdb.status
        )

    wait_for(counted, timeout=60, what=f"PodDisruptionBudget {name} counting its pod")


def upgrade_past_a_guarded_pod(
    cluster: Cluster, namespace: str, observer: Observer, node: str, deletion: dict[str, Any]
) -> tuple[Any, int]:
    """V1 ready, a GPU pod on `node` that a PodDisruptionBudget guards, then the change to V2; the pod
    and the observer's mark from before the change."""
    apply_policy(cluster, upgrade_policy(V1, podDeletion=deletion))
    wait_state(cluster, NAME, "ready")
    (guarded,) = run_gpu_pods(cluster, namespace, "guarded", 1, node=node)
    guard(cluster, namespace, "guarded")
    mark = observer.mark()
    apply_policy(cluster, upgrade_policy(V2, podDeletion=deletion))
    return guarded, mark


def in_progress(status: dict[str, Any], node: str) -> dict[str, Any]:
    return next((e for e in status.get("inProgress", []) if e["node"] == node), {})


def assert_forward(path: list[str]) -> None:
    """A node's states only move forward in NVIDIA's order (after where it started: none or done)."""
    steps = path[1:] if path and path[0] in ("", "upgrade-done") else path
    positions = [ORDER.index(s) for s in steps]
    assert positions == sorted(positions), path


# --- tests ---------------------------------------------------------------------------------------


def test_version_change_goes_node_by_node_within_max_parallel_upgrades(
    cluster: Cluster, upgrades: OperatorProcess, namespace: str, observer: Observer
) -> None:
    apply_policy(cluster, upgrade_policy(V1, maxParallelUpgrades=1, maxUnavailable="100%"))
    wait_state(cluster, NAME, "ready")
    first_pods = run_gpu_pods(cluster, namespace, "train", 4)
    mark = observer.mark()
    apply_policy(cluster, upgrade_policy(V2, maxParallelUpgrades=1, maxUnavailable="100%"))
    wait_upgraded(cluster, V2)
    assert observer.most_in_progress(mark) == 1
    # Every GPU pod was evicted, each from a node cordoned for it, at pod-deletion-required...
    gone = {g.uid: g for g in observer.pods_gone(mark)}
    assert {p.metadata.uid for p in first_pods} <= gone.keys()
    for pod in gone.values():
        then = observer.node_when(pod.version)[pod.node]
        assert then.state == "pod-deletion-required" and then.unschedulable, (pod, then)
    # ... and rescheduled by its Deployment.
    wait_gpu_pods(cluster, namespace, "train", 4)
    for node in NODES:
        path = observer.path(node, mark)
        assert_forward(path)
        assert "pod-restart-required" in path and path[-1] == "upgrade-done", (node, path)

    # Two at a time now; gpu-node-3 was cordoned by someone else and stays so.
    client.CoreV1Api(cluster.api).patch_node("gpu-node-3", {"spec": {"unschedulable": True}})
    mark = observer.mark()
    apply_policy(cluster, upgrade_policy(V3, maxParallelUpgrades=2, maxUnavailable=2))
    status = wait_upgraded(cluster, V3, cordoned=("gpu-node-3",))
    assert observer.most_in_progress(mark) == 2
    assert observer.most_cordoned(mark) <= 2  # gpu-node-3's own cordon counts
    assert not any(
        k.startswith(ANNOTATION_PREFIX + ".node-initial-state")
        for k in client.CoreV1Api(cluster.api).read_node("gpu-node-3").metadata.annotations or {}
    )
    assert status["pending"] == [] and status["failed"] == [] and not status["paused"]

    # What else tells the story: NVIDIA's gauges, the printer column, an Event per node step.
    gauges = wait_for(lambda: _gauges_done(upgrades), timeout=30, what="upgrade gauges after the upgrade")
    assert gauges["gpu_operator_driver_auto_upgrade_enabled"] == 1
    assert gauges["gpu_operator_nodes_upgrades_in_progress"] == 0
    assert gauges["gpu_operator_nodes_upgrades_failed"] == 0
    assert gauges["gpu_operator_nodes_upgrades_pending"] == 0
    table = cluster.kubectl("get", "clusterpolicy", NAME)
    assert "DRIVER UPGRADE" in table and "up to date" in table, table
    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.kind=Node,involvedObject.name=gpu-node-0",
        "-o",
        "json",
    )
    messages = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "GPUDriverUpgrade"]
    assert any("pod-restart-required" in m for m in messages), messages
    assert any("uncordoned" in m for m in messages), messages


def _gauges_done(process: OperatorProcess) -> dict[str, float | None]:
    samples = scrape(process)
    gauges = {name: value(samples, name) for name in GAUGES}
    assert gauges["gpu_operator_nodes_upgrades_done"] == len(NODES), gauges
    return gauges


def test_pod_disruption_budget_holds_until_the_timeout(
    cluster: Cluster, upgrades: OperatorProcess, namespace: str, observer: Observer
) -> None:
    deletion = {"force": True, "timeoutSeconds": 8}
    guarded, mark = upgrade_past_a_guarded_pod(cluster, namespace, observer, "gpu-node-1", deletion)

    def refused() -> dict[str, Any]:
        entry = in_progress(upgrade_status(cluster), "gpu-node-1")
        assert "disruption budget" in entry.get("reason", ""), upgrade_status(cluster)
        return entry

    entry = wait_for(refused, timeout=UPGRADE, what="the eviction refused, and why, in the status")
    assert entry["state"] == "pod-deletion-required" and "times out at" in entry["reason"]
    # The status and `doctor` name the pod and the budget that holds it.
    assert f"{namespace}/{guarded.metadata.name}" in entry["reason"], entry
    assert "The disruption budget guarded needs 1 healthy pods" in entry["reason"], entry
    _, told, _ = doctor(cluster.kubeconfig)
    assert "DriverUpgradeInProgress" in told and "The disruption budget guarded needs" in told, told
    wait_upgraded(cluster, V2)
    # force: deleted once the timeout was over, not before.
    (gone,) = [g for g in observer.pods_gone(mark) if g.uid == guarded.metadata.uid]
    then = observer.node_when(gone.version)["gpu-node-1"]
    assert then.state == "pod-deletion-required" and gone.at >= int(then.started) + deletion["timeoutSeconds"]

    # Without force the node fails instead, and the upgrade pauses with every later node untouched.
    wait_gpu_pods(cluster, namespace, "guarded", 1)
    before = {n: p.metadata.uid for n, p in driver_pods(cluster).items()}
    strict = {"timeoutSeconds": 8}
    apply_policy(cluster, upgrade_policy(V3, podDeletion=strict))

    def paused() -> dict[str, Any]:
        status = upgrade_status(cluster)
        assert status.get("paused") and status["failed"][0]["node"] == "gpu-node-1", status
        return status

    status = wait_for(paused, timeout=UPGRADE, what="the upgrade paused on gpu-node-1")
    assert (
        "pod-deletion-required" in status["pausedReason"] and "eviction timed out" in status["pausedReason"]
    )
    now = driver_pods(cluster)
    for node in ("gpu-node-2", "gpu-node-3"):
        assert now[node].metadata.uid == before[node], f"{node}: driver pod replaced while paused"
        assert not client.CoreV1Api(cluster.api).read_node(node).spec.unschedulable
    # The cause goes (someone removes the blocking pod): the node resumes by itself.
    client.PolicyV1Api(cluster.api).delete_namespaced_pod_disruption_budget("guarded", namespace)
    client.AppsV1Api(cluster.api).delete_namespaced_deployment("guarded", namespace)
    wait_upgraded(cluster, V3)


def test_canary_failure_pauses_the_rest_then_rollback(
    cluster: Cluster, upgrades: OperatorProcess, namespace: str, observer: Observer, failures: None
) -> None:
    canary = {"nodeSelector": {CANARY_LABEL: "canary"}}
    client.CoreV1Api(cluster.api).patch_node("gpu-node-2", {"metadata": {"labels": {CANARY_LABEL: "canary"}}})
    apply_policy(cluster, upgrade_policy(V1, maxParallelUpgrades=0, maxUnavailable="100%", canary=canary))
    wait_state(cluster, NAME, "ready")
    before = {n: p.metadata.uid for n, p in driver_pods(cluster).items()}
    run_gpu_pods(cluster, namespace, "train", 4)
    inject_failure(cluster.api, DRIVER, "gpu-node-2", "CrashLoopBackOff", restarts=11)
    mark = observer.mark()
    apply_policy(cluster, upgrade_policy(V2, maxParallelUpgrades=0, maxUnavailable="100%", canary=canary))

    def paused() -> dict[str, Any]:
        status = upgrade_status(cluster)
        assert status.get("paused") and [f["node"] for f in status["failed"]] == ["gpu-node-2"], status
        return status

    # The canary's new driver pod starts at 11 restarts (crash-looping a while): failing at once.
    status = wait_for(paused, timeout=UPGRADE, what="the canary failing and the upgrade paused")
    assert "crash-looping" in status["failed"][0]["reason"]
    assert "pod-restart-required" in status["failed"][0]["reason"]
    others = ("gpu-node-0", "gpu-node-1", "gpu-node-3")
    assert {n for g in status["pending"] for n in g["nodes"]} == set(others)
    now = driver_pods(cluster)
    core = client.CoreV1Api(cluster.api)
    for node in others:
        assert now[node].metadata.uid == before[node], f"{node}: driver pod replaced"
        assert not core.read_node(node).spec.unschedulable, f"{node} cordoned"
        assert observer.path(node, mark)[-1] == "upgrade-required"
    assert {g.node for g in observer.pods_gone(mark)} <= {"gpu-node-2"}  # no GPU pod touched elsewhere

    # Rollback: the previous version again; the canary goes back the same way, the others never moved.
    clear_failure(cluster.api, DRIVER, "gpu-node-2", delete_pods=False)
    apply_policy(cluster, upgrade_policy(V1, maxParallelUpgrades=0, maxUnavailable="100%", canary=canary))
    wait_upgraded(cluster, V1)
    now = driver_pods(cluster)
    assert all(now[n].metadata.uid == before[n] for n in others)
    assert now["gpu-node-2"].metadata.uid != before["gpu-node-2"]
    assert {g.node for g in observer.pods_gone(mark)} <= {"gpu-node-2"}


def test_operator_killed_mid_upgrade_resumes_at_the_same_step(
    cluster: Cluster, upgrades: OperatorProcess, namespace: str, observer: Observer
) -> None:
    deletion = {"force": True, "timeoutSeconds": 15}
    guarded, mark = upgrade_past_a_guarded_pod(cluster, namespace, observer, "gpu-node-0", deletion)

    def blocked() -> str:
        node = client.CoreV1Api(cluster.api).read_node("gpu-node-0")
        assert (node.metadata.labels or {}).get(STATE_LABEL) == "pod-deletion-required", node.metadata.labels
        return str(node.metadata.annotations[STATE_START_ANNOTATION])

    started = wait_for(blocked, timeout=UPGRADE, what="gpu-node-0 blocked at pod-deletion-required")
    upgrades.kill()
    upgrades.start()
    wait_upgraded(cluster, V2)
    path = observer.path("gpu-node-0", mark)
    assert_forward(path)
    # The timeout ran from the state's start as recorded before the kill, not from the restart.
    at_step = {
        c.started
        for s in observer.states(mark)
        for c in [s["gpu-node-0"]]
        if c.state == "pod-deletion-required"
    }
    assert at_step == {started}
    (gone,) = [g for g in observer.pods_gone(mark) if g.uid == guarded.metadata.uid]
    assert gone.at >= int(started) + deletion["timeoutSeconds"]


def test_auto_upgrade_off_leaves_pods_alone_and_says_so(
    cluster: Cluster, upgrades: OperatorProcess, namespace: str, observer: Observer
) -> None:
    apply_policy(cluster, upgrade_policy(V1, autoUpgrade=False))
    wait_state(cluster, NAME, "ready")
    before = {n: p.metadata.uid for n, p in driver_pods(cluster).items()}
    mark = observer.mark()
    apply_policy(cluster, upgrade_policy(V2, autoUpgrade=False))

    def manual() -> dict[str, Any]:
        status = upgrade_status(cluster)
        assert status.get("targetVersion", "").startswith(V2), status
        assert status["summary"] == "manual: 4 nodes wait for a driver pod restart", status
        return status

    status = wait_for(manual, timeout=UPGRADE, what="the status saying nodes wait for a manual restart")
    assert not status["autoUpgrade"]
    assert "driver pod is deleted by hand" in status["pending"][0]["reason"]
    assert {n: p.metadata.uid for n, p in driver_pods(cluster).items()} == before
    core = client.CoreV1Api(cluster.api)
    for node in NODES:
        found = core.read_node(node)
        assert not found.spec.unschedulable
        assert "nvidia.com/gpu-driver-upgrade-enabled" not in (found.metadata.annotations or {})
    assert observer.most_in_progress(mark) == 0
    # A driver pod deleted by hand brings its node the new driver.
    pod = driver_pods(cluster)["gpu-node-0"]
    core.delete_namespaced_pod(pod.metadata.name, NS)
    wait_for(
        lambda: _assert_summary(cluster, "manual: 3 nodes wait for a driver pod restart"),
        timeout=UPGRADE,
        what="gpu-node-0 counted upgraded",
    )


def _assert_summary(cluster: Cluster, summary: str) -> None:
    status = upgrade_status(cluster)
    assert status.get("summary") == summary, status
