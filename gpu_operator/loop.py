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
from collections.abc import Callable
from typing import Any

from gpu_operator import metrics
from gpu_operator.kube import ApiError
from gpu_operator.reconciler import Outcome
from gpu_operator.settings import Settings
from gpu_operator.store import Store

log = logging.getLogger("gpu_operator")


class RejectedWrites(Exception):
    """Some writes were rejected (already reported in the status); retry with backoff."""


class Loop:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.wakeup = asyncio.Event()
        self.listed = asyncio.Event()
        """Set once Kopf has listed every watched kind (see gpu_operator/operator.py)."""
        self.completed = asyncio.Event()
        """Set once a pass has run to its end (some writes may have been rejected)."""
        self.started = False
        """Set once the loop runs (Kopf's startup handler has built the reconciler)."""
        self.passes = 0
        self.failures = 0
        self.last_error = ""

    def wake(self) -> None:
        self.wakeup.set()

    async def run(self, one_pass: Callable[[], Outcome]) -> None:
        """Run `one_pass` whenever woken (at the latest after `resync_seconds`), until cancelled."""
        backoff = 1.0
        self.started = True
        await self.listed.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=self.settings.resync_seconds)
            self.wakeup.clear()
            try:
                outcome = await asyncio.to_thread(_timed, one_pass)
                self.completed.set()
                if outcome.stale:
                    # The watch may bring the node's new version without a change a pass would react
                    # to (a status update): look again shortly, without counting a failure.
                    asyncio.get_running_loop().call_later(self.settings.stale_retry_seconds, self.wake)
                if outcome.errors:
                    raise RejectedWrites("; ".join(f"{k}: {v}" for k, v in outcome.errors.items()))
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
                backoff = 1.0


def _timed(one_pass: Callable[[], Outcome]) -> Outcome:
    started = time.monotonic()
    try:
        outcome = one_pass()
    except Exception as exc:
        bug = not isinstance(exc, ApiError | OSError)
        metrics.observe_aborted_pass(time.monotonic() - started, operator_error=bug)
        raise
    metrics.observe_pass(outcome.plan, outcome.errors, outcome.plan.gpu_nodes, time.monotonic() - started)
    return outcome


# --- probes (served by gpu_operator/server.py) ---------------------------------------------------


def health(loop: Loop, store: Store) -> tuple[bool, dict[str, Any]]:
    """Liveness: the event loop answers. The body is what Kopf's probe endpoint used to show."""
    if not loop.started:
        return True, {"reconcile": {"started": False}}
    return True, {
        "reconcile": {
            "passes": loop.passes,
            "failures": loop.failures,
            "lastError": loop.last_error,
            "nodes": store.size("nodes"),
            "pods": store.size("pods"),
        }
    }


def ready(loop: Loop) -> tuple[bool, dict[str, Any]]:
    """Readiness: every watch has listed its kind, and a pass has run to its end since."""
    listed = loop.listed.is_set()
    completed = loop.completed.is_set()
    return listed and completed, {"watchesEstablished": listed, "firstPassDone": completed}
