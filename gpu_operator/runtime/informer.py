"""List and watch one kind with kubernetes_asyncio, recording every object into the Store.

An informer lists its kind in pages (`limit`/`continue`), reports the complete listing (so the Store
forgets what vanished while no watch was open), then watches from the listing's resourceVersion with
bookmarks, resuming from the last version it saw whenever the server ends the watch, the connection
drops or it stays silent past the inactivity timeout. A `410 Gone` lists the kind again. A kind that is
not served (404: its CRD is absent) counts as listed and empty, and is tried again with a growing delay,
at once when a CRD changes (`poke`). Any other failure (403, 5xx, an ERROR event, an API server that is
down) is logged and listed again after the same growing delay: a watch never stops the operator.

Requests go through the public `ApiClient.call_api` with `_preload_content=False`, which hands back
the raw aiohttp response: the listing is decoded by `safe_json.loads` (no depth of nesting makes it
raise) and the watch stream is read and decoded line by line by gpu_operator/runtime/watch_stream.py
(a pod event slimmed before decoding), without the library's model classes, which nothing here needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from kubernetes_asyncio import client

from gpu_operator.runtime import safe_json, watch_stream
from gpu_operator.runtime.backoff import Backoff
from gpu_operator.runtime.settings import Settings

log = logging.getLogger("gpu_operator")

Names = set[tuple[str, str]]
"""{(namespace or "", name)} of the objects of a complete listing."""
Listed = Callable[[Names], None]


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespace: str | None = None
    """Watched in this namespace only; None: cluster-wide."""
    label_selector: str = ""
    field_selector: str = ""

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return (
            f"{base}/namespaces/{self.namespace}/{self.plural}" if self.namespace else f"{base}/{self.plural}"
        )

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def selectors(self) -> list[tuple[str, str]]:
        found = [("labelSelector", self.label_selector), ("fieldSelector", self.field_selector)]
        return [(key, value) for key, value in found if value]


@dataclass(frozen=True)
class Timing:
    """An informer's sizes and timeouts, from the operator's Settings (their meaning is told there)."""

    chunk_size: int
    server_timeout: int
    inactivity: float
    connect: float
    request: float
    retry: float

    @classmethod
    def of(cls, settings: Settings) -> Timing:
        return cls(
            chunk_size=settings.list_chunk_size,
            server_timeout=settings.watch_server_timeout_seconds,
            inactivity=settings.watch_inactivity_seconds,
            connect=settings.api_timeout_seconds[0],
            request=settings.request_timeout_seconds,
            retry=settings.watch_retry_seconds,
        )


@dataclass
class Informer:
    api: client.ApiClient
    kind: Kind
    events: watch_stream.Events
    listed: Listed
    timing: Timing
    poke: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to retry a failed or unserved kind at once (a CRD changed: it may be served now)."""
    backoff: Backoff = field(init=False)
    back_since: float | None = field(init=False, default=None)
    """When the connection last failed (monotonic), until a listing succeeds again: an API server that
    has just come back answers 403 until its authorizer has synced and 429 while its storage
    initializes, and those refusals, retried like any other, are logged quietly for a minute."""

    def __post_init__(self) -> None:
        # Not sooner than `retry`: an API server that has just come back refuses requests (403) until
        # its authorizer has synced, and every kind's informer would log that.
        self.backoff = Backoff(self.timing.retry, self.timing.retry * 12)

    async def run(self) -> None:
        """List, then watch until the kind must be listed again; forever (until cancelled)."""
        while True:
            try:
                if await self.list_kind():
                    self.backoff.reset()
                    self.back_since = None
                    while self.events.version:
                        await self.watch_once()
                    continue  # 410 Gone: list again at once
                delay = self.backoff.next()
                log.debug("%s is not served; trying again in %.1fs", self.kind.name, delay)
            except Exception as exc:
                delay = self.backoff.next()
                self._failed(exc, delay)
            self.poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poke.wait(), delay)

    async def list_kind(self) -> bool:
        """List the kind into the Store and report the listing; False if it is not served (404)."""
        present: Names = set()
        first = [*self.kind.selectors(), ("limit", str(self.timing.chunk_size))]
        query = first
        while True:
            timeout = aiohttp.ClientTimeout(total=self.timing.request, sock_connect=self.timing.connect)
            response = await self._get(query, timeout)
            try:
                if response.status == 404:
                    self.listed(set())
                    return False
                await _raise_for(response)
                page = safe_json.loads(await response.read())
            finally:
                response.release()
            kind = str(page.get("kind") or "")
            item_kind = kind.removesuffix("List")
            for body in page.get("items") or []:
                # A list's items carry no kind or apiVersion of their own; the Store's records read them.
                body.setdefault("kind", item_kind)
                body.setdefault("apiVersion", page.get("apiVersion"))
                metadata = body.get("metadata") or {}
                present.add((metadata.get("namespace") or "", metadata.get("name") or ""))
                self.events.add(None, body)
            metadata = page.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                break
            query = [*first, ("continue", str(token))]
        self.events.version = str(metadata.get("resourceVersion") or "")
        self.listed(present)
        return True

    async def watch_once(self) -> None:
        """One watch request from `events.version`, recorded until it ends; `events.version` is ""
        afterwards when the kind must be listed again (410 Gone)."""
        timing = self.timing
        query = [
            *self.kind.selectors(),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self.events.version),
            ("timeoutSeconds", str(timing.server_timeout)),
        ]
        timeout = aiohttp.ClientTimeout(
            total=timing.server_timeout + 30, sock_connect=timing.connect, sock_read=timing.inactivity
        )
        response = await self._get(query, timeout)
        try:
            if response.status in (404, 410):
                # Gone (list again), or no longer served (its CRD deleted): the listing says which.
                self.events.version = ""
                return
            await _raise_for(response)
            transport = response.connection.transport if response.connection is not None else None
            await watch_stream.read(response.content, self.events, transport)
        except TimeoutError:
            log.debug("watch of %s inactive; resuming", self.kind.name)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            # Dropped: resumed from the last version seen, after a short pause (a server that drops every
            # connection at once is not hammered).
            self.back_since = time.monotonic()
            await asyncio.sleep(self.timing.retry / 10)
        finally:
            response.close()

    def _failed(self, exc: Exception, delay: float) -> None:
        if isinstance(exc, aiohttp.ClientConnectionError | TimeoutError | OSError):
            self.back_since = self.back_since or time.monotonic()
        level = logging.WARNING
        if isinstance(exc, watch_stream.WatchFailed) and self.back_since is not None:
            level = logging.DEBUG if time.monotonic() - self.back_since < 60 else logging.WARNING
        log.log(level, "watch of %s failed (%r); listing again in %.1fs", self.kind.name, exc, delay)

    async def _get(
        self, query: list[tuple[str, str]], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self.api.call_api(
            self.kind.path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        return response


async def _raise_for(response: aiohttp.ClientResponse) -> None:
    if response.status != 200:
        text = (await response.read())[:300].decode(errors="replace")
        raise watch_stream.WatchFailed(f"{response.status} {text}")
