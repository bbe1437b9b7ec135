"""Kube's own kept-alive connections (gpu_operator/runtime/connections.py) against a local HTTP/1.1 server:
what is sent, what comes back, reuse, a connection the server closed, and when the ApiClient is kept."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from gpu_operator.runtime.client import ApiError, Kube, NotLeader
from gpu_operator.runtime.connections import ConnectionFailed, Connections, for_client


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[dict[str, Any]] = []
        self.answer: tuple[int, dict[str, Any]] = (200, {"kind": "Node"})
        self.close_after = False
        """Answer with `Connection: close` (the server drops the connection after it)."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers),
                "body": body,
                "client": self.client_address,
            }
        )
        status, answer = self.server.answer
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.server.close_after:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_DELETE = _any

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    found = Server()
    thread = threading.Thread(target=found.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield found
    found.shutdown()
    found.server_close()


def configuration(server: Server, **settings: Any) -> client.Configuration:
    found = client.Configuration()
    found.host = f"http://127.0.0.1:{server.server_address[1]}"
    found.api_key = {"authorization": "Bearer sekret"}
    for key, value in settings.items():
        setattr(found, key, value)
    return found


def kube(server: Server, **settings: Any) -> Kube:
    api = client.ApiClient(configuration(server, **settings))
    api.user_agent = "gpu-operator/test"
    return Kube(api)


def test_requests_go_on_kept_alive_connections_with_the_clients_credentials(server: Server) -> None:
    found = kube(server)
    assert found.connections is not None
    answer = found.apply_node_labels("n1", {"a": "b"}, "uid-1", "7")
    found.patch_node("n1", {"metadata": {"annotations": {"x": "ü"}}})
    assert answer == {"kind": "Node"}
    apply, patch = server.seen
    assert apply["method"] == "PATCH"
    assert apply["path"] == "/api/v1/nodes/n1?fieldManager=gpu-operator&force=true"
    assert apply["headers"]["Authorization"] == "Bearer sekret"
    assert apply["headers"]["User-Agent"] == "gpu-operator/test"
    assert apply["headers"]["Content-Type"] == "application/apply-patch+yaml"
    sent = json.loads(apply["body"])
    assert sent["metadata"] == {"name": "n1", "uid": "uid-1", "labels": {"a": "b"}, "resourceVersion": "7"}
    assert patch["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch["body"]) == {"metadata": {"annotations": {"x": "ü"}}}
    # One connection for both: the second request reused the first one's.
    assert apply["client"] == patch["client"]


def test_a_refusal_is_an_api_error_with_the_servers_reason(server: Server) -> None:
    server.answer = (409, {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"})
    with pytest.raises(ApiError) as refused:
        kube(server).apply_node_labels("n1", {}, "uid-1", "7")
    assert (refused.value.status, refused.value.reason) == (409, "Conflict")
    assert refused.value.message == "the object has been modified"


def test_a_standby_sends_no_write(server: Server) -> None:
    found = kube(server)
    found.may_write = lambda: False
    with pytest.raises(NotLeader):
        found.patch_node("n1", {})
    assert found.get("v1", "Node", "n1") == {"kind": "Node"}
    assert [s["method"] for s in server.seen] == ["GET"]


def test_a_connection_the_server_closed_is_not_used_again(server: Server) -> None:
    found = kube(server)
    server.close_after = True
    found.get("v1", "Node", "n1")
    server.close_after = False
    found.get("v1", "Node", "n1")
    found.get("v1", "Node", "n1")
    first, second, third = (s["client"] for s in server.seen)
    assert first != second == third


def test_an_idle_connection_dropped_by_the_server_is_replaced() -> None:
    """The server closes a kept-alive connection while it is idle (its idle timeout): the next request
    sees that before it writes anything and opens a new connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()
    paths: list[bytes] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            paths.append(conn.recv(65536).split(b" ")[1])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            conn.close()  # after the answer, without Connection: close
            closed.set()

    threading.Thread(target=serve, daemon=True).start()
    connections = Connections("127.0.0.1", listener.getsockname()[1], None)
    assert connections.request("GET", "/a", None, {}, (1.0, 1.0)) == (200, b"{}")
    assert closed.wait(5)
    assert connections.request("GET", "/b", None, {}, (1.0, 1.0)) == (200, b"{}")
    assert paths == [b"/a", b"/b"]
    listener.close()


def test_no_answer_is_a_connection_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    connections = Connections("127.0.0.1", port, None)
    with pytest.raises(ConnectionFailed):
        connections.request("GET", "/", None, {}, (1.0, 1.0))
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(ConnectionFailed, match="timed out"):
            Connections("127.0.0.1", silent.getsockname()[1], None).request("GET", "/", None, {}, (1.0, 0.2))
    finally:
        silent.close()
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    with pytest.raises(ApiError) as failed:
        Kube(api).get("v1", "Node", "n1")
    assert failed.value.status == 0


@pytest.mark.parametrize(
    "settings",
    [
        {"proxy": "http://proxy.example:3128"},
        {"tls_server_name": "kubernetes.default"},
        {"assert_hostname": False},
        {"host": "https://rancher.example/k8s/clusters/c-1"},
    ],
)
def test_what_the_connections_do_not_handle_stays_on_the_api_client(server: Server, settings: Any) -> None:
    assert for_client(configuration(server, **settings)) is None
    assert kube(server, **settings).connections is None


def test_a_proxy_the_host_bypasses_still_uses_the_connections(server: Server) -> None:
    bypassed = configuration(server, proxy="http://proxy.example:3128", no_proxy="127.0.0.1")
    assert for_client(bypassed) is not None
