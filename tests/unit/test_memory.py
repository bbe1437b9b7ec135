"""What one pass leaves for the next (core/memory.py): what it keeps, what it forgets, and when."""

from __future__ import annotations

from gpu_operator.core.memory import Memory
from gpu_operator.core.plan import Observed
from gpu_operator.core.upgrade import EvictionResult, Facts, WorkloadPod


def watching(*uids: str) -> Observed:
    pods = tuple(WorkloadPod("default", f"pod-{uid}", uid, "gpu-0") for uid in uids)
    return Observed((), {}, (), {}, {}, "gpu-operator", upgrade=Facts(nodes=(), pods=pods))


def test_the_answers_to_evictions_go_into_the_facts_of_the_pods_still_watched_only() -> None:
    refused, accepted = EvictionResult(429, "budget", 10.0), EvictionResult(201, "", 11.0)
    memory = Memory(evictions={"uid-a": refused, "uid-b": accepted})
    observed = memory.with_evictions(watching("uid-a", "uid-c"))
    assert observed.upgrade.evictions == {"uid-a": refused}
    assert memory.evictions == {"uid-a": refused}, "the answer about a pod gone is forgotten for good"
    memory.evictions["uid-c"] = accepted
    assert observed.upgrade.evictions == {"uid-a": refused}, "the facts are a copy: later answers stay out"


def test_a_new_memory_is_an_operator_just_started() -> None:
    memory, other = Memory(), Memory()
    assert (memory.applied, memory.reported, memory.evictions, memory.status_written) == ({}, {}, {}, {})
    assert memory.good is None
    assert memory.caches is not other.caches, "two memories never share the planner's results"
