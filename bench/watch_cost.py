"""The event loop's CPU per watch event: what the operator pays for each of the ~48,000 pod and node
events of a 1000-node rollout, with nothing else running.

A server process of its own (loopback, TLS, as an API server) answers the LIST of a kind with an empty
list and then streams N watch events, taken in turn from real ones (bench/data/watch-events.jsonl.gz:
pod and node events recorded from a 10-node rollout), each with a resourceVersion of its own, at
`--rate` a second in small batches, so that each arrives on its own as in a rollout rather than
thousands in one read. The operator's watch of that kind runs as in the operator (its informer,
gpu_operator/runtime/informer.py, into a Store), and the process's CPU from the first event to the last
is divided by N.

    python -m bench.watch_cost --events 2000 --rate 100 --coalesce 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "data" / "watch-events.jsonl.gz"
KINDS = {"Pod": ("", "v1", "pods"), "Node": ("", "v1", "nodes")}


@dataclass(frozen=True)
class Result:
    events: int
    cpu_s: float
    wall_s: float

    @property
    def us_per_event(self) -> float:
        return self.cpu_s / self.events * 1e6


def event_lines(fixture: Path, kind: str, count: int) -> Iterator[bytes]:
    """`count` watch events of `kind` (MODIFIED, a new resourceVersion each), cycling the fixture's."""
    bodies = [
        event["object"]
        for event in map(json.loads, gzip.decompress(fixture.read_bytes()).splitlines())
        if event["object"].get("kind") == kind
    ]
    if not bodies:
        raise SystemExit(f"{fixture}: no {kind} events")
    for i in range(count):
        body = bodies[i % len(bodies)]
        body["metadata"]["resourceVersion"] = str(100 + i)
        # The API server's own encoding: compact, in the object's key order.
        yield json.dumps({"type": "MODIFIED", "object": body}, separators=(",", ":")).encode() + b"\n"


# --- the server: a process of its own, so that its CPU is not counted ----------------------------


def serve(port: int, cert: str, key: str, fixture: Path, kind: str, events: int, rate: float) -> None:
    import ssl

    from aiohttp import web

    lines = list(event_lines(fixture, kind, events))
    plural = KINDS[kind][2]

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response(
                {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        started = time.monotonic()
        for i, line in enumerate(lines):
            due = started + i / rate
            delay = due - time.monotonic()
            if delay > 0.002:  # batches of what is due every 2 ms: one read each, as in a rollout
                await asyncio.sleep(delay)
            await response.write(line)
        await asyncio.sleep(3600)  # hold the watch open; the client ends the run
        return response

    app = web.Application()
    app.router.add_get(f"/api/v1/{plural}", handle)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None)


# --- the client: the operator's watch of one kind -------------------------------------------------


async def watch(port: int, ca: str, kind: str, events: int, coalesce: float) -> Result:
    from kubernetes_asyncio import client

    from gpu_operator.runtime import informer
    from gpu_operator.runtime.settings import Settings
    from gpu_operator.runtime.store import Store
    from gpu_operator.runtime.watch_stream import Events

    store = Store()
    seen = [0, 0.0, 0.0]  # events, CPU and wall clock at the first one

    def record(body: Any, deleted: bool) -> bool:
        if seen[0] == 0:
            seen[1], seen[2] = time.process_time(), time.monotonic()
        seen[0] += 1
        if seen[0] == events:
            done.set()
        recorder = store.record_pod if kind == "Pod" else store.record_node
        return recorder(body, deleted)

    done = asyncio.Event()
    group, version, plural = KINDS[kind]

    def settle() -> Awaitable[object] | None:  # as WorkQueue.settle while a pass always runs or is asked for
        return asyncio.sleep(coalesce) if coalesce > 0 else None

    configuration = client.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.ssl_ca_cert = ca
    configuration.api_key = {"BearerToken": "bench"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    api = client.ApiClient(configuration)
    kind_ = informer.Kind(group, version, plural)
    recorder = Events(record, plural, lambda: None, settle)
    watcher = informer.Informer(api, kind_, recorder, lambda _: None, informer.Timing.of(Settings()))
    task = asyncio.create_task(watcher.run())
    await done.wait()
    cpu, wall = time.process_time() - seen[1], time.monotonic() - seen[2]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await api.close()
    return Result(events - 1, cpu, wall)


def measure(kind: str, events: int, rate: float, coalesce: float = 0.0, fixture: Path = FIXTURE) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", key, "-out", cert],
            check=True, capture_output=True,
        )  # fmt: skip
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.watch_cost", "--serve", str(port), "--cert", cert, "--key", key,
             "--fixture", str(fixture), "--kind", kind, "--events", str(events), "--rate", str(rate)],
        )  # fmt: skip
        try:
            _wait_port(port)
            return asyncio.run(watch(port, cert, kind, events, coalesce))
        finally:
            server.terminate()
            server.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit("the bench's watch server did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", choices=sorted(KINDS), nargs="+", default=["Pod", "Node"])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0, help="events a second")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument(
        "--coalesce",
        type=float,
        default=0.0,
        help="seconds between reads, as while a pass runs or waits (settings.watch_batch_seconds)",
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.cert, args.key, args.fixture, args.kind[0], args.events, args.rate)
        return 0
    for kind in args.kind:
        r = measure(kind, args.events, args.rate, args.coalesce, args.fixture)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"{kind} (coalesce {args.coalesce:g} s): {r.events} events in {r.wall_s:.1f} s, "
            f"{r.cpu_s:.2f} s of CPU: "
            f"{r.us_per_event:.0f} µs an event (peak RSS {usage.ru_maxrss / 1024:.0f} MiB)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
