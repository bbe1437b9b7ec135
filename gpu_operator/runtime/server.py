"""The operator's one HTTP endpoint: /metrics (Prometheus), /healthz (liveness), /readyz (readiness).

An aiohttp app on Kopf's event loop, replacing Kopf's own liveness endpoint so that one port
serves all three. What a probe means is not decided here: the operator passes a `Check` for each,
a function returning (healthy, JSON body), answered with 200 or 503. Serving a probe never calls
the API server; metrics are rendered from the in-process registry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

log = logging.getLogger("gpu_operator")

Check = Callable[[], tuple[bool, Mapping[str, Any]]]
"""→ (healthy, what to show): 200 when healthy, else 503, with the mapping as JSON."""

_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (every interface) → (host, port); ValueError otherwise.
    Port 0 picks a free port (the log line says which)."""
    match = _ADDRESS.match(address.strip())
    port = int(match["port"]) if match else -1
    if match is None or not 0 <= port <= 65535:
        raise ValueError(f"{address!r} is not HOST:PORT (e.g. 0.0.0.0:8080, [::]:8080, :8080)")
    host = match["v6"] or match["host"] or "0.0.0.0"
    return host, port


def _probe(check: Check) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        healthy, body = check()
        return web.json_response(dict(body), status=200 if healthy else 503)

    return handle


def app(health: Check, ready: Check, registry: CollectorRegistry) -> web.Application:
    application = web.Application()
    application.add_routes(
        [
            web.get("/healthz", _probe(health)),
            web.get("/readyz", _probe(ready)),
            web.get("/metrics", make_aiohttp_handler(registry)),
        ]
    )
    return application


class ServerError(Exception):
    """The address cannot be served (port in use, no such interface), in one line."""


@dataclass
class Server:
    runner: web.AppRunner
    url: str
    """http://HOST:PORT as bound (the real port when 0 was asked for)."""

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(address: str, health: Check, ready: Check, registry: CollectorRegistry) -> Server:
    host, port = parse_address(address)
    # No access log: probes every few seconds would drown the operator's own log.
    runner = web.AppRunner(app(health, ready, registry), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ServerError(f"cannot serve HTTP on {address}: {exc.strerror or exc}") from None
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{shown}:{bound[1]}"
    log.info("serving /metrics, /healthz and /readyz on %s", url)
    return Server(runner, url)
