"""What one pass leaves for the next, as one object the core owns and its owner passes in.

The planner decides from the cluster as the watches show it, but a few facts only the operator's own
writes know: what its applies returned (to tell someone else's edit from its own), what its Events
and status writes have said and when, what the API server answered to its evictions, and the last
generation it wrote in full. They live together here rather than in the runtime's fields, so that
whoever runs passes holds one Memory that every pass reads and updates through the core: the operator
keeps one for its whole life (runtime/reconciler.py), a test makes its own, and a new one is an
operator just started, which must decide the same from the cluster alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpu_operator.core.caches import Caches
from gpu_operator.core.observed import ObjectKey
from gpu_operator.core.plan import Applied, Good, Observed, Plan
from gpu_operator.core.status import Signature
from gpu_operator.core.upgrade import EvictionResult


@dataclass(eq=False)
class Memory:
    """What a pass leaves for the next; one for the operator's life, used by one pass at a time (the
    reconciler runs on the operator's one event loop)."""

    applied: dict[ObjectKey, Applied] = field(default_factory=dict)
    """What our own last apply of each object returned (plan.to_write: a later difference is someone
    else's edit)."""
    reported: dict[str, Signature] = field(default_factory=dict)
    """Policy name → what the Events posted for it have said."""
    evictions: dict[str, EvictionResult] = field(default_factory=dict)
    """Pod UID → the API server's answer to our last Eviction of it: facts for the next pass."""
    good: Good | None = None
    """The last generation of the active policy written in full (see plan.Good)."""
    status_written: dict[str, float] = field(default_factory=dict)
    """Policy name → when (monotonic seconds) its status was last written: progress-only writes wait
    (writes.paced_statuses)."""
    caches: Caches = field(default_factory=Caches)
    """The planner's memos (core/caches.py): a pass plans again only what changed since the last."""

    def with_evictions(self, observed: Observed) -> Observed:
        """The pass's facts with the answers to our evictions of the pods it watches. Those about pods
        no longer watched (gone, or their node done) are of no use to any pass again: forgotten."""
        known = {pod.uid for pod in observed.upgrade.pods}
        self.evictions = {uid: e for uid, e in self.evictions.items() if uid in known}
        return replace(observed, upgrade=replace(observed.upgrade, evictions=dict(self.evictions)))

    def written(self, plan: Plan, errors: Mapping[str, str]) -> None:
        """After a pass's writes (`errors`: those that failed): a valid generation written without an
        error is the one a later generation that cannot be written falls back to."""
        active = plan.active
        if active is not None and plan.spec is not None and not plan.problems and not errors:
            self.good = Good(active.uid, active.generation, active.spec)
