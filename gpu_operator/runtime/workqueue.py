"""The work queue: passes over the whole cluster, one at a time, woken by watch events.

The shape of controller-runtime's workqueue for its one key, the cluster: every decision depends on
all of it (nodes, pods, DaemonSets, every ClusterPolicy), so any change anywhere asks for one more
pass of the same work. An ask while a pass runs marks it dirty: one pass follows, whatever the number
of asks. A failed pass is retried with exponential back-off; a pass is also asked for later
(`add_after`: the upgrade's next timeout, the status pacing) and, as a safety net, every
`resync_seconds`. Passes are rate limited by a token bucket, as client-go limits requests, where a
pass costs one token per node still rolling out (at least a share of the cluster's size): a small
cluster's rollout never waits, a large one, whose pace the DaemonSet controller sets anyway, is
planned in fewer, larger passes, and a node that joins a large settled cluster is planned at once.
A pass runs on the event loop like everything else of the operator: its planning is a few CPU
slices between its requests, and while it waits for answers the watches and the probes run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from gpu_operator.runtime import metrics
from gpu_operator.runtime.backoff import Backoff
from gpu_operator.runtime.client import ApiError, NotLeader
from gpu_operator.runtime.reconciler import Outcome
from gpu_operator.runtime.settings import Settings

log = logging.getLogger("gpu_operator")


class RejectedWrites(Exception):
    """Some writes were rejected (already reported in the status); retry with back-off."""


class TokenBucket:
    """client-go's token bucket rate limiter (flowcontrol.NewTokenBucketRateLimiter): it holds at most
    `burst` tokens, refilled at `rate` a second; taking more than it holds waits until it holds them.
    A cost above `burst` counts as `burst`, so no wait is longer than burst / rate and nothing is owed
    after it."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = burst
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def delay(self, cost: float) -> float:
        """How long until the bucket holds `cost` tokens (0: it does now)."""
        self._refill()
        missing = min(cost, self.burst) - self.tokens
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, cost: float) -> None:
        self._refill()
        self.tokens = max(0.0, self.tokens - min(cost, self.burst))


class Batch:
    """One wait the watches share while a pass runs or is due: they read their connections again
    when it ends (after `seconds`, or at once when the queue goes idle), so that the events of the
    wait arrive in one read each rather than one read per event. One timer for every watch."""

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


class WorkQueue:
    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        leading: Callable[[], bool] = lambda: True,
        size: Callable[[], int] = lambda: 1,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.leading = leading
        """Whether this replica may reconcile now (holds the leader lease); a standby runs no pass."""
        self.size = size
        """The cluster's nodes (the Store's): a pass costs at least `pass_min_cost_share` of them."""
        self.dirty = asyncio.Event()
        """Set while a pass is asked for and not started yet."""
        self.idle = asyncio.Event()
        """Set while no pass runs and none is asked for: the next watch event starts one."""
        self.listed = asyncio.Event()
        """Set once every informer has listed its kind (see gpu_operator/main.py start_informers)."""
        self.completed = asyncio.Event()
        """Set once a pass has run to its end (some writes may have been rejected)."""
        self.started = False
        """Set once the queue runs (Kopf's startup handler has built the reconciler)."""
        self.passes = 0
        self.failures = 0
        self.cpu_seconds = 0.0
        """CPU the passes took, all of them together (the watches run on the event loop)."""
        self.last_error = ""
        """The error of the last pass; empty once a pass succeeds."""
        self.work_since: float | None = None
        """Since when there is work no finished pass has taken up (an ask, or a pass running)."""
        self.last_finished: float | None = None
        """When the last pass ended, successful or not."""
        self.later: dict[str, asyncio.TimerHandle] = {}
        """Passes asked for later, by why (the latest ask for each reason wins)."""
        self.rolling_out: int | None = None
        """The GPU nodes still rolling out, as the last successful pass counted them (None before the
        first): what the next pass costs in tokens."""
        self.backoff = Backoff(settings.retry_seconds, settings.max_backoff_seconds)
        self.tokens = TokenBucket(settings.pass_rate_nodes_per_second, settings.pass_burst_nodes, clock)
        self.reads = Batch(settings.watch_batch_seconds)

    # --- asking for a pass ------------------------------------------------------------------------

    def add(self) -> None:
        """Ask for a pass (a watch event that changes what a pass would decide)."""
        if self.work_since is None and self.leading():
            self.work_since = self.clock()
        self.dirty.set()
        self.idle.clear()

    def add_after(self, seconds: float, why: str = "later") -> None:
        """Ask for a pass in `seconds`; an earlier ask for the same reason is replaced."""
        self.cancel(why)
        self.later[why] = asyncio.get_running_loop().call_later(max(0.0, seconds), self._due, why)

    def add_at(self, when: float | None, why: str = "at") -> None:
        """Ask for a pass at `when` (Unix seconds); None cancels the ask of the same reason."""
        if when is None:
            self.cancel(why)
        else:
            self.add_after(when - time.time(), why)

    def add_soon(self) -> None:
        """Ask for a pass within `status_interval_seconds`, for a change that only shows in the status:
        the changes of that while are one pass instead of one each."""
        if "soon" not in self.later and not self.dirty.is_set():
            self.add_after(self.settings.status_interval_seconds, "soon")

    def cancel(self, why: str) -> None:
        timer = self.later.pop(why, None)
        if timer is not None:
            timer.cancel()

    def _due(self, why: str) -> None:
        self.later.pop(why, None)
        self.add()

    # --- what the watches and the probes ask ---------------------------------------------------------

    def settle(self) -> Awaitable[object] | None:
        """For a watch after a read: None while the queue is idle (read on: the next event may be what
        starts a pass), else the shared wait of `watch_batch_seconds` (a pass runs or is due: it would
        not see the events any sooner)."""
        if self.idle.is_set() or self.settings.watch_batch_seconds <= 0:
            return None
        return self.reads.wait()

    def stuck_for(self) -> float:
        """How long work has waited without any pass finishing (0 when there is none)."""
        return 0.0 if self.work_since is None else max(0.0, self.clock() - self.work_since)

    def _finished(self) -> None:
        self.last_finished = self.clock()
        # Work asked for during the pass waits from now on: the pass that ends here did not see it.
        self.work_since = self.last_finished if self.dirty.is_set() else None

    # --- the passes ------------------------------------------------------------------------------

    async def run(self, one_pass: Callable[[], Awaitable[Outcome]]) -> None:
        """Run `one_pass` whenever asked (at the latest after `resync_seconds`), until cancelled."""
        self.started = True
        await self.listed.wait()
        while True:
            if not self.dirty.is_set():
                self.idle.set()
                self.reads.end()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), timeout=self.settings.resync_seconds)
            self.idle.clear()
            if not self.leading():
                self.dirty.clear()
                self.work_since = None  # a standby has no work
                # Asked again a retry period on: the elector asks for a pass when this replica wins
                # the lease, but not when a late renewal of a lease it kept goes through (a slow API
                # server), and an ask dropped then would wait for the resync.
                self.add_after(self.settings.lease.retry, "standby")
                continue
            if self.work_since is None:  # the resync: work as much as an ask
                self.work_since = self.clock()
            cost = self.cost()
            if wait := self.tokens.delay(cost):
                # What the watches bring meanwhile goes into this pass (they read in batches: not idle).
                # Not read at all until the pass, their connections would stay paused for seconds, and
                # the API server closes a watch that long unresponsive (a 1000-node rollout then
                # listed its pods again three times).
                await asyncio.sleep(wait)
            self.tokens.take(cost)
            self.dirty.clear()
            for why in ("soon", "standby"):  # this pass sees what it was asked for
                self.cancel(why)
            await self._pass(one_pass)

    def cost(self) -> float:
        """The next pass's tokens: the nodes still rolling out (all of them before the first pass has
        counted), at least `pass_min_cost_share` of the cluster and at least one."""
        size = self.size()
        rolling_out = size if self.rolling_out is None else self.rolling_out
        return max(1.0, float(rolling_out), size * self.settings.pass_min_cost_share)

    async def _pass(self, one_pass: Callable[[], Awaitable[Outcome]]) -> None:
        spent = [0.0]
        try:
            outcome = await _timed(one_pass, spent)
            self.completed.set()
            self.rolling_out = outcome.plan.nodes_rolling_out
            self.add_at(outcome.wake_at, "wake_at")
            if outcome.stale:
                # The watch may bring the node's new version without a change a pass would react to
                # (a status update): look again shortly, without counting a failure.
                self.add_after(self.settings.stale_retry_seconds, "stale")
            if outcome.errors:
                raise RejectedWrites("; ".join(f"{k}: {v}" for k, v in outcome.errors.items()))
        except NotLeader:
            # The lease was lost during the pass: not a failure, and no back-off; the elector asks for
            # a pass the moment this replica leads again (at once when nobody else took it).
            log.info("pass stopped: this replica no longer holds the leader lease")
        except Exception as exc:
            self.failures += 1
            delay = self.backoff.next()
            if isinstance(exc, ApiError | OSError | RejectedWrites):
                # API trouble: retry later; watch events in between ask sooner.
                self.last_error = str(exc)
                log.warning("reconcile failed, retrying in %.0fs: %s", delay, exc)
            else:
                log.exception("reconcile failed with an unexpected error")
            self.add_after(delay, "retry")
        else:
            self.passes += 1
            self.last_error = ""
            self.backoff.reset()
            self.cancel("retry")
        finally:
            self.cpu_seconds += spent[0]
            self._finished()
            # What arrived during the pass is read now, for the next one: waiting out the batch, a
            # pass already asked for would start without it.
            self.reads.end()


async def _timed(one_pass: Callable[[], Awaitable[Outcome]], spent: list[float]) -> Outcome:
    """Run a pass, observed; `spent` gets the CPU seconds the event loop's thread spent meanwhile (the
    pass's own, and the watches' reading of what its writes set off)."""
    started, cpu = time.monotonic(), time.thread_time()
    try:
        outcome = await one_pass()
    except Exception as exc:
        bug = not isinstance(exc, ApiError | OSError)
        metrics.observe_aborted_pass(time.monotonic() - started, operator_error=bug)
        raise
    finally:
        spent[0] = time.thread_time() - cpu
    metrics.observe_pass(outcome.plan, outcome.errors, outcome.plan.gpu_nodes, time.monotonic() - started)
    return outcome
