"""Exponential back-off, the one every retry of the runtime uses (informers, drain watches, passes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """`first` seconds, doubled with each failure in a row up to `most`; `reset` after a success
    (client-go's and controller-runtime's per-item failure rate limiter)."""

    first: float
    most: float
    current: float = 0.0

    def next(self) -> float:
        self.current = min(self.most, self.current * 2 if self.current else self.first)
        return self.current

    def reset(self) -> None:
        self.current = 0.0
