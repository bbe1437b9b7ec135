"""The plan of a pass and its proven change, step by step: what to ask the API server, and from the
answers, what to ask next or what to carry out.

`prove` is a generator: it yields each question (metadata lookups, then dry runs) and is sent the
answers by key; it returns the plan to carry out and its Verdict. The runtime only asks and reports
(gpu_operator/runtime/reconciler.py), so the sequence — the current generation first, the last one
written when that cannot be written, nothing changed when neither can — is decided here and tested
without an API server.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.core.answers import Failure
from gpu_operator.core.memory import Memory
from gpu_operator.core.observed import ObjectKey
from gpu_operator.core.plan import Observed, Plan, build, to_write, vetting_context
from gpu_operator.core.vetting import (
    Answers,
    Lookup,
    Problems,
    Verdict,
    judge,
    lookup_answers,
    requests,
    to_look_up,
)


@dataclass(frozen=True)
class LookUp:
    """Read these objects' metadata (None for an object that is not there, a Failure for no answer)."""

    keys: tuple[ObjectKey, ...]


@dataclass(frozen=True)
class DryRun:
    """Server-side apply these objects as a dry run (None for accepted, a Failure for refused)."""

    bodies: tuple[dict[str, Any], ...]


Question = LookUp | DryRun
Answer = Mapping[ObjectKey, Any]
"""By key: a LookUp's `Lookup`s, a DryRun's `Failure | None`s."""


@dataclass(frozen=True)
class Proven:
    plan: Plan
    """The plan to carry out."""
    verdict: Verdict
    """Its proven change (nothing to write unless proven)."""
    unchecked: tuple[tuple[str, Failure], ...] = field(default=())
    """References the operator may not look up (403): not checked, not holding the change back."""


Proof = Generator[Question, Answer, Proven]


def prove(observed: Observed, stamp: str, clock: float, memory: Memory, namespace: str) -> Proof:
    """The plan to carry out and its proven change. A generation that cannot be written leaves the
    cluster on the last one written (the memory's `good`); when that cannot take the cluster's new
    facts either, or none is known (after a restart), nothing changes."""
    good, caches = memory.good, memory.caches
    unchecked: list[tuple[str, Failure]] = []
    plan = build(observed, stamp, good, clock=clock, caches=caches)
    verdict = yield from _vet(plan, observed, memory, namespace, unchecked)
    if verdict.proven:
        return Proven(plan, verdict, tuple(unchecked))
    if plan.problems is None:  # the current generation itself: fall back to the last one written
        plan = build(observed, stamp, good, verdict.problems, clock, caches=caches)
        verdict = yield from _vet(plan, observed, memory, namespace, unchecked)
        if verdict.proven:
            return Proven(plan, verdict, tuple(unchecked))
    problems = (plan.problems or Problems()) + verdict.problems
    nothing = build(observed, stamp, None, problems, clock, caches=caches)
    return Proven(nothing, Verdict(conflicts=verdict.conflicts), tuple(unchecked))


def _vet(
    plan: Plan, observed: Observed, memory: Memory, namespace: str, unchecked: list[tuple[str, Failure]]
) -> Generator[Question, Answer, Verdict]:
    """Ask what the plan's change needs asked (nothing when nothing is to be written), and judge it."""
    context = vetting_context(plan, observed)
    if context is None:
        return Verdict(deletes=tuple(plan.deletes))
    writes = to_write(plan, observed.objects, memory.applied)
    if not writes:
        return judge(context, writes, plan.deletes, Answers(dry_run={}))
    asks = requests(writes, observed.objects, context.spec)
    got: Mapping[ObjectKey, Lookup] = yield LookUp(tuple(to_look_up(asks, namespace)))
    answers, not_checked = lookup_answers(asks, namespace, got)
    unchecked.extend(not_checked)
    verdict = judge(context, writes, plan.deletes, answers)
    if not verdict.proven:
        return verdict
    dry_runs: Mapping[ObjectKey, Failure | None] = yield DryRun(verdict.dry_run)
    return judge(context, writes, plan.deletes, replace(answers, dry_run=dict(dry_runs)))
