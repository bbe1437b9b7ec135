"""The reading of one watch stream (gpu_operator/runtime/informer.py opens it), straight into the Store.

Each chunk the connection delivers is split into lines in one loop, each line decoded from bytes once
(`safe_json.loads_event`, which slims a pod's event before decoding) and recorded at once; the
inactivity timeout is aiohttp's read timeout, rearmed per chunk by aiohttp itself. No model classes,
no per-event generators or tasks: for the operand pods and the nodes, tens of thousands of events in
a large rollout, each ends in one function call that puts a slim record into the Store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpu_operator.runtime import metrics, safe_json

log = logging.getLogger("gpu_operator")

Record = Callable[[Mapping[str, Any], bool], bool]
"""(object, deleted) → whether a pass must follow."""
Settle = Callable[[], Awaitable[object] | None]
"""Asked after each read: None to read on at once, else what to await first (see `read`)."""
_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


class WatchFailed(Exception):
    """The API server refused a list or watch, or sent an ERROR event (its status and message)."""


@dataclass
class Events:
    """One kind's stream: where its objects go (the Store, through `record`; the loop, `wake`, when one
    needs a pass), when to read again (`settle`), and the last resourceVersion seen, where a watch
    resumes ("" once the kind must be listed again)."""

    record: Record
    plural: str
    wake: Callable[[], None]
    settle: Settle
    version: str = ""
    decode: Callable[[bytes], Any] = safe_json.loads_event
    """How a line of the stream is decoded: by default without what nothing reads of a pod;
    `safe_json.loads` for a stream whose pods are read whole (drain_watches.py)."""

    def add(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """One listed (kind None) or watched object into the Store; a bug here never stops the watch."""
        metrics.observe_watch_event(body.get("kind") or self.plural, kind)
        try:
            if self.record(body, kind == "DELETED"):
                self.wake()
        except Exception:
            log.exception("could not record %s %s", self.plural, (body.get("metadata") or {}).get("name"))


async def read(
    content: aiohttp.StreamReader, events: Events, transport: asyncio.Transport | None = None
) -> None:
    """Record every event of the stream, until it ends or a 410 Gone (then `events.version` is "").

    After each read `events.settle` says whether to read on at once (the work queue is idle: the next
    event may be what starts a pass) or to wait first (a pass runs or is asked for: it would not see
    the events any sooner). While waiting, the connection's `transport` is not read at all, so that
    the events of the wait arrive in one read: each wake-up of the event loop costs about as much as
    the events it brings (measured: bench/watch_cost.py, bench/README.md).
    """
    rest = b""
    while data := await content.readany():
        if rest:
            data, rest = rest + data, b""
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            line = data[start:end]
            start = end + 1
            if line.strip() and _event(line, events):
                return
        rest = data[start:]
        waiting = events.settle()
        if waiting is not None:
            await _unread(waiting, transport)


def _event(line: bytes, events: Events) -> bool:
    """Record one event and keep its resourceVersion; True for a 410 Gone (list the kind again)."""
    event = events.decode(line)
    kind = event.get("type")
    body = event.get("object") or {}
    if kind == "ERROR":
        if body.get("code") == 410:
            log.debug("watch of %s: resourceVersion too old; listing again", events.plural)
            events.version = ""
            return True
        raise WatchFailed(f"an ERROR event in the watch stream: {body}")
    if kind in _EVENTS:
        events.add(kind, body)
    elif kind != "BOOKMARK":
        log.warning("ignoring a watch event of an unknown type: %.200s", line)
    events.version = str((body.get("metadata") or {}).get("resourceVersion") or events.version)
    return False


async def _unread(waiting: Awaitable[object], transport: asyncio.Transport | None) -> None:
    """Await `waiting` with the connection's reading paused. A TLS transport (asyncio's sslproto) goes
    on reading the socket into its buffer while only its decrypting is paused; a read buffer limit of
    zero pauses the socket too (asyncio.Transport.set_read_buffer_limits: "causes pause_reading() to be
    called whenever the buffer becomes non-empty"), and the default limits resume it."""
    if transport is None or transport.is_closing():
        await waiting
        return
    limits = getattr(transport, "set_read_buffer_limits", None)
    transport.pause_reading()
    if limits is not None:
        limits(high=0)
    try:
        await waiting
    finally:
        if not transport.is_closing():
            if limits is not None:
                limits()
            transport.resume_reading()
