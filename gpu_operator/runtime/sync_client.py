"""The operator's client (gpu_operator/runtime/client.py) for callers without an event loop of their own.

`doctor`, the Helm cleanup hook, `kubeconfig`, the node agent, the bench and the tests' helpers are
plain sequential code, some with threads. They call the same async client, on the same transport,
through `SyncKube`: one event loop in a daemon thread runs every call, whichever thread asks, and each
method blocks until its call has an answer. Nothing here talks to the API server itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from gpu_operator.runtime.client import DEFAULT_TIMEOUT, Kube, Timeout, connect

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _blocking(
    method: Callable[Concatenate[Kube, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SyncKube, P], R]:
    """A Kube method as a SyncKube method: the same arguments, the answer once it is there."""

    def call(self: SyncKube, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.run(method(self.kube, *args, **kwargs))

    call.__doc__ = method.__doc__
    return call


class SyncKube:
    """Kube's calls, blocking. Build one with `connect`; `close` ends its connections and its loop."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Kube]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gpu-operator-client", daemon=True)
        self.thread.start()
        try:
            self.kube = self.run(make())
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def connect(
        cls,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        user_agent: str = "",
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> SyncKube:
        """A client for the kubeconfig, else in-cluster credentials, else $KUBECONFIG or
        ~/.kube/config (client.connect); ConfigException or OSError when none works."""

        async def make() -> Kube:
            return Kube(await connect(kubeconfig, context, user_agent), timeout=timeout)

        return cls(make)

    def run(self, call: Coroutine[Any, Any, R]) -> R:
        """Run a coroutine on the client's loop and wait for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(call, self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.run(self.kube.close())
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def watch(
        self, api_version: str, kind: str, query: Mapping[str, str], timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """Kube.watch's events, one at a time as they come."""
        events = self.kube.watch(api_version, kind, query, timeout_seconds)
        try:
            yield from self.iterate(events)
        finally:
            self.run(events.aclose())

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator's items, each taken on the client's loop; closing it is the caller's."""
        while True:
            try:
                yield self.run(_next(items))
            except StopAsyncIteration:
                return

    request = _blocking(Kube.request)
    get = _blocking(Kube.get)
    metadata = _blocking(Kube.metadata)
    list_at = _blocking(Kube.list_at)
    list = _blocking(Kube.list)
    pod_log = _blocking(Kube.pod_log)
    text = _blocking(Kube.text)
    apply = _blocking(Kube.apply)
    delete = _blocking(Kube.delete)
    apply_node_labels = _blocking(Kube.apply_node_labels)
    rewrite_labels = _blocking(Kube.rewrite_labels)
    patch_node = _blocking(Kube.patch_node)
    evict = _blocking(Kube.evict)
    delete_pod = _blocking(Kube.delete_pod)
    patch_status = _blocking(Kube.patch_status)
    post_event = _blocking(Kube.post_event)


async def _next(items: AsyncIterator[T]) -> T:
    return await anext(items)
