"""Three things Kopf's watches do not do, added around its `continuous_watch`
(kopf/_cogs/clients/watching.py, the list-then-watch of one kind, called again by `infinite_watch`
whenever it returns):

1. Say when a listing is complete and what it held. Kopf lists a kind again after every broken watch
   (410 Gone after a CRD update or an API server restart, a dropped connection) and reports the listed
   objects, but not those that vanished while no watch was open: without this the Store would keep a
   deleted node or DaemonSet forever. `Hooks.listed` gets the (namespace, name) of every listed object
   once the listing is over (Kopf's `Bookmark.LISTED`), and the Store forgets the others.
2. Record the busy kinds without Kopf's per-event machinery. Every pod and node change would go through
   Kopf's stream of async generators, a per-object worker task, a batching queue and two handler
   invocations with their keyword arguments, to do what one function call does: put the slim record
   into the Store. The kinds in `Hooks.direct` (gpu_operator/main.py: all but ClusterPolicies, CRDs
   and the namespace) are listed and watched by gpu_operator/runtime/watch_stream.py instead of Kopf's
   function,
   which records each object itself and hands Kopf only the end of the listing (`Bookmark.LISTED`):
   that still marks the kind indexed, so Kopf runs no event handler before every kind is listed, and
   for these kinds every listed object is in the Store before that bookmark.
3. Survive the API server. A 404 (the CRD deleted between two watch requests), a 403, a watch ERROR
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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
from kopf._cogs.clients import errors, watching

from gpu_operator.runtime import watch_stream

log = logging.getLogger("gpu_operator")

Listed = Callable[[str, str, set[tuple[str, str]]], None]
"""(group, plural, {(namespace or "", name)} of the listing)."""
Record = watch_stream.Record
_ATTRIBUTE = "gpu_operator_watch_hooks"
_ORIGINAL = "_gpu_operator_original"


@dataclass(frozen=True)
class Hooks:
    listed: Listed
    retry_seconds: float = 5.0
    direct: Mapping[tuple[str, str], Record] = field(default_factory=dict)
    """(group, plural) → how its objects enter the Store, for the kinds recorded here (see above)."""
    wake: Callable[[], None] = lambda: None
    """Called (on the event loop) when a directly recorded object needs a pass."""
    settle: watch_stream.Settle = lambda rate: None
    """Asked after each read of a direct kind's stream: whether to wait before the next (Loop.settle)."""


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
    record = hooks.direct.get((resource.group, resource.plural))
    listed = partial(hooks.listed, resource.group, resource.plural)
    if record is not None:
        stream = watch_stream.list_then_watch(
            settings=settings,
            resource=resource,
            record=record,
            listed=listed,
            wake=hooks.wake,
            settle=hooks.settle,
            **kwargs,
        )
    else:
        stream = _reporting(original(settings=settings, resource=resource, **kwargs), listed)
    try:
        async for item in stream:
            yield item
    except _TROUBLE as exc:
        what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        log.warning("watch of %s failed (%s); listing again in %.0fs", what, exc, hooks.retry_seconds)
        await asyncio.sleep(hooks.retry_seconds)


async def _reporting(
    stream: AsyncIterator[Any], listed: Callable[[set[tuple[str, str]]], None]
) -> AsyncIterator[Any]:
    """Kopf's own stream, unchanged, with its listing reported once it is complete."""
    listing: set[tuple[str, str]] | None = set()
    async for item in stream:
        if item is watching.Bookmark.LISTED and listing is not None:
            listed(listing)
            listing = None
        elif listing is not None and isinstance(item, dict) and item.get("type") is None:
            metadata = (item.get("object") or {}).get("metadata") or {}
            listing.add((metadata.get("namespace") or "", metadata.get("name") or ""))
        yield item


def install() -> None:
    """Route Kopf's list-then-watch through `guarded_watch` (idempotent)."""
    if watching.continuous_watch is guarded_watch:
        return
    setattr(guarded_watch, _ORIGINAL, watching.continuous_watch)
    watching.continuous_watch = guarded_watch
