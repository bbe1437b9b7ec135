"""Requests to the API server over kept-alive `http.client` connections, for Kube
(gpu_operator/runtime/client.py).

The `kubernetes` package's ApiClient spends most of a request's client CPU in its own layers (its
param_serialize and sanitize_for_serialization, its RESTClientObject, urllib3's pool manager,
connection pool and response wrapper, then http.client underneath); the same server-side apply sent
on a kept-alive http.client connection costs about half as much (measured: bench/README.md). A large
rollout sends thousands of such requests (a label write per node and stage, the Lease, the status),
so that overhead is paid on the path that decides how fast the nodes get their labels. Everything a
request needs comes from the ApiClient's configuration: the server, its CA, the client certificate,
and the credentials, read per request through `auth_settings` (whose refresh hook renews expiring tokens).

`for_client` returns None for what this does not handle, and Kube keeps the ApiClient for those: a
proxy (urllib3's ProxyManager), a TLS server name or hostname check other than the host's, custom
socket options. Watches stay on the ApiClient too (a streamed response holds its connection).
"""

from __future__ import annotations

import http.client
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kubernetes.client.rest import should_bypass_proxies
from urllib3.util.wait import wait_for_read


class ConnectionFailed(Exception):
    """The request could not be sent or its answer not read (refused, reset, TLS, timeout)."""


Timeout = tuple[float, float]
"""(connect, read) seconds; read is the longest wait for the next bytes of an answer."""


@dataclass
class Connections:
    """Idle connections to one API server, each used by one request at a time; at most `keep` are
    kept between requests (more may be open while more threads ask at once)."""

    host: str
    port: int | None
    context: ssl.SSLContext | None
    """None: plain HTTP."""
    keep: int = 4
    _idle: list[http.client.HTTPConnection] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], timeout: Timeout
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ConnectionFailed when there is no answer. Never retried: a
        write may have reached the server (the callers retry, as they do any failure)."""
        connect, read = timeout
        connection = self._take()
        try:
            if connection.sock is None:
                connection.timeout = connect
                connection.connect()
            assert connection.sock is not None
            connection.sock.settimeout(read)
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise ConnectionFailed(f"{type(exc).__name__}: {exc}") from None
        if response.will_close:
            connection.close()
        else:
            self._give(connection)
        return response.status, data

    def _take(self) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                if self.context is None:
                    return http.client.HTTPConnection(self.host, self.port)
                return http.client.HTTPSConnection(self.host, self.port, context=self.context)
            # An idle connection with something to read has been closed by the server (or is broken):
            # urllib3's is_connection_dropped, the same check.
            if connection.sock is not None and not wait_for_read(connection.sock, timeout=0.0):
                return connection
            connection.close()

    def _give(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def for_client(configuration: Any) -> Connections | None:
    """Connections as the ApiClient of `configuration` would make them; None where it needs more."""
    if (
        (configuration.proxy and not should_bypass_proxies(configuration.host, configuration.no_proxy or ""))
        or configuration.tls_server_name
        or configuration.assert_hostname is not None
        or configuration.socket_options is not None
    ):
        return None
    url = urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname or url.path.strip("/"):
        return None
    keep = configuration.connection_pool_maxsize or 4
    if url.scheme == "http":
        return Connections(url.hostname, url.port, None, keep)
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return Connections(url.hostname, url.port, context, keep)
