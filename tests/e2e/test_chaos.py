"""The chaos suite (issue 16): the operator, logged in as the chart's ServiceAccount, under faults of
its own process, of the control plane and of the network, on the local cluster only (loopback).

After each fault, the invariants: operands that ran still run (the same DaemonSets, same uid and
generation, unless the fault changed the policy), no duplicate object, no Node created, the status
honest (observedGeneration = generation, Ready only when every operand DaemonSet is rolled out), and
convergence within a bound. Recovery times go to .cache/chaos-results.json (docs/production.md, "What the
chaos tests show").

`make test` runs the quick faults; `make test-chaos` all of them (marker `chaos`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import GPU_PRESENT
from gpu_operator.core.plan import POLICY_CRD
from gpu_operator.core.upgrade.states import STATE_LABEL
from gpu_operator.runtime.client import ApiError, path
from gpu_operator.runtime.sync_client import SyncKube

from .chaos import (
    Component,
    api_ready,
    assert_survived,
    cluster_dir,
    compact_etcd,
    record,
    relay_to,
    relayed_kubeconfig,
    timed,
)
from .kube_helpers import Cluster, wait_for, wait_timeout
from .operator_process import OPERATOR, ROOT, OperatorProcess, chart_operator
from .test_operator import (
    NS,
    apply_policy,
    apply_seed,
    apply_seed_config_maps,
    assert_cleaned_up,
    seed_drivers,
)
from .test_upgrade import V1, V2, upgrade_policy

POLICY = "cluster-policy"
BOUND = wait_timeout(180.0)
"""Convergence after a fault: fresh pods on kwok nodes are ready in seconds, plus one operand-stack
start of the emulators' profile (a fault may restart every node's operands, in parallel)."""
MANAGED = "app.kubernetes.io/managed-by=gpu-operator"
chaos = pytest.mark.chaos


@dataclass(frozen=True)
class Snapshot:
    daemonsets: dict[str, tuple[str, int]]
    """Operand DaemonSet name → (uid, generation)."""
    nodes: frozenset[str]


def snapshot(admin: SyncKube) -> Snapshot:
    daemonsets = admin.list("apps/v1", "DaemonSet", NS, MANAGED)
    nodes = admin.list("v1", "Node")
    return Snapshot(
        {d["metadata"]["name"]: (d["metadata"]["uid"], d["metadata"]["generation"]) for d in daemonsets},
        frozenset(n["metadata"]["name"] for n in nodes),
    )


def honest_and_converged(admin: SyncKube) -> None:
    policy = admin.get("nvidia.com/v1", "ClusterPolicy", POLICY)
    status = policy.get("status") or {}
    assert status.get("observedGeneration") == policy["metadata"]["generation"], "status is stale"
    ready: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    assert status.get("state") == "ready" and ready.get("status") == "True", status.get("conditions")
    # Ready only when it really is: every operand DaemonSet rolled out on every node it targets.
    for ds in admin.list("apps/v1", "DaemonSet", NS, MANAGED):
        st = ds.get("status") or {}
        desired = st.get("desiredNumberScheduled", 0)
        assert st.get("observedGeneration") == ds["metadata"]["generation"], ds["metadata"]["name"]
        # The driver is OnDelete (its pods are replaced by upgrades, not by a template change).
        on_delete = ds["spec"]["updateStrategy"]["type"] == "OnDelete"
        updated = desired if on_delete else st.get("updatedNumberScheduled", 0)
        assert st.get("numberReady", 0) == desired and updated == desired, (
            f"{ds['metadata']['name']} not rolled out but the status says ready: {st}"
        )


def assert_invariants(
    admin: SyncKube, before: Snapshot, changed: bool = False, nodes: frozenset[str] | None = None
) -> float:
    """The invariants after a fault; seconds until converged."""
    seconds = timed(lambda: honest_and_converged(admin), BOUND, "converged and honest after the fault")
    after = snapshot(admin)
    assert sorted(after.daemonsets) == sorted(before.daemonsets), "operand DaemonSets added or lost"
    uids = {name: uid for name, (uid, _) in after.daemonsets.items()}
    assert uids == {name: uid for name, (uid, _) in before.daemonsets.items()}, (
        "an operand DaemonSet was replaced"
    )
    if not changed:
        assert after.daemonsets == before.daemonsets, "an operand DaemonSet rolled, the policy did not change"
    assert after.nodes <= (nodes if nodes is not None else before.nodes), "a Node was created"
    return seconds


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> SyncKube:
    if not cluster.local:
        pytest.skip("faults of the control plane need the local cluster")
    return cluster.api


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, admin: SyncKube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with chart_operator(cluster, tmp_path_factory.mktemp("chaos"), NS) as process:
        apply_seed_config_maps(cluster)  # what the seed sample names, there before it is applied
        yield process


@pytest.fixture
def converged(cluster: Cluster, admin: SyncKube, operator: OperatorProcess) -> Iterator[Snapshot]:
    """The seed sample applied and converged; removed (and the operator healthy) afterwards."""
    if not operator.running:
        operator.start()
    apply_seed(cluster, POLICY)
    wait_for(lambda: honest_and_converged(admin), timeout=BOUND, what="converged before the fault")
    try:
        yield snapshot(admin)
    finally:
        wait_for(lambda: api_ready(admin), timeout=120, what="API server back")
        if not operator.running:
            operator.start()
        delete_seed(admin)
        wait_for(lambda: assert_cleaned_up(cluster), timeout=BOUND, what="cleanup after the fault")
        assert_survived(operator)


def edit_policy(admin: SyncKube) -> None:
    """A policy change (a new generation) that every operand DaemonSet follows: a label of ours on
    them, so each rolls (a new generation) without being replaced."""
    body = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": POLICY}}
    spec = {"daemonsets": {"labels": {"chaos": str(int(time.time()))}}}
    admin.apply({**body, "spec": spec}, manager="chaos-edit")


def delete_seed(admin: SyncKube) -> None:
    """The seed sample's ClusterPolicy and NVIDIADrivers deleted (the operator then removes the rest)."""
    for driver in seed_drivers():
        with contextlib.suppress(ApiError):
            admin.delete(("nvidia.com/v1alpha1", "NVIDIADriver", "", driver["metadata"]["name"]))
    with contextlib.suppress(ApiError):
        admin.delete(("nvidia.com/v1", "ClusterPolicy", "", POLICY))


def wanted_daemonsets(admin: SyncKube, policy: dict[str, Any], scratch: Path) -> list[str]:
    """The operand DaemonSets the planner wants for `policy` and the cluster's NVIDIADrivers (as the API
    server has them: their names hash their uid) on the cluster's nodes, from `gpu-operator render`
    (offline): after the faults there must be exactly these, once each."""
    drivers = admin.list("nvidia.com/v1alpha1", "NVIDIADriver")
    (scratch / "policy.yaml").write_text(yaml.safe_dump_all([policy, *drivers]))
    nodes = {"apiVersion": "v1", "kind": "List", "items": admin.list("v1", "Node")}
    (scratch / "nodes.yaml").write_text(yaml.safe_dump(nodes))
    command = [str(OPERATOR), "render", "-f", "policy.yaml", "--nodes", "nodes.yaml", "--namespace", NS]
    rendered = subprocess.run(command, cwd=scratch, check=True, capture_output=True, text=True).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    return sorted(o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet")


def restore_nodes(cluster: Cluster, gpu: int = 4) -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT), "cluster-up", f"NODES={gpu}", "CPU_NODES=1"], check=True)


# --- quick faults (make test) ---------------------------------------------------------------------


def test_deletions_missed_while_no_watch_was_open_are_forgotten(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    """The operator is frozen, a GPU node is deleted, etcd compacted and the API server restarted (its
    watch cache gone): the operator's watches resume from a resourceVersion that is too old (410
    Gone), Kopf lists again without reporting the deletion; the Store must forget the node anyway."""
    apiserver = Component.of(cluster_dir(cluster), "kube-apiserver")
    gone = "gpu-node-3"
    assert operator.process is not None
    try:
        operator.process.send_signal(signal.SIGSTOP)
        try:
            # Its connections go first (it does not notice, frozen), then the node, then the history.
            restart(apiserver, admin)
            admin.delete(("v1", "Node", "", gone))
            wait_for(lambda: node_gone(admin, gone), timeout=60, what=f"{gone} deleted")
            compact_etcd(cluster)
            restart(apiserver, admin)
        finally:
            operator.process.send_signal(signal.SIGCONT)

        def three_gpu_nodes() -> None:
            status = admin.get("nvidia.com/v1", "ClusterPolicy", POLICY).get("status") or {}
            assert status.get("gpuNodes") == 3, (
                f"the operator still counts {status.get('gpuNodes')} GPU nodes"
            )
            _, body = operator.probe("healthz")
            assert body["reconcile"]["nodes"] == len(converged.nodes) - 1, body

        seconds = timed(three_gpu_nodes, BOUND, "the deleted node forgotten")
        record("missed-deletion", forgotten_after_s=seconds)
        assert_invariants(admin, converged, nodes=converged.nodes - {gone})
    finally:
        restore_nodes(cluster)


def restart(component: Component, admin: SyncKube) -> None:
    component.kill()
    component.start()
    wait_for(lambda: api_ready(admin), timeout=120, what="API server back")


def node_gone(admin: SyncKube, name: str) -> None:
    try:
        admin.get("v1", "Node", name)
    except ApiError as exc:
        if exc.status == 404:
            return
        raise
    raise AssertionError(f"{name} still there")


def test_crd_deleted_and_restored(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    """Deleting the CRD deletes every ClusterPolicy (and the garbage collector their operands): the
    operator keeps running, creates the CRD again (operator.createCRD, the chart's default) and
    converges when a policy comes back."""
    crd_path = path("apiextensions.k8s.io/v1", "CustomResourceDefinition", name=POLICY_CRD)
    started = time.monotonic()
    admin.request("DELETE", crd_path)

    def recreated() -> None:
        try:
            crd = admin.request("GET", crd_path)
        except ApiError as exc:
            raise AssertionError(f"no CRD: {exc}") from None
        assert not crd["metadata"].get("deletionTimestamp"), "still being deleted"
        conditions = (crd.get("status") or {}).get("conditions") or []
        established = {c["type"]: c["status"] for c in conditions}
        assert established.get("Established") == "True"

    wait_for(recreated, timeout=BOUND, what="the CRD created again by the operator")
    recreated_s = round(time.monotonic() - started, 1)
    assert operator.running, "the operator exited"
    assert operator.probe("healthz")[0] == 200
    apply_seed(cluster, POLICY)
    seconds = timed(lambda: honest_and_converged(admin), BOUND, "converged on the policy re-created")
    record("crd-deleted", crd_recreated_s=recreated_s, converged_after_policy_s=seconds)
    after = snapshot(admin)
    assert sorted(after.daemonsets) == sorted(converged.daemonsets) and after.nodes <= converged.nodes


def test_standby_takes_over_when_the_leader_is_killed(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    standby = OperatorProcess(operator.kubeconfig, NS, operator.log_path.with_name("standby.log")).start()
    try:
        wait_for(
            lambda: ready_as(standby, leader=False), timeout=60, what="the second replica a ready standby"
        )
        assert ready_as(operator, leader=True)
        # The standby writes nothing while the lease is held (not even the Lease): its own metrics.
        assert standby.metric("gpu_operator_api_writes_total") == 0
        operator.kill()
        killed = time.monotonic()
        wait_for(lambda: ready_as(standby, leader=True), timeout=30, what="the standby leading")
        takeover = round(time.monotonic() - killed, 1)
        assert takeover <= 19.0 + 5.0, f"takeover took {takeover}s (lease 15 s, retry 2 s; the probe adds)"
        edit_policy(admin)
        seconds = assert_invariants(admin, converged, changed=True)
        record("leader-killed", takeover_s=takeover, converged_after_edit_s=seconds)
        operator.start()  # the old leader comes back as a standby
        wait_for(lambda: ready_as(operator, leader=False), timeout=60, what="the restarted replica a standby")
    finally:
        standby.stop()


def ready_as(process: OperatorProcess, leader: bool) -> bool:
    status, body = process.probe("readyz")
    assert status == 200 and body.get("leader") is leader, (status, body)
    return True


def test_black_hole_between_operator_and_api_server(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    """A relay that stops forwarding without closing: every call of the operator hangs until its
    timeout. The loop keeps making progress (passes fail fast), liveness holds, and an edit made
    during the black hole is acted on soon after it ends."""
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with relay_to(server) as relay:
        operator.stop()
        relayed = relayed_kubeconfig(operator.kubeconfig, relay, operator.kubeconfig.with_name("relayed"))
        through = OperatorProcess(relayed, NS, operator.log_path.with_name("relayed.log")).start()
        try:
            wait_for(lambda: ready_as(through, leader=True), timeout=90, what="the relayed operator leading")
            wait_for(lambda: honest_and_converged(admin), timeout=BOUND, what="converged through the relay")
            relay.black_hole()
            edit_policy(admin)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                assert through.running and through.probe("healthz")[0] == 200, (
                    "liveness failed in a black hole"
                )
                time.sleep(5)  # the black hole is the fault itself; this only observes it
            relay.restore()
            seconds = assert_invariants(admin, converged, changed=True)
            record("black-hole-60s", converged_after_restore_s=seconds)
        finally:
            through.stop()
            operator.start()


def leads(process: OperatorProcess) -> bool:
    status, body = process.probe("readyz")
    return status == 200 and body.get("leader") is True


@chaos
@pytest.mark.parametrize(("gpu_nodes", "replicas"), [(4, 1), (4, 2), (100, 1), (100, 2)])
def test_an_api_server_answering_2_to_8_seconds_late(
    cluster: Cluster,
    admin: SyncKube,
    operator: OperatorProcess,
    converged: Snapshot,
    gpu_nodes: int,
    replicas: int,
) -> None:
    """Every answer of the API server held back 2-8 s (a relay; within the 10 s renew deadline): an
    edit is still rolled out (at 100 nodes, with 96 nodes joining as it is made: a whole rollout
    through the slow API server), at most one replica leads at any moment, and the only replica
    never stops its work for leadership (no pass ends NotLeader, it never stands by)."""
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with relay_to(server) as relay:
        operator.stop()
        relayed = relayed_kubeconfig(operator.kubeconfig, relay, operator.kubeconfig.with_name("slow"))
        logs = [operator.log_path.with_name(f"slow-{replicas}-{i}.log") for i in range(replicas)]
        processes = [OperatorProcess(relayed, NS, log).start() for log in logs]
        try:
            # Slowed down once running (its watches listed, the leader's first pass done), as an API
            # server that saturates during a rollout.
            wait_for(lambda: sum(map(leads, processes)) == 1, timeout=120, what="one replica leading")
            wait_for(lambda: all(p.probe("readyz")[0] == 200 for p in processes), timeout=120, what="ready")
            relay.slow(2.0, 8.0)
            if gpu_nodes > 4:
                restore_nodes(cluster, gpu_nodes)
            edit_policy(admin)
            leaders: list[int] = []

            def rolled_out() -> None:
                leaders.append(sum(map(leads, processes)))
                honest_and_converged(admin)
                status = admin.get("nvidia.com/v1", "ClusterPolicy", POLICY)["status"]
                assert status["gpuNodes"] == gpu_nodes, status["gpuNodes"]
                # The end of every node's chain (it waits for the driver and toolkit to validate).
                plugin = admin.get("apps/v1", "DaemonSet", "nvidia-device-plugin-daemonset", NS)
                assert plugin["status"]["numberReady"] == gpu_nodes, plugin["status"]

            # Every node's chain goes through answers 2-8 s late: a 100-node rollout takes minutes.
            bound = 3 * BOUND * (2 if gpu_nodes > 4 else 1)
            seconds = timed(rolled_out, bound, "the edit rolled out through the slow API server")
            assert max(leaders) <= 1, f"two replicas led at once: {leaders}"
            if replicas == 1:
                text = logs[0].read_text()
                assert "no longer holds the leader lease" not in text and "NotLeader" not in text
                assert "standing by" not in text
            record(f"slow-api-2-8s-{gpu_nodes}-nodes-{replicas}-replicas", converged_after_edit_s=seconds)
        finally:
            for process in processes:
                process.stop()
            operator.start()
            if gpu_nodes > 4:
                restore_nodes(cluster)


# --- the long faults (make test-chaos) -----------------------------------------------------------


@chaos
def test_api_server_killed_and_restarted(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    apiserver = Component.of(cluster_dir(cluster), "kube-apiserver")
    apiserver.kill()
    edit_after = time.monotonic()
    apiserver.start()
    wait_for(lambda: api_ready(admin), timeout=120, what="API server back")
    back = round(time.monotonic() - edit_after, 1)
    edit_policy(admin)
    seconds = assert_invariants(admin, converged, changed=True)
    assert operator.running
    record("apiserver-restart", apiserver_back_s=back, converged_after_edit_s=seconds)


@chaos
def test_api_server_paused_90_seconds(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    apiserver = Component.of(cluster_dir(cluster), "kube-apiserver")
    managers = [Component.of(cluster_dir(cluster), n) for n in ("kube-controller-manager", "kube-scheduler")]
    apiserver.signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            # No restart storm: liveness holds however long the API server is silent.
            assert operator.running and operator.probe("healthz")[0] == 200
            time.sleep(5)  # the pause is the fault itself; this only observes it
    finally:
        apiserver.signal(signal.SIGCONT)
    resumed = time.monotonic()
    wait_for(lambda: api_ready(admin), timeout=60, what="API server answering")
    # kube-controller-manager and kube-scheduler exit when they lose their own leases in the pause;
    # the kubelet would restart them (static pods), here the test does.
    for manager in managers:
        if not manager.running():
            manager.start()
    edit_policy(admin)
    seconds = assert_invariants(admin, converged, changed=True)
    record(
        "apiserver-sigstop-90s", converged_after_resume_s=round(time.monotonic() - resumed, 1), edit_s=seconds
    )


@chaos
def test_etcd_restarted(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, converged: Snapshot
) -> None:
    etcd = Component.of(cluster_dir(cluster), "etcd")
    etcd.kill()
    started = time.monotonic()
    etcd.start()
    wait_for(lambda: api_ready(admin), timeout=120, what="API server ready again")
    back = round(time.monotonic() - started, 1)
    edit_policy(admin)
    seconds = assert_invariants(admin, converged, changed=True)
    record("etcd-restart", api_ready_s=back, converged_after_edit_s=seconds)


@chaos
@pytest.mark.parametrize("gpu_nodes", [4, 50])
def test_sigkill_ten_times_while_converging(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, gpu_nodes: int, tmp_path: Path
) -> None:
    restore_nodes(cluster, gpu_nodes)
    chance = random.Random(gpu_nodes)
    try:
        nodes = snapshot(admin).nodes
        policy = apply_seed(cluster, POLICY)
        wanted = wanted_daemonsets(admin, policy, tmp_path)
        started = time.monotonic()
        for _ in range(10):
            time.sleep(chance.uniform(0.5, 6.0))  # a random moment of the convergence
            operator.kill()
            operator.start()
        seconds = timed(lambda: honest_and_converged(admin), BOUND * 2, "converged after 10 SIGKILLs")
        after = snapshot(admin)
        assert sorted(after.daemonsets) == wanted, "operand DaemonSets missing or left over"
        assert after.nodes == nodes, "a Node was created"
        record(
            f"sigkill-x10-{gpu_nodes}-nodes",
            converged_after_last_kill_s=seconds,
            total_s=round(time.monotonic() - started, 1),
        )
    finally:
        delete_seed(admin)
        wait_for(lambda: assert_cleaned_up(cluster), timeout=BOUND * 2, what="cleanup")
        restore_nodes(cluster)


@chaos
def test_fifty_nodes_added_and_deleted_while_converging(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess
) -> None:
    try:
        nodes = snapshot(admin).nodes
        apply_seed(cluster, POLICY)
        restore_nodes(cluster, 54)
        restore_nodes(cluster, 4)
        seconds = timed(
            lambda: honest_and_converged(admin), BOUND * 2, "converged after 50 nodes came and went"
        )
        status = admin.get("nvidia.com/v1", "ClusterPolicy", POLICY)["status"]
        assert status["gpuNodes"] == 4, status["gpuNodes"]
        assert snapshot(admin).nodes == nodes, "a Node was created (or one of ours is left)"
        record("50-nodes-churn", converged_s=seconds)
    finally:
        delete_seed(admin)
        wait_for(lambda: assert_cleaned_up(cluster), timeout=BOUND * 2, what="cleanup")
        restore_nodes(cluster)


@chaos
@pytest.mark.parametrize(("gpu_nodes", "parallel"), [(10, 3), (50, 5)], ids=["10-nodes", "50-nodes"])
def test_upgrade_with_driver_and_validator_pods_deleted_at_random(
    cluster: Cluster, admin: SyncKube, operator: OperatorProcess, gpu_nodes: int, parallel: int
) -> None:
    """A driver upgrade of many GPU nodes while driver and validator pods are deleted by hand at random
    moments, as people and NVIDIA's own update test do: every node ends done at the new version,
    validated after its new driver, none cordoned, and no node ever runs two driver pods at once.
    Records the time to done and the longest any node stayed at each step (`make test-chaos`; under
    SIM_PROFILE=realistic for the numbers in bench/README.md)."""
    restore_nodes(cluster, gpu_nodes)
    chance = random.Random(gpu_nodes)
    waves = -(-gpu_nodes // parallel)
    bound = wait_timeout(BOUND * 2, node_starts=2 * waves)
    upgrade = {
        "maxParallelUpgrades": parallel,
        "maxUnavailable": "100%",
        "validation": {"timeoutSeconds": 600},
    }
    clock = StepClock(admin)
    try:
        apply_policy(cluster, upgrade_policy(V1, **upgrade))
        wait_for(lambda: all_done(admin, V1, gpu_nodes), timeout=bound, what=f"every node at {V1}")
        clock.start()
        apply_policy(cluster, upgrade_policy(V2, **upgrade))
        started = time.monotonic()
        deleted: dict[str, int] = {DRIVER_COMPONENT: 0, VALIDATOR_COMPONENT: 0}
        while sum(deleted.values()) < 3 * waves and clock.in_progress():
            time.sleep(chance.uniform(0.5, 4.0))  # a random moment of the rollout
            component = chance.choice(sorted(deleted))
            pods = admin.list("v1", "Pod", NS, f"app.kubernetes.io/component={component}")
            if pods:
                victim = chance.choice(pods)["metadata"]
                with contextlib.suppress(ApiError):  # gone meanwhile
                    admin.delete(("v1", "Pod", NS, victim["name"]))
                    deleted[component] += 1
        seconds = timed(
            lambda: all_done(admin, V2, gpu_nodes), bound, "every node upgraded after the deletions"
        )
        clock.stop()
        assert sum(deleted.values()), "nothing was deleted"
        assert clock.most_driver_pods == 1, f"a node ran two driver pods at once: {clock.most_driver_pods}"
        record(
            f"upgrade-{gpu_nodes}-nodes-{parallel}-parallel-random-pod-deletions",
            profile=f"{os.environ.get('SIM_PROFILE', 'instant')}x{os.environ.get('SIM_TIME_SCALE', '1')}",
            driver_pods_deleted=deleted[DRIVER_COMPONENT],
            validator_pods_deleted=deleted[VALIDATOR_COMPONENT],
            done_after_last_deletion_s=seconds,
            total_s=round(time.monotonic() - started, 1),
            longest_at_step_s=json.dumps(clock.longest()),
        )
    finally:
        clock.stop()
        delete_seed(admin)
        wait_for(lambda: assert_cleaned_up(cluster), timeout=BOUND * 2, what="cleanup")
        restore_nodes(cluster)


class StepClock:
    """Samples every half second which upgrade step each GPU node is at, and how many live driver pods
    each runs: how long each node stayed at each step, and whether one ever ran two."""

    def __init__(self, admin: SyncKube) -> None:
        self.admin = admin
        self.spans: dict[tuple[str, str], list[float]] = {}
        """(node, step) → [first seen, last seen] (monotonic seconds)."""
        self.current: dict[str, str] = {}
        self.most_driver_pods = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def in_progress(self) -> bool:
        return not self.current or any(step != "upgrade-done" for step in self.current.values())

    def longest(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for (_, step), (first, last) in self.spans.items():
            if step not in ("", "upgrade-done"):  # not waits: before the change, and the end
                found[step] = round(max(found.get(step, 0.0), last - first), 1)
        return dict(sorted(found.items()))

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(ApiError):
                now = time.monotonic()
                for node in self.admin.list("v1", "Node", "", f"{GPU_PRESENT}=true"):
                    name = node["metadata"]["name"]
                    step = (node["metadata"].get("labels") or {}).get(STATE_LABEL, "")
                    self.current[name] = step
                    self.spans.setdefault((name, step), [now, now])[1] = now
                counts = live_driver_pods(self.admin).values()
                self.most_driver_pods = max(self.most_driver_pods, *counts, 0)


DRIVER_COMPONENT = BY_NAME["driver"].component_label
VALIDATOR_COMPONENT = BY_NAME["operator-validator"].component_label


def live_driver_pods(admin: SyncKube) -> dict[str, int]:
    """Node → its driver pods not being deleted."""
    found: dict[str, int] = {}
    for pod in admin.list("v1", "Pod", NS, f"app.kubernetes.io/component={DRIVER_COMPONENT}"):
        if not pod["metadata"].get("deletionTimestamp"):
            node = pod["spec"].get("nodeName", "")
            found[node] = found.get(node, 0) + 1
    return found


def all_done(admin: SyncKube, version: str, gpu_nodes: int) -> None:
    """Every GPU node upgrade-done and uncordoned, its one driver pod Ready at `version`, its validator
    pod Ready and started after that driver pod; the status says up to date."""
    nodes = [n for n in admin.list("v1", "Node") if (n["metadata"].get("labels") or {}).get(GPU_PRESENT)]
    assert len(nodes) == gpu_nodes, [n["metadata"]["name"] for n in nodes]
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    for component in (DRIVER_COMPONENT, VALIDATOR_COMPONENT):
        for pod in admin.list("v1", "Pod", NS, f"app.kubernetes.io/component={component}"):
            pods[component, pod["spec"].get("nodeName", "")] = pod
    for node in nodes:
        name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
        assert labels.get(STATE_LABEL) == "upgrade-done", f"{name}: {labels.get(STATE_LABEL)}"
        assert not node["spec"].get("unschedulable"), f"{name} cordoned"
        driver, validator = pods.get((DRIVER_COMPONENT, name)), pods.get((VALIDATOR_COMPONENT, name))
        assert driver is not None and validator is not None, f"{name}: driver or validator pod missing"
        tag = driver["spec"]["containers"][0]["image"].rsplit(":", 1)[-1]
        assert tag.startswith(version), f"{name}: not at {version} ({tag})"
        for pod in (driver, validator):
            assert ready(pod), f"{name}: {pod['metadata']['name']} not ready"
        assert validator["metadata"]["creationTimestamp"] >= driver["metadata"]["creationTimestamp"], (
            f"{name}: the validator ran before the new driver"
        )
    status = admin.get("nvidia.com/v1", "ClusterPolicy", POLICY).get("status") or {}
    assert (status.get("driverUpgrade") or {}).get("summary") == "up to date", status.get("driverUpgrade")


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    alive = not pod["metadata"].get("deletionTimestamp")
    return alive and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
