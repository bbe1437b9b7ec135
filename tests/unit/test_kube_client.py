"""The async client (runtime/client.py) against a small HTTP server on 127.0.0.1, through the loader of a
real kubeconfig: what it sends (token, user agent, query, body), how it reads the answers (pages,
refusals, a watch's events whatever their chunks, text), and that a call without an answer fails at
once, or after its read timeout, never retried inside the library (callers retry, with back-off).
Then the same client through SyncKube (runtime/sync_client.py), from several threads."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from gpu_operator.main import connection_info, login
from gpu_operator.runtime.client import (
    PARTIAL_METADATA,
    ApiError,
    ConfigException,
    Kube,
    connect,
    environment_proxy,
)
from gpu_operator.runtime.sync_client import SyncKube


def write_kubeconfig(path: Path, port: int) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)
    """JSON, or bytes as they are."""
    chunks: list[bytes] | None = None
    """A chunked answer, flushed one chunk at a time (a watch)."""
    content_type: str = "application/json"


Route = Callable[[Request], Answer]


class Server:
    """An HTTP/1.1 server on 127.0.0.1 that answers each request with `route(request)` and keeps them."""

    def __init__(self, route: Route) -> None:
        self.requests: list[Request] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(
                    self.command,
                    url.path,
                    dict(parse_qsl(url.query)),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
                outer.requests.append(request)
                answer = route(request)
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                if answer.chunks is not None:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.chunks:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = answer

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Route], tuple[Server, Path]]]:
    """A server for a route, and a kubeconfig that logs in to it with the token `t`."""
    servers: list[Server] = []

    def start(route: Route) -> tuple[Server, Path]:
        servers.append(Server(route))
        kubeconfig = tmp_path / f"kubeconfig-{len(servers)}"
        write_kubeconfig(kubeconfig, servers[-1].port)
        return servers[-1], kubeconfig

    yield start
    for server in servers:
        server.close()


def status(code: int, reason: str, message: str, causes: list[dict[str, Any]] | None = None) -> Answer:
    body: dict[str, Any] = {"kind": "Status", "code": code, "reason": reason, "message": message}
    if causes is not None:
        body["details"] = {"causes": causes}
    return Answer(code, body)


async def client(kubeconfig: Path, timeout: tuple[float, float] = (2.0, 5.0), user_agent: str = "") -> Kube:
    return Kube(await connect(kubeconfig, user_agent=user_agent), timeout=timeout)


# --- no answer -----------------------------------------------------------------------------------


def listening(close: bool) -> tuple[socket.socket, list[socket.socket]]:
    """A server that accepts connections and closes each at once (`close`) or keeps it open, silent;
    and the connections it accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)
            if close:
                connection.close()

    threading.Thread(target=accept, daemon=True).start()
    return server, accepted


def unanswered(tmp_path: Path, close: bool, call: str, timeout: tuple[float, float]) -> tuple[ApiError, int]:
    server, accepted = listening(close)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, server.getsockname()[1])

    async def scenario() -> None:
        kube = await client(kubeconfig, timeout)
        try:
            if call == "get":
                await kube.get("v1", "Node", "n")
            else:
                await kube.patch_node("n", {"metadata": {"labels": {"a": "b"}}})
        finally:
            await kube.close()

    try:
        with pytest.raises(ApiError) as raised:
            asyncio.run(scenario())
    finally:
        server.close()
        for connection in accepted:
            connection.close()
    return raised.value, len(accepted)


def test_a_connection_closed_without_an_answer_is_an_error_at_once(tmp_path: Path) -> None:
    error, attempts = unanswered(tmp_path, True, "patch", (2.0, 5.0))
    assert (error.status, error.reason, attempts) == (0, "ConnectionError", 1)
    # aiohttp (3.14 does) may send an idempotent request (GET, PUT, DELETE) once more on a new
    # connection when the first one closes without an answer (RFC 9112 9.3.1); never more.
    error, attempts = unanswered(tmp_path, True, "get", (2.0, 5.0))
    assert (error.status, error.reason) == (0, "ConnectionError") and attempts in (1, 2)


def test_a_silent_server_is_one_attempt_that_fails_after_the_read_timeout(tmp_path: Path) -> None:
    error, attempts = unanswered(tmp_path, False, "get", (2.0, 0.3))
    # No retry inside the library (a read timeout is never resent): callers retry, with back-off.
    assert (error.status, error.reason, attempts) == (0, "ConnectionError", 1)


# --- what it sends and how it reads the answers ------------------------------------------------------


def test_a_list_sends_the_token_and_user_agent_and_follows_the_pages(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    def pages(request: Request) -> Answer:
        if "continue" not in request.query:
            return Answer(body={"metadata": {"continue": "next"}, "items": [{"metadata": {"name": "a"}}]})
        return Answer(body={"metadata": {"resourceVersion": "42"}, "items": [{"metadata": {"name": "b"}}]})

    server, kubeconfig = serve(pages)

    async def scenario() -> tuple[list[dict[str, Any]], str]:
        kube = await client(kubeconfig, user_agent="gpu-operator-test")
        try:
            return await kube.list_at(
                "v1", "Pod", "ns", label_selector="app=x", field_selector="spec.nodeName=n"
            )
        finally:
            await kube.close()

    items, version = asyncio.run(scenario())
    assert [i["metadata"]["name"] for i in items] == ["a", "b"] and version == "42"
    first, second = server.requests
    assert (first.method, first.path) == ("GET", "/api/v1/namespaces/ns/pods")
    assert first.query == {"limit": "500", "labelSelector": "app=x", "fieldSelector": "spec.nodeName=n"}
    assert second.query == {**first.query, "continue": "next"}
    assert first.headers["authorization"] == "Bearer t"
    assert first.headers["user-agent"] == "gpu-operator-test"
    assert first.headers["accept"] == "application/json"


def test_an_apply_sends_its_body_as_it_is_and_a_refusal_names_its_fields(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    refusal = status(
        422, "Invalid", "ConfigMap c is invalid", [{"field": "data.v", "message": "too long"}, {"x": 1}]
    )
    answers = iter([Answer(body={"kind": "ConfigMap", "metadata": {"name": "c"}}), refusal])
    server, kubeconfig = serve(lambda _: next(answers))
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}

    async def scenario() -> tuple[dict[str, Any], ApiError]:
        kube = await client(kubeconfig)
        try:
            applied = await kube.apply({**body, "data": {"v": "\U0001f600"}}, dry_run=True)
            try:
                await kube.apply(body, manager="someone", force=False)
            except ApiError as exc:
                return applied, exc
            raise AssertionError("not refused")
        finally:
            await kube.close()

    applied, refused = asyncio.run(scenario())
    assert applied == {"kind": "ConfigMap", "metadata": {"name": "c"}}
    assert (refused.status, refused.reason, refused.message) == (422, "Invalid", "ConfigMap c is invalid")
    assert refused.causes == (("data.v", "too long"), ("", ""))
    first, second = server.requests
    assert (first.method, first.path) == ("PATCH", "/api/v1/namespaces/n/configmaps/c")
    assert first.headers["content-type"] == "application/apply-patch+yaml; charset=utf-8"
    assert first.query == {"fieldManager": "gpu-operator", "force": "true", "dryRun": "All"}
    assert "\U0001f600".encode() in first.body and json.loads(first.body)["data"] == {"v": "\U0001f600"}
    assert second.query == {"fieldManager": "someone", "force": "false"}


def test_an_answer_that_is_not_a_status_is_an_error_with_its_text(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    _, kubeconfig = serve(lambda _: Answer(503, b"upstream connect error", content_type="text/plain"))

    async def scenario() -> None:
        kube = await client(kubeconfig)
        try:
            await kube.get("v1", "Node", "n")
        finally:
            await kube.close()

    with pytest.raises(ApiError) as raised:
        asyncio.run(scenario())
    assert (raised.value.status, raised.value.message) == (503, "upstream connect error")


def test_metadata_asks_for_the_metadata_alone_and_a_missing_object_is_none(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    answers = iter([Answer(body={"metadata": {"name": "s", "uid": "u"}}), status(404, "NotFound", "gone")])
    server, kubeconfig = serve(lambda _: next(answers))

    async def scenario() -> list[dict[str, Any] | None]:
        kube = await client(kubeconfig)
        try:
            return [
                await kube.metadata("v1", "Secret", "s", "ns"),
                await kube.metadata("v1", "Secret", "t", "ns"),
            ]
        finally:
            await kube.close()

    assert asyncio.run(scenario()) == [{"metadata": {"name": "s", "uid": "u"}}, None]
    assert [r.headers["accept"] for r in server.requests] == [PARTIAL_METADATA] * 2
    assert server.requests[0].path == "/api/v1/namespaces/ns/secrets/s"


def test_a_delete_of_a_missing_object_is_done_its_propagation_given_and_a_write_can_be_gated(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    server, kubeconfig = serve(lambda _: status(404, "NotFound", "gone"))

    async def refuse() -> bool:
        return False

    async def scenario() -> ApiError:
        kube = await client(kubeconfig)
        try:
            await kube.delete(("apps/v1", "DaemonSet", "ns", "d"))
            await kube.delete(("apps/v1", "DaemonSet", "ns", "e"), "Orphan")
            kube.may_write = refuse
            try:
                await kube.patch_node("n", {"metadata": {"labels": {"a": None}}})
            except ApiError as exc:
                return exc
            raise AssertionError("written")
        finally:
            await kube.close()

    assert asyncio.run(scenario()).reason == "NotLeader"
    deleted, orphaning = server.requests  # the refused write never reached the server
    assert (deleted.method, deleted.path) == ("DELETE", "/apis/apps/v1/namespaces/ns/daemonsets/d")
    assert json.loads(deleted.body) == {"propagationPolicy": "Background"}
    assert json.loads(orphaning.body) == {"propagationPolicy": "Orphan"}, "its pods stay"


def test_a_log_is_text(serve: Callable[[Route], tuple[Server, Path]]) -> None:
    server, kubeconfig = serve(lambda _: Answer(body=b"line 1\nline \xff\n", content_type="text/plain"))

    async def scenario() -> str:
        kube = await client(kubeconfig)
        try:
            return await kube.pod_log("ns", "p", "c", 20, previous=True)
        finally:
            await kube.close()

    assert asyncio.run(scenario()) == "line 1\nline \ufffd\n"
    (request,) = server.requests
    assert request.path == "/api/v1/namespaces/ns/pods/p/log"
    assert request.query == {"container": "c", "tailLines": "20", "previous": "true"}
    assert request.headers["accept"] == "text/plain"


WATCHED = [
    {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "1"}}},
    {
        "type": "MODIFIED",
        "object": {"metadata": {"name": "a", "resourceVersion": "2"}, "big": "x" * 3_000_000},
    },
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}},
]


def watch_chunks() -> list[bytes]:
    """The events as the API server streams them, cut anywhere: within a line, between lines, and one
    line (a large Node) longer than the client's read buffer."""
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in WATCHED) + b"\n"
    cuts = [0, 7, len(stream) // 2, len(stream) - 40, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(cuts)]


def test_a_watch_yields_each_event_whatever_its_chunks(serve: Callable[[Route], tuple[Server, Path]]) -> None:
    server, kubeconfig = serve(lambda _: Answer(chunks=watch_chunks()))

    async def scenario() -> list[dict[str, Any]]:
        kube = await client(kubeconfig)
        try:
            return [e async for e in kube.watch("v1", "Node", {"resourceVersion": "7"}, 60)]
        finally:
            await kube.close()

    assert asyncio.run(scenario()) == WATCHED
    (request,) = server.requests
    assert request.path == "/api/v1/nodes"
    assert request.query == {"resourceVersion": "7", "watch": "true", "timeoutSeconds": "60"}


# --- the same client, blocking ---------------------------------------------------------------------


def test_sync_kube_answers_several_threads_and_iterates_a_watch(
    serve: Callable[[Route], tuple[Server, Path]],
) -> None:
    def route(request: Request) -> Answer:
        if request.query.get("watch"):
            return Answer(chunks=watch_chunks())
        return Answer(body={"metadata": {"name": request.path.rsplit("/", 1)[-1]}})

    server, kubeconfig = serve(route)
    kube = SyncKube.connect(kubeconfig, user_agent="sync")
    try:
        got: dict[int, str] = {}

        def get(i: int) -> None:
            got[i] = kube.get("v1", "Node", f"n{i}")["metadata"]["name"]

        threads = [threading.Thread(target=get, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == {i: f"n{i}" for i in range(8)}
        assert list(kube.watch("v1", "Node", {}, 60)) == WATCHED
        for event in kube.watch("v1", "Node", {}, 60):  # left early: the watch is closed, not leaked
            assert event == WATCHED[0]
            break
        assert kube.run(kube.kube.get("v1", "Node", "direct"))["metadata"]["name"] == "direct"
    finally:
        kube.close()
    assert kube.loop.is_closed() and not kube.thread.is_alive()
    kube.close()  # twice is fine
    assert {r.headers["user-agent"] for r in server.requests} == {"sync"}


def test_sync_kube_raises_the_clients_errors(serve: Callable[[Route], tuple[Server, Path]]) -> None:
    _, kubeconfig = serve(lambda _: status(403, "Forbidden", "no"))
    kube = SyncKube.connect(kubeconfig)
    try:
        with pytest.raises(ApiError) as raised:
            kube.list("v1", "Node")
        assert raised.value.status == 403
    finally:
        kube.close()


# --- connecting ----------------------------------------------------------------------------------------


def test_no_kubeconfig_is_one_clear_error_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "nowhere.yaml"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigException, match=f"no kubeconfig at {missing}, and not running in a cluster"):
        asyncio.run(connect(missing))
    monkeypatch.setenv("KUBECONFIG", f"{missing}{os.pathsep}{tmp_path / 'other.yaml'}")
    with pytest.raises(ConfigException, match=re.escape("other.yaml")):
        asyncio.run(connect())
    assert not caplog.records, "nothing logged besides the error"
    threads = threading.active_count()
    with pytest.raises(ConfigException):
        SyncKube.connect(missing)
    assert threading.active_count() == threads, "a failed connect leaves no loop thread behind"


def test_the_proxy_comes_from_the_environment_once_and_no_request_reads_it_again(
    serve: Callable[[Route], tuple[Server, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    assert environment_proxy("https://api.example:6443") == "http://proxy.example:3128"
    assert environment_proxy("https://internal.example:6443") is None
    assert environment_proxy("http://api.example") is None, "no HTTP_PROXY set"
    _, kubeconfig = serve(lambda request: Answer())

    async def scenario() -> None:
        api = await connect(kubeconfig, pool_size=3)
        try:
            session = api.rest_client.pool_manager
            assert not session.trust_env, "no ~/.netrc or proxy lookup per request"
            assert session.connector is not None and session.connector.limit == 3
            assert api.configuration.proxy is None, "127.0.0.1 goes direct"
        finally:
            await api.close()

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    asyncio.run(scenario())


def test_kopf_logs_in_with_what_the_client_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's credentials come from the same configuration as the operator's client (its own
    login_via_client would read the synchronous `kubernetes` package, which is not installed)."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, 6443)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = asyncio.run(login())
    assert (info.server, info.scheme, info.token) == ("http://127.0.0.1:6443", "Bearer", "t")
    assert info.username is None and info.certificate_path is None and info.proxy_url is None
    configuration = SimpleNamespace(
        host="h",
        ssl_ca_cert=None,
        verify_ssl=True,
        username="",
        password="",
        cert_file=None,
        key_file=None,
        proxy=None,
    )
    bare = connection_info(configuration, "token-only")
    assert (bare.scheme, bare.token) == (None, "token-only"), "a header without a scheme (RFC 7235)"
