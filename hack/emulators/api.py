"""A small asyncio client for the Kubernetes API: JSON in, JSON out, watches as async iterators.

The emulators act for thousands of pods on one event loop, so they talk to the API server with raw
aiohttp and plain dicts (no generated models). Two kinds of credentials share one connection pool:

* the admin identity of the kubeconfig (kwokctl's client certificate), for what a kubelet or the
  cluster itself does (pod status, deleting terminated pods, node status, TokenRequests);
* a ServiceAccount token (:meth:`Api.with_token`), for every call an operand image makes, so RBAC
  decides exactly as it would for the real image.

Errors are :class:`ApiError`, whose ``str()`` is the API server's ``Status.message``: the text
client-go's ``StatusError.Error()`` returns, and so the text the real images print, e.g.
``daemonsets.apps is forbidden: User "system:serviceaccount:gpu-operator:nvidia-container-toolkit"
cannot list resource "daemonsets" in API group "apps" in the namespace "gpu-operator"``.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A server-side watch ends after this long; the caller resumes from the last resourceVersion.
WATCH_TIMEOUT_S = 300


class ApiError(Exception):
    """A non-2xx answer. ``str(err)`` is the Status message, as client-go prints it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message or reason or f"HTTP {status}")
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _pem(user: Mapping[str, Any], key: str, folder: Path, scratch: Path) -> str | None:
    """Path of a PEM file given either as `<key>` (a path) or `<key>-data` (base64)."""
    if user.get(f"{key}-data"):
        path = scratch / key
        path.write_bytes(base64.b64decode(user[f"{key}-data"]))
        return str(path)
    if user.get(key):
        found = Path(user[key])
        return str(found if found.is_absolute() else folder / found)
    return None


class Api:
    """One API server, one identity. Cheap to derive per token (:meth:`with_token`)."""

    def __init__(
        self, server: str, session: aiohttp.ClientSession, token_session: aiohttp.ClientSession | None = None
    ) -> None:
        self.server = server.rstrip("/")
        self.session = session
        # ServiceAccount calls need connections without the admin's client certificate: the API
        # server authenticates a TLS client certificate before it looks at a bearer token.
        self.token_session = token_session or session
        self.token: str | None = None
        # Ours, so audit-log readers can tell the emulators from kwok and the tests (all kwok-admin).
        self.user_agent = "gpu-operator-emulators"

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Api:
        config: JSON = yaml.safe_load(path.read_text())
        current = config.get("current-context") or config["contexts"][0]["name"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        scratch = Path(tempfile.mkdtemp(prefix="emulators-pki-"))
        ca = _pem(cluster, "certificate-authority", path.parent, scratch)
        admin_ssl = ssl.create_default_context(cafile=ca)
        token_ssl = ssl.create_default_context(cafile=ca)
        cert = _pem(user, "client-certificate", path.parent, scratch)
        key = _pem(user, "client-key", path.parent, scratch)
        if cert and key:
            admin_ssl.load_cert_chain(cert, key)
        api = cls(cluster["server"], _session(admin_ssl), _session(token_ssl))
        if user.get("token"):
            api.token = user["token"]
        return api

    def with_token(self, token: str, user_agent: str) -> Api:
        """The same server, authenticated as a ServiceAccount (what an image does)."""
        other = Api(self.server, self.token_session)
        other.token = token
        other.user_agent = user_agent
        return other

    async def close(self) -> None:
        await self.session.close()
        await self.token_session.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = None if body is None else json.dumps(body)
        async with self.session.request(
            method, url, data=data, headers=self._headers(content_type if data is not None else None)
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise _error(response.status, text)
            return json.loads(text) if text else {}

    async def get(self, path: str, **params: str) -> JSON:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.request("POST", path, body)

    async def update(self, path: str, body: JSON) -> JSON:
        return await self.request("PUT", path, body)

    async def patch(self, path: str, body: JSON, content_type: str = MERGE_PATCH) -> JSON:
        return await self.request("PATCH", path, body, content_type=content_type)

    async def delete(self, path: str, body: JSON | None = None) -> JSON:
        return await self.request("DELETE", path, body)

    async def watch(self, path: str, resource_version: str, **params: str) -> AsyncIterator[JSON]:
        """Watch events (dicts with `type` and `object`) from `resource_version` until the server
        ends the watch; raises ApiError on an ERROR event (e.g. 410 Gone: relist)."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
            **params,
        }
        url = f"{self.server}{path}?{urlencode(query)}"
        async with self.session.get(url, headers=self._headers()) as response:
            if response.status >= 300:
                raise _error(response.status, await response.text())
            # Lines can be far longer than aiohttp's default read chunk; readline keeps them whole.
            while True:
                line = await response.content.readline()
                if not line:
                    return
                event: JSON = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(
                        int(status.get("code") or 500), status.get("reason", ""), status.get("message", "")
                    )
                yield event


def _session(context: ssl.SSLContext) -> aiohttp.ClientSession:
    # Thousands of pods' calls share few connections (HTTP/1.1 to the API server): a generous pool.
    # read_bufsize: one watch event is one line; a big pod or node must fit in the buffer.
    connector = aiohttp.TCPConnector(limit=64, ssl=context)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), read_bufsize=2**21
    )


def _error(status: int, text: str) -> ApiError:
    try:
        body = json.loads(text)
    except ValueError:
        return ApiError(status, "", text.strip())
    return ApiError(status, str(body.get("reason", "")), str(body.get("message", "")))


def path_for(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """REST path of a collection or object: `path_for("apps/v1", "daemonsets", "ns")`."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    return base + (f"/{name}" if name else "")
