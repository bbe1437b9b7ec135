"""CPU time and peak memory of processes, and machine facts, from /proc (parsers are pure)."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu(text: str, ticks: int = CLOCK_TICKS) -> float:
    """utime + stime in seconds from /proc/<pid>/stat.

    The command name (field 2) is in parentheses and may hold spaces and ')', so fields are counted
    after the last ')': state is then field 0, utime field 11 and stime field 12.
    """
    rest = text[text.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / ticks


def parse_status_kib(text: str, key: str) -> int | None:
    """A `Key:   1234 kB` line of /proc/<pid>/status, in KiB; None when absent (kernel threads)."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def parse_machine_busy(text: str) -> tuple[float, float]:
    """(busy, total) jiffies from the `cpu` line of /proc/stat (busy excludes idle and iowait)."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            total = sum(values[:8])
            return float(total - idle), float(total)
    raise ValueError("no cpu line in /proc/stat")


def busy_fraction(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Share of all CPUs that were busy between two /proc/stat samples."""
    total = after[1] - before[1]
    return None if total <= 0 else (after[0] - before[0]) / total


@dataclass(frozen=True)
class ProcessUsage:
    cpu_s: float
    peak_rss_mib: float | None
    rss_mib: float | None


def usage(pid: int) -> ProcessUsage | None:
    """CPU seconds and peak/current RSS of a live process; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    hwm = parse_status_kib(status, "VmHWM")
    rss = parse_status_kib(status, "VmRSS")
    return ProcessUsage(
        cpu_s=parse_stat_cpu(stat),
        peak_rss_mib=None if hwm is None else hwm / 1024,
        rss_mib=None if rss is None else rss / 1024,
    )


def thread_cpu(pid: int, tid: int) -> float | None:
    """CPU seconds of one thread of a live process (the main thread's tid is the pid); None when gone."""
    try:
        return parse_stat_cpu(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """name → CPU seconds so far, for the processes still alive."""
    found = {}
    for name, pid in pids.items():
        u = usage(pid)
        if u is not None:
            found[name] = u.cpu_s
    return found


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds each process used between two samples, largest first."""
    delta = {name: round(after[name] - before[name], 2) for name in after if name in before}
    return dict(sorted(delta.items(), key=lambda item: -item[1]))


def machine_busy() -> tuple[float, float]:
    return parse_machine_busy(Path("/proc/stat").read_text())


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def machine() -> dict[str, object]:
    """nproc, memory, CPU model, kernel: what the numbers were measured on."""
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = parse_status_kib(Path("/proc/meminfo").read_text(), "MemTotal") or 0
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu_model": model or platform.processor(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


TERMINATED_WATCHERS = "apiserver_terminated_watchers_total{"


def terminated_watchers(metrics: str) -> dict[str, int]:
    """Resource → the watchers the API server has closed as unresponsive (its /metrics text). A run in
    which it closes pod watchers is one whose control plane could not keep up: kwok watches pods again
    from resourceVersion 0 and replays every pod (bench/README.md, "a saturated control plane")."""
    found: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith(TERMINATED_WATCHERS):
            labels, _, value = line[len(TERMINATED_WATCHERS) :].rpartition("} ")
            fields = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
            resource = fields.get("resource", "").strip('"')
            found[resource] = found.get(resource, 0) + int(float(value))
    return found
