"""The work queue and its probes: one pass at a time, asked for by events, retried with back-off;
liveness fails only when work waits with no pass finishing (an API outage that makes passes fail fast
is progress), lastError clears after a good pass. Timers run on a clock the tests move by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from builders import Clock

from gpu_operator.runtime.backoff import Backoff
from gpu_operator.runtime.client import ApiError, NotLeader
from gpu_operator.runtime.probes import health, ready
from gpu_operator.runtime.reconciler import Outcome
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store
from gpu_operator.runtime.workqueue import TokenBucket, WorkQueue

SETTINGS = Settings(
    stuck_after_seconds=100.0, retry_seconds=0.01, max_backoff_seconds=0.01, resync_seconds=3600.0
)


def outcome(rolling_out: int = 0) -> Outcome:
    plan: Any = type(
        "P",
        (),
        {
            "statuses": {},
            "active": None,
            "spec": None,
            "gpu_nodes": 0,
            "driver_pools": {},
            "dra": None,
            "nodes_rolling_out": rolling_out,
        },
    )()
    return Outcome(plan, {})


def live(loop: WorkQueue) -> bool:
    return health(loop, Store())[0]


def test_work_waiting_without_a_finished_pass_fails_liveness(clock: Clock) -> None:
    loop = WorkQueue(SETTINGS, clock)
    loop.started = True
    clock.now += 1000  # idle for long: nothing to do is not stuck
    assert live(loop)
    loop.add()
    clock.now += 99
    assert live(loop)
    clock.now += 2
    healthy, body = health(loop, Store())
    assert not healthy and body["reconcile"]["stuck"] and body["reconcile"]["workWaitingSeconds"] == 101
    loop._finished()  # a pass ends: what it was woken for is done
    assert live(loop) and loop.stuck_for() == 0


def test_work_arriving_during_a_pass_waits_from_its_end(clock: Clock) -> None:
    loop = WorkQueue(SETTINGS, clock)
    loop.started = True
    loop.add()
    loop.dirty.clear()  # the pass starts
    clock.now += 50
    loop.add()  # an event during the pass
    clock.now += 10
    loop._finished()
    assert loop.stuck_for() == 0  # counted from the end of the pass that could not see it
    clock.now += 101
    assert not live(loop)


def scenario(passes: list[Exception | None]) -> tuple[WorkQueue, list[tuple[bool, dict[str, Any]]]]:
    """Run the queue over passes that raise or succeed in turn; the probes after each."""
    seen: list[tuple[bool, dict[str, Any]]] = []
    done = asyncio.Event()

    async def main() -> WorkQueue:
        loop = WorkQueue(SETTINGS)
        remaining = list(passes)

        async def one_pass() -> Outcome:
            error = remaining.pop(0)
            if not remaining:
                done.set()
            if error is not None:
                raise error
            return outcome()

        loop.listed.set()
        loop.add()
        task = asyncio.create_task(loop.run(one_pass))
        while not done.is_set() or loop.work_since is not None:
            await asyncio.sleep(0.01)
            if loop.last_finished is not None:
                seen.append(health(loop, Store()))
        task.cancel()
        return loop

    return asyncio.run(main()), seen


def test_an_unreachable_api_server_is_progress_and_a_good_pass_clears_last_error() -> None:
    down = ApiError(0, "ConnectionError", "connection refused")
    loop, seen = scenario([down, down, down, None])
    assert loop.failures == 3 and loop.passes == 1
    assert all(healthy for healthy, _ in seen), "an API outage never fails liveness"
    assert any("connection refused" in body["reconcile"]["lastError"] for _, body in seen)
    assert loop.last_error == ""
    assert ready(loop)[0]


def test_a_pass_that_lost_the_lease_is_no_failure_and_is_not_retried_on_a_back_off() -> None:
    # The elector wakes the loop when this replica leads again; a back-off would only delay that.
    settings = Settings(max_backoff_seconds=60.0, resync_seconds=86400.0)
    calls: list[int] = []

    def step(loop: WorkQueue) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise NotLeader()

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(lambda: len(calls) == 1 and loop.idle.is_set(), "the pass that lost the lease")
        await skip(120)  # twice the longest back-off: nothing retries it by itself
        assert len(calls) == 1 and loop.failures == 0 and loop.last_error == ""
        loop.add()  # leading again
        await until(lambda: loop.passes == 1, "the pass once it leads again")
        assert loop.failures == 0

    drive(settings, step, script)


def test_an_ask_while_a_renewal_is_late_is_not_lost() -> None:
    """A slow API server makes a renewal late: the replica still holds the lease but does not lead for
    a moment, and the elector asks for nothing when the renewal gets through. The pass asked for then
    runs a retry period later, with no other event."""
    settings = Settings(resync_seconds=86400.0)
    leads = [False]
    passes: list[float] = []

    async def script(loop: WorkQueue) -> None:
        loop.add()  # the edit, while the renewal is late
        await until(lambda: "standby" in loop.later, "the ask put off")
        assert passes == [], "no pass while not leading"
        leads[0] = True  # the renewal got through: nobody asks for a pass
        await skip(settings.lease.retry)
        await until(lambda: len(passes) == 1, "the pass asked for while the renewal was late")

    drive(settings, lambda loop: passes.append(loop.clock()), script, leading=lambda: leads[0])


class SteppedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs with the real one and jumps when the test says (`skip`): the
    tests set their intervals a minute or more long, so that no timer fires on its own while a test
    runs, however slow the machine, and each fires when the test moves the clock past it."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped


async def skip(seconds: float) -> None:
    """Move the event loop's clock (and the Loop's, which reads it) on; the timers now due have run
    when this returns."""
    running = asyncio.get_running_loop()
    assert isinstance(running, SteppedLoop)
    running.skipped += seconds
    for _ in range(2):  # the timers due run in the next iteration, after the task that yielded
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (at most 10 s, a guard against a hang, not a bound on speed) until `condition` holds."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def done(waiting: Awaitable[object]) -> None:
    """Await a wait that the test has already made due (a guard against a hang, not a bound on speed)."""
    await asyncio.wait_for(waiting, timeout=10)


def drive(
    settings: Settings,
    step: Callable[[WorkQueue], Awaitable[None] | None],
    script: Callable[[WorkQueue], Awaitable[None]],
    nodes: int = 1,
    leading: Callable[[], bool] = lambda: True,
    rolling_out: Callable[[], int] | None = None,
) -> None:
    """Run the queue over a cluster of `nodes`, each pass doing `step` and then succeeding with
    `rolling_out` nodes still rolling out (all of them unless told), while `script` acts and checks; the
    queue's clock is the event loop's, that `skip` moves on."""

    async def main() -> None:
        loop = WorkQueue(settings, asyncio.get_running_loop().time, leading, size=lambda: nodes)
        loop.listed.set()

        async def one_pass() -> Outcome:
            stepped = step(loop)
            if stepped is not None:
                await stepped
            return outcome(nodes if rolling_out is None else rolling_out())

        task = asyncio.create_task(loop.run(one_pass))
        try:
            await script(loop)
        finally:
            task.cancel()

    with asyncio.Runner(loop_factory=SteppedLoop) as runner:
        runner.run(main())


def test_changes_that_only_show_coalesce_into_one_pass_soon() -> None:
    settings = Settings(status_interval_seconds=60.0, resync_seconds=86400.0)
    started: list[float] = []

    async def script(loop: WorkQueue) -> None:
        await until_idle(loop)
        for _ in range(20):  # pods going Init:1/4, Init:2/4, ... on many nodes
            loop.add_soon()
        await asyncio.sleep(0.1)
        assert started == [], "not at once"
        await skip(60.0)
        await until_idle(loop)
        assert len(started) == 1, "one pass for them all"
        loop.add_soon()
        loop.add()  # a change that decides: at once, and it takes the pending one along
        await until(lambda: len(started) == 2, "the pass at once")
        assert len(started) == 2 and "soon" not in loop.later
        await until_idle(loop)
        await skip(60.0)
        await until_idle(loop)
        assert len(started) == 2

    drive(settings, lambda loop: started.append(loop.clock()), script)


async def until_idle(loop: WorkQueue) -> None:
    await until(loop.idle.is_set, "the queue went idle")


def test_a_failing_pass_is_retried_after_a_doubling_back_off_and_a_success_resets_it() -> None:
    settings = Settings(retry_seconds=10.0, max_backoff_seconds=35.0, resync_seconds=86400.0)
    started: list[float] = []

    def step(loop: WorkQueue) -> None:
        started.append(loop.clock())
        if len(started) <= 4:
            raise ApiError(500, "InternalError", "etcd is sad")

    async def script(loop: WorkQueue) -> None:
        loop.add()
        for count, wait in enumerate((10.0, 20.0, 35.0, 35.0), start=1):  # doubled, at most the most
            await until(lambda: loop.failures == count, "failed")  # noqa: B023 (awaited at once)
            assert len(started) == count
            await skip(wait - 1.0)
            await asyncio.sleep(0.05)
            assert len(started) == count, f"not retried before {wait} s"
            await skip(1.0)
            await until(lambda: len(started) == count + 1, f"retried after {wait} s")  # noqa: B023
        await until(lambda: loop.passes == 1, "the good pass")
        assert loop.last_error == "" and loop.backoff.current == 0

    drive(settings, step, script)


def test_an_event_during_the_back_off_asks_for_a_pass_at_once() -> None:
    settings = Settings(retry_seconds=600.0, resync_seconds=86400.0)
    calls: list[int] = []

    def step(loop: WorkQueue) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ApiError(0, "ConnectionError", "refused")

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(lambda: loop.failures == 1, "the failed pass")
        loop.add()  # a watch event: the pass it asks for does not wait for the back-off
        await until(lambda: loop.passes == 1, "the pass the event asked for")

    drive(settings, step, script)


def test_backoff_doubles_up_to_its_most() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 1.0


def test_the_token_bucket_waits_for_what_it_lacks_and_owes_nothing(clock: Clock) -> None:
    bucket = TokenBucket(rate=10.0, burst=2500.0, clock=clock)
    assert bucket.delay(1000) == 0.0
    bucket.take(1000)
    bucket.take(1000)
    assert bucket.delay(1000) == pytest.approx(50.0), "500 left, 500 missing at 10 a second"
    clock.now += 50
    assert bucket.delay(1000) == 0.0
    bucket.take(1000)
    assert bucket.delay(10_000) == 250.0, "a cost over the burst counts as the burst: no debt"
    clock.now += 10_000
    assert bucket.delay(0) == 0.0 and bucket.tokens == 2500.0, "full, and no fuller"


def test_passes_over_a_large_cluster_wait_for_their_tokens_once_the_burst_is_spent() -> None:
    """A pass costs a token per node: with 2000 tokens and 10 a second, two passes over 1000 nodes go
    at once and each one after waits 100 s, the events of the wait planned together."""
    settings = Settings(pass_rate_nodes_per_second=10.0, pass_burst_nodes=2000.0, resync_seconds=86400.0)
    started: list[float] = []

    def step(loop: WorkQueue) -> None:
        started.append(loop.clock())
        loop.add()  # events keep coming

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(lambda: len(started) == 2, "the burst")
        await asyncio.sleep(0.05)
        assert len(started) == 2, "the third pass waits for its tokens"
        await skip(99.0)
        await asyncio.sleep(0.05)
        assert len(started) == 2
        await skip(1.0)
        await until(lambda: len(started) == 3, "the third pass, 100 s on")

    drive(settings, step, script, nodes=1000)
    assert started[1] - started[0] < 1.0 and started[2] - started[1] >= 100.0


def test_a_pass_costs_the_nodes_still_rolling_out_and_at_least_a_share_of_the_cluster() -> None:
    """Once the rollout of 1000 nodes settles, the passes of a node joining cost a tenth of the
    cluster (10 s at 10 tokens a second), not all of it (100 s), even with the bucket spent."""
    settings = Settings(pass_rate_nodes_per_second=10.0, pass_burst_nodes=2000.0, resync_seconds=86400.0)
    started: list[float] = []
    rolling = [1000]

    def step(loop: WorkQueue) -> None:
        started.append(loop.clock())

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(lambda: len(started) == 1, "the first pass")
        loop.add()
        await until(lambda: len(started) == 2, "the second, from the burst")
        assert loop.cost() == 1000.0, "all nodes still rolling out"
        rolling[0] = 1  # the next pass sees the rollout settled but for one node
        loop.add()
        await skip(100.0)
        await until(lambda: len(started) == 3, "the third, after 100 s")
        assert loop.cost() == 100.0, "one node rolling out: the tenth of the cluster a pass looks over"
        loop.add()
        await skip(9.0)
        await asyncio.sleep(0.05)
        assert len(started) == 3, "the bucket is empty: 100 tokens take 10 s"
        await skip(1.0)
        await until(lambda: len(started) == 4, "the fourth, 10 s on")

    drive(settings, step, script, nodes=1000, rolling_out=lambda: rolling[0])
    assert started[3] - started[2] >= 10.0


def test_a_small_clusters_passes_never_wait() -> None:
    settings = Settings(pass_rate_nodes_per_second=10.0, pass_burst_nodes=2000.0, resync_seconds=86400.0)
    started: list[float] = []

    def step(loop: WorkQueue) -> None:
        started.append(loop.clock())
        if len(started) < 100:
            loop.add()

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(lambda: len(started) == 100, "100 passes over 10 nodes, back to back")

    drive(settings, step, script, nodes=10)
    assert started[-1] - started[0] < 60.0, "no 1000-token wait on the moved clock"


def test_an_ask_during_a_pass_is_one_more_pass_after_it() -> None:
    running = asyncio.Event()
    release = asyncio.Event()
    started: list[float] = []

    async def step(loop: WorkQueue) -> None:
        started.append(loop.clock())
        if len(started) == 1:
            running.set()
            await release.wait()

    async def script(loop: WorkQueue) -> None:
        loop.add()
        await until(running.is_set, "the first pass running")
        for _ in range(5):
            loop.add()  # events during the pass
        release.set()
        await until(lambda: len(started) == 2, "the pass after it")
        await until_idle(loop)
        assert len(started) == 2, "one pass for every event that came during the first"

    drive(Settings(resync_seconds=86400.0), step, script)


def test_no_event_for_resync_seconds_is_a_pass_anyway() -> None:
    started: list[float] = []

    async def script(loop: WorkQueue) -> None:
        await until_idle(loop)
        await skip(599.0)
        await asyncio.sleep(0.05)
        assert started == []
        await skip(2.0)
        await until(lambda: len(started) == 1, "the resync pass")

    drive(Settings(resync_seconds=600.0), lambda loop: started.append(loop.clock()), script)


def test_watches_read_on_while_the_queue_is_idle_and_wait_while_a_pass_runs_or_is_asked_for() -> None:
    """WorkQueue.settle (gpu_operator/runtime/watch_stream.py asks it after each read): None while idle;
    while a pass runs, a wait that ends when the queue is idle again, or after watch_batch_seconds, one
    timer for every watch."""
    running = asyncio.Event()
    release = asyncio.Event()

    async def step(loop: WorkQueue) -> None:
        running.set()
        await release.wait()

    async def script(loop: WorkQueue) -> None:
        await until_idle(loop)
        assert loop.settle() is None, "idle: the next event may start a pass"
        loop.add()
        assert not loop.idle.is_set(), "asked for: a pass is due"
        await until(running.is_set, "the pass running")
        waiting = loop.settle()
        assert waiting is not None
        timer = loop.reads.timer
        await skip(30.0)
        other = loop.settle()  # another watch, later in the same interval
        assert other is not None and loop.reads.timer is timer, "one timer, one wake-up for every watch"
        assert not loop.reads.ended.is_set(), "not before the interval is over"
        await skip(30.0)
        await done(asyncio.gather(waiting, other))  # the pass is still running: after the interval
        assert loop.reads.timer is None
        waiting = loop.settle()
        assert waiting is not None
        release.set()  # the pass ends, and so does the wait, before the interval is over
        await done(waiting)  # the clock was not moved on: the interval is not over
        await until_idle(loop)

    drive(Settings(resync_seconds=86400.0, watch_batch_seconds=60.0), step, script)
    assert WorkQueue(Settings(watch_batch_seconds=0)).settle() is None, "0: every event read at once"


def test_the_watches_read_when_a_pass_ends_even_with_the_next_one_asked_for() -> None:
    """What arrived during a pass is read as it ends, before the next pass (asked for during this one)
    starts, not when the batch interval is over."""
    running = asyncio.Event()
    release = asyncio.Event()
    passes: list[float] = []

    async def step(loop: WorkQueue) -> None:
        passes.append(loop.clock())
        running.set()
        await release.wait()

    async def script(loop: WorkQueue) -> None:
        await until_idle(loop)
        loop.add()
        await until(running.is_set, "the pass running")
        waiting = loop.settle()
        assert waiting is not None
        loop.add()  # an event read during the pass: the next pass is due as soon as this one ends
        release.set()
        await done(waiting)  # read when the pass ended: the clock never reaches the 60 s interval

    drive(Settings(resync_seconds=86400.0, watch_batch_seconds=60.0), step, script)
