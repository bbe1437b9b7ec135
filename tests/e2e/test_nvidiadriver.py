"""NVIDIADriver pools end to end (issue 36): two pools at two driver versions converge, a conflicting
third NVIDIADriver is reported on both objects and changes nothing, the ClusterPolicy's driver moves to
pools and back, and the operator killed in the middle of each resumes.

What the tests hold the operator to comes from watches (`DriverPods`), not samples: at no point does a
node run two driver pods (a terminating one counts: its driver is still loaded), a node whose driver
stays the same keeps its pod (same UID), and every GPU node ends with exactly one Ready driver pod of
the version its pool names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.api.nvidiadriver import OWNER_LABEL
from gpu_operator.core.components import BY_NAME

from .kube_helpers import (
    Cluster,
    assert_true,
    clear_failure,
    client,
    follow_pods,
    gpu_nodes,
    inject_failure,
    list_pods,
    pod_is_ready,
    wait_for,
    wait_timeout,
)
from .operator_process import OperatorProcess
from .test_operator import apply_policy as apply
from .test_operator import assert_cleaned_up, delete_policies, wait_state
from .test_upgrade import reset_upgrade_state, upgrade_policy

pytestmark = pytest.mark.e2e

NS = "gpu-operator"
NAME = "cluster-policy"
GROUP, VERSION, PLURAL = "nvidia.com", "v1alpha1", "nvidiadrivers"
DRIVER = BY_NAME["driver"].component_label
CLUSTERPOLICY_DRIVER = BY_NAME["driver"].daemonset
"""The ClusterPolicy's driver DaemonSet; each NVIDIADriver pool has its own (nvidia-<name>-driver-...)."""
POOL_LABEL = "e2e.gpu-operator/pool"
CANARY_LABEL = "e2e.gpu-operator/canary"
V1, V2 = "595.91.07", "580.95.05"
CONVERGE = wait_timeout(120.0, node_starts=2)
"""Seconds a pool change may take: a node's driver pod goes, then its new one starts."""


def policy(*, pools: bool, version: str = V1) -> dict[str, Any]:
    """test_upgrade's ClusterPolicy (only what a driver change involves), its driver its own (`pools`
    False, at `version`) or the NVIDIADrivers'."""
    body = upgrade_policy(version)
    body["spec"]["driver"]["useNvidiaDriverCRD"] = pools
    return body


def nvidiadriver(
    name: str, version: str, *, selector: dict[str, str] | None = None, upgrade: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A pool: the nodes `selector` matches, or (None) the default, every GPU node no other selects;
    `upgrade`, its upgradePolicy (autoUpgrade and a short validation gate)."""
    spec: dict[str, Any] = {"repository": "nvcr.io/nvidia", "image": "driver", "version": version}
    if upgrade:
        spec["upgradePolicy"] = {"autoUpgrade": True, "validation": {"timeoutSeconds": 60}, **upgrade}
    if selector is None:
        spec["default"] = True
    else:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": spec,
    }


def custom(cluster: Cluster) -> Any:
    return client.CustomObjectsApi(cluster.api)


def get_driver(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom(cluster).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    return found


def delete_driver(cluster: Cluster, name: str) -> None:
    try:
        custom(cluster).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def label_nodes(cluster: Cluster, nodes: list[str], value: str | None) -> None:
    core = client.CoreV1Api(cluster.api)
    for node in nodes:
        core.patch_node(node, {"metadata": {"labels": {POOL_LABEL: value}}})


def driver_state(
    cluster: Cluster, name: str, state: str, counts: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Wait for the NVIDIADriver's `state` and, given, its (nodesDesired, nodesReady)."""

    def check() -> dict[str, Any]:
        found = get_driver(cluster, name)
        status = found.get("status") or {}
        assert status.get("state") == state, status
        if counts is not None:
            assert (status.get("nodesDesired"), status.get("nodesReady")) == counts, status
        return found

    return wait_for(check, timeout=CONVERGE, what=f"NVIDIADriver {name} {state}")


def message(found: dict[str, Any]) -> str:
    return " ".join(c.get("message", "") for c in (found.get("status") or {}).get("conditions", []))


def driver_pods(cluster: Cluster) -> dict[str, list[Any]]:
    """Node → its driver pods."""
    found: dict[str, list[Any]] = {}
    for pod in list_pods(cluster.api, NS, labels=f"app.kubernetes.io/component={DRIVER}"):
        found.setdefault(pod.spec.node_name or "", []).append(pod)
    return found


def wait_drivers(
    cluster: Cluster,
    versions: dict[str, str],
    owners: dict[str, str | None],
    timeout: float = CONVERGE,
) -> dict[str, str]:
    """Wait until each node runs exactly one Ready driver pod at its version and carries its owner label
    (None: none); node → the pod's UID."""

    def check() -> dict[str, str]:
        pods = driver_pods(cluster)
        core = client.CoreV1Api(cluster.api)
        uids = {}
        for node, version in versions.items():
            mine = pods.get(node, [])
            assert len(mine) == 1, f"{node}: {[p.metadata.name for p in mine]}"
            pod = mine[0]
            assert pod_is_ready(pod) and pod.metadata.deletion_timestamp is None, (
                f"{node}: {pod.metadata.name}"
            )
            assert (
                pod.spec.containers[0].image.endswith(f":{version}")
                or f":{version}-" in pod.spec.containers[0].image
            ), f"{node}: {pod.spec.containers[0].image}"
            labels = core.read_node(node).metadata.labels or {}
            assert labels.get(OWNER_LABEL) == owners[node], f"{node}: owner {labels.get(OWNER_LABEL)}"
            # The node's owner label changes before its pod is replaced: the pod's own DaemonSet tells
            # whose it is (a pool's is never the ClusterPolicy's).
            daemonset = next(
                (o.name for o in pod.metadata.owner_references or [] if o.kind == "DaemonSet"), None
            )
            assert (daemonset == CLUSTERPOLICY_DRIVER) == (owners[node] is None), f"{node}: {daemonset}"
            uids[node] = pod.metadata.uid
        return uids

    return wait_for(check, timeout=timeout, what="driver pods at their pools' versions")


def killed_once(operator: OperatorProcess, seen: Callable[[], object] = lambda: True, what: str = "") -> None:
    """SIGKILL the operator once `seen()` is truthy (waited for), and start it again."""
    wait_for(lambda: assert_true(seen()), timeout=CONVERGE, what=what or "the moment to kill")
    operator.kill()
    operator.start()


@dataclass
class DriverPods:
    """Every driver pod of the operand namespace from a watch, in etcd's order: the most pods a node
    had at once (a terminating pod counts until it is deleted), and the UIDs that went."""

    api: Any
    present: dict[str, set[str]] = field(default_factory=dict)
    most: dict[str, int] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> DriverPods:
        threading.Thread(target=self._watch, daemon=True).start()
        assert self.ready.wait(timeout=30), "the driver pod watch did not start"
        return self

    def _record(self, kind: str, pod: Any) -> None:
        node, uid = pod.spec.node_name or "", pod.metadata.uid
        if not node:
            return
        if kind == "DELETED":
            self.present.get(node, set()).discard(uid)
            self.gone.add(uid)
            return
        self.present.setdefault(node, set()).add(uid)
        self.most[node] = max(self.most.get(node, 0), len(self.present[node]))

    def _watch(self) -> None:
        selector = f"app.kubernetes.io/component={DRIVER}"
        follow_pods(self.api, NS, selector, self._record, self.ready, self.stop)

    def assert_never_two(self) -> None:
        twice = {node: n for node, n in self.most.items() if n > 1}
        assert not twice, f"nodes that ran two driver pods at once: {twice}"


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def pools(cluster: Cluster, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """Each test ends with no ClusterPolicy, no NVIDIADriver, nothing of the operator's left, and the
    nodes without pool, owner or upgrade labels."""
    try:
        yield operator
    finally:
        delete_policies(cluster)
        if not operator.running:
            operator.start()
        wait_for(lambda: assert_cleaned_up(cluster), timeout=CONVERGE, what="cleanup after the test")

        def no_owner_labels() -> None:
            core = client.CoreV1Api(cluster.api)
            left = [
                n.metadata.name for n in core.list_node().items if OWNER_LABEL in (n.metadata.labels or {})
            ]
            assert not left, f"owner labels left on {left}"

        wait_for(no_owner_labels, timeout=CONVERGE, what="owner labels removed")
        label_nodes(cluster, gpu_nodes(cluster.api), None)
        reset_upgrade_state(cluster, CANARY_LABEL)
        operator.assert_clean_log()


@pytest.fixture
def watched(cluster: Cluster) -> Iterator[DriverPods]:
    watching = DriverPods(cluster.api).start()
    try:
        yield watching
    finally:
        watching.stop.set()


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True], ids=["", "operator-killed"])
def test_two_pools_converge_and_a_conflict_changes_nothing(
    cluster: Cluster, pools: OperatorProcess, watched: DriverPods, kill: bool
) -> None:
    """With `kill`, the operator is killed as soon as the first driver pod exists, and again once the
    conflicting NVIDIADriver is applied, and started again each time."""
    nodes = gpu_nodes(cluster.api)
    first, rest = nodes[:2], nodes[2:]
    label_nodes(cluster, first, "a")
    apply(cluster, nvidiadriver("pool-a", V2, selector={POOL_LABEL: "a"}))
    apply(cluster, nvidiadriver("default", V1))
    apply(cluster, policy(pools=True))
    if kill:
        killed_once(pools, lambda: watched.most, "a first driver pod")
    versions = {**dict.fromkeys(first, V2), **dict.fromkeys(rest, V1)}
    owners: dict[str, str | None] = {**dict.fromkeys(first, "pool-a"), **dict.fromkeys(rest, "default")}
    before = wait_drivers(cluster, versions, owners)
    # The pool's DaemonSet counts its pods a moment after they are Ready, and the status follows it.
    ready = driver_state(cluster, "pool-a", "ready", counts=(2, 2))["status"]
    assert ready["conditions"], ready
    listed = cluster.kubectl("get", "nvidiadrivers", "pool-a", "--no-headers").split()
    assert listed[:4] == ["pool-a", "ready", "2", "2"], listed
    driver_state(cluster, "default", "ready")

    # A third NVIDIADriver that selects pool a's nodes: both are notReady, naming each other and the
    # nodes, and no driver pod changes.
    apply(cluster, nvidiadriver("pool-c", V1, selector={POOL_LABEL: "a"}))
    if kill:
        killed_once(pools)
    for name, other in (("pool-a", "pool-c"), ("pool-c", "pool-a")):
        found = driver_state(cluster, name, "notReady")
        said = message(found)
        assert "multiple NVIDIADrivers match the same node" in said and other in said, said
        assert all(node in said for node in first), said
    assert wait_drivers(cluster, versions, owners) == before
    delete_driver(cluster, "pool-c")
    driver_state(cluster, "pool-a", "ready")
    assert wait_drivers(cluster, versions, owners) == before

    # A node moved from pool a to the default: only its driver changes.
    label_nodes(cluster, first[:1], None)
    versions[first[0]], owners[first[0]] = V1, "default"
    after = wait_drivers(cluster, versions, owners)
    assert after[first[0]] != before[first[0]]
    assert {n: after[n] for n in nodes[1:]} == {n: before[n] for n in nodes[1:]}
    watched.assert_never_two()


@pytest.mark.parametrize("kill", [False, True], ids=["", "operator-killed"])
def test_clusterpolicy_driver_to_pools_and_back(
    cluster: Cluster, pools: OperatorProcess, watched: DriverPods, kill: bool
) -> None:
    """The switch both ways, node by node: no node ever runs two driver pods; with `kill`, the operator
    is killed as soon as the first node has switched, and started again. Switching on goes through the
    pool's upgrade (each orphaned ClusterPolicy driver pod replaced in turn, maxParallelUpgrades 1)."""
    nodes = gpu_nodes(cluster.api)
    apply(cluster, policy(pools=False))
    legacy = wait_drivers(cluster, dict.fromkeys(nodes, V1), dict.fromkeys(nodes, None))

    apply(cluster, nvidiadriver("default", V1))
    apply(cluster, policy(pools=True))
    if kill:
        killed_once(pools, lambda: watched.gone & set(legacy.values()), "a node switching")
    in_turn = wait_timeout(120.0, node_starts=len(nodes) + 1)
    switched = wait_drivers(cluster, dict.fromkeys(nodes, V1), dict.fromkeys(nodes, "default"), in_turn)
    assert not set(switched.values()) & set(legacy.values())
    driver_state(cluster, "default", "ready")
    wait_state(cluster, NAME, "ready")

    apply(cluster, policy(pools=False))
    if kill:
        killed_once(pools, lambda: watched.gone & set(switched.values()), "a node going back")
    back = wait_drivers(cluster, dict.fromkeys(nodes, V1), dict.fromkeys(nodes, None))
    assert not set(back.values()) & set(switched.values())
    driver_state(cluster, "default", "disabled")
    watched.assert_never_two()


def test_a_canary_failure_pauses_its_pool_only(
    cluster: Cluster, pools: OperatorProcess, watched: DriverPods, failures: None
) -> None:
    """Pool a's canary fails its upgrade: pool a pauses (its status says so, its other node keeps its
    driver), while the default pool upgrades to a new version untouched by it; the operator killed
    while pool a is paused changes none of that."""
    nodes = gpu_nodes(cluster.api)
    first, rest = nodes[:2], nodes[2:]
    label_nodes(cluster, first, "a")
    client.CoreV1Api(cluster.api).patch_node(first[0], {"metadata": {"labels": {CANARY_LABEL: "yes"}}})
    everywhere: dict[str, Any] = {"maxParallelUpgrades": 0, "maxUnavailable": "100%"}
    upgrade = {**everywhere, "canary": {"nodeSelector": {CANARY_LABEL: "yes"}}}
    apply(cluster, nvidiadriver("pool-a", V1, selector={POOL_LABEL: "a"}, upgrade=upgrade))
    apply(cluster, nvidiadriver("default", V1, upgrade=everywhere))
    apply(cluster, policy(pools=True))
    owners: dict[str, str | None] = {**dict.fromkeys(first, "pool-a"), **dict.fromkeys(rest, "default")}
    before = wait_drivers(cluster, dict.fromkeys(nodes, V1), owners)

    inject_failure(cluster.api, DRIVER, first[0], "CrashLoopBackOff", restarts=11)
    apply(cluster, nvidiadriver("pool-a", V2, selector={POOL_LABEL: "a"}, upgrade=upgrade))

    def paused() -> dict[str, Any]:
        status = get_driver(cluster, "pool-a").get("status") or {}
        upgrading = status.get("driverUpgrade") or {}
        assert upgrading.get("paused") and [f["node"] for f in upgrading["failed"]] == [first[0]], upgrading
        return dict(upgrading)

    wait_for(paused, timeout=CONVERGE, what="pool a's canary failing and pool a paused")
    apply(cluster, nvidiadriver("default", V2, upgrade=everywhere))
    after = wait_drivers(cluster, dict.fromkeys(rest, V2), {n: owners[n] for n in rest})
    assert all(after[n] != before[n] for n in rest)
    killed_once(pools)
    wait_drivers(cluster, dict.fromkeys(rest, V2), {n: owners[n] for n in rest})
    paused()
    pods = driver_pods(cluster)
    assert [p.metadata.uid for p in pods[first[1]]] == [before[first[1]]], "pool a's other node was upgraded"
    assert not client.CoreV1Api(cluster.api).read_node(first[1]).spec.unschedulable
    clear_failure(cluster.api, DRIVER, first[0], delete_pods=False)
    watched.assert_never_two()
