"""The API client fails a call at once instead of retrying it inside urllib3 (callers retry), and runs
the config loader's credentials hook at most once a second, not before every request."""

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.config.kube_config import KubeConfigLoader

from gpu_operator.runtime import client as kube_module
from gpu_operator.runtime.client import ApiError, Kube, load_api_client, throttled


def write_kubeconfig(path: Path, port: int) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )


def test_a_connection_closed_without_an_answer_is_one_attempt(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[int] = []

    def close_every_connection() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            connection.close()

    threading.Thread(target=close_every_connection, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, server.getsockname()[1])
    kube = Kube(load_api_client(kubeconfig), timeout=(2.0, 2.0))
    try:
        with pytest.raises(ApiError) as raised:
            kube.request("GET", "/api/v1/nodes")
    finally:
        server.close()
    assert raised.value.status == 0
    assert len(accepted) == 1


class Configuration:
    refresh_api_key_hook: Any = None


def reinstalling_hook(calls: list[int]) -> Any:
    """Like the config loaders' `_set_config`: each run installs a new copy of the hook."""

    def hook(configuration: Any) -> None:
        calls.append(1)
        configuration.refresh_api_key_hook = reinstalling_hook(calls)

    return hook


def test_the_credentials_hook_runs_at_most_once_a_second_though_it_reinstalls_itself() -> None:
    now = [100.0]
    calls: list[int] = []
    configuration = Configuration()
    configuration.refresh_api_key_hook = throttled(reinstalling_hook(calls), 1.0, lambda: now[0])
    for _ in range(50):
        configuration.refresh_api_key_hook(configuration)
    assert len(calls) == 1
    now[0] += 0.5
    configuration.refresh_api_key_hook(configuration)
    assert len(calls) == 1
    now[0] += 0.6
    for _ in range(3):
        configuration.refresh_api_key_hook(configuration)
    assert len(calls) == 2


def test_a_client_from_a_kubeconfig_refreshes_its_credentials_once_for_many_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []
    set_config = KubeConfigLoader._set_config

    def counted(self: KubeConfigLoader, configuration: Any) -> None:
        ran.append(1)
        set_config(self, configuration)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(KubeConfigLoader, "_set_config", counted)
    monkeypatch.setattr(kube_module, "AUTH_REFRESH_SECONDS", 3600.0)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, 1)
    api = load_api_client(kubeconfig)
    assert len(ran) == 1  # loading
    for _ in range(20):
        headers = api.param_serialize(method="GET", resource_path="/api", auth_settings=["BearerToken"])[2]
        assert headers["authorization"] == "Bearer t"
    assert len(ran) == 2  # and the first request's refresh, not one per request
