"""Where the operator's wall time goes, from `py-spy record --idle --threads --format raw` output (pure).

Each raw line is `thread (tid): name;frame;frame;... count`, a frame `function (file:line)`, the root
first. With --idle every thread is sampled at every tick, so the main thread's sample count is the
number of ticks, and a share is "fraction of the wall-clock time". The operator is one asyncio event
loop on the main thread: Kopf, the informers (watch streams into the Store), the probes and the
reconcile pass (`Reconciler.run_once` and the tasks it gathers for its writes) all run there; other
threads (the default executor warming the renderer at start-up, aiohttp's resolver) are left out.
py-spy shows a coroutine's frames only while it runs, not while it awaits, so a main-thread sample is
either idle (the loop waiting in select()) or the CPU of whatever runs: the pass (by step: store
snapshot, planning, vetting, concluding, the client building requests and reading answers, other),
the watches, or anything else (Kopf, the probes, aiohttp's own callbacks). How many writes are in
flight is no longer observable by sampling (an awaiting coroutine has no frames), so there are no
"in flight" shares.
"""

from __future__ import annotations

from collections import Counter

RECONCILE_FILE = "gpu_operator/runtime/reconciler.py"
"""A main-thread sample with a frame of this file is the pass's CPU (run_once, its gathered writes)."""
RECONCILE_STEPS: tuple[tuple[str, str | None, str], ...] = (
    ("gpu_operator/runtime/store.py", "snapshot", "store snapshot"),
    ("gpu_operator/core/plan.py", "build", "planning"),
    ("gpu_operator/core/vetting.py", None, "vetting"),
    ("gpu_operator/core/plan.py", "conclude", "concluding"),
    ("gpu_operator/runtime/client.py", None, "client: requests and answers"),
)
"""(file, function or None for any, step) of a pass's sample: the outermost frame that matches names the
step (what planning calls of vetting.py is planning's); none is `other`."""
WATCH_FILES = (
    "gpu_operator/runtime/informer.py",
    "gpu_operator/runtime/watch_stream.py",
    "gpu_operator/runtime/drain_watches.py",
    "gpu_operator/runtime/safe_json.py",
)
WATCH_STORE = ("gpu_operator/runtime/store.py", "record_")
"""A watch event recorded into the Store (Store.record_pod, ...) is the watches' CPU too."""
IDLE_LEAF = ("selectors.py", "select")
"""The event loop waiting for I/O (EpollSelector.select) as the innermost frame."""


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


def frame_of(frame: str) -> tuple[str, str]:
    """(file, function) of `Class.function (file:line)`: the function without its class or outer
    function (py-spy shows qualified names on Python 3.11+)."""
    name, found, where = frame.rpartition(" (")
    if not found:
        return "", frame
    return where.rstrip(")").rsplit(":", 1)[0], name.rsplit(".", 1)[-1]


def is_idle(frames: list[str]) -> bool:
    return bool(frames) and frame_of(frames[-1]) == IDLE_LEAF


def reconcile_step(frames: list[tuple[str, str]]) -> str | None:
    """The pass's step of a sample, None when the sample is not the pass's."""
    if not any(file == RECONCILE_FILE for file, _ in frames):
        return None
    for file, function in frames:
        for step_file, step_function, step in RECONCILE_STEPS:
            if file == step_file and step_function in (None, function):
                return step
    return "other"


def is_watch(frames: list[tuple[str, str]]) -> bool:
    return any(
        file in WATCH_FILES or (file == WATCH_STORE[0] and function.startswith(WATCH_STORE[1]))
        for file, function in frames
    )


def summarise(raw: str) -> dict[str, float]:
    """Shares of wall-clock time (fractions of the main thread's ticks, 3 places; {} without any):
    `reconcile: <step>` for each step of the pass, most first, `reconcile (total)`, `watches`, and
    `event loop busy` (every main-thread sample not waiting in select(): the pass, the watches and
    the rest)."""
    ticks = 0
    busy = 0
    watches = 0
    steps: Counter[str] = Counter()
    for thread, stack, count in parse(raw):
        if thread != "MainThread":
            continue
        ticks += count
        if is_idle(stack):
            continue
        busy += count
        frames = [frame_of(frame) for frame in stack]
        step = reconcile_step(frames)
        if step is not None:
            steps[step] += count
        elif is_watch(frames):
            watches += count
    if not ticks:
        return {}
    shares = {f"reconcile: {name}": round(n / ticks, 3) for name, n in steps.most_common()}
    shares["reconcile (total)"] = round(sum(steps.values()) / ticks, 3)
    shares["watches"] = round(watches / ticks, 3)
    shares["event loop busy"] = round(busy / ticks, 3)
    return shares
