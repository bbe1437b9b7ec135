"""Medians, ratios and targets of the benchmark (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Issue targets (#13): operator convergence within 1.25x the limit at 10 and 100 nodes and no slower
# than it at 1000; nothing written at rest; peak RSS under 150 MiB at 1000 nodes.
RATIO_TARGET_SMALL = 1.25
RATIO_TARGET_LARGE = 1.0
LARGE_N = 1000
IDLE_WRITES_TARGET = 0.0
RSS_TARGET_MIB = 150.0


def median(values: Sequence[float]) -> float | None:
    """The median, None for no values."""
    return float(statistics.median(values)) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator; None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def paired_ratios(operator: Sequence[float | None], limit: Sequence[float | None]) -> list[float]:
    """Per-round operator/limit ratios of the rounds that have both numbers.

    The two runs of a round ran back to back on the same cluster, so their ratio cancels load that
    other processes put on the shared machine at that moment; the median of these is the reported ratio.
    """
    found = []
    for a, b in zip(operator, limit, strict=False):
        r = ratio(a, b)
        if r is not None:
            found.append(r)
    return found


def ratio_target(nodes: int) -> float:
    return RATIO_TARGET_LARGE if nodes >= LARGE_N else RATIO_TARGET_SMALL


@dataclass(frozen=True)
class Verdict:
    value: float | None
    target: float
    met: bool | None
    """None: not measured, or no target at this size."""


def ratio_verdict(nodes: int, value: float | None) -> Verdict:
    target = ratio_target(nodes)
    return Verdict(value, target, None if value is None else value <= target)


def idle_verdict(value: float | None) -> Verdict:
    return Verdict(value, IDLE_WRITES_TARGET, None if value is None else value <= IDLE_WRITES_TARGET)


def rss_verdict(nodes: int, value: float | None) -> Verdict:
    """The RSS target is set for 1000 nodes; smaller sizes report the number without a verdict."""
    applies = nodes >= LARGE_N and value is not None
    return Verdict(value, RSS_TARGET_MIB, (value is not None and value < RSS_TARGET_MIB) if applies else None)
