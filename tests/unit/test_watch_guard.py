"""The guard around Kopf's list-then-watch (gpu_operator/runtime/watch_guard.py): a finished listing reports
what it held, so the Store forgets what vanished while no watch was open; a failing watch is retried
instead of stopping the operator. And the Kopf function it wraps still has the shape it relies on."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

kopf = pytest.importorskip("kopf")
from kopf._cogs.clients import errors, watching  # noqa: E402

from gpu_operator.core.node_labels import NodeInfo  # noqa: E402
from gpu_operator.core.observed import ObjectInfo, PolicyRef  # noqa: E402
from gpu_operator.core.plan import POLICY_CRD  # noqa: E402
from gpu_operator.main import watches  # noqa: E402
from gpu_operator.runtime import watch_guard  # noqa: E402
from gpu_operator.runtime.store import Store  # noqa: E402

RESOURCE = SimpleNamespace(group="", plural="nodes")


def consume(
    items: list[Any], fail: BaseException | None = None, resource: Any = RESOURCE, **hooks: Any
) -> tuple[list[Any], list[Any]]:
    """Run guarded_watch over a fake Kopf stream of `resource`; (what it yielded, what the hook was told)."""
    told: list[Any] = []

    async def original(**_: Any) -> AsyncIterator[Any]:
        for item in items:
            yield item
        if fail is not None:
            raise fail

    async def main() -> list[Any]:
        settings = SimpleNamespace()
        hook = watch_guard.Hooks(lambda *args: told.append(args), retry_seconds=0, **hooks)
        watch_guard.attach(settings, hook)
        return [item async for item in watch_guard.guarded_watch(settings=settings, resource=resource)]

    saved = getattr(watch_guard.guarded_watch, "_gpu_operator_original", None)
    watch_guard.guarded_watch._gpu_operator_original = original  # type: ignore[attr-defined]
    try:
        return asyncio.run(main()), told
    finally:
        watch_guard.guarded_watch._gpu_operator_original = saved  # type: ignore[attr-defined]


def listed(name: str, namespace: str = "") -> dict[str, Any]:
    return {"type": None, "object": {"metadata": {"name": name, "namespace": namespace}}}


def test_a_finished_listing_is_reported_once_with_what_it_held() -> None:
    later = {"type": "ADDED", "object": {"metadata": {"name": "c"}}}
    items = [listed("a"), listed("b", "ns"), watching.Bookmark.LISTED, later]
    seen, told = consume(items)
    assert seen == items, "everything still reaches Kopf"
    assert told == [("", "nodes", {("", "a"), ("ns", "b")})]


@pytest.mark.parametrize(
    "failure",
    [
        errors.APINotFoundError("gone", status=404, headers={}),
        watching.WatchingError("Error in the watch-stream"),
        ConnectionResetError("reset"),
        TimeoutError(),
    ],
    ids=["404-crd-gone", "watch-error", "connection", "timeout"],
)
def test_a_failing_watch_returns_to_be_listed_again(failure: BaseException) -> None:
    seen, told = consume([listed("a")], fail=failure)
    assert seen == [listed("a")] and told == []  # not a complete listing: nothing forgotten


def test_install_wraps_kopfs_function_once_and_its_shape_holds() -> None:
    parameters = inspect.signature(watching.continuous_watch).parameters
    assert {"settings", "resource", "namespace", "operator_pause_waiter"} <= set(parameters)
    assert watching.Bookmark.LISTED
    watch_guard.install()
    watch_guard.install()
    assert watching.continuous_watch is watch_guard.guarded_watch
    original = watch_guard.guarded_watch._gpu_operator_original  # type: ignore[attr-defined]
    assert original is not watch_guard.guarded_watch and inspect.isasyncgenfunction(original)


def retainer(store: Store, plural: str) -> Any:
    return next(w.retain for w in watches(store) if w.plural == plural)


def test_a_relisting_forgets_what_vanished_of_its_own_kind_only() -> None:
    store = Store()
    store.put("nodes", "gone", NodeInfo("gone", {}))
    store.put("nodes", "kept", NodeInfo("kept", {}))
    assert retainer(store, "nodes")({("", "kept")})
    assert store.get("nodes", "gone") is None and store.get("nodes", "kept") is not None
    assert not retainer(store, "nodes")({("", "kept")}), "nothing more to forget"
    ds = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dcgm")
    cm = ("v1", "ConfigMap", "gpu-operator", "nvidia-dcgm")
    for key in (ds, cm):
        store.put("objects", key, ObjectInfo(key, "dcgm", "h", 1, "1", "u"))
    assert retainer(store, "daemonsets")(set())
    assert store.get("objects", ds) is None and store.get("objects", cm) is not None


def test_the_policy_crd_gone_means_every_policy_is_gone() -> None:
    store = Store()
    store.put("policies", "p", PolicyRef("p", "u", 1, "", {}, {}))
    assert retainer(store, "customresourcedefinitions")(set())
    assert store.get("policies", "p") is None and store.get("crds", POLICY_CRD) is False
    store.put("policies", "p", PolicyRef("p", "u", 1, "", {}, {}))
    assert store.record_crd({"metadata": {"name": POLICY_CRD}}, deleted=True)
    assert store.get("policies", "p") is None
    assert not store.record_crd({"metadata": {"name": "other.example.com"}}, deleted=False)
