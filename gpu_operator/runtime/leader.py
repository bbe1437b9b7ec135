"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Kopf's peering only lets operators pause for each other; it is not leader election. Here every
replica runs the watches (warm caches), but only the holder of the Lease runs reconcile passes and
writes: every write of the operator's client awaits `Elector.may_write` first (client.Kube.may_write).

The rules (`Election`, pure, its clock passed in, so unit tests run it on a fake one):

- A replica that holds the lease renews it every `retry` seconds (from the start of one round to the
  next, however slow the answers), from an asyncio task on the operator's loop with a client of its
  own (its own connection pool: a lease call never waits behind a pass's requests), and retries a
  renewal that got no answer after half a second. It leads while its last successful renewal
  *started* less than `renew_deadline` ago: a leader cut off from the API server stops writing before
  anyone else may take over, since others wait a full `duration` after they last saw the lease
  change, and renew_deadline < duration. A write meanwhile waits for the late renewal rather than fail
  (`Elector.may_write`): the only replica on a slow API server loses no pass to it.
- A standby reads the lease every `retry` seconds and takes it over once it has seen no change for
  `duration` seconds (its own monotonic clock: no comparison of clocks across machines), or at once
  when the holder released it (holder empty) on a clean shutdown.
- Writes carry the resourceVersion read: of two replicas that try at once, one gets 409 Conflict.

The timing is client-go's default, 15/10/2 s: a renewal answered up to 10 s after it was sent still
renews (an API server answering 2-8 s late keeps its only replica leading), and a standby takes over
at most duration + two retry periods = 19 s after the leader's last renewal (SIGKILL); a leader
that shuts down releases the lease and a standby takes it within a retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpu_operator.runtime import metrics
from gpu_operator.runtime.client import ApiError, Kube, path

log = logging.getLogger("gpu_operator")

LEASE_API = ("coordination.k8s.io/v1", "Lease")
RETRY_AFTER_FAILURE = 0.5
"""Seconds before a leader tries again after a renewal the API server did not answer."""


@dataclass(frozen=True)
class Timing:
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(f"leader election needs 0 < retry < renew deadline < duration, not {self}")


@dataclass(frozen=True)
class Record:
    """A Lease's spec, and the resourceVersion it was read at."""

    holder: str
    duration_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str = ""

    def same_as(self, other: Record | None) -> bool:
        """Unchanged, as far as a standby can tell (renewals move renew_time)."""
        return other is not None and replace(self, resource_version="") == replace(other, resource_version="")


def micro_time(moment: datetime | None = None) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Election:
    """What one replica knows of the lease and decides about it."""

    def __init__(self, identity: str, timing: Timing) -> None:
        self.identity = identity
        self.timing = timing
        self.observed: Record | None = None
        self.observed_at = 0.0
        """When the lease was last seen to change (this replica's monotonic clock)."""
        self.renewed_at: float | None = None
        """When our last successful acquire or renewal was sent."""

    def observe(self, record: Record | None, now: float) -> None:
        if record is None or not record.same_as(self.observed):
            self.observed_at = now
        self.observed = record

    def wanted(self, now: float, stamp: str) -> Record | None:
        """The record to write now (acquire or renew), or None: someone else holds a live lease."""
        duration = int(self.timing.duration)
        current = self.observed
        if current is not None and current.holder == self.identity:
            return replace(current, renew_time=stamp, duration_seconds=duration)
        if current is not None and current.holder and now < self.observed_at + current.duration_seconds:
            return None
        transitions = 0 if current is None else current.transitions + 1
        version = "" if current is None else current.resource_version
        return Record(self.identity, duration, stamp, stamp, transitions, version)

    def wrote(self, record: Record, sent_at: float, now: float) -> None:
        self.observe(record, now)
        self.renewed_at = sent_at if record.holder == self.identity else None

    def leading(self, now: float) -> bool:
        return self.left(now) > 0

    def holds(self) -> bool:
        """The lease, as last seen, names this replica (leading or not: its renewal may be late)."""
        return self.observed is not None and self.observed.holder == self.identity

    def left(self, now: float) -> float:
        """Seconds until this replica must stop leading unless a renewal gets through (0: not leading)."""
        if self.renewed_at is None or self.observed is None or self.observed.holder != self.identity:
            return 0.0
        return max(0.0, self.renewed_at + self.timing.renew_deadline - now)

    def released(self, stamp: str) -> Record | None:
        """The record that hands the lease back on shutdown (None: not ours to release)."""
        if self.observed is None or self.observed.holder != self.identity:
            return None
        return replace(self.observed, holder="", duration_seconds=1, renew_time=stamp)


def record_of(lease: Mapping[str, Any]) -> Record:
    spec = lease.get("spec") or {}
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=str(spec.get("acquireTime") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def lease_body(namespace: str, name: str, record: Record) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    return {
        "apiVersion": LEASE_API[0],
        "kind": LEASE_API[1],
        "metadata": metadata,
        "spec": {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.duration_seconds,
            "acquireTime": record.acquire_time,
            "renewTime": record.renew_time,
            "leaseTransitions": record.transitions,
        },
    }


class Elector:
    """Runs an Election against the API server as an asyncio task on the operator's loop.

    `kube` must not be gated by `leading` (the lease writes are what makes this replica the leader),
    is a client of its own (its own connection pool, so a lease call never waits behind a pass's
    requests), and its timeout is the renew deadline: a renewal counts from when it was sent, so an
    answer that takes that long still renews (on a saturated API server a TLS handshake alone can take
    seconds). Sharing the loop, a renewal goes out only when the loop is free: whatever holds the loop
    for long without awaiting delays it."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing,
        on_change: Callable[[bool], None] = lambda leading: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        # Only ever used on the loop, between awaits: the Election needs no lock.
        self.election = Election(identity, timing)
        self.on_change = on_change
        self.clock = clock
        self.rounds = asyncio.Condition()
        """Notified after every round, and on stop: writes waiting for a late renewal look again."""
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._was_leading = False
        self._said = ""

    def leading(self) -> bool:
        return self.election.leading(self.clock())

    async def may_write(self) -> bool:
        """Whether a write may go out now. While leading, yes. A holder whose renewal is late (an API
        server slower than the renew deadline) waits for it, up to the lease duration, rather than
        refuse the write: nobody else may take the lease before its duration is out, so the wait
        keeps one writer at a time and loses no pass. A replica the lease does not name, or one that
        is stopping: no, at once.
        """
        deadline = self.clock() + self.election.timing.duration
        async with self.rounds:
            while not self.election.leading(self.clock()):
                left = deadline - self.clock()
                if not self.election.holds() or self.stopping.is_set() or left <= 0:
                    return False
                # Looks again at least every retry period, even if no round notifies.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.rounds.wait(), min(left, self.election.timing.retry))
            return True

    def start(self) -> Elector:
        """Start campaigning: a task on the running loop (called from within it)."""
        log.info("leader election: lease %s/%s as %s", self.namespace, self.name, self.election.identity)
        self.task = asyncio.create_task(self._run(), name="gpu-operator-leader")
        self.task.add_done_callback(self._ended)
        return self

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning; with `release`, hand the lease back so a standby takes over at once."""
        self.stopping.set()
        async with self.rounds:
            self.rounds.notify_all()  # a write waiting for a late renewal is refused now
        task = self.task
        if task is not None and not task.done():
            # A round in flight may finish (as long as its requests may take): cancelled in the middle
            # of a write that got through, the lease would move on without this replica knowing its
            # resourceVersion, and the release would be refused.
            timeout = self.election.timing.retry + sum(self.kube.timeout)
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                await asyncio.wait({task})
        if release:
            record = self.election.released(micro_time())
            if record is not None:
                try:
                    await self._write(record)
                    log.info("leader election: released the lease")
                except ApiError as exc:
                    log.warning("leader election: could not release the lease: %s", exc)
        self._changed(False)

    async def _run(self) -> None:
        while not self.stopping.is_set():
            started = self.clock()
            done = await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.pause(started, done))

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Log a campaign that ended on an error (a task's exception is otherwise seen by no one; the
        lease then lapses and a standby takes over)."""
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("leader election stopped: %r", error, exc_info=error)

    def pause(self, started: float, done: bool) -> float:
        """How long to wait after a round that began at `started`. Rounds begin every `retry` seconds,
        however long the API server took to answer (a slow answer must not push the next renewal past
        the deadline); a leader whose renewal got no answer tries again almost at once, since its
        renew deadline is only a few attempts away."""
        if not done and self.leading():
            return RETRY_AFTER_FAILURE
        return max(0.0, started + self.election.timing.retry - self.clock())

    async def step(self) -> bool:
        """One round: read the lease, acquire or renew it when due; False when the API server did not
        answer. The leader renews on the lease as it last wrote it, without reading it first
        (client-go's optimistic fast path): one request every `retry` seconds at rest instead of two;
        a refused renewal (409: someone else wrote it) falls back to reading it."""
        try:
            if await self._renewed():
                self._say("")
                return True
            try:
                current: Record | None = record_of(await self.kube.get(*LEASE_API, self.name, self.namespace))
            except ApiError as exc:
                if exc.status != 404:
                    raise
                current = None
            self.election.observe(current, self.clock())
            wanted = self.election.wanted(self.clock(), micro_time())
            if current is not None and current.holder not in ("", self.election.identity):
                self._say(f"leader election: the lease is held by {current.holder}")
            if wanted is not None:
                await self._write(wanted)
                self._say("")
            return True
        except ApiError as exc:
            # 409: another replica wrote first; anything else: the API server is not reachable now.
            self._say(f"leader election: {exc}")
            return exc.status != 0
        finally:
            self._changed(self.leading())
            async with self.rounds:
                self.rounds.notify_all()

    async def _renewed(self) -> bool:
        """The leader's renewal without a read first; False when not leading or refused."""
        if not self.election.leading(self.clock()):
            return False
        wanted = self.election.wanted(self.clock(), micro_time())
        if wanted is None:
            return False
        try:
            await self._write(wanted)
        except ApiError as exc:
            log.debug("leader election: renewal without a read refused (%s); reading the lease", exc)
            return False
        return True

    async def _write(self, record: Record) -> None:
        """Create or replace the lease (at the resourceVersion read), and take in what it became."""
        body = lease_body(self.namespace, self.name, record)
        sent_at = self.clock()
        if record.resource_version:
            answer = await self.kube.request(
                "PUT", path(*LEASE_API, self.namespace, self.name), body=body, kind="Lease"
            )
        else:
            answer = await self.kube.request(
                "POST", path(*LEASE_API, self.namespace), body=body, kind="Lease"
            )
        self.election.wrote(record_of(answer), sent_at, self.clock())

    def _changed(self, leading: bool) -> None:
        if leading == self._was_leading:
            return
        self._was_leading = leading
        metrics.LEADER.set(1 if leading else 0)
        if leading:
            log.info("leader election: leading: this replica reconciles")
        elif self.stopping.is_set():
            log.info("leader election: stopped; this replica writes nothing more")
        else:
            holder = self.election.observed.holder if self.election.observed is not None else ""
            why = (
                f"the lease is {holder}'s"
                if holder and holder != self.election.identity
                else "no renewal got through within the renew deadline; it writes nothing until one does"
            )
            log.warning("leader election: standing by: %s", why)
        self.on_change(leading)

    def _say(self, message: str) -> None:
        """Log a problem once, not every round."""
        if message and message != self._said:
            log.warning("%s", message)
        self._said = message


class Leadership:
    """Whether this replica leads: always without leader election, else what its Elector says (no
    until the elector runs and wins)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.elector: Elector | None = None

    def leading(self) -> bool:
        if not self.enabled:
            return True
        return self.elector is not None and self.elector.leading()

    async def may_write(self) -> bool:
        """Awaited before every write (Elector.may_write: a late renewal is waited for)."""
        if not self.enabled:
            return True
        return self.elector is not None and await self.elector.may_write()
