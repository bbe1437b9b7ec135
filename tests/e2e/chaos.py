"""Faults for the chaos suite (tests/e2e/test_chaos.py), all on loopback and on this cluster's own
processes: control-plane components killed, restarted or paused by their pid files, a TCP relay that
turns into a black hole, and the invariants every fault must leave intact.

A control-plane process is restarted exactly as kwokctl started it: the same command line,
environment, working directory and log file (read from /proc before it is stopped), and its pid file
is updated, so `make cluster-down` still finds it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.runtime.client import ApiError
from gpu_operator.runtime.sync_client import SyncKube

from .kube_helpers import Cluster, wait_for
from .operator_process import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / ".cache" / "chaos-results.json"


def record(name: str, results: Path = RESULTS, **numbers: float | int | str) -> None:
    """Keep a measurement (recovery times) for the report: `results` (.cache/chaos-results.json), by
    test."""
    found: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    found[name] = {**numbers, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(found, indent=2, sort_keys=True))
    print(f"{results.stem} {name}: {numbers}")


# --- control-plane processes ---------------------------------------------------------------------


@dataclass
class Component:
    """One process of the local cluster (etcd, kube-apiserver, ...), by its kwokctl pid file."""

    pid_file: Path
    command: list[str] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    log: str = ""

    @classmethod
    def of(cls, cluster_dir: Path, name: str) -> Component:
        found = cls(cluster_dir / "pids" / f"{name}.pid")
        pid = found.pid
        found.command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
        assert str(cluster_dir) in " ".join(found.command), f"pid {pid} is not this cluster's {name}"
        raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").decode(errors="replace")
        found.environ = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        found.cwd = os.readlink(f"/proc/{pid}/cwd")
        found.log = os.readlink(f"/proc/{pid}/fd/1")
        return found

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text().strip())

    def running(self) -> bool:
        try:
            return Path(f"/proc/{self.pid}/cmdline").read_bytes().startswith(self.command[0].encode())
        except (OSError, ValueError):
            return False

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _gone(pid), timeout=30, what=f"{self.command[0]} gone")

    def start(self) -> None:
        """Start it again; retried while the old one's ports are still being released (the killed
        process's threads can outlive its zombie leader for a moment)."""

        def started() -> None:
            with open(self.log, "ab") as log:
                process = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.environ,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            try:
                code = process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.pid_file.write_text(f"{process.pid}\n")
                return
            raise AssertionError(f"{self.command[0]} exited with {code} at once (log: {self.log})")

        wait_for(started, timeout=60, what=f"{self.command[0]} started again")


def _gone(pid: int) -> None:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return
    assert state == "Z" and threads <= 1, f"pid {pid} still running"


def assert_survived(operator: OperatorProcess) -> None:
    """The operator ran through the faults: still running, no error of its own code (a traceback
    through gpu_operator/) and no RBAC denial. API errors while the API server was down are expected
    and logged as one-line warnings."""
    assert operator.running, f"the operator exited:\n{operator.log()[-4000:]}"
    text = operator.log()
    for block in text.split("Traceback (most recent call last):")[1:]:
        frames = block.split("\n\n")[0]
        assert "gpu_operator/" not in frames, f"operator traceback:\n{frames[-3000:]}"
    denials = rbac_denials(text)
    assert not denials, "RBAC denials:\n" + "\n".join(denials[-20:])


def rbac_denials(log: str) -> list[str]:
    """The log lines saying 403 or forbidden, less one right after the API server could not be reached:
    a restarted kube-apiserver answers before its RBAC authorizer has read the roles back and denies
    what it will allow a moment later; the operator's retry then goes through. A missing permission
    is denied again on every retry, so it still shows."""
    lines = log.splitlines()
    return [
        line
        for i, line in enumerate(lines)
        if (" 403 " in line or "forbidden" in line.lower())
        and not any("ConnectionError" in before for before in lines[max(0, i - 3) : i])
    ]


def cluster_dir(cluster: Cluster) -> Path:
    return cluster.kubeconfig.parent


def compact_etcd(cluster: Cluster) -> None:
    """Compact etcd's history up to now: a watch resuming from an older resourceVersion then gets 410
    Gone once the API server's own watch cache (gone after a restart) cannot serve it."""
    etcd = Component.of(cluster_dir(cluster), "etcd")
    endpoint = next(a.split("=", 1)[1] for a in etcd.command if a.startswith("--advertise-client-urls="))
    etcdctl = [str(Path(cluster.kubectl_path).parent / "etcdctl"), f"--endpoints={endpoint}"]
    status = json.loads(
        subprocess.run([*etcdctl, "endpoint", "status", "-w", "json"], capture_output=True, check=True).stdout
    )
    revision = status[0]["Status"]["header"]["revision"]
    subprocess.run([*etcdctl, "compact", str(revision)], capture_output=True, check=True)


def api_ready(admin: SyncKube) -> None:
    """The API server answers and is ready (its own /readyz: etcd reachable, informers synced)."""
    try:
        admin.text("/readyz")
    except ApiError as exc:
        raise AssertionError(f"API server not ready: {exc}") from None


# --- a loopback relay that can become a black hole -----------------------------------------------


class Relay:
    """A TCP relay on 127.0.0.1 in front of `target`. `black_hole()` stops forwarding without
    closing anything: open connections go silent, new ones are accepted and hear nothing, like a
    network partition that drops packets. `restore()` resumes forwarding. `slow(low, high)` holds
    back the first bytes the server sends after each thing the client sent (a response, a TLS
    handshake step) by a random `low`..`high` seconds, like a saturated API server; what streams
    on without a new request (watch events) is not held."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        self.delay: tuple[float, float] | None = None
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def slow(self, low: float, high: float) -> None:
        self.delay = (low, high)

    def black_hole(self) -> None:
        self.forwarding.clear()

    def restore(self) -> None:
        self.forwarding.set()

    def close(self) -> None:
        self.closed.set()
        self.forwarding.set()
        self.server.close()
        for sock in list(self.sockets):
            with suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True, name="relay-conn").start()

    def _connect(self, client: socket.socket) -> None:
        self.sockets.append(client)
        self.forwarding.wait()
        if self.closed.is_set():
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self.sockets.append(upstream)
        asked: list[float | None] = [None]  # when the client sent what the server has not answered
        for source, sink, request in ((client, upstream, True), (upstream, client, False)):
            threading.Thread(
                target=self._pump, args=(source, sink, request, asked), daemon=True, name="relay-pump"
            ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, request: bool, asked: list[float | None]
    ) -> None:
        try:
            while not self.closed.is_set():
                self.forwarding.wait()
                data = source.recv(65536)
                if not data:
                    break
                if request:
                    asked[0] = asked[0] or time.monotonic()
                elif self.delay is not None and asked[0] is not None:
                    due = asked[0] + random.uniform(*self.delay)
                    asked[0] = None
                    time.sleep(max(0.0, due - time.monotonic()))  # the server's slowness is the fault
                self.forwarding.wait()  # a black hole swallows what is in flight, too
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def relayed_kubeconfig(kubeconfig: Path, relay: Relay, path: Path) -> Path:
    """A copy of `kubeconfig` whose server is the relay (same TLS: the API server's certificate is
    for 127.0.0.1)."""
    import yaml

    config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@contextmanager
def relay_to(server: str) -> Iterator[Relay]:
    host, port = server.removeprefix("https://").rsplit(":", 1)
    relay = Relay((host, int(port)))
    try:
        yield relay
    finally:
        relay.close()


# --- timing ----------------------------------------------------------------------------------------


def timed(check: Callable[[], Any], timeout: float, what: str) -> float:
    """Seconds until `check` passes (wait_for, measured)."""
    started = time.monotonic()
    wait_for(check, timeout=timeout, what=what)
    return round(time.monotonic() - started, 1)
