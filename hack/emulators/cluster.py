"""Cluster-side services of the emulators: tokens, pod IPs, list-and-watch.

These are the parts a real cluster provides around the images: the kubelet's projected
ServiceAccount tokens (a TokenRequest bound to the pod, refreshed before it expires), pod IP
allocation, and informers (list, then watch from the list's resourceVersion, relist on 410 Gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from .api import Api, ApiError
from .podspec import Pod
from .process import ContainerExit

log = logging.getLogger("emulators")

JSON = dict[str, Any]
TOKEN_SECONDS = 3600
# The kubelet refreshes a projected token after 80% of its lifetime.
TOKEN_REFRESH_FRACTION = 0.8
RELIST_DELAY_S = 1.0
PAGE = "500"


class Tokens:
    """A bound ServiceAccount token per pod, as the kubelet's projected volume holds it."""

    def __init__(self, admin: Api) -> None:
        self.admin = admin
        self._cache: dict[str, tuple[str, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def token(self, pod: Pod) -> str:
        cached = self._cache.get(pod.uid)
        if cached and time.monotonic() < cached[1]:
            return cached[0]
        lock = self._locks.setdefault(pod.uid, asyncio.Lock())
        async with lock:
            cached = self._cache.get(pod.uid)
            if cached and time.monotonic() < cached[1]:
                return cached[0]
            body = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": TOKEN_SECONDS,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
                },
            }
            path = f"/api/v1/namespaces/{pod.namespace}/serviceaccounts/{pod.service_account}/token"
            try:
                answer = await self.admin.create(path, body)
            except ApiError as exc:
                # The kubelet could not mount the projected token: the container cannot start.
                raise ContainerExit(
                    128,
                    f'MountVolume.SetUp failed for volume "kube-api-access": failed to fetch token: {exc}',
                ) from exc
            token = str(answer["status"]["token"])
            self._cache[pod.uid] = (token, time.monotonic() + TOKEN_SECONDS * TOKEN_REFRESH_FRACTION)
            return token

    async def api_for(self, pod: Pod, agent: str) -> Api:
        return self.admin.with_token(await self.token(pod), agent)

    def forget(self, uid: str) -> None:
        self._cache.pop(uid, None)
        self._locks.pop(uid, None)


class IpPool:
    """Pod IPs in 127.3.0.0/16 (kwok hands out 127.2.0.0/16 to the pods it runs): loopback only."""

    def __init__(self, network: str = "127.3.0.0/16") -> None:
        self.network = ipaddress.ip_network(network)
        self._next = 1
        self._by_uid: dict[str, str] = {}
        self._free: list[str] = []

    def allocate(self, uid: str, keep: str = "") -> str:
        """An address for the pod; `keep` is the one its status already has (after a restart)."""
        if uid in self._by_uid:
            return self._by_uid[uid]
        if keep and keep not in self._by_uid.values():
            with contextlib.suppress(ValueError):
                self._free.remove(keep)
            self._by_uid[uid] = keep
            return keep
        if self._free:
            address = self._free.pop()
        else:
            used = set(self._by_uid.values())
            while True:
                address = str(self.network.network_address + self._next)
                self._next = self._next % (self.network.num_addresses - 2) + 1
                if address not in used:
                    break
        self._by_uid[uid] = address
        return address

    def release(self, uid: str) -> None:
        address = self._by_uid.pop(uid, None)
        if address:
            self._free.append(address)


Handler = Callable[[str, JSON], None]
"""(event type: ADDED/MODIFIED/DELETED, or SYNC with {"items": [...]} after a (re)list, object)."""


async def list_all(api: Api, path: str, **params: str) -> tuple[list[JSON], str]:
    """Every item of `path`, listed in pages of PAGE, and the listing's resourceVersion."""
    items: list[JSON] = []
    query = {**params, "limit": PAGE}
    while True:
        page = await api.get(path, **query)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items, str((page.get("metadata") or {}).get("resourceVersion") or "0")
        query["continue"] = token


async def informer(api: Api, path: str, handler: Handler, synced: asyncio.Event, **params: str) -> None:
    """List `path`, hand the items over, then watch from there; start over after any failure."""
    while True:
        try:
            items, version = await list_all(api, path, **params)
            handler("SYNC", {"items": items})
            synced.set()
            while True:
                async for event in api.watch(path, version, **params):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        handler(str(event.get("type")), obj)
        except asyncio.CancelledError:
            raise
        except ApiError as exc:
            if exc.status != 410:
                log.warning("watch %s: %s; relisting", path, exc)
                await asyncio.sleep(RELIST_DELAY_S)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("watch %s: %s; relisting", path, exc)
            await asyncio.sleep(RELIST_DELAY_S)
        except Exception:
            log.exception("watch %s: handler failed; relisting", path)
            await asyncio.sleep(RELIST_DELAY_S)
