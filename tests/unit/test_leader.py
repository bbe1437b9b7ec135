"""Leader election (gpu_operator/runtime/leader.py) on a fake clock and an in-memory Lease with optimistic
concurrency: one leader at a time, a standby takes over within 15 s of the leader's death (on a
10/7/2 s timing), a leader cut off from the API server stops writing before anyone else may start, a
released lease is taken at once, a slow API server does not cost the only replica its lease."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, cast

import pytest
from builders import Clock

from gpu_operator.runtime.client import ApiError, Kube, NotLeader
from gpu_operator.runtime.leader import Election, Elector, Leadership, Record, Timing, lease_body, record_of

TIMING = Timing(duration=10, renew_deadline=7, retry=2)
"""The rules on a shorter timing than the default (client-go's 15/10/2 s), whose numbers they check."""

P = ParamSpec("P")


def in_loop(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """An async test run as a plain one, on an event loop of its own (pytest-asyncio is not a
    dependency); its fixtures are still the async function's parameters."""

    @functools.wraps(test)
    def plain(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return plain


async def settle() -> None:
    """Let every task that can go on go on: a few turns of the loop, no time passing."""
    for _ in range(20):
        await asyncio.sleep(0)


class LeaseServer:
    """One Lease, with resourceVersions and 409 on a stale one; `down` makes every call fail."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.slow = 0.0
        """Seconds every answer takes (on `clock`)."""
        self.clock = clock or Clock()
        self.writes = 0
        self.reads = 0

    def client(self) -> Kube:
        return cast(Kube, FakeKube(self))


class FakeKube:
    timeout = (7.0, 7.0)

    def __init__(self, server: LeaseServer) -> None:
        self.server = server

    async def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        return await self.request("GET", f"/{kind}/{name}")

    async def request(
        self,
        method: str,
        url: str,
        body: Mapping[str, Any] | None = None,
        kind: str = "",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        server = self.server
        if server.down:
            raise ApiError(0, "ConnectionError", "refused")
        if server.slow:
            # The answer takes `slow` seconds (on the fake clock): a request whose timeout is shorter
            # gets none.
            waited = min(server.slow, timeout or max(self.timeout))
            server.clock.now += waited
            if waited < server.slow:
                raise ApiError(
                    0, "ConnectionError", "TimeoutError: _ssl.c:989: The handshake operation timed out"
                )
        if method == "GET":
            server.reads += 1
            if server.lease is None:
                raise ApiError(404, "NotFound", "no lease")
            return server.lease
        assert body is not None
        if method == "POST" and server.lease is not None:
            raise ApiError(409, "AlreadyExists", "exists")
        if method == "PUT":
            current = (server.lease or {}).get("metadata", {}).get("resourceVersion")
            if body["metadata"].get("resourceVersion") != current:
                raise ApiError(409, "Conflict", "the object has been modified")
        server.version += 1
        server.writes += 1
        server.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(server.version)}}
        return server.lease


def elector(server: LeaseServer, clock: Clock, name: str, timing: Timing = TIMING) -> Elector:
    kube = server.client()
    kube.timeout = (timing.renew_deadline, timing.renew_deadline)  # as main.py makes the lease's client
    return Elector(kube, "ns", "gpu-operator", name, timing, clock=clock)


async def run(clock: Clock, electors: list[Elector], seconds: float) -> list[set[str]]:
    """Step every elector each retry period for `seconds`; who leads after each round."""
    leaders = []
    end = clock.now + seconds
    while clock.now < end:
        for each in electors:
            await each.step()
        leaders.append({e.election.identity for e in electors if e.leading()})
        clock.now += TIMING.retry
    return leaders


def test_timing_must_leave_a_margin() -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < duration"):
        Timing(duration=10, renew_deadline=10, retry=2)


@in_loop
async def test_one_leader_and_a_standby_takes_over_within_15_seconds_of_its_death(clock: Clock) -> None:
    server = LeaseServer()
    a, b = elector(server, clock, "a"), elector(server, clock, "b")
    rounds = await run(clock, [a, b], 30)
    assert all(len(leaders) == 1 for leaders in rounds), rounds
    assert rounds[-1] == {"a"}, "the first one keeps it while it renews"
    died = clock.now - TIMING.retry  # a's last renewal was in the last round
    taken = None
    while taken is None:
        await b.step()
        if b.leading():
            taken = clock.now
        clock.now += 0.5
    assert taken - died <= 15.0
    assert record_of(cast(dict[str, Any], server.lease)).transitions == 1


@in_loop
async def test_a_leader_cut_off_stops_before_a_standby_may_start(clock: Clock) -> None:
    server = LeaseServer()
    a, b = elector(server, clock, "a"), elector(server, clock, "b")
    await run(clock, [a, b], 10)
    assert a.leading()
    last_renewal = clock.now - TIMING.retry
    server.down = True
    stopped = None
    while stopped is None:
        await a.step()
        if not a.leading():
            stopped = clock.now
        clock.now += 0.5
    server.down = False
    started = None
    while started is None:
        await b.step()
        if b.leading():
            started = clock.now
        clock.now += 0.5
    assert stopped - last_renewal <= TIMING.renew_deadline + 0.5
    assert started > stopped + 2, "no overlap: the old leader stopped writing well before"


async def campaign(clock: Clock, each: Elector, seconds: float) -> list[bool]:
    """Run one elector as its task does (each round, then its pause) for `seconds`; whether it leads
    after each round."""
    leading = []
    end = clock.now + seconds
    while clock.now < end:
        started = clock.now
        done = await each.step()
        leading.append(each.leading())
        clock.now += each.pause(started, done)
    return leading


@in_loop
async def test_the_only_replica_keeps_its_lease_on_an_api_server_slower_than_a_round(clock: Clock) -> None:
    # Every answer takes 5 s (a saturated API server: TLS handshakes alone time out at 2-3 s):
    # renewals go out back to back, each may take until the renew deadline, and none is given up.
    server = LeaseServer(clock)
    a = elector(server, clock, "a")
    assert (await campaign(clock, a, 10))[-1]
    server.slow = 5.0
    assert all(await campaign(clock, a, 120))
    assert record_of(cast(dict[str, Any], server.lease)).transitions == 0


@in_loop
async def test_by_default_answers_8_seconds_late_keep_the_only_replica_leading(clock: Clock) -> None:
    # The chaos suite's slow API server answers 2-8 s late; client-go's timing (a 10 s renew
    # deadline) keeps leading through it where 10/7/2 s could not (an answer after 7 s comes too late).
    server = LeaseServer(clock)
    a = elector(server, clock, "a", Timing())
    await campaign(clock, a, 10)
    server.slow = 8.0
    assert all(await campaign(clock, a, 120))
    short = elector(LeaseServer(clock), clock, "b")
    await campaign(clock, short, 10)
    short.kube.server.slow = 8.0  # type: ignore[attr-defined]
    assert not all(await campaign(clock, short, 60))


@in_loop
async def test_a_lease_lost_to_nobody_is_taken_back_at_once(clock: Clock) -> None:
    server = LeaseServer(clock)
    a = elector(server, clock, "a")
    await campaign(clock, a, 10)
    server.slow = 8.0  # past the renew deadline: it must stop writing
    assert not all(await campaign(clock, a, 20))
    server.slow = 0.0
    assert await campaign(clock, a, 0.1) == [True]  # the first round that gets through
    assert record_of(cast(dict[str, Any], server.lease)).holder == "a"


@in_loop
async def test_a_write_waits_for_a_late_renewal_of_the_lease_this_replica_holds(clock: Clock) -> None:
    server = LeaseServer(clock)
    a = elector(server, clock, "a")
    await campaign(clock, a, 4)
    clock.now += TIMING.renew_deadline  # the renewal is late: not leading, but the lease names it
    assert not a.leading()
    writer = asyncio.create_task(a.may_write())
    await settle()
    assert not writer.done(), "it waits rather than refuse"
    await a.step()  # the renewal gets through
    await settle()
    assert writer.done() and writer.result() is True


@in_loop
async def test_a_write_is_refused_at_once_when_another_replica_holds_the_lease(clock: Clock) -> None:
    server = LeaseServer(clock)
    a, b = elector(server, clock, "a"), elector(server, clock, "b")
    await run(clock, [a, b], 6)
    assert not await b.may_write()
    clock.now += TIMING.renew_deadline
    a.stopping.set()  # a stopping leader waits for nothing
    assert not await a.may_write()


@in_loop
async def test_a_failed_renewal_is_retried_at_once_while_leading(clock: Clock) -> None:
    server = LeaseServer(clock)
    a = elector(server, clock, "a")
    await campaign(clock, a, 10)
    started = clock.now
    server.down = True
    assert not await a.step()
    assert a.pause(started, False) < TIMING.retry
    server.down = False
    assert await a.step() and a.pause(clock.now, True) == TIMING.retry


@in_loop
async def test_a_released_lease_is_taken_at_the_next_round(clock: Clock) -> None:
    server = LeaseServer()
    a, b = elector(server, clock, "a"), elector(server, clock, "b")
    await run(clock, [a, b], 6)
    await a.stop(release=True)
    assert not a.leading() and record_of(cast(dict[str, Any], server.lease)).holder == ""
    await b.step()
    assert b.leading()


@in_loop
async def test_a_standby_writes_nothing_while_the_lease_is_held(clock: Clock) -> None:
    server = LeaseServer()
    a = elector(server, clock, "a")
    await run(clock, [a], 4)
    writes = server.writes
    b = elector(server, clock, "b")
    await run(clock, [b], 8)  # a is silent but its lease is not yet expired
    assert server.writes == writes and not b.leading()


@in_loop
async def test_the_leader_renews_without_reading_and_reads_once_its_renewal_is_refused(clock: Clock) -> None:
    """At rest a leader costs the API server one write per retry period, no read (client-go's fast
    path); a lease someone else wrote meanwhile (a 409 on the renewal) is read and respected."""
    server = LeaseServer()
    a = elector(server, clock, "a")
    await run(clock, [a], 4)
    reads, writes = server.reads, server.writes
    await run(clock, [a], 20)
    assert (server.reads - reads, server.writes - writes) == (0, 10) and a.leading()
    # An admin hands the lease to "b" (a write a does not know of): a's next renewal is refused.
    lease = cast(dict[str, Any], server.lease)
    server.version += 1
    server.lease = {**lease, "spec": {**lease["spec"], "holderIdentity": "b"}}
    server.lease["metadata"] = {**lease["metadata"], "resourceVersion": str(server.version)}
    reads = server.reads
    await a.step()
    assert server.reads == reads + 1 and not a.leading()
    assert record_of(server.lease).holder == "b"


def test_election_rules_on_their_own() -> None:
    election = Election("me", TIMING)
    assert election.wanted(0.0, "t0") == Record("me", 10, "t0", "t0", 0)  # no lease: create it
    theirs = Record("other", 10, "t0", "t0", 3, "7")
    election.observe(theirs, 0.0)
    assert election.wanted(9.9, "t1") is None
    election.observe(theirs, 9.9)  # unchanged: still counted from 0
    assert election.wanted(10.0, "t2") == Record("me", 10, "t2", "t2", 4, "7")
    assert not election.leading(10.0) and election.released("t3") is None


@in_loop
async def test_a_started_elector_leads_and_on_stop_releases_the_lease(clock: Clock) -> None:
    """The task: its first round at once, then (the fake clock standing still) a wait for the next,
    which stop ends at once; stop hands the lease back and says so."""
    server = LeaseServer(clock)
    changes: list[bool] = []
    a = Elector(server.client(), "ns", "gpu-operator", "a", TIMING, changes.append, clock=clock)
    a.start()
    await settle()
    assert a.leading() and changes == [True] and server.writes == 1
    await a.stop()
    assert a.task is not None and a.task.done() and not a.task.cancelled()
    assert not a.leading() and changes == [True, False]
    assert record_of(cast(dict[str, Any], server.lease)).holder == ""


@in_loop
async def test_a_write_waiting_for_a_late_renewal_is_refused_when_the_elector_stops(clock: Clock) -> None:
    server = LeaseServer(clock)
    a = elector(server, clock, "a")
    await campaign(clock, a, 4)
    clock.now += TIMING.renew_deadline
    writer = asyncio.create_task(a.may_write())
    await settle()
    assert not writer.done()
    await a.stop(release=False)
    await settle()
    assert writer.done() and writer.result() is False
    assert record_of(cast(dict[str, Any], server.lease)).holder == "a", "not released"


def test_leadership_gates_writes() -> None:
    assert Leadership(enabled=False).leading()
    assert asyncio.run(Leadership(enabled=False).may_write())
    standby = Leadership(enabled=True)
    assert not standby.leading(), "no elector yet: a standby"
    assert not asyncio.run(standby.may_write())
    kube = Kube(cast(Any, None), may_write=standby.may_write)
    with pytest.raises(NotLeader):
        asyncio.run(kube.delete(("v1", "ConfigMap", "ns", "x")))


def test_lease_body_round_trip() -> None:
    record = Record("me", 10, "a", "b", 2, "9")
    assert record_of(lease_body("ns", "l", record)) == record
