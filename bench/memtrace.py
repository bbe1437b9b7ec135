"""`python -m bench.memtrace run ...`: the operator's own entry point under tracemalloc (`--tracemalloc`).

The operator is unchanged: this sets up tracemalloc, and a SIGUSR1 handler that writes what is
allocated (top source lines and files, plus tracemalloc's current and peak totals) to the file named
by GPU_OPERATOR_BENCH_MEMTRACE, then runs `gpu_operator.cli.main`. A thread keeps a snapshot of the
highest traced total seen (looked at twice a second, taken again once it grows by a MiB): RSS keeps
the high-water mark, so what was alive at that moment is what a lower peak RSS has to shed. Tracing
slows the operator and adds its own memory, so runs with it are for finding where memory goes, not for
the numbers in the table.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType

ENV = "GPU_OPERATOR_BENCH_MEMTRACE"
TOP = 25
PEAK_STEP = 2**20
highest: tuple[int, tracemalloc.Snapshot | None] = (0, None)


def snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ]
    )


def top(title: str, taken: tracemalloc.Snapshot) -> list[str]:
    lines = []
    for kind in ("filename", "lineno"):
        lines.append(f"{title}, top by {kind}:")
        for stat in taken.statistics(kind)[:TOP]:
            frame = stat.traceback[0]
            where = frame.filename if kind == "filename" else f"{frame.filename}:{frame.lineno}"
            lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} blocks  {where}")
    return lines


def report() -> str:
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"traced current {current / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB"]
    lines += top("now", snapshot())
    size, at_peak = highest
    if at_peak is not None:
        lines += [f"highest snapshot {size / 2**20:.1f} MiB", *top("at the highest", at_peak)]
    return "\n".join(lines) + "\n"


def follow_peak() -> None:
    global highest
    while True:
        time.sleep(0.5)
        current, _ = tracemalloc.get_traced_memory()
        if current > highest[0] + PEAK_STEP:
            highest = (current, snapshot())


def dump(signum: int, frame: FrameType | None) -> None:
    Path(os.environ[ENV]).write_text(report())


def main() -> None:
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, dump)
    threading.Thread(target=follow_peak, name="memtrace-peak", daemon=True).start()
    from gpu_operator.cli import main as operator_main

    sys.exit(operator_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
