"""The operator's /metrics, /healthz and /readyz end to end: scraped from the running operator while a
rollout is held back by a failing driver, after it converges, and checked against the API server's
audit log (every write the operator made is counted, by verb)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_operator.core.components import BY_NAME

from .kube_helpers import Cluster, clear_failure, inject_failure, wait_for
from .operator_process import OperatorProcess, chart_operator
from .test_operator import (
    CONVERGE,
    apply_policy,
    assert_cleaned_up,
    delete_policies,
    policy_from,
    writes_by,
)

DRIVER = BY_NAME["driver"].component_label
"""The driver pods' app.kubernetes.io/component label (NVIDIA's `nvidia-driver`)."""

NS = "gpu-operator"
USER = f"system:serviceaccount:{NS}:gpu-operator"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    with chart_operator(cluster, tmp_path_factory.mktemp("metrics"), NS) as process:
        try:
            yield process
        finally:
            delete_policies(cluster)
            wait_for(lambda: assert_cleaned_up(cluster), timeout=CONVERGE, what="operands removed")
            process.assert_clean_log()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(operator: OperatorProcess) -> Samples:
    status, text = get(operator.url() + "/metrics")
    assert status == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_probes_and_metrics_through_a_rollout(
    cluster: Cluster, operator: OperatorProcess, failures: None
) -> None:
    if cluster.audit_log is None:
        pytest.skip("compares with the local cluster's audit log")
    started = time.time() - 1  # the audit log has whole seconds; this operator started after it

    def ready() -> None:
        # A standby is ready too (200, leader false): the previous module's operator may not have
        # handed the lease back, and this one then takes it over only once it expires (within 19 s).
        status, body = get(operator.url() + "/readyz")
        assert status == 200, body
        assert json.loads(body) == {"watchesEstablished": True, "firstPassDone": True, "leader": True}

    wait_for(ready, timeout=60, what="/readyz of the leader")
    status, body = get(operator.url() + "/healthz")
    assert status == 200 and json.loads(body)["reconcile"]["nodes"] == 5, body
    idle = scrape(operator)
    assert value(idle, "gpu_operator_reconciliation_status") == -1, "no ClusterPolicy yet"
    assert value(idle, "gpu_operator_gpu_nodes_total") == 4
    assert (value(idle, "gpu_operator_watch_events_total", kind="Node", type="LISTED") or 0) >= 5

    # A rollout that cannot finish: the driver crash-loops on gpu-node-1.
    inject_failure(cluster.api, DRIVER, "gpu-node-1", "CrashLoopBackOff")
    apply_policy(cluster, policy_from("empty"))

    def held_back() -> Samples:
        samples = scrape(operator)
        assert value(samples, "gpu_operator_component_nodes_failing", component="driver") == 1, samples
        assert value(samples, "gpu_operator_component_nodes_ready", component="device-plugin") == 3
        return samples

    rolling = wait_for(held_back, timeout=CONVERGE, what="metrics of the held-back rollout")
    assert value(rolling, "gpu_operator_reconciliation_status") == 0
    assert value(rolling, "gpu_operator_component_ready", component="driver") == 0
    assert value(rolling, "gpu_operator_component_nodes_desired", component="driver") == 4
    assert value(rolling, "gpu_operator_component_nodes_waiting", component="container-toolkit") == 1
    assert (value(rolling, "gpu_operator_reconciliation_failed_total") or 0) >= 1

    clear_failure(cluster.api, DRIVER, "gpu-node-1")

    def converged() -> Samples:
        samples = scrape(operator)
        assert value(samples, "gpu_operator_reconciliation_status") == 1, "not ready yet"
        return samples

    done = wait_for(converged, timeout=CONVERGE, what="reconciliation_status 1")
    ready_components = {
        dict(labels)["component"]: v
        for (name, labels), v in done.items()
        if name == "gpu_operator_component_ready"
    }
    assert ready_components and set(ready_components.values()) == {1.0}, ready_components
    assert (value(done, "gpu_operator_reconciliation_last_success_ts_seconds") or 0) >= started
    total = value(done, "gpu_operator_reconciliation_total") or 0
    assert total > (value(done, "gpu_operator_reconciliation_failed_total") or 0)
    # Every counted pass is timed (passes without a policy are timed but, as NVIDIA's, not counted).
    observed = (value(done, "gpu_operator_reconciliation_duration_seconds_count") or 0) - (
        value(idle, "gpu_operator_reconciliation_duration_seconds_count") or 0
    )
    assert observed >= total > 0, (observed, total)

    # Every write the operator made, by verb, is what the API server logged of its ServiceAccount.
    def writes_match() -> None:
        counted: dict[str, float] = {}
        for (name, labels), count in scrape(operator).items():
            if name == "gpu_operator_api_writes_total" and dict(labels)["code"] != "<error>":
                verb = {"apply": "patch"}.get(dict(labels)["verb"], dict(labels)["verb"])
                counted[verb] = counted.get(verb, 0) + count
        logged: dict[str, float] = {}
        for write in writes_by(cluster, USER, started):
            verb = write.split()[0]
            logged[verb] = logged.get(verb, 0) + 1
        assert counted == logged, f"metrics {counted}, audit log {logged}"

    wait_for(writes_match, timeout=30, what="metrics agree with the audit log")
