"""What the Store's recorders say about a watched change: that a decision may change (a pass at once),
that it only shows in the status (a pass soon), or nothing at all (a DaemonSet's status counts)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

from builders import condition, daemonset_body, node_body, operand_pod, operand_pod_body

from gpu_operator.core.components import BY_NAME, COMPONENTS
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.status import operands_by_node, pods_by_node
from gpu_operator.runtime.store import Store


def test_a_pod_whose_reason_alone_changed_only_asks_for_a_pass_soon() -> None:
    shown: list[bool] = []
    store = Store(shown=lambda: shown.append(True))

    def pod(ready: bool, waiting: str = "") -> dict[str, Any]:
        status = {"initContainerStatuses": [{"state": {"waiting": {"reason": waiting}}}]} if waiting else {}
        return operand_pod_body(
            "t1", "container-toolkit", conditions=[condition("Ready", ready)], status=status
        )

    assert store.record_pod(pod(False, "PodInitializing"), False), "a new pod decides"
    assert not store.record_pod(pod(False, "CrashLoopBackOff"), False) and shown == [True]
    assert store.get("pods", "gpu-operator/t1").reason == "CrashLoopBackOff", "kept, to be shown"
    assert not store.record_pod(pod(False, "CrashLoopBackOff"), False) and len(shown) == 1
    assert store.record_pod(pod(True), False), "ready decides"
    assert store.record_pod(pod(True), True), "so does a pod gone"


def test_a_driver_pod_past_its_init_containers_decides() -> None:
    """The toolkit is labelled once the driver pod is Initialized (gpu_operator/core/node_labels.py)."""
    store = Store()

    def pod(initialized: bool) -> dict[str, Any]:
        conditions = [condition("Initialized", initialized), condition("Ready", False)]
        return operand_pod_body("d1", "nvidia-driver", conditions=conditions)

    assert store.record_pod(pod(False), False)
    assert store.get("pods", "gpu-operator/d1").reason == "Pending"
    assert store.record_pod(pod(True), False), "Initialized decides"
    assert store.get("pods", "gpu-operator/d1").initialized
    assert not store.record_pod(pod(True), False)


def test_a_daemonsets_status_counts_only_when_its_rollout_changes() -> None:
    store = Store()

    def ds(version: int, ready: int, desired: int = 3, generation: int = 1) -> dict[str, Any]:
        return daemonset_body(
            "nvidia-dcgm",
            "dcgm",
            ready=ready,
            desired=desired,
            resource_version=str(version),
            generation=generation,
        )

    assert store.record_managed(ds(1, 0), False)
    assert not store.record_managed(ds(2, 1), False), "1 of 3 ready: nothing the plan reads changed"
    assert store.get("daemonsets", ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dcgm")).ready == 1
    assert not store.record_managed(ds(3, 2, desired=4), False)
    assert store.record_managed(ds(4, 4, desired=4), False), "rolled out"
    assert store.record_managed(ds(5, 5, desired=5), False), "rolled out on another node count"
    assert store.record_managed(ds(6, 5, desired=5, generation=2), False), "edited"
    going = ds(7, 5, desired=5, generation=2)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert store.record_managed(going, False), "being deleted (its pods orphaned or going with it)"
    assert store.get("objects", ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dcgm")).deleting


def test_the_pod_that_speaks_for_each_slot_is_kept_as_pods_come_and_go() -> None:
    rng = random.Random(7)
    store = Store()
    for step in range(400):
        key = f"gpu-operator/p{rng.randrange(12)}"
        if rng.random() < 0.2:
            store.put("pods", key, None)
        else:
            pod = operand_pod(
                key,
                rng.choice(["driver", "dcgm"]),
                rng.choice(["gpu-0", "gpu-1"]),
                rng.random() < 0.5,
                terminating=rng.random() < 0.3,
                created=f"2026-12-01T00:00:{rng.randrange(60):02d}Z",
            )
            store.put("pods", key, pod)
        if step % 50 == 0:
            store.retain("pods", {k for k in store.pods if rng.random() < 0.8})
        rows = dict(store.operands)
        store.put("pods", key, store.pods.get(key))  # the same pod again
        assert all(store.operands[node] is row for node, row in rows.items()), "rows kept as they were"
        assert store.speaking == pods_by_node(store.pods.values())
        assert store.operands == operands_by_node(store.speaking)
        assert {k for keys in store.slots.values() for k in keys} == set(store.pods)
    snapshot = store.snapshot("gpu-operator", {})
    assert snapshot.speaking == pods_by_node(store.pods.values())
    assert snapshot.operands == operands_by_node(snapshot.speaking)


def test_a_pod_change_gives_its_node_a_new_row_and_leaves_the_others_as_they_are() -> None:
    """What the per-node memos rely on to find an unchanged node by one comparison (plan, status)."""
    store = Store()
    pods = {
        node: operand_pod(f"gpu-operator/d-{node}", "driver", node, False, created="2026-12-01T00:00:00Z")
        for node in ("gpu-0", "gpu-1")
    }
    for pod in pods.values():
        store.put("pods", pod.name, pod)
    before = dict(store.operands)
    ready = replace(pods["gpu-0"], ready=True)
    store.put("pods", ready.name, ready)
    assert store.operands["gpu-1"] is before["gpu-1"]
    assert store.operands["gpu-0"] is not before["gpu-0"]
    assert store.operands["gpu-0"][COMPONENTS.index(BY_NAME["driver"])] is ready
    store.put("pods", ready.name, None)
    assert "gpu-0" not in store.operands, "a node without operand pods has no row"


def test_a_writer_waits_for_the_watch_to_bring_a_nodes_new_version() -> None:
    """reconciler._node_after_conflict: the new version (or the node's deletion) ends the wait; nothing
    in time, and the caller reads the node itself."""
    store = Store()
    store.put("nodes", "gpu-0", NodeInfo("gpu-0", {}, uid="u0", resource_version="41"))
    moved = NodeInfo("gpu-0", {}, uid="u0", resource_version="57")

    async def script() -> None:
        assert await store.wait_node("gpu-0", "41", 0.01) == (False, store.get("nodes", "gpu-0"))
        loop = asyncio.get_running_loop()
        loop.call_soon(store.record_node, node_body("gpu-0", uid="u0", resource_version="57"), False)
        arrived, found = await store.wait_node("gpu-0", "41", 60.0)
        assert arrived and found == moved and found.resource_version == "57"
        loop.call_soon(store.put, "nodes", "gpu-0", None)
        assert await store.wait_node("gpu-0", "57", 60.0) == (True, None)

    asyncio.run(script())


def driver_body(spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": "h100", "uid": "u1", "generation": 1, **metadata}, "spec": spec}


def test_an_nvidiadriver_wakes_a_pass_for_its_spec_identity_and_deletion_not_its_status() -> None:
    store = Store()
    spec = {"version": "595.91.07", "nodeSelector": {"pool": "h100"}}
    assert store.record_driver(driver_body(spec), False)
    # Our own status write coming back: kept (the next status is compared with it), no pass.
    assert not store.record_driver({**driver_body(spec), "status": {"state": "ready"}}, False)
    assert store.get("drivers", "h100").status == {"state": "ready"}
    assert store.record_driver(driver_body({**spec, "version": "600.1.2"}, generation=2), False)
    assert store.record_driver(driver_body({**spec, "version": "600.1.2"}, generation=2, uid="u2"), False)
    deleting = driver_body({**spec, "version": "600.1.2"}, generation=2, uid="u2", deletionTimestamp="t")
    assert store.record_driver(deleting, False)
    assert store.get("drivers", "h100").deleting
    assert store.record_driver(deleting, True) and store.snapshot("ns", {}).drivers == ()


def test_an_nvidiadriver_spec_that_does_not_parse_is_kept_with_its_errors() -> None:
    store = Store()
    store.record_driver(driver_body({"default": True, "nodeSelector": {"a": "b"}, "version": "1.2.3"}), False)
    ref = store.snapshot("ns", {}).drivers[0]
    assert ref.spec is None and [e.path for e in ref.errors] == ["spec.nodeSelector"]


def test_the_snapshot_names_the_driver_daemonsets_by_uid() -> None:
    store = Store()
    store.put("driver_daemonsets", "ds-uid", "nvidia-gpu-driver-ubuntu22.04-x")
    assert store.snapshot("ns", {}).driver_daemonsets == {"ds-uid": "nvidia-gpu-driver-ubuntu22.04-x"}
