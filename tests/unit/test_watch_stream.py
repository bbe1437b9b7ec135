"""The list-then-watch of the kinds recorded straight into the Store (gpu_operator/runtime/watch_stream.py),
through the guard that routes Kopf's watches (gpu_operator/runtime/watch_guard.py), against a loopback HTTP
server that answers a LIST and streams watch events as the API server does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

kopf = pytest.importorskip("kopf")
from aiohttp import web  # noqa: E402
from builders import daemonset_body, node_body  # noqa: E402
from kopf._cogs.clients import auth, watching  # noqa: E402
from kopf._cogs.structs import credentials, references  # noqa: E402

from gpu_operator.main import watches  # noqa: E402
from gpu_operator.runtime import watch_guard, watch_stream  # noqa: E402
from gpu_operator.runtime.store import Store  # noqa: E402

NODES = references.Resource("", "v1", "nodes", namespaced=False)
DAEMONSETS = references.Resource("apps", "v1", "daemonsets", namespaced=True)
Part = bytes | float | None
"""What a watch stream sends next: bytes, a pause of that many seconds, or None: the connection drops."""


def line(kind: str | None, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": body}, separators=(",", ":")).encode() + b"\n"


def node(name: str, version: str, **labels: str) -> dict[str, Any]:
    return node_body(name, labels, resource_version=version, typed=True)


@dataclass
class FakeApi:
    """One kind's collection: its LIST answer and, in turn, what each watch request streams (a request
    past the last stream is held open until the client goes)."""

    items: list[dict[str, Any]]
    streams: list[list[Part]]
    list_version: str = "10"
    requests: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if request.query.get("watch") != "true":
            metadata = {"resourceVersion": self.list_version}
            return web.json_response({"kind": "List", "metadata": metadata, "items": self.items})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if not self.streams:
            await asyncio.sleep(3600)
        for part in self.streams.pop(0):
            if part is None:
                assert request.transport is not None
                request.transport.close()
                return response
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                await response.write(part)
        return response


@dataclass
class Watched:
    yielded: list[Any]
    """What the guard handed Kopf."""
    told: list[Any]
    """What the `listed` hook was told."""
    woken: int
    settled: int
    rates: list[float]
    """The bytes a second `settle` was told after each read."""


def run(
    api: FakeApi,
    record: watch_stream.Record,
    until: Callable[[], bool],
    resource: references.Resource = NODES,
    settle: Callable[[], Any] = lambda: None,
) -> Watched:
    """Watch `resource` of `api` through the guard until `until()` holds, then pause it as Kopf would
    (its pause waiter done), or until the guard ends on its own; what it did."""
    told: list[Any] = []
    counts = {"woken": 0, "settled": 0}
    rates: list[float] = []

    def counted_settle(rate: float) -> Any:
        counts["settled"] += 1
        rates.append(rate)
        return settle()

    def wake() -> None:
        counts["woken"] += 1

    async def main() -> list[Any]:
        app = web.Application()
        app.router.add_get(resource.get_url(namespace=None), api.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        vault = credentials.Vault()
        await vault.populate({"t": credentials.ConnectionInfo(server=f"http://127.0.0.1:{port}", token="t")})
        auth.vault_var.set(vault)
        settings = kopf.OperatorSettings()
        settings.watching.label_selectors[resource.group, resource.plural] = "a=b"
        settings.watching.server_timeout = 300
        direct = {(resource.group, resource.plural): record}
        hooks = watch_guard.Hooks(
            lambda *args: told.append(args), 0, direct, wake=wake, settle=counted_settle
        )
        watch_guard.attach(settings, hooks)
        paused: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def consume() -> list[Any]:
            stream = watch_guard.guarded_watch(
                settings=settings, resource=resource, namespace=None, operator_pause_waiter=paused
            )
            return [item async for item in stream]

        task = asyncio.create_task(consume())
        for _ in range(500):
            if until() or task.done():
                break
            await asyncio.sleep(0.01)
        paused.set_result(None)
        yielded = await asyncio.wait_for(task, 10)
        await vault.close()
        await runner.cleanup()
        return yielded

    async def kopfs(**_: Any) -> Any:
        raise AssertionError("a direct kind never goes through Kopf's continuous_watch")
        yield

    saved = getattr(watch_guard.guarded_watch, "_gpu_operator_original", None)
    watch_guard.guarded_watch._gpu_operator_original = kopfs  # type: ignore[attr-defined]
    try:
        yielded = asyncio.run(main())
    finally:
        watch_guard.guarded_watch._gpu_operator_original = saved  # type: ignore[attr-defined]
    return Watched(yielded, told, counts["woken"], counts["settled"], rates)


def recorder(store: Store, names: list[str]) -> watch_stream.Record:
    def record(body: Any, deleted: bool) -> bool:
        names.append(body["metadata"]["name"])
        return store.record_node(body, deleted)

    return record


def test_a_direct_kind_is_listed_watched_and_recorded_and_kopf_sees_only_the_end_of_its_listing() -> None:
    store = Store()
    recorded: list[str] = []
    gpu = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    stream: list[Part] = [
        line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "11"}}),
        line("MODIFIED", node("n1", "12", **gpu)),  # nothing a decision reads changed: no pass
        b"\n",  # a blank line between events
        line("MODIFIED", node("n1", "13", a="b")),
        line("DELETED", node("n1", "14", a="b")),
        line("MODIFIED", {"kind": "Node", "metadata": {}}),  # a bug in recording: logged, the watch goes on
        line("ADDED", node("n2", "15")),
    ]
    api = FakeApi([node("n1", "9", **gpu)], [stream])
    watched = run(api, recorder(store, recorded), until=lambda: store.get("nodes", "n2") is not None)
    assert watched.yielded == [watching.Bookmark.LISTED], "Kopf gets the listing's end, never an object"
    assert watched.told == [("", "nodes", {("", "n1")})]
    assert recorded == ["n1", "n1", "n1", "n1", "n2"]
    assert store.get("nodes", "n1") is None and store.get("nodes", "n2") is not None
    assert watched.woken == 4, "listed, relabelled, deleted, added"
    listing, first = api.requests[0], api.requests[1]
    assert listing["labelSelector"] == "a=b" and "watch" not in listing
    assert first["watch"] == "true" and first["resourceVersion"] == "10", "from the listing's version"
    assert first["labelSelector"] == "a=b" and first["allowWatchBookmarks"] == "true"


def test_an_ended_or_broken_watch_resumes_from_the_last_version_it_saw() -> None:
    store = Store()
    recorded: list[str] = []
    streams: list[list[Part]] = [
        [line("ADDED", node("n1", "12"))],  # the server ends it (its timeoutSeconds)
        [line("ADDED", node("n2", "20")), 0.05, b'{"type":"ADDED","obj', None],  # dropped mid-event
        [line("ADDED", node("n3", "30"))],
    ]
    api = FakeApi([], streams)
    run(api, recorder(store, recorded), until=lambda: len(recorded) == 3)
    assert [r.get("resourceVersion") for r in api.requests[:4]] == [None, "10", "12", "20"]
    assert recorded == ["n1", "n2", "n3"]


def test_gone_lists_the_kind_again_and_an_error_event_is_retried_by_the_guard() -> None:
    gone = FakeApi([], [[line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})]])
    watched = run(gone, lambda body, deleted: False, until=lambda: False)
    assert watched.yielded == [watching.Bookmark.LISTED], "ended by itself: Kopf lists it again"
    assert len(gone.requests) == 2
    failing = FakeApi([], [[line("ERROR", {"kind": "Status", "code": 500, "message": "boom"})]])
    watched = run(failing, lambda body, deleted: False, until=lambda: False)
    assert watched.yielded == [watching.Bookmark.LISTED] and len(failing.requests) == 2


def test_while_the_loop_is_busy_the_events_of_the_wait_arrive_in_one_read() -> None:
    """Events arriving while `settle` says wait are all read at once after it, a line cut between two
    writes included, in order and none lost."""
    store = Store()
    recorded: list[str] = []
    third = line("ADDED", node("n3", "13"))
    stream: list[Part] = [
        line("ADDED", node("n1", "11")),
        0.05,
        line("ADDED", node("n2", "12")),
        0.05,
        third[:20],
        0.05,
        third[20:],
    ]
    api = FakeApi([], [stream])
    watched = run(
        api,
        recorder(store, recorded),
        until=lambda: len(recorded) == 3,
        settle=lambda: asyncio.sleep(0.5),
    )
    assert recorded == ["n1", "n2", "n3"]
    assert watched.settled == 2, "one read for the first event, one for the three writes of the wait"
    waited = len(stream[2]) + len(third)  # type: ignore[arg-type]
    assert waited < watched.rates[1] < waited / 0.5, "what the read brought, a second: over the 0.5 s wait"


def test_the_connection_is_not_read_at_all_while_waiting() -> None:
    """A TLS transport's reading is paused and its read buffer limit set to zero, which pauses the
    socket under it too; both are undone afterwards."""
    calls: list[Any] = []

    class Transport:
        def is_closing(self) -> bool:
            return False

        def pause_reading(self) -> None:
            calls.append("pause")

        def resume_reading(self) -> None:
            calls.append("resume")

        def set_read_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
            calls.append(("limits", high))

    async def waiting() -> None:
        calls.append("waited")

    asyncio.run(watch_stream._unread(waiting(), Transport()))  # type: ignore[arg-type]
    assert calls == ["pause", ("limits", 0), "waited", ("limits", None), "resume"]


def test_only_policies_crds_and_the_namespace_go_through_kopfs_workers() -> None:
    """Every other kind is read by watch_stream: a DaemonSet's status updates (about 900 in a 1000-node
    rollout) reach the Store, and wake a pass only when its rollout flips."""
    store = Store()
    every = watches(store)
    assert {w.plural for w in every if not w.direct} == {
        "clusterpolicies",
        "customresourcedefinitions",
        "namespaces",
    }
    record = next(w.record for w in every if w.plural == "daemonsets")
    ours = {"app.kubernetes.io/managed-by": "gpu-operator"}

    def daemonset(ready: int) -> dict[str, Any]:
        return daemonset_body(
            "nvidia-dcgm", "dcgm", ready=ready, desired=2, updated=ready, resource_version="5", labels=ours
        )

    key = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dcgm")
    stream: list[Part] = [
        line("MODIFIED", daemonset(1)),  # counts moved: no pass
        line("MODIFIED", daemonset(2)),  # rolled out
    ]
    api = FakeApi([daemonset(0)], [stream])

    def rolled_out() -> bool:
        found = store.get("daemonsets", key)
        return found is not None and found.ready == 2

    watched = run(api, record, until=rolled_out, resource=DAEMONSETS)
    assert watched.told == [("apps", "daemonsets", {("gpu-operator", "nvidia-dcgm")})]
    assert store.get("objects", key) is not None and rolled_out()
    assert watched.woken == 2, "listed, rolled out"
    gone = FakeApi([], [[line("DELETED", daemonset(2))]])
    run(gone, record, until=lambda: store.get("daemonsets", key) is None, resource=DAEMONSETS)
    assert store.get("daemonsets", key) is None and store.get("objects", key) is None
