"""The single-flight reconcile loop, and what the probes say about it.

Why one loop instead of Kopf's create/update handlers: every decision depends on the whole cluster
(nodes, pods, DaemonSets and every ClusterPolicy), so any change anywhere means "reconcile again".
A single-flight loop coalesces bursts of watch events into one pass and never runs two passes at
once. Each pass runs in a worker thread (the reconciler's I/O is synchronous), never on Kopf's
event loop, so the watches and the probes keep answering while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpu_operator.runtime import metrics
from gpu_operator.runtime.client import ApiError, NotLeader
from gpu_operator.runtime.reconciler import Outcome
from gpu_operator.runtime.settings import Settings
from gpu_operator.runtime.store import Store

log = logging.getLogger("gpu_operator")


class RejectedWrites(Exception):
    """Some writes were rejected (already reported in the status); retry with backoff."""


class Budget:
    """The CPU seconds passes may still spend at once: `burst` when full, refilled at `share` of a core
    (settings.planning_share). A pass may overspend it, but never into more debt than `max_wait`
    seconds of refilling: the next pass waits at most that long, and what a pass costs beyond it is
    forgiven rather than carried on. Carried, the debt of a large rollout's passes (each costing more
    than `max_wait` seconds of refilling at a small share) grows pass after pass, and a node that
    joins a minute after the rollout would still wait for that debt to be repaid, long after the work
    that ran it up is over (measured: bench/README.md)."""

    def __init__(self, burst: float, share: float, clock: Callable[[], float], max_wait: float) -> None:
        self.burst = burst
        self.share = share
        self.clock = clock
        self.most_owed = max_wait * share
        self.left = burst
        self.at = clock()

    def available(self, now: float | None = None) -> float:
        """The CPU seconds left now (negative: what the last pass overspent, still to be refilled)."""
        now = self.clock() if now is None else now
        return min(self.burst, self.left + (now - self.at) * self.share)

    def spend(self, cpu: float) -> float:
        """Take a pass's CPU seconds; return how long the next pass must wait for the budget (0 when
        some is left)."""
        now = self.clock()
        self.left = max(self.available(now) - cpu, -self.most_owed)
        self.at = now
        return 0.0 if self.left >= 0 else -self.left / self.share


class Interval:
    """A coalescing interval the watches wait for together: one timer, one wake-up of the event loop
    for all of them (a wake-up of the event loop costs CPU of its own, comparable to handling the
    events it brings; measured: bench/README.md), started by the first watch that asks and ended by
    the timer or early (`end`)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ended = asyncio.Event()
        self.timer: asyncio.TimerHandle | None = None

    def wait(self) -> Awaitable[object]:
        if self.timer is None:
            self.ended.clear()
            self.timer = asyncio.get_running_loop().call_later(self.seconds, self.end)
        return self.ended.wait()

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.ended.set()


class Loop:
    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.leading = leading
        """Whether this replica may reconcile now (holds the leader lease); a standby runs no pass."""
        self.wakeup = asyncio.Event()
        self.idle = asyncio.Event()
        """Set while the loop waits for work with none pending: the next watch event may start a pass."""
        self.listed = asyncio.Event()
        """Set once every informer has listed its kind (see gpu_operator/main.py start_informers)."""
        self.completed = asyncio.Event()
        """Set once a pass has run to its end (some writes may have been rejected)."""
        self.started = False
        """Set once the loop runs (Kopf's startup handler has built the reconciler)."""
        self.passes = 0
        self.failures = 0
        self.cpu_seconds = 0.0
        """CPU the passes took, all of them together (planning; the watches run on the event loop)."""
        self.last_error = ""
        """The error of the last pass; empty once a pass succeeds."""
        self.work_since: float | None = None
        """Since when there is work no finished pass has taken up (a wake-up, or a pass running)."""
        self.last_finished: float | None = None
        """When the last pass ended, successful or not."""
        self.timer: asyncio.TimerHandle | None = None
        """The pass asked for by the last one (Outcome.wake_at): one at a time, the latest wins."""
        self.soon: asyncio.TimerHandle | None = None
        """The pass asked for by a change that only shows in the status (wake_soon)."""
        self.next_pass_at: float | None = None
        """While the loop waits for the next pass's spacing or budget: when that wait ends (`clock`)."""
        self.reads = Interval(settings.watch_coalesce_seconds)
        """What the watches wait for while a pass runs or is due (see settle)."""
        self.quiet_reads = Interval(settings.watch_quiet_seconds)
        """What the quiet watches wait for between passes (see settle)."""
        self.budget = Budget(
            settings.planning_burst_seconds, settings.planning_share, clock, settings.max_budget_wait_seconds
        )

    def wake(self) -> None:
        if self.work_since is None and self.leading():
            self.work_since = self.clock()
        self.wakeup.set()
        self.idle.clear()

    def settle(self, rate: float) -> Awaitable[object] | None:
        """For a watch after a read that brought `rate` bytes a second (gpu_operator/runtime/watch_stream.py):
        None while the loop is idle (read on), else a wait until it is or a pass ends: what arrives
        meanwhile would wait for the pass anyway, and arrives in one read instead of one each.

        The wait is `watch_coalesce_seconds`, except while the next pass waits for its spacing or budget
        (most of a large rollout) for longer than a quiet interval and one more: a watch bringing
        less than `watch_quiet_bytes` in `watch_quiet_seconds` then waits `watch_quiet_seconds`, since
        fewer, larger reads cost less. So every watch reads at most `watch_coalesce_seconds` before the
        pass starts, and the pass plans on nodes as fresh as before: a pass planned on what a quiet
        watch still held back writes labels on old node versions, which the API server refuses as
        stale and which then cost a read of the node each (measured: bench/README.md)."""
        if self.idle.is_set() or self.settings.watch_coalesce_seconds <= 0:
            return None
        settings = self.settings
        quiet = settings.watch_quiet_seconds
        if (
            self.next_pass_at is not None
            and rate * quiet <= settings.watch_quiet_bytes
            and self.next_pass_at - self.clock() > quiet + settings.watch_coalesce_seconds
        ):
            return self.quiet_reads.wait()
        return self.reads.wait()

    def _read_now(self) -> None:
        """End the coalescing intervals: every watch reads again."""
        self.reads.end()
        self.quiet_reads.end()

    def wake_at(self, when: float | None) -> None:
        """A pass at `when` (Unix seconds), without a sleeping handler: a timer on the event loop."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if when is not None:
            delay = max(0.0, when - time.time())
            self.timer = asyncio.get_running_loop().call_later(delay, self.wake)

    def wake_soon(self) -> None:
        """A pass within `status_interval_seconds`, for a change that only shows in the status: the
        changes of that while coalesce into one pass instead of one pass each (on the event loop)."""
        if self.soon is None and not self.wakeup.is_set():
            delay = self.settings.status_interval_seconds
            self.soon = asyncio.get_running_loop().call_later(delay, self.wake)

    def wake_from(self, loop: asyncio.AbstractEventLoop) -> None:
        """wake(), from another thread (the leader elector's)."""
        loop.call_soon_threadsafe(self.wake)

    def stuck_for(self) -> float:
        """How long work has waited without any pass finishing (0 when there is none)."""
        return 0.0 if self.work_since is None else max(0.0, self.clock() - self.work_since)

    def _finished(self) -> None:
        self.last_finished = self.clock()
        # Work that arrived during the pass waits from now on: the pass that ends here did not see it.
        self.work_since = self.last_finished if self.wakeup.is_set() else None

    async def run(self, one_pass: Callable[[], Outcome]) -> None:
        """Run `one_pass` whenever woken (at the latest after `resync_seconds`), until cancelled."""
        backoff = 1.0
        self.started = True
        await self.listed.wait()
        while True:
            if not self.wakeup.is_set():
                self.idle.set()
                self._read_now()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=self.settings.resync_seconds)
            self.idle.clear()
            self.wakeup.clear()
            if self.soon is not None:  # this pass sees what it was asked for
                self.soon.cancel()
                self.soon = None
            if not self.leading():
                self.work_since = None  # a standby has no work; the leader it becomes is woken
                continue
            if self.work_since is None:  # the resync: work as much as a wake-up
                self.work_since = self.clock()
            spent = [0.0]
            try:
                outcome = await asyncio.to_thread(_timed, one_pass, spent)
                self.completed.set()
                self.wake_at(outcome.wake_at)
                if outcome.stale:
                    # The watch may bring the node's new version without a change a pass would react
                    # to (a status update): look again shortly, without counting a failure.
                    asyncio.get_running_loop().call_later(self.settings.stale_retry_seconds, self.wake)
                if outcome.errors:
                    raise RejectedWrites("; ".join(f"{k}: {v}" for k, v in outcome.errors.items()))
            except NotLeader:
                # The lease was lost during the pass: not a failure, and no back-off; the elector wakes
                # the loop the moment this replica leads again (at once when nobody else took it).
                log.info("pass stopped: this replica no longer holds the leader lease")
            except (ApiError, OSError, RejectedWrites) as exc:
                # API trouble: retry later; watch events in between wake us sooner.
                self.failures += 1
                self.last_error = str(exc)
                log.warning("reconcile failed, retrying in %.0fs: %s", backoff, exc)
                asyncio.get_running_loop().call_later(backoff, self.wake)
                backoff = min(backoff * 2, self.settings.max_backoff_seconds)
            except Exception:
                self.failures += 1
                log.exception("reconcile failed with an unexpected error")
                asyncio.get_running_loop().call_later(backoff, self.wake)
                backoff = min(backoff * 2, self.settings.max_backoff_seconds)
            else:
                self.passes += 1
                self.last_error = ""
                backoff = 1.0
            finally:
                self.cpu_seconds += spent[0]
                self._finished()
                # What arrived during the pass is read now, for the next one: waiting out the interval,
                # a pass already due (woken during this one) started without it, and the events that
                # arrived late in a pass waited a pass more, which delays every stage of a rollout.
                self._read_now()
            delay = self.spacing(spent[0])
            self.next_pass_at = self.clock() + delay
            try:
                await asyncio.sleep(delay)
            finally:
                self.next_pass_at = None

    def spacing(self, cpu: float) -> float:
        """How long to wait after a pass that took `cpu` seconds: the events of the wait coalesce into
        the next pass. However fast they come (a large rollout brings many a second), planning takes
        at most 1 / (1 + pass_spacing) of a core, and once its burst is spent, planning_share."""
        settings = self.settings
        spacing = min(settings.max_pass_spacing_seconds, settings.pass_spacing * cpu)
        return max(spacing, self.budget.spend(cpu))


def _timed(one_pass: Callable[[], Outcome], spent: list[float]) -> Outcome:
    """Run a pass (in a worker thread), observed; `spent` gets the CPU seconds it took."""
    started, cpu = time.monotonic(), time.thread_time()
    try:
        outcome = one_pass()
    except Exception as exc:
        bug = not isinstance(exc, ApiError | OSError)
        metrics.observe_aborted_pass(time.monotonic() - started, operator_error=bug)
        raise
    finally:
        spent[0] = time.thread_time() - cpu
    metrics.observe_pass(outcome.plan, outcome.errors, outcome.plan.gpu_nodes, time.monotonic() - started)
    return outcome


# --- probes (served by gpu_operator/runtime/server.py) ---------------------------------------------------


def health(loop: Loop, store: Store) -> tuple[bool, dict[str, Any]]:
    """Liveness: the event loop answers, and work never waits longer than `stuck_after_seconds`
    without a pass finishing. A pass that fails fast because the API server is unreachable finishes
    too: an API outage alone never fails liveness (restarting would not bring the API server back)."""
    if not loop.started:
        return True, {"reconcile": {"started": False}}
    waiting = loop.stuck_for()
    stuck = waiting > loop.settings.stuck_after_seconds
    since = None if loop.last_finished is None else round(loop.clock() - loop.last_finished, 1)
    return not stuck, {
        "reconcile": {
            "passes": loop.passes,
            "failures": loop.failures,
            "lastError": loop.last_error,
            "secondsSinceLastPass": since,
            "planningCpuSeconds": round(loop.cpu_seconds, 3),
            "planningBudgetSeconds": round(loop.budget.available(), 3),
            "workWaitingSeconds": round(waiting, 1),
            "stuck": stuck,
            "nodes": store.size("nodes"),
            "pods": store.size("pods"),
        }
    }


def ready(loop: Loop) -> tuple[bool, dict[str, Any]]:
    """Readiness: every watch has listed its kind, and (leader) a pass has run to its end since. A
    standby is ready with its caches warm: it is what a rolling update waits for before it stops the
    leader."""
    listed = loop.listed.is_set()
    completed = loop.completed.is_set()
    leading = loop.leading()
    body = {"watchesEstablished": listed, "firstPassDone": completed, "leader": leading}
    return listed and (completed or not leading), body
