"""Where the operator's wall time goes, from `py-spy record --idle --threads --format raw` output (pure).

Each raw line is `thread (tid): name;frame;frame;... count`. With --idle every thread is sampled at
every tick, so the main thread's sample count is the number of ticks, and a share is "fraction of the
wall-clock time". The reconcile pass runs in a worker thread (asyncio.to_thread); its samples are
classified by what the pass was doing; its writes run on a pool of writer threads, whose samples per
tick are the number of requests in flight; the main thread runs Kopf's event loop (watch streams and
handlers) and is either busy or waiting in select().
"""

from __future__ import annotations

from collections import Counter

# First match wins: (what the stack contains, category).
RECONCILE_STEPS: tuple[tuple[str, str], ...] = (
    ("Kube.patch_status", "status PATCH"),
    ("Kube.post_event", "Event POST"),
    ("_in_parallel", "waiting for its parallel writes"),
    ("apply_node_labels", "node label PATCH"),
    ("Kube.delete", "DELETE"),
    ("Kube.apply ", "object apply PATCH"),
    ("build (gpu_operator/core/plan.py", "planning (pure)"),
    ("snapshot (gpu_operator/runtime/reconciler.py", "store snapshot"),
    # run_once waits for its label writes itself (concurrent.futures.wait) while the waves go out.
    ("wait (concurrent/futures/_base.py", "waiting for its parallel writes"),
)
WRITES: tuple[tuple[str, str], ...] = (
    ("apply_node_labels", "node label PATCH"),
    ("Kube.delete", "DELETE"),
    ("Kube.apply ", "object apply PATCH"),
)
RECONCILE = "Reconciler.run_once"
WRITER_THREADS = ("gpu-operator-write", "gpu-operator-apply")
"""The reconciler's pools (gpu_operator/runtime/reconciler.py: label writes, object applies); their samples /
ticks = writes in flight."""
IDLE_LEAF = ".select (selectors.py"
"""The event loop waiting for I/O (EpollSelector.select)."""


def parse(raw: str) -> list[tuple[str, list[str], int]]:
    """(thread name, frames, samples) per line."""
    found = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, _, rest = stack.partition(": ")
        frames = rest.split(";")
        found.append((frames[0] if frames else head, frames[1:], int(count)))
    return found


def summarise(raw: str) -> dict[str, float]:
    """Shares of wall-clock time: `reconcile: <step>` for each step of the reconcile pass, `reconcile
    (total)`, and `event loop busy` (the main thread not waiting in select)."""
    ticks = 0
    main_busy = 0
    steps: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    for thread, frames, count in parse(raw):
        joined = ";".join(frames)
        if thread == "MainThread":
            ticks += count
            if not frames or IDLE_LEAF not in frames[-1]:
                main_busy += count
        elif thread.startswith(WRITER_THREADS):
            write = next((name for marker, name in WRITES if marker in joined), None)
            if write is not None:
                writes[write] += count
        elif RECONCILE in joined:
            step = next((name for marker, name in RECONCILE_STEPS if marker in joined), "other")
            steps[step] += count
    if not ticks:
        return {}
    shares = {f"reconcile: {name}": round(n / ticks, 3) for name, n in steps.most_common()}
    shares["reconcile (total)"] = round(sum(steps.values()) / ticks, 3)
    shares.update({f"in flight: {name}": round(n / ticks, 3) for name, n in writes.most_common()})
    shares["event loop busy"] = round(main_busy / ticks, 3)
    return shares
