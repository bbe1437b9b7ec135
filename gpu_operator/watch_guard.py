"""Three things Kopf's watches do not do, added around its `continuous_watch`
(kopf/_cogs/clients/watching.py, the list-then-watch of one kind, called again by `infinite_watch`
whenever it returns):

1. Say when a listing is complete and what it held. Kopf lists a kind again after every broken watch
   (410 Gone after a CRD update or an API server restart, a dropped connection) and reports the listed
   objects, but not those that vanished while no watch was open: without this the Store would keep a
   deleted node or DaemonSet forever. `Hooks.listed` gets the (namespace, name) of every listed object
   once the listing is over (Kopf's `Bookmark.LISTED`), and the Store forgets the others.
2. Record the busy kinds without Kopf's per-event machinery. Every pod and node change would go through
   a per-object worker task, a batching queue and two handler invocations with their keyword
   arguments, to do what one function call does: put the slim record into the Store. For the kinds in
   `Hooks.direct` (gpu_operator/operator.py: all but ClusterPolicies, CRDs and the namespace) the guard
   records each listed or watched object itself and hands Kopf only the end of the listing
   (`Bookmark.LISTED`), which still marks the kind indexed: Kopf runs no event handler before every
   kind is listed, and for these kinds every listed object is in the Store before that bookmark.
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
from typing import Any

import aiohttp
from kopf._cogs.clients import errors, watching

from gpu_operator import metrics

log = logging.getLogger("gpu_operator")

Listed = Callable[[str, str, set[tuple[str, str]]], None]
"""(group, plural, {(namespace or "", name)} of the listing)."""
Record = Callable[[Mapping[str, Any], bool], bool]
"""(object, deleted) → whether a pass must follow."""
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
    record = hooks.direct.get((resource.group, resource.plural))
    try:
        async for item in original(settings=settings, resource=resource, **kwargs):
            if item is watching.Bookmark.LISTED and listing is not None:
                hooks.listed(resource.group, resource.plural, listing)
                listing = None
            elif listing is not None and isinstance(item, dict) and item.get("type") is None:
                metadata = (item.get("object") or {}).get("metadata") or {}
                listing.add((metadata.get("namespace") or "", metadata.get("name") or ""))
            if record is not None and isinstance(item, dict):
                _record(record, item, resource.plural, hooks.wake)
                continue
            yield item
    except _TROUBLE as exc:
        what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        log.warning("watch of %s failed (%s); listing again in %.0fs", what, exc, hooks.retry_seconds)
        await asyncio.sleep(hooks.retry_seconds)


def _record(record: Record, event: Mapping[str, Any], plural: str, wake: Callable[[], None]) -> None:
    """One listed (type None) or watched object into the Store; a bug here never stops the watch."""
    kind = event.get("type")
    if kind == "BOOKMARK":
        return
    body = event.get("object") or {}
    metrics.observe_watch_event(body.get("kind") or plural, kind)
    try:
        if record(body, kind == "DELETED"):
            wake()
    except Exception:
        log.exception("could not record %s %s", plural, (body.get("metadata") or {}).get("name"))


def install() -> None:
    """Route Kopf's list-then-watch through `guarded_watch` (idempotent)."""
    if watching.continuous_watch is guarded_watch:
        return
    setattr(guarded_watch, _ORIGINAL, watching.continuous_watch)
    watching.continuous_watch = guarded_watch
