"""`python -m bench.memtrace run ...`: the operator's own entry point under tracemalloc (`--tracemalloc`).

The operator is unchanged: this sets up tracemalloc, and a SIGUSR1 handler that writes what is
allocated (top source lines and files, plus tracemalloc's current and peak totals) to the file named
by GPU_OPERATOR_BENCH_MEMTRACE, then runs `gpu_operator.cli.main`. Tracing slows the operator and adds
its own memory, so runs with it are for finding where memory goes, not for the numbers in the table.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

ENV = "GPU_OPERATOR_BENCH_MEMTRACE"
TOP = 25


def report() -> str:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ]
    )
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"traced current {current / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB"]
    for kind in ("filename", "lineno"):
        lines.append(f"top by {kind}:")
        for stat in snapshot.statistics(kind)[:TOP]:
            frame = stat.traceback[0]
            where = frame.filename if kind == "filename" else f"{frame.filename}:{frame.lineno}"
            lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} blocks  {where}")
    return "\n".join(lines) + "\n"


def dump(signum: int, frame: FrameType | None) -> None:
    Path(os.environ[ENV]).write_text(report())


def main() -> None:
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, dump)
    from gpu_operator.cli import main as operator_main

    sys.exit(operator_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
