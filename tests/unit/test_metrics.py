"""Metrics: NVIDIA's reconciliation metrics from a pass's plan, per-component gauges, API writes counted
in runtime/client.py's request path, and the HTTP server that serves them with the probes."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from builders import PCI, operand_daemonset, operand_pod

from gpu_operator.api import parse_spec
from gpu_operator.core.components import BY_NAME, COMPONENTS
from gpu_operator.core.driver_pool_counts import PoolCounts
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.plan import Observed, Plan, PolicyRef, build
from gpu_operator.runtime import metrics, server
from gpu_operator.runtime.client import ApiError, Kube

NOW = "2026-01-01T00:00:00Z"


def value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def counter(name: str, **labels: str) -> float:
    return value(name, **labels) or 0.0


def plan_for(spec: dict[str, Any] | None, ready_pods: bool = False, nodes: int = 2) -> Plan:
    """A plan for `nodes` fresh GPU nodes; with `ready_pods`, every enabled component is labelled,
    rolled out and ready on every node."""
    policies = () if spec is None else (PolicyRef("p", "uid", 1, NOW, spec, {}),)
    names = [f"gpu-{i}" for i in range(nodes)]
    components = [
        c.name for c in COMPONENTS if ready_pods and spec is not None and c.enabled(parse_spec(spec))
    ]
    labels = {PCI: "true", **{f"nvidia.com/gpu.deploy.{c}": "true" for c in components}}
    infos = {name: NodeInfo(name, labels) for name in names}
    pods = tuple(operand_pod(f"{c}-{n}", c, n, created=NOW) for c in components for n in names)
    daemonsets = {ds: operand_daemonset(ds, c, nodes) for c in components for ds in [BY_NAME[c].daemonset]}
    return build(Observed(policies, infos, pods, daemonsets, {}, "gpu-operator"), NOW)


def test_no_policy_is_unavailable_and_not_counted() -> None:
    before = counter("gpu_operator_reconciliation_total")
    metrics.observe_pass(plan_for(None), {}, 3, 0.01)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_POLICY_UNAVAILABLE
    assert value("gpu_operator_gpu_nodes_total") == 3
    assert counter("gpu_operator_reconciliation_total") == before
    assert value("gpu_operator_component_ready", component="driver") is None


def test_nvidiadriver_series_follow_the_drivers_and_go_with_them() -> None:
    plan = plan_for({})
    pools = {"h100": PoolCounts("notReady", 3, 2), "l4": PoolCounts("disabled", 0, 0)}
    metrics.observe_pass(replace(plan, driver_pools=pools), {}, 3, 0.01)
    assert value("gpu_operator_nvidiadriver_nodes_desired", nvidiadriver="h100") == 3
    assert value("gpu_operator_nvidiadriver_nodes_ready", nvidiadriver="h100") == 2
    assert value("gpu_operator_nvidiadriver_state", nvidiadriver="h100", state="notReady") == 1
    assert value("gpu_operator_nvidiadriver_state", nvidiadriver="h100", state="ready") == 0
    assert value("gpu_operator_nvidiadriver_state", nvidiadriver="l4", state="disabled") == 1
    # Without a valid ClusterPolicy the NVIDIADrivers still have a state (notReady: none is active).
    no_policy = replace(plan_for(None), driver_pools={"h100": PoolCounts("notReady", 0, 0)})
    metrics.observe_pass(no_policy, {}, 3, 0.01)
    assert value("gpu_operator_nvidiadriver_nodes_desired", nvidiadriver="h100") == 0
    assert value("gpu_operator_nvidiadriver_nodes_desired", nvidiadriver="l4") is None, "deleted: gone"
    assert value("gpu_operator_nvidiadriver_state", nvidiadriver="l4", state="disabled") is None
    metrics.observe_pass(plan, {}, 3, 0.01)
    assert value("gpu_operator_nvidiadriver_state", nvidiadriver="h100", state="notReady") is None


def test_invalid_policy_is_unavailable() -> None:
    metrics.observe_pass(plan_for({"driver": {"enabled": "maybe"}}), {}, 2, 0.01)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_POLICY_UNAVAILABLE


def test_rolling_out_is_not_ready_and_counts_components() -> None:
    total, failed = (
        counter("gpu_operator_reconciliation_total"),
        counter("gpu_operator_reconciliation_failed_total"),
    )
    metrics.observe_pass(plan_for({}), {}, 2, 0.2)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_NOT_READY
    assert counter("gpu_operator_reconciliation_total") == total + 1
    assert counter("gpu_operator_reconciliation_failed_total") == failed + 1
    # First pass on fresh nodes: the driver is labelled everywhere, the rest waits for it.
    assert value("gpu_operator_component_nodes_desired", component="driver") == 2
    assert value("gpu_operator_component_nodes_ready", component="driver") == 0
    assert value("gpu_operator_component_nodes_waiting", component="device-plugin") == 2
    assert value("gpu_operator_component_nodes_failing", component="driver") == 0
    assert value("gpu_operator_component_ready", component="driver") == 0
    assert value("gpu_operator_component_ready", component="node-status-exporter") is None, "off by default"


def test_ready_pass_is_a_success_and_disabled_components_drop_out() -> None:
    plan = plan_for({}, ready_pods=True)
    assert plan.active is not None and plan.statuses["p"].state == "ready", plan.statuses["p"]
    metrics.observe_pass(plan, {}, 2, 0.05)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_SUCCESS
    assert (value("gpu_operator_reconciliation_last_success_ts_seconds") or 0) > 1.7e9
    assert value("gpu_operator_component_ready", component="device-plugin") == 1
    assert value("gpu_operator_component_nodes_ready", component="device-plugin") == 2
    metrics.observe_pass(plan_for({"devicePlugin": {"enabled": False}}, ready_pods=True), {}, 2, 0.05)
    assert value("gpu_operator_component_ready", component="device-plugin") is None
    assert value("gpu_operator_component_ready", component="driver") == 1


def test_rejected_writes_make_a_ready_pass_a_failure() -> None:
    failed = counter("gpu_operator_reconciliation_failed_total")
    metrics.observe_pass(plan_for({}, ready_pods=True), {"driver": "422 Invalid"}, 2, 0.05)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_NOT_READY
    assert counter("gpu_operator_reconciliation_failed_total") == failed + 1


def test_aborted_passes() -> None:
    metrics.observe_aborted_pass(0.5, operator_error=False)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_NOT_READY
    metrics.observe_aborted_pass(0.5, operator_error=True)
    assert value("gpu_operator_reconciliation_status") == metrics.STATUS_OPERATOR_ERROR


def test_pass_duration_histogram() -> None:
    count = counter("gpu_operator_reconciliation_duration_seconds_count")
    slow = counter("gpu_operator_reconciliation_duration_seconds_bucket", le="1.0")
    metrics.observe_pass(plan_for(None), {}, 0, 3.0)
    assert counter("gpu_operator_reconciliation_duration_seconds_count") == count + 1
    assert counter("gpu_operator_reconciliation_duration_seconds_bucket", le="1.0") == slow
    assert counter("gpu_operator_reconciliation_duration_seconds_bucket", le="5.0") >= count + 1


def test_watch_events() -> None:
    before = counter("gpu_operator_watch_events_total", kind="Pod", type="LISTED")
    metrics.observe_watch_event("Pod", None)
    metrics.observe_watch_event("Pod", "MODIFIED")
    assert counter("gpu_operator_watch_events_total", kind="Pod", type="LISTED") == before + 1
    assert counter("gpu_operator_watch_events_total", kind="Pod", type="MODIFIED") >= 1


# --- API writes, counted in runtime/client.py --------------------------------------------------------------


class FakeResponse:
    """What `ApiClient.call_api(..., _preload_content=False)` answers: aiohttp's response, unread."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        self.status = status
        self.body = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeApiClient:
    """The ApiClient methods runtime/client.py uses; answers with `status`, or fails to connect."""

    def __init__(self, status: int = 200, connect: bool = True) -> None:
        self.status = status
        self.connect = connect

    async def call_api(self, resource_path: str, method: str, **_: Any) -> FakeResponse:
        if not self.connect:
            raise aiohttp.ClientConnectionError("refused")
        return FakeResponse(self.status, {"kind": "Status", "reason": "Invalid", "message": "bad"})

    async def close(self) -> None:
        pass


def kube(status: int = 200, connect: bool = True) -> Kube:
    return Kube(cast(Any, FakeApiClient(status, connect)))


DAEMONSET = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x", "namespace": "ns"}}


def test_writes_are_counted_by_verb_kind_and_code() -> None:
    def writes(verb: str, kind: str, code: str) -> float:
        return counter("gpu_operator_api_writes_total", verb=verb, kind=kind, code=code)

    applied, rejected, failed = writes("apply", "DaemonSet", "200"), writes("apply", "DaemonSet", "422"), 0.0
    failed = writes("delete", "DaemonSet", "<error>")
    asyncio.run(kube().apply(DAEMONSET))
    with pytest.raises(ApiError):
        asyncio.run(kube(422).apply(DAEMONSET))
    with pytest.raises(ApiError) as unanswered:
        asyncio.run(kube(connect=False).delete(("apps/v1", "DaemonSet", "ns", "x")))
    assert unanswered.value.status == 0
    assert writes("apply", "DaemonSet", "200") == applied + 1
    assert writes("apply", "DaemonSet", "422") == rejected + 1
    assert writes("delete", "DaemonSet", "<error>") == failed + 1
    statuses = writes("patch", "ClusterPolicy", "200")
    asyncio.run(kube().patch_status("p", {"state": "ready"}))
    assert writes("patch", "ClusterPolicy", "200") == statuses + 1


def test_reads_are_not_writes() -> None:
    def total() -> float:
        return sum(
            s.value
            for family in metrics.REGISTRY.collect()
            if family.name == "gpu_operator_api_writes"
            for s in family.samples
        )

    before = total()
    asyncio.run(kube().get("v1", "Node", "n"))
    asyncio.run(kube().list("v1", "Pod"))
    assert total() == before


# --- the HTTP server -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("0.0.0.0:8080", ("0.0.0.0", 8080)),
        (":9090", ("0.0.0.0", 9090)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert server.parse_address(address) == expected


@pytest.mark.parametrize("address", ["8080", "a:b", "x:99999", "http://x:1/healthz", "[::1]", ""])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        server.parse_address(address)


def test_server_serves_probes_and_metrics() -> None:
    readiness = {"ready": False}

    def health() -> tuple[bool, Mapping[str, Any]]:
        return True, {"reconcile": {"passes": 1}}

    def ready() -> tuple[bool, Mapping[str, Any]]:
        return readiness["ready"], {"firstPassDone": readiness["ready"]}

    async def scenario() -> dict[str, Any]:
        running = await server.start("127.0.0.1:0", health, ready, metrics.REGISTRY)
        seen: dict[str, Any] = {"url": running.url}
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(running.url + "/healthz") as response:
                    seen["healthz"] = (response.status, await response.json())
                async with session.get(running.url + "/readyz") as response:
                    seen["not ready"] = (response.status, await response.json())
                readiness["ready"] = True
                async with session.get(running.url + "/readyz") as response:
                    seen["ready"] = response.status
                async with session.get(running.url + "/metrics") as response:
                    seen["metrics"] = (response.headers["Content-Type"], await response.text())
                headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
                async with session.get(running.url + "/metrics", headers=headers) as response:
                    seen["openmetrics"] = response.headers["Content-Type"]
                async with session.get(running.url + "/nothing") as response:
                    seen["404"] = response.status
        finally:
            await running.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen["url"].startswith("http://127.0.0.1:") and not seen["url"].endswith(":0")
    assert seen["healthz"] == (200, {"reconcile": {"passes": 1}})
    assert seen["not ready"] == (503, {"firstPassDone": False})
    assert seen["ready"] == 200
    content_type, text = seen["metrics"]
    assert content_type.startswith("text/plain")
    assert "# TYPE gpu_operator_reconciliation_status gauge" in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text
    assert seen["openmetrics"].startswith("application/openmetrics-text")
    assert seen["404"] == 404


def test_operator_probes() -> None:
    from gpu_operator.runtime.probes import health, ready
    from gpu_operator.runtime.settings import Settings
    from gpu_operator.runtime.store import Store
    from gpu_operator.runtime.workqueue import WorkQueue

    async def scenario() -> list[tuple[bool, Any]]:
        loop = WorkQueue(Settings())
        seen = [ready(loop), health(loop, Store())]
        loop.started = True
        loop.listed.set()
        seen.append(ready(loop))
        loop.completed.set()
        seen.append(ready(loop))
        seen.append(health(loop, Store()))
        return seen

    before_listing, not_started, listed, done, healthy = asyncio.run(scenario())
    assert before_listing == (False, {"watchesEstablished": False, "firstPassDone": False, "leader": True})
    assert not_started == (True, {"reconcile": {"started": False}})
    assert listed[0] is False and done[0] is True
    assert healthy[0] is True and healthy[1]["reconcile"]["passes"] == 0


def test_run_exits_2_when_its_port_is_taken(tmp_path: Path) -> None:
    """Checked before Kopf starts: one line, no retry loop of a failing startup handler."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [sys.executable, "-m", "gpu_operator.cli", "run", "--listen", address],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"gpu-operator run: cannot serve HTTP on {address}: ")
    assert "Traceback" not in result.stderr
