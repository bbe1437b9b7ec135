"""Results kept per name while their inputs stay equal: what makes a pass over a large cluster cost
what changed, not what exists.

A pass plans every node again (plan.build), but between two passes only the nodes some event touched
differ. The inputs are frozen values (NodeInfo, PodInfo, the parsed spec) and the Store hands out the
same objects until an event replaces them, so an unchanged node's inputs compare by identity (tuple
comparison tries `is` first) and its result is reused; a node whose inputs are merely equal is reused
too, so reuse never depends on identity for being right. The memos of a pass live in the Caches it
is given (gpu_operator/core/caches.py), so whoever runs passes owns what they keep.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """The last result per name and the inputs it was computed from. Callers must not mutate results."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, tuple[tuple[Any, ...], V]] = {}

    def get(self, name: Hashable, inputs: tuple[Any, ...], compute: Callable[[], V]) -> V:
        hit = self.entries.get(name)
        if hit is not None and hit[0] == inputs:
            # Keep these inputs: when an event replaced a node by an equal copy (a heartbeat, a field the
            # operator does not keep), the next pass then finds it by identity instead of comparing
            # every label again, pass after pass.
            self.entries[name] = (inputs, hit[1])
            return hit[1]
        value = compute()
        self.entries[name] = (inputs, value)
        return value

    def keep(self, names: Collection[Hashable]) -> None:
        """Forget the names not in `names` (nodes gone), so the memo never outgrows the cluster."""
        if len(self.entries) > len(names):
            self.entries = {name: entry for name, entry in self.entries.items() if name in names}
