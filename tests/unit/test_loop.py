"""The reconcile loop and its probes: liveness fails only when work waits with no pass finishing (an
API outage that makes passes fail fast is progress), lastError clears after a good pass."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from builders import Clock

from gpu_operator.runtime.client import ApiError, NotLeader
from gpu_operator.runtime.loop import Loop, health, ready
from gpu_operator.runtime.reconciler import Outcome
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

SETTINGS = Settings(stuck_after_seconds=100.0, max_backoff_seconds=0.01, resync_seconds=3600.0)


def outcome() -> Outcome:
    plan: Any = type("P", (), {"statuses": {}, "active": None, "spec": None, "gpu_nodes": 0})()
    return Outcome(plan, {})


def live(loop: Loop) -> bool:
    return health(loop, Store())[0]


def test_work_waiting_without_a_finished_pass_fails_liveness(clock: Clock) -> None:
    loop = Loop(SETTINGS, clock)
    loop.started = True
    clock.now += 1000  # idle for long: nothing to do is not stuck
    assert live(loop)
    loop.wake()
    clock.now += 99
    assert live(loop)
    clock.now += 2
    healthy, body = health(loop, Store())
    assert not healthy and body["reconcile"]["stuck"] and body["reconcile"]["workWaitingSeconds"] == 101
    loop._finished()  # a pass ends: what it was woken for is done
    assert live(loop) and loop.stuck_for() == 0


def test_work_arriving_during_a_pass_waits_from_its_end(clock: Clock) -> None:
    loop = Loop(SETTINGS, clock)
    loop.started = True
    loop.wake()
    loop.wakeup.clear()  # the pass starts
    clock.now += 50
    loop.wake()  # an event during the pass
    clock.now += 10
    loop._finished()
    assert loop.stuck_for() == 0  # counted from the end of the pass that could not see it
    clock.now += 101
    assert not live(loop)


def scenario(passes: list[Exception | None]) -> tuple[Loop, list[tuple[bool, dict[str, Any]]]]:
    """Run the loop over passes that raise or succeed in turn; the probes after each."""
    seen: list[tuple[bool, dict[str, Any]]] = []
    done = threading.Event()

    async def main() -> Loop:
        loop = Loop(SETTINGS)
        remaining = list(passes)

        def one_pass() -> Outcome:
            error = remaining.pop(0)
            if not remaining:
                done.set()
            if error is not None:
                raise error
            return outcome()

        loop.listed.set()
        loop.wake()
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

    def step(loop: Loop) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise NotLeader()

    async def script(loop: Loop) -> None:
        loop.wake()
        await until(lambda: len(calls) == 1 and loop.idle.is_set(), "the pass that lost the lease")
        await skip(120)  # twice the longest back-off: nothing retries it by itself
        assert len(calls) == 1 and loop.failures == 0 and loop.last_error == ""
        loop.wake()  # leading again
        await until(lambda: loop.passes == 1, "the pass once it leads again")
        assert loop.failures == 0

    drive(settings, step, script)


class SteppedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs with the real one and jumps when the test moves `hand` on
    (`skip`); the Loop's own clock is `hand` alone, so what it computes (its budget, when the next pass
    is due) does not depend on how fast the machine is. The tests set their intervals a minute or more
    long, so that no timer fires on its own while a test runs, however slow the machine, and each
    fires when the test moves the clock past it."""

    def __init__(self) -> None:
        super().__init__()
        self.hand = Clock(0.0)

    def time(self) -> float:
        return super().time() + self.hand.now


async def skip(seconds: float) -> None:
    """Move the hand-moved clock (the Loop's, and the event loop's with it) on; the timers now due
    have run when this returns."""
    running = asyncio.get_running_loop()
    assert isinstance(running, SteppedLoop)
    running.hand.now += seconds
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
    settings: Settings, step: Callable[[Loop], None], script: Callable[[Loop], Awaitable[None]]
) -> None:
    """Run the loop, each pass doing `step` and then succeeding, while `script` acts and checks; the
    Loop's clock is the hand-moved one that `skip` moves on (SteppedLoop.hand)."""

    async def main() -> None:
        running = asyncio.get_running_loop()
        assert isinstance(running, SteppedLoop)
        loop = Loop(settings, running.hand)
        loop.listed.set()

        def one_pass() -> Outcome:
            step(loop)
            return outcome()

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

    async def script(loop: Loop) -> None:
        await until_idle(loop)
        for _ in range(20):  # pods going Init:1/4, Init:2/4, ... on many nodes
            loop.wake_soon()
        await asyncio.sleep(0.1)
        assert started == [], "not at once"
        await skip(60.0)
        await until_idle(loop)
        assert len(started) == 1, "one pass for them all"
        loop.wake_soon()
        loop.wake()  # a change that decides: at once, and it takes the pending one along
        await until(lambda: len(started) == 2, "the pass at once")
        assert len(started) == 2 and loop.soon is None
        await until_idle(loop)
        await skip(60.0)
        await until_idle(loop)
        assert len(started) == 2

    drive(settings, lambda loop: started.append(loop.clock()), script)


def busy_passes(settings: Settings, cpus: list[float], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Run a pass for each of `cpus` in turn while events keep coming, each taking that many CPU
    seconds and lasting as long on the hand-moved clock (a pass lasts at least its CPU), the clock
    moved on to the end of each wait between them: the gaps between their starts on that clock.

    The CPU seconds are a clock the passes move, not the machine's: `time.thread_time`, what the Loop
    measures a pass's CPU with, reads it while they run, so that neither the CPU a pass takes nor
    how long anything lasts depends on how fast or busy the machine is."""
    cpu = Clock(0.0)
    monkeypatch.setattr(time, "thread_time", cpu)
    started: list[float] = []

    def step(loop: Loop) -> None:
        assert isinstance(loop.clock, Clock)
        started.append(loop.clock())
        took = cpus[len(started) - 1]
        cpu.now += took
        loop.clock.now += took
        if len(started) < len(cpus):
            loop.wake()  # events keep coming

    async def script(loop: Loop) -> None:
        loop.wake()
        for number in range(1, len(cpus)):
            await next_pass(loop, started, number)

    drive(settings, step, script)
    return [b - a for a, b in itertools.pairwise(started)]


async def next_pass(loop: Loop, started: list[float], number: int) -> None:
    """Once pass `number` has ended, move the clock to the end of the wait after it (if the loop waits
    at all), and see pass `number + 1` start."""
    await until(lambda: loop.passes >= number, f"pass {number} ended")
    if len(started) == number and loop.next_pass_at is not None:  # waiting, from the end of that pass
        await skip(loop.next_pass_at - loop.clock())
    await until(lambda: len(started) > number, f"pass {number + 1} started")


def test_the_next_pass_waits_twice_the_cpu_the_last_one_took(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        pass_spacing=2.0,
        max_pass_spacing_seconds=1200.0,
        planning_burst_seconds=1000.0,  # more than the passes take: no wait for the budget
        resync_seconds=86400.0,
    )
    cpus = [60.0, 30.0, 60.0]  # passes planning thousands of nodes
    gaps = busy_passes(settings, cpus, monkeypatch)
    # Each gap: the pass itself (its CPU), then twice its CPU of spacing.
    assert gaps == [3.0 * cpu for cpu in cpus[:-1]], (gaps, cpus)


def test_once_the_planning_burst_is_spent_passes_wait_for_the_budget_to_refill(clock: Clock) -> None:
    settings = Settings(
        pass_spacing=2.0,
        max_pass_spacing_seconds=1.0,
        planning_burst_seconds=1.0,
        planning_share=0.1,
        max_budget_wait_seconds=10.0,
    )
    loop = Loop(settings, clock)
    loop.started = True
    assert loop.spacing(0.01) == 0.02, "within the burst: spaced by its cost alone"
    assert loop.spacing(0.99) == 1.0, "the burst spent to the last: still by cost (at most 1 s)"
    assert loop.spacing(0.2) == 2.0, "0.2 s overspent at a tenth of a core: 2 s to refill"
    clock.now += 2.0
    assert loop.budget.available() == 0.0
    assert loop.spacing(5.0) == 10.0, "never longer than max_budget_wait_seconds"
    assert loop.budget.available() == -1.0, "what it cost beyond 10 s of refilling is not owed"
    clock.now += 10.0
    assert loop.spacing(0.01) == pytest.approx(0.1), "the debt paid off: by this pass alone"
    clock.now += 1000
    assert loop.budget.available() == 1.0, "refilled up to the burst, no further"
    assert health(loop, Store())[1]["reconcile"]["planningBudgetSeconds"] == 1.0


def test_passes_past_the_burst_run_at_the_planning_share(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        pass_spacing=0.0,
        planning_burst_seconds=60.0,
        planning_share=0.5,
        max_budget_wait_seconds=3600.0,  # longer than any wait here: no debt forgiven
        resync_seconds=86400.0,
    )
    gaps = busy_passes(settings, [60.0] * 4, monkeypatch)
    assert gaps[0] == 60.0, "the first pass spends the burst: the next starts as it ends"
    # From then on a pass (and its wait) lasts as long as refilling its 60 s at half a core takes:
    # 120 s, where spacing by cost alone (pass_spacing 0) would not wait.
    assert gaps[1:] == [120.0, 120.0], gaps


def test_watches_read_on_while_the_loop_is_idle_and_wait_while_a_pass_runs_or_is_due() -> None:
    """Loop.settle (gpu_operator/runtime/watch_stream.py asks it after each read): None while idle; while a
    pass runs, a wait that ends when the loop is idle again, or after watch_coalesce_seconds, one timer
    for every watch, quiet or not."""
    running = threading.Event()
    release = threading.Event()

    def step(loop: Loop) -> None:
        running.set()
        release.wait(30)  # until the script lets it end (a guard against a hang)

    async def script(loop: Loop) -> None:
        await until_idle(loop)
        assert loop.settle(BUSY) is None, "idle: the next event may start a pass"
        loop.wake()
        assert not loop.idle.is_set(), "woken: a pass is due"
        await until(running.is_set, "the pass started")
        waiting = loop.settle(QUIET)
        assert waiting is not None and loop.quiet_reads.timer is None, "a pass runs: quiet or not"
        timer = loop.reads.timer
        await skip(30.0)
        other = loop.settle(BUSY)  # another watch, later in the same interval
        assert other is not None and loop.reads.timer is timer, "one timer, one wake-up for every watch"
        assert not loop.reads.ended.is_set(), "not before the interval is over"
        await skip(30.0)
        await done(asyncio.gather(waiting, other))  # the pass is still running: after the interval
        assert loop.reads.timer is None
        waiting = loop.settle(BUSY)
        assert waiting is not None
        release.set()  # the pass ends, and so does the wait, before the interval is over
        await done(waiting)  # the clock was not moved on: the interval is not over
        await until_idle(loop)

    settings = Settings(resync_seconds=86400.0, pass_spacing=0.0, watch_coalesce_seconds=60.0)
    drive(settings, step, script)
    assert Loop(Settings(watch_coalesce_seconds=0)).settle(BUSY) is None, "0: every event read at once"


QUIET = 20_000.0
"""Bytes a second of a watch under Settings.watch_quiet_bytes a second (the nodes of a rollout)."""
BUSY = 1_000_000.0
"""Bytes a second of one over it (the pods of a 1000-node rollout)."""


async def until_idle(loop: Loop) -> None:
    await until(loop.idle.is_set, "the loop went idle")


def test_while_the_next_pass_waits_a_quiet_watch_reads_less_often_until_just_before_it() -> None:
    """While the next pass waits (for its spacing or its budget) longer than a quiet interval and one
    more, a watch bringing less than watch_quiet_bytes a watch_quiet_seconds waits that long, a busy
    one watch_coalesce_seconds; closer to the pass, every watch reads every watch_coalesce_seconds,
    so that the pass plans on what they brought."""
    passes: list[float] = []

    def step(loop: Loop) -> None:
        passes.append(loop.clock())
        spent = time.thread_time() + 0.05
        while time.thread_time() < spent:  # CPU: what the spacing after the pass is sized by
            pass

    async def script(loop: Loop) -> None:
        await until_idle(loop)
        loop.wake()
        await until(lambda: loop.next_pass_at is not None, "the pass ended")
        assert not loop.idle.is_set(), "the pass's spacing (pass_spacing times its CPU: 1200 s)"
        busy, quiet = loop.settle(BUSY), loop.settle(QUIET)
        assert busy is not None and quiet is not None and loop.quiet_reads.timer is not None
        await skip(60.0)
        await done(busy)  # a busy watch: watch_coalesce_seconds
        assert not loop.quiet_reads.ended.is_set(), "a quiet watch waits longer"
        await skip(240.0)
        await done(quiet)  # a quiet watch: watch_quiet_seconds
        loop.wake()  # an event read meanwhile: a pass is due at the end of the spacing
        assert loop.next_pass_at is not None
        await skip(loop.next_pass_at - loop.clock() - 250.0)  # the pass 250 s away: within a quiet wait
        near = loop.settle(QUIET)
        assert near is not None and loop.quiet_reads.timer is None, "the pass is near: no quiet wait"
        await skip(60.0)
        await done(near)
        assert len(passes) == 1, "read before the next pass"

    settings = Settings(
        resync_seconds=86400.0,
        pass_spacing=1e5,
        max_pass_spacing_seconds=1200.0,
        watch_coalesce_seconds=60.0,
        watch_quiet_seconds=300.0,
        watch_quiet_bytes=300 * 384 * 1024,  # QUIET under 384 KiB a second, BUSY over it
    )
    drive(settings, step, script)


def test_the_watches_read_when_a_pass_ends_even_with_the_next_one_due() -> None:
    """What arrived during a pass is read as it ends, before the next pass (woken during this one)
    starts, not when the coalescing interval is over."""
    running = threading.Event()
    release = threading.Event()
    passes: list[float] = []

    def step(loop: Loop) -> None:
        passes.append(loop.clock())
        running.set()
        release.wait(30)  # until the script lets it end (a guard against a hang)

    async def script(loop: Loop) -> None:
        await until_idle(loop)
        loop.wake()
        await until(running.is_set, "the pass started")
        waiting = loop.settle(BUSY)
        assert waiting is not None
        loop.wake()  # an event read during the pass: the next pass is due as soon as this one ends
        release.set()
        await done(waiting)  # read when the pass ended: the clock never reaches the 60 s interval
        assert len(passes) == 1, "read before the next pass started"

    settings = Settings(resync_seconds=86400.0, pass_spacing=0.0, watch_coalesce_seconds=60.0)
    drive(settings, step, script)
