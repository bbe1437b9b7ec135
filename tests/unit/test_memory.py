"""What one pass leaves for the next (core/memory.py): what it keeps, what it forgets, and when."""

from __future__ import annotations

from dataclasses import replace

from gpu_operator.api import FieldError, parse_spec
from gpu_operator.core.memory import Memory
from gpu_operator.core.plan import Good, Observed, Plan, PolicyRef
from gpu_operator.core.upgrade import EvictionResult, Facts, WorkloadPod
from gpu_operator.core.vetting import Problems


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


def planned(generation: int, spec: dict[str, object]) -> Plan:
    """A plan for generation `generation` of policy p whose spec the models accept."""
    active = PolicyRef("p", "uid-p", generation, "2026-01-01T00:00:00Z", spec, {})
    return Plan(active, parse_spec(spec), [], [], [], {}, {}, [])


def test_the_generation_written_in_full_is_the_one_to_fall_back_to() -> None:
    memory = Memory()
    memory.written(planned(1, {"dcgm": {"enabled": False}}), {})
    first = Good("uid-p", 1, {"dcgm": {"enabled": False}})
    assert memory.good == first
    memory.written(planned(2, {}), {"driver": "500 Internal Server Error"})
    assert memory.good == first, "a write failed: generation 2 is not what the operands run"
    refused = Problems(invalid=(FieldError("spec.driver", "refused"),))
    memory.written(replace(planned(3, {}), problems=refused), {})
    assert memory.good == first, "generation 3 could not be written: the plan ran generation 1"
    memory.written(replace(planned(4, {}), spec=None), {})
    assert memory.good == first, "nothing valid was written"
    memory.written(replace(planned(5, {}), active=None), {})
    assert memory.good == first, "no policy (uninstalled): nothing to fall back to changes"
    memory.written(planned(6, {}), {})
    assert memory.good == Good("uid-p", 6, {})
