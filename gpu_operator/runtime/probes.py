"""What /healthz and /readyz say (served by gpu_operator/runtime/server.py)."""

from __future__ import annotations

from typing import Any

from gpu_operator.runtime.store import Store
from gpu_operator.runtime.workqueue import WorkQueue


def health(queue: WorkQueue, store: Store) -> tuple[bool, dict[str, Any]]:
    """Liveness: the event loop answers, and work never waits longer than `stuck_after_seconds`
    without a pass finishing. A pass that fails fast because the API server is unreachable finishes
    too: an API outage alone never fails liveness (restarting would not bring the API server back)."""
    if not queue.started:
        return True, {"reconcile": {"started": False}}
    waiting = queue.stuck_for()
    stuck = waiting > queue.settings.stuck_after_seconds
    since = None if queue.last_finished is None else round(queue.clock() - queue.last_finished, 1)
    return not stuck, {
        "reconcile": {
            "passes": queue.passes,
            "failures": queue.failures,
            "lastError": queue.last_error,
            "secondsSinceLastPass": since,
            "planningCpuSeconds": round(queue.cpu_seconds, 3),
            "passTokens": round(queue.tokens.tokens),
            "workWaitingSeconds": round(waiting, 1),
            "stuck": stuck,
            "nodes": store.size("nodes"),
            "pods": store.size("pods"),
        }
    }


def ready(queue: WorkQueue) -> tuple[bool, dict[str, Any]]:
    """Readiness: every watch has listed its kind, and (leader) a pass has run to its end since. A
    standby is ready with its caches warm: it is what a rolling update waits for before it stops the
    leader."""
    listed = queue.listed.is_set()
    completed = queue.completed.is_set()
    leading = queue.leading()
    body = {"watchesEstablished": listed, "firstPassDone": completed, "leader": leading}
    return listed and (completed or not leading), body
