"""The informers (gpu_operator/runtime/informer.py) and the reading of their watch streams
(gpu_operator/runtime/watch_stream.py), against a loopback HTTP server that answers a LIST (in pages)
and streams watch events as the API server does."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp import web
from builders import daemonset_body, node_body
from kubernetes_asyncio import client

from gpu_operator.main import watches
from gpu_operator.runtime import informer, watch_stream
from gpu_operator.runtime.backoff import Backoff
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

NODES = informer.Kind("", "v1", "nodes", label_selector="a=b")
DAEMONSETS = informer.Kind("apps", "v1", "daemonsets", "gpu-operator")
FAST = replace(informer.Timing.of(Settings()), chunk_size=2, retry=0.0)
"""Pages of two objects; failures retried at once."""
Part = bytes | float | Callable[[], Awaitable[object]] | None
"""What a watch stream sends next: bytes, a pause of that many seconds, a step of the test's that the
stream awaits (an event to wait for, a change to make), or None: the connection drops."""


def line(kind: str | None, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": body}, separators=(",", ":")).encode() + b"\n"


def node(name: str, version: str, **labels: str) -> dict[str, Any]:
    """A Node at resourceVersion `version`, as the watch streams and the listings carry it (a shorthand
    of builders.node_body for the streams below)."""
    return node_body(name, labels, resource_version=version, typed=True)


@dataclass
class FakeApi:
    """One kind's collection: its LIST answer (in pages of `limit`), and in turn what each watch request
    streams (a request past the last stream is held open until the client goes). The first `missing`
    requests are answered 404 (the kind is not served)."""

    items: list[dict[str, Any]]
    streams: list[list[Part]]
    list_version: str = "10"
    missing: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        self.headers.append(dict(request.headers))
        if self.missing:
            self.missing -= 1
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.query.get("watch") != "true":
            start = int(request.query.get("continue") or 0)
            limit = int(request.query.get("limit") or len(self.items) or 1)
            metadata = {"resourceVersion": self.list_version}
            if start + limit < len(self.items):
                metadata["continue"] = str(start + limit)
            first = self.items[0] if self.items else {"kind": "Node", "apiVersion": "v1"}
            page = [dict(item) for item in self.items[start : start + limit]]
            for item in page:  # as the API server lists built-in kinds
                item.pop("kind", None)
                item.pop("apiVersion", None)
            kind, api_version = f"{first['kind']}List", first["apiVersion"]
            body = {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": page}
            return web.json_response(body)
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
            elif isinstance(part, bytes):
                await response.write(part)
            else:
                await part()
        return response


@dataclass
class Watched:
    told: list[set[tuple[str, str]]]
    """What the `listed` callback was told, listing after listing."""
    woken: int
    settled: int


def run(
    api: FakeApi,
    record: watch_stream.Record,
    until: Callable[[], bool],
    kind: informer.Kind = NODES,
    settle: Callable[[], Any] = lambda: None,
    timing: informer.Timing = FAST,
) -> Watched:
    """Run an informer of `kind` against `api` until `until()` holds (or 5 s pass), then stop it."""
    told: list[set[tuple[str, str]]] = []
    counts = {"woken": 0, "settled": 0}

    def counted_settle() -> Any:
        counts["settled"] += 1
        return settle()

    def wake() -> None:
        counts["woken"] += 1

    async def main() -> None:
        app = web.Application()
        app.router.add_get(kind.path, api.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        configuration.api_key = {"BearerToken": "t"}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        api_client = client.ApiClient(configuration)
        events = watch_stream.Events(record, kind.plural, wake, counted_settle)
        watcher = informer.Informer(api_client, kind, events, told.append, timing)
        task = asyncio.create_task(watcher.run())
        for _ in range(500):
            if until():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()
        await runner.cleanup()

    asyncio.run(main())
    return Watched(told, counts["woken"], counts["settled"])


def recorder(store: Store, names: list[str]) -> watch_stream.Record:
    def record(body: Any, deleted: bool) -> bool:
        names.append(body["metadata"]["name"])
        return store.record_node(body, deleted)

    return record


def test_a_kind_is_listed_in_pages_watched_and_recorded() -> None:
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
    api = FakeApi([node("n1", "9", **gpu), node("n0", "8"), node("n9", "7")], [stream])
    watched = run(api, recorder(store, recorded), until=lambda: store.get("nodes", "n2") is not None)
    assert watched.told == [{("", "n1"), ("", "n0"), ("", "n9")}], "the listing, once complete"
    assert recorded == ["n1", "n0", "n9", "n1", "n1", "n1", "n2"]
    assert store.get("nodes", "n1") is None and store.get("nodes", "n2") is not None
    assert store.get("nodes", "n0") is not None, "listed items get the list's kind and apiVersion"
    first_page, second_page, watch = api.requests[:3]
    assert first_page == {"labelSelector": "a=b", "limit": "2"}
    assert second_page == {"labelSelector": "a=b", "limit": "2", "continue": "2"}
    assert watch["watch"] == "true" and watch["resourceVersion"] == "10", "from the listing's version"
    assert watch["labelSelector"] == "a=b" and watch["allowWatchBookmarks"] == "true"
    assert watch["timeoutSeconds"] == "300"
    assert all(h.get("Authorization") == "Bearer t" for h in api.headers), "the client's credentials"


def test_an_ended_or_broken_watch_resumes_from_the_last_version_it_saw() -> None:
    store = Store()
    recorded: list[str] = []
    streams: list[list[Part]] = [
        [line("ADDED", node("n1", "12"))],  # the server ends it (its timeoutSeconds)
        [line("ADDED", node("n2", "20")), 0.05, b'{"type":"ADDED","obj', None],  # dropped mid-event
        [line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "25"}})],
        [line("ADDED", node("n3", "30"))],
    ]
    api = FakeApi([], streams)
    watched = run(api, recorder(store, recorded), until=lambda: len(recorded) == 3)
    assert [r.get("resourceVersion") for r in api.requests[:5]] == [None, "10", "12", "20", "25"]
    assert recorded == ["n1", "n2", "n3"]
    assert watched.told == [set()], "listed once: resumed, never listed again"


def test_gone_lists_the_kind_again_and_what_vanished_meanwhile_is_reported() -> None:
    store = Store()
    recorded: list[str] = []
    expired = line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})

    async def vanish() -> None:
        gone.items = []  # deleted while the watch runs, before its 410

    gone = FakeApi([node("n1", "9")], [[vanish, expired]])

    def relisted() -> bool:
        return len(gone.requests) >= 4

    watched = run(gone, recorder(store, recorded), until=relisted)
    assert "watch" not in gone.requests[2], "listed again after the 410"
    assert watched.told[:2] == [{("", "n1")}, set()], "the second listing lacks what vanished"


def test_an_error_event_or_a_refusal_is_retried_and_never_stops_the_informer() -> None:
    failing = FakeApi([], [[line("ERROR", {"kind": "Status", "code": 500, "message": "boom"})]])
    watched = run(failing, lambda body, deleted: False, until=lambda: len(failing.requests) >= 4)
    assert ["watch" in r for r in failing.requests[:4]] == [False, True, False, True]
    assert len(watched.told) >= 2


def test_a_kind_not_served_counts_as_listed_and_empty_and_is_tried_again() -> None:
    """A 404 (the CRD is absent): the Store forgets the kind's objects and the first pass need not wait
    for it; once served, it is listed and watched."""
    store = Store()
    recorded: list[str] = []
    api = FakeApi([node("n1", "9")], [], missing=2)
    watched = run(api, recorder(store, recorded), until=lambda: bool(recorded))
    assert watched.told[:3] == [set(), set(), {("", "n1")}]
    assert recorded == ["n1"]


def test_a_watch_answered_404_lists_again_and_its_kind_counts_as_empty() -> None:
    """The CRD deleted under a running watch: the next watch request gets 404, the listing too, and the
    Store is told the kind is empty (its objects went with the CRD)."""
    store = Store()
    recorded: list[str] = []
    api = FakeApi([node("n1", "9")], [[]])  # the first watch ends at once

    async def gone(request: web.Request) -> web.StreamResponse:
        if len(api.requests) < 2:  # the listing and the first watch
            return await FakeApi.handle(api, request)
        api.requests.append(dict(request.query))
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    api.handle = gone  # type: ignore[method-assign]
    watched = run(api, recorder(store, recorded), until=lambda: len(api.requests) >= 5)
    assert ["watch" in r for r in api.requests[:4]] == [False, True, True, False]
    assert watched.told[:2] == [{("", "n1")}, set()]


def test_refusals_right_after_a_dropped_connection_are_logged_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API server that has just come back answers 403 until its authorizer syncs: retried, and
    logged at debug level; the same refusal with no connection trouble before it is a warning."""

    def refusing(
        api: FakeApi, after: int
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if len(api.requests) < after or len(api.requests) >= after + 2:
                return await FakeApi.handle(api, request)
            api.requests.append(dict(request.query))
            return web.json_response({"kind": "Status", "code": 403, "reason": "Forbidden"}, status=403)

        return handle

    caplog.set_level(logging.DEBUG, logger="gpu_operator")
    dropped = FakeApi([node("n1", "9")], [[None]])  # the first watch drops, then two refusals
    dropped.handle = refusing(dropped, 2)  # type: ignore[method-assign,assignment]
    run(dropped, lambda body, deleted: False, until=lambda: len(dropped.requests) >= 6)
    refusals = [r for r in caplog.records if "403" in r.getMessage()]
    assert refusals and all(r.levelno == logging.DEBUG for r in refusals)
    caplog.clear()
    refused = FakeApi([node("n1", "9")], [])
    refused.handle = refusing(refused, 0)  # type: ignore[method-assign,assignment]
    run(refused, lambda body, deleted: False, until=lambda: len(refused.requests) >= 3)
    refusals = [r for r in caplog.records if "403" in r.getMessage()]
    assert refusals and all(r.levelno == logging.WARNING for r in refusals)


def test_backoff_doubles_up_to_its_bound_and_starts_again_after_a_success() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_a_policy_nested_deeper_than_pythons_decoder_goes_is_recorded_truncated() -> None:
    """A ClusterPolicy nested thousands of levels deep (a free-form section of the CRD keeps it) reaches
    the Store truncated, from the listing and from the watch, and the informer goes on: the planner
    reports it as InvalidSpec (api.too_deep)."""
    from gpu_operator.api import too_deep

    def deep(name: str, version: str) -> dict[str, Any]:
        metadata = {"name": name, "uid": f"uid-{name}", "resourceVersion": version, "generation": 1}
        spec = {"kataManager": {"config": "DEEP"}}
        return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": metadata, "spec": spec}

    nested = b"{" + b'"a": {' * 3000 + b"}" * 3001

    def deepened(text: bytes) -> bytes:
        return text.replace(b'"DEEP"', nested)  # json.dumps would recurse as deep: built as text

    store = Store()
    policies = informer.Kind("nvidia.com", "v1", "clusterpolicies")
    listed = FakeApi([deep("first", "9")], [[deepened(line("ADDED", deep("second", "12")))]])
    original = listed.handle

    async def handle(request: web.Request) -> web.StreamResponse:
        response = await original(request)
        if isinstance(response, web.Response) and response.body is not None:
            response.body = deepened(bytes(response.body))  # type: ignore[arg-type]
        return response

    listed.handle = handle  # type: ignore[method-assign]
    watched = run(
        listed, store.record_policy, until=lambda: store.get("policies", "second") is not None, kind=policies
    )
    assert watched.told == [{("", "first")}]
    for name in ("first", "second"):
        found = store.get("policies", name)
        assert found is not None and too_deep(found.spec) is not None, name


def test_while_the_queue_is_busy_the_events_of_the_wait_arrive_in_one_read() -> None:
    """Events arriving while `settle` says wait are all read at once after it, a line cut between two
    writes included, in order and none lost.

    The stream writes them once the wait has begun, and the wait ends once they are written, so that
    how fast the machine is does not matter."""
    began, written = asyncio.Event(), asyncio.Event()

    async def wait() -> None:
        await written.wait()

    def settle() -> Awaitable[None] | None:
        """Wait after the first read (the queue is busy), read on after the next (idle again)."""
        if began.is_set():
            return None
        began.set()
        return wait()

    async def all_written() -> None:
        written.set()

    store = Store()
    recorded: list[str] = []
    second, third = line("ADDED", node("n2", "12")), line("ADDED", node("n3", "13"))
    stream: list[Part] = [
        line("ADDED", node("n1", "11")),
        began.wait,
        second,
        third[:20],
        third[20:],
        all_written,
    ]
    api = FakeApi([], [stream])
    watched = run(api, recorder(store, recorded), until=lambda: len(recorded) == 3, settle=settle)
    assert recorded == ["n1", "n2", "n3"]
    assert watched.settled == 2, "one read for the first event, one for the three writes of the wait"


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


def test_every_kind_has_an_informer_scoped_as_the_operator_needs() -> None:
    store = Store()
    kinds = {w.plural: w.kind("gpu-operator") for w in watches(store)}
    assert {"clusterpolicies", "customresourcedefinitions", "namespaces", "pods", "nodes"} <= set(kinds)
    assert kinds["pods"].path == "/api/v1/namespaces/gpu-operator/pods"
    assert kinds["pods"].label_selector == "app.kubernetes.io/managed-by=gpu-operator"
    assert kinds["nodes"].path == "/api/v1/nodes" and not kinds["nodes"].label_selector
    assert kinds["namespaces"].path == "/api/v1/namespaces"
    assert kinds["namespaces"].field_selector == "metadata.name=gpu-operator"
    assert kinds["clusterpolicies"].path == "/apis/nvidia.com/v1/clusterpolicies"
    assert kinds["nvidiadrivers"].path == "/apis/nvidia.com/v1alpha1/nvidiadrivers"
    assert kinds["daemonsets"].path == "/apis/apps/v1/namespaces/gpu-operator/daemonsets"


def test_a_daemonsets_status_updates_reach_the_store_and_wake_a_pass_only_when_it_rolls_out() -> None:
    """A DaemonSet's status updates (about 900 in a 1000-node rollout) reach the Store, and wake a pass
    only when its rollout flips."""
    store = Store()
    every = watches(store)
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

    watched = run(api, record, until=rolled_out, kind=DAEMONSETS)
    assert watched.told == [{("gpu-operator", "nvidia-dcgm")}]
    assert store.get("objects", key) is not None and rolled_out()
    assert watched.woken == 2, "listed, rolled out"
    gone = FakeApi([], [[line("DELETED", daemonset(2))]])
    run(gone, record, until=lambda: store.get("daemonsets", key) is None, kind=DAEMONSETS)
    assert store.get("daemonsets", key) is None and store.get("objects", key) is None
