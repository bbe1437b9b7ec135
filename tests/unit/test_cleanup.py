"""`gpu-operator cleanup` (the chart's pre-delete hook) and the ServiceAccount kubeconfig writer, against
a fake API (the real ones run end to end in tests/e2e/test_helm.py)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from builders import label_owner, node_body

from gpu_operator import cli
from gpu_operator.runtime.cleanup import cleanup, operator_labels
from gpu_operator.runtime.client import ApiError
from gpu_operator.runtime.kubeconfig import write_service_account_kubeconfig
from gpu_operator.runtime.sync_client import SyncKube

DEPLOY = "nvidia.com/gpu.deploy.driver"


def node(
    name: str, labels: dict[str, str], owned: list[str], manager: str = "gpu-operator"
) -> dict[str, Any]:
    """A Node whose labels `owned` belong to `manager` (the operator's apply by default), the rest to
    kubectl-label (a person): a shorthand of builders.node_body for who owns which of its labels."""
    operation = "Apply" if manager == "gpu-operator" else "Update"
    by_hand = [key for key in labels if key not in owned]
    owners = [label_owner(owned, manager, operation), label_owner(by_hand, "kubectl-label", "Update")]
    return node_body(name, labels, managed_fields=owners)


class FakeKube:
    """Node listings in turn (the last one repeats); each watch yields one event."""

    def __init__(self, listings: list[list[dict[str, Any]]], delete: ApiError | None = None) -> None:
        self.listings = listings
        self.delete_error = delete
        self.calls: list[tuple[str, str]] = []
        self.watches = 0

    def request(self, method: str, url: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, url))
        if method == "DELETE":
            if self.delete_error is not None:
                raise self.delete_error
            return {}
        items = self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]
        return {"metadata": {"resourceVersion": "7"}, "items": items}

    def watch(self, api_version: str, kind: str, query: Mapping[str, str], timeout: int) -> Iterator[Any]:
        assert query == {"resourceVersion": "7"} and timeout >= 1
        self.watches += 1
        yield {"type": "MODIFIED"}


def run(fake: FakeKube, timeout: float = 30.0) -> list[dict[str, Any]]:
    out = io.StringIO()
    assert cleanup(cast(SyncKube, fake), "cluster-policy", timeout, out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_only_labels_the_operator_removes_count() -> None:
    hand = node("a", {DEPLOY: "true", "nvidia.com/gpu.present": "true", "team": "x"}, [])
    assert operator_labels(hand) == []
    ours = node("b", {DEPLOY: "true", "nvidia.com/gpu.present": "true"}, [DEPLOY, "nvidia.com/gpu.present"])
    assert operator_labels(ours) == [DEPLOY, "nvidia.com/gpu.present"]
    # k8s-driver-manager's marks (written on the operator's behalf) go too; a person's opt-out stays.
    nvsm, dcgm = "nvidia.com/gpu.deploy.nvsm", "nvidia.com/gpu.deploy.dcgm"
    manager = node(
        "c", {nvsm: "", DEPLOY: "paused-for-driver-upgrade", dcgm: "false"}, [nvsm, DEPLOY], "driver-manager"
    )
    assert operator_labels(manager) == [DEPLOY, nvsm]


def test_deletes_the_policy_and_waits_for_the_labels_to_go() -> None:
    labelled = node("gpu-0", {DEPLOY: "true"}, [DEPLOY])
    fake = FakeKube([[labelled], [labelled], [node("gpu-0", {}, [])]])
    lines = run(fake)
    assert fake.calls[0] == ("DELETE", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")
    assert fake.watches == 2  # woken by node events, no polling
    assert [line["message"] for line in lines] == [
        "deleted the ClusterPolicy",
        "the operator removed its node labels",
    ]


def test_gives_up_at_the_deadline_and_still_succeeds() -> None:
    labelled = node("gpu-0", {DEPLOY: "true"}, [DEPLOY])
    lines = run(FakeKube([[labelled]]), timeout=0.001)
    assert lines[-1]["nodes"] == {"gpu-0": [DEPLOY]}


def test_a_missing_policy_is_fine_a_refused_delete_stops() -> None:
    assert run(FakeKube([[]], delete=ApiError(404, "NotFound", "gone")))[-1]["message"].startswith(
        "the operator removed"
    )
    refused = FakeKube([[]], delete=ApiError(403, "Forbidden", "no"))
    lines = run(refused)
    assert lines == [
        {
            "message": "cannot delete the ClusterPolicy",
            "policy": "cluster-policy",
            "error": "403 Forbidden: no",
        }
    ]
    assert refused.calls == [("DELETE", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")]


class GPUClusterKube(FakeKube):
    """FakeKube, and a GPUCluster read `reads` times before it is gone (404); each of its watches
    yields one event."""

    def __init__(self, listings: list[list[dict[str, Any]]], reads: int) -> None:
        super().__init__(listings)
        self.reads = reads
        self.gpucluster_watches: list[Mapping[str, str]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        if "/gpuclusters/" not in url:
            return super().request(method, url, **kwargs)
        self.calls.append((method, url))
        if method == "GET":
            if self.reads == 0:
                raise ApiError(404, "NotFound", "gpuclusters gpu-cluster not found")
            self.reads -= 1
            return {"metadata": {"name": "gpu-cluster", "resourceVersion": "3"}}
        return {}

    def watch(self, api_version: str, kind: str, query: Mapping[str, str], timeout: int) -> Iterator[Any]:
        if kind != "GPUCluster":
            yield from super().watch(api_version, kind, query, timeout)
            return
        self.gpucluster_watches.append(query)
        yield {"type": "MODIFIED"}


def test_a_gpucluster_goes_first_and_the_policy_only_once_it_is_gone() -> None:
    """The operator removes the GPUCluster's finalizer once its claim holders are drained, then the API
    server deletes it: the policy waits for that, woken by the GPUCluster's watch."""
    fake = GPUClusterKube([[node("gpu-0", {}, [])]], reads=2)
    out = io.StringIO()
    assert cleanup(cast(SyncKube, fake), "cluster-policy", 30.0, out, gpucluster="gpu-cluster") == 0
    url = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster"
    deletes = [call for call in fake.calls if call[0] == "DELETE"]
    assert deletes == [("DELETE", url), ("DELETE", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")]
    assert fake.calls.index(("GET", url), 0) < fake.calls.index(deletes[1])
    assert (
        fake.gpucluster_watches
        == [{"fieldSelector": "metadata.name=gpu-cluster", "resourceVersion": "3"}] * 2
    )
    messages = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert messages == [
        "deleted the GPUCluster",
        "the GPUCluster is gone",
        "deleted the ClusterPolicy",
        "the operator removed its node labels",
    ]


def test_a_gpucluster_that_stays_is_given_up_on_and_the_policy_still_goes() -> None:
    fake = GPUClusterKube([[node("gpu-0", {}, [])]], reads=10**6)
    out = io.StringIO()
    assert cleanup(cast(SyncKube, fake), "cluster-policy", 0.001, out, gpucluster="gpu-cluster") == 0
    messages = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert messages[:2] == [
        "deleted the GPUCluster",
        "gave up waiting for the GPUCluster: is the operator running?",
    ]
    assert ("DELETE", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy") in fake.calls


def test_service_account_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA")
    admin = {
        "current-context": "admin",
        "contexts": [{"name": "admin", "context": {"cluster": "local", "user": "admin"}}],
        "clusters": [
            {"name": "local", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "ca.crt"}}
        ],
        "users": [{"name": "admin", "user": {"client-certificate": "admin.crt"}}],
    }
    (tmp_path / "admin.yaml").write_text(yaml.safe_dump(admin))

    class TokenKube:
        def request(self, method: str, url: str, body: Any = None, **_: Any) -> dict[str, Any]:
            assert (method, url) == ("POST", "/api/v1/namespaces/ns/serviceaccounts/sa/token")
            assert body["spec"] == {
                "expirationSeconds": 600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"},
            }
            return {"status": {"token": "secret"}}

    out = tmp_path / "sa.yaml"
    write_service_account_kubeconfig(
        cast(SyncKube, TokenKube()), tmp_path / "admin.yaml", "ns", "sa", out, 600, bound_pod=("p", "u")
    )
    written = yaml.safe_load(out.read_text())
    assert out.stat().st_mode & 0o777 == 0o600
    assert written["users"] == [{"name": "sa", "user": {"token": "secret"}}]
    cluster = written["clusters"][0]["cluster"]
    assert cluster == {
        "server": "https://127.0.0.1:1",
        "certificate-authority-data": base64.b64encode(b"CA").decode(),
    }


@pytest.mark.parametrize("account", ["sa", "ns/", "/sa", "a/b/c"])
def test_kubeconfig_command_wants_namespace_and_name(account: str, tmp_path: Path) -> None:
    assert cli.main(["kubeconfig", "--service-account", account, "-o", str(tmp_path / "x")]) == 2


def test_kubeconfig_command_without_credentials_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.yaml"
    code = cli.main(
        ["kubeconfig", "--service-account", "ns/sa", "-o", str(tmp_path / "x"), "--kubeconfig", str(missing)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kubeconfig: ") and len(err.strip().splitlines()) == 1
