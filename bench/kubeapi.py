"""The bench's API helpers over the project's client (gpu_operator.runtime.client, blocking through
gpu_operator.runtime.sync_client), and watches that timestamp a condition.

`Watcher` is how every duration is measured: it lists a collection, opens a watch from the list's
resourceVersion (before the action being timed starts), and records the wall-clock time of the
first event after which a predicate over the whole collection holds. No polling interval adds to
any measured time; the only latency is the watch's own, the same for the operator and the limit.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_operator.runtime import client
from gpu_operator.runtime.client import ApiError, Kube
from gpu_operator.runtime.sync_client import SyncKube

USER_AGENT = "gpu-operator-bench"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
WATCH_SECONDS = 60

Objects = Mapping[str, dict[str, Any]]
"""`namespace/name` → object, as the watch currently sees the collection."""


def connect(kubeconfig: Path, pool: int = 16) -> SyncKube:
    """Admin (or any kubeconfig) access through the project's client; thread-safe, with `pool`
    connections for parallel writes and the watches (a watch holds one; a request that waits longer
    than the connect timeout for a free one fails). Its user agent keeps the bench's own requests
    out of the audit counts."""

    async def make() -> Kube:
        return Kube(await client.connect(kubeconfig, user_agent=USER_AGENT, pool_size=pool))

    return SyncKube(make)


def get(kube: SyncKube, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
    return kube.request("GET", path, query=query)


def items(kube: SyncKube, path: str, query: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    return list(get(kube, path, query).get("items") or [])


def exists(kube: SyncKube, path: str, selector: str = "") -> bool:
    """Whether the collection (or object) has anything matching; one cheap request."""
    try:
        found = get(kube, path, {"labelSelector": selector, "limit": "1"} if selector else {"limit": "1"})
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return bool(found.get("items")) if "items" in found else True


def delete(
    kube: SyncKube, path: str, body: Mapping[str, Any] | None = None, query: Mapping[str, str] | None = None
) -> None:
    try:
        kube.request("DELETE", path, body=dict(body or {}), query=query)
    except ApiError as exc:
        if exc.status != 404:
            raise


def delete_collection(kube: SyncKube, path: str, selector: str) -> None:
    """Delete what matches at once, without grace period. The answer lists every deleted object,
    so ask for metadata only (8000 pods as full objects are 80 MB)."""
    patient = dataclasses.replace(kube.kube, timeout=(kube.kube.timeout[0], 300.0))  # the same connections
    kube.run(
        patient.request(
            "DELETE",
            path,
            body={"gracePeriodSeconds": 0},
            query={"labelSelector": selector},
            accept=PARTIAL_METADATA,
        )
    )


def collection(path: str) -> tuple[str, str, str]:
    """(apiVersion, kind, namespace) of a collection's URL path (`/api/v1/nodes`,
    `/apis/apps/v1/namespaces/NS/daemonsets`), as the client's `watch` names it."""
    head = path.rsplit("/", 1)[0]
    namespace = head.split("/namespaces/", 1)[1] if "/namespaces/" in head else ""
    for api_version, kind in client.RESOURCES:
        if client.path(api_version, kind, namespace) == path:
            return api_version, kind, namespace
    raise ValueError(f"{path}: not a collection of a kind the client knows")


def object_key(body: Mapping[str, Any]) -> str:
    metadata = body.get("metadata") or {}
    return f"{metadata.get('namespace') or ''}/{metadata.get('name')}"


class Watcher:
    """Watch a collection in a thread; `done_at` is when `predicate(objects)` first held.

    Start it before the action to be timed: `start()` returns once the watch is open, so no event
    the action causes is missed.
    """

    def __init__(
        self,
        api: SyncKube,
        path: str,
        predicate: Callable[[Objects], bool],
        query: Mapping[str, str] | None = None,
        what: str = "",
    ) -> None:
        self.api = api
        self.path = path
        self.query = dict(query or {})
        self.api_version, self.kind, namespace = collection(path)
        self.watch_query = dict(self.query)
        if namespace:  # the client watches a kind's whole collection: narrowed to the namespace here
            selectors = (self.query.get("fieldSelector"), f"metadata.namespace={namespace}")
            self.watch_query["fieldSelector"] = ",".join(s for s in selectors if s)
        self.predicate = predicate
        self.what = what or path
        self.objects: dict[str, dict[str, Any]] = {}
        self.done_at: float | None = None
        self.held_before_start = False
        self.error: BaseException | None = None
        self._listed = threading.Event()
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {self.what}", daemon=True)

    def start(self, timeout: float = 60.0) -> Watcher:
        self._thread.start()
        if not self._listed.wait(timeout):
            raise TimeoutError(f"{self.what}: no list after {timeout:.0f}s")
        if self.error is not None:
            raise RuntimeError(f"{self.what}: {self.error}") from self.error
        return self

    def wait(self, timeout: float) -> float:
        """The time the predicate first held; TimeoutError (with what was seen) after `timeout` s."""
        if not self._done.wait(timeout):
            self.stop()
            raise TimeoutError(
                f"{self.what}: not reached after {timeout:.0f}s ({len(self.objects)} objects seen)"
            )
        if self.error is not None:
            raise RuntimeError(f"{self.what}: {self.error}") from self.error
        assert self.done_at is not None
        return self.done_at

    def stop(self) -> None:
        self._stop.set()

    def _check(self) -> None:
        if self.done_at is None and self.predicate(self.objects):
            self.done_at = time.time()
            self._done.set()

    def _relist(self) -> str:
        listing = get(self.api, self.path, self.query)
        self.objects = {object_key(item): item for item in listing.get("items") or []}
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        try:
            version = self._relist()
            if self.predicate(self.objects):  # nothing to time: the caller treats this as an error
                self.held_before_start = True
                self.done_at = time.time()
                self._done.set()
            self._listed.set()
            while not self._stop.is_set() and self.done_at is None:
                query = {**self.watch_query, "resourceVersion": version, "allowWatchBookmarks": "true"}
                for event in self.api.watch(self.api_version, self.kind, query, WATCH_SECONDS):
                    kind, body = event["type"], event["object"]
                    if kind == "ERROR":  # 410 Gone: the version is too old; start over from a list
                        version = self._relist()
                        break
                    version = str(body["metadata"].get("resourceVersion") or version)
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        self.objects.pop(object_key(body), None)
                    else:
                        self.objects[object_key(body)] = body
                    self._check()
                    if self.done_at is not None or self._stop.is_set():
                        return
                self._check()
        except BaseException as exc:  # reported to the waiting thread
            self.error = exc
            self._listed.set()
            self._done.set()
