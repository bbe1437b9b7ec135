"""Two things Kopf's watches do not do, added around its `continuous_watch`
(kopf/_cogs/clients/watching.py, the list-then-watch of one kind, called again by `infinite_watch`
whenever it returns):

1. Say when a listing is complete and what it held. Kopf lists a kind again after every broken watch
   (410 Gone after a CRD update or an API server restart, a dropped connection) and reports the listed
   objects, but not those that vanished while no watch was open: without this the Store would keep a
   deleted node or DaemonSet forever. `Hooks.listed` gets the (namespace, name) of every listed object
   once the listing is over (Kopf's `Bookmark.LISTED`), and the Store forgets the others.
2. Survive the API server. A 404 (the CRD deleted between two watch requests), a 403, a watch ERROR
   event or an API server that stays down longer than Kopf's own retries make the watch raise, which
   stops Kopf and the whole operator. Here the watch logs one line, waits `retry_seconds` and lists
   again (through `infinite_watch`), so the operator keeps running and resumes when the API does.

The hooks travel on Kopf's settings object of one operator run (`attach`), not in module state.
`install` replaces the function once per process; Kopf is pinned below 2 (pyproject.toml) and
tests/unit/test_watch_guard.py fails if the function it wraps changes its shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kopf._cogs.clients import errors, watching

log = logging.getLogger("gpu_operator")

Listed = Callable[[str, str, set[tuple[str, str]]], None]
"""(group, plural, {(namespace or "", name)} of the listing)."""
_ATTRIBUTE = "gpu_operator_watch_hooks"
_ORIGINAL = "_gpu_operator_original"


@dataclass(frozen=True)
class Hooks:
    listed: Listed
    retry_seconds: float = 5.0


def attach(kopf_settings: Any, hooks: Hooks) -> None:
    setattr(kopf_settings, _ATTRIBUTE, hooks)


_TROUBLE = (errors.APIError, watching.WatchingError, aiohttp.ClientError, OSError, TimeoutError)


async def guarded_watch(*, settings: Any, resource: Any, **kwargs: Any) -> AsyncIterator[Any]:
    original = getattr(guarded_watch, _ORIGINAL)
    hooks: Hooks | None = getattr(settings, _ATTRIBUTE, None)
    if hooks is None:
        async for item in original(settings=settings, resource=resource, **kwargs):
            yield item
        return
    listing: set[tuple[str, str]] | None = set()
    try:
        async for item in original(settings=settings, resource=resource, **kwargs):
            if item is watching.Bookmark.LISTED and listing is not None:
                hooks.listed(resource.group, resource.plural, listing)
                listing = None
            elif listing is not None and isinstance(item, dict) and item.get("type") is None:
                metadata = (item.get("object") or {}).get("metadata") or {}
                listing.add((metadata.get("namespace") or "", metadata.get("name") or ""))
            yield item
    except _TROUBLE as exc:
        what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        log.warning("watch of %s failed (%s); listing again in %.0fs", what, exc, hooks.retry_seconds)
        await asyncio.sleep(hooks.retry_seconds)


def install() -> None:
    """Route Kopf's list-then-watch through `guarded_watch` (idempotent)."""
    if watching.continuous_watch is guarded_watch:
        return
    setattr(guarded_watch, _ORIGINAL, watching.continuous_watch)
    watching.continuous_watch = guarded_watch
