"""The API client fails a call at once instead of retrying it inside urllib3 (callers retry)."""

import socket
import threading
from pathlib import Path

import pytest

from gpu_operator.kube import ApiError, Kube, load_api_client


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
