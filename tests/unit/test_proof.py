"""The proof of a pass's change (core/proof.py), step by step and without an API server: what it asks,
in which order, and what it decides from the answers: the current generation when it is proven, the
last one written when it is refused, nothing changed when neither can be written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from builders import gpu_node

from gpu_operator.core.answers import Failure
from gpu_operator.core.memory import Memory
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import ObjectKey, object_key
from gpu_operator.core.plan import Observed, PolicyRef
from gpu_operator.core.proof import Answer, DryRun, LookUp, Proof, Proven, Question, prove

NOW = "2026-12-05T12:00:00Z"
CLOCK = 1796472000.0
NAMESPACE = "gpu-operator"
PLUGIN = "nvidia-device-plugin-daemonset"
REFUSED = Failure(
    422, "Invalid", "DaemonSet is invalid", (("spec.template.spec.containers[0].image", "bad"),)
)


def observed(generation: int = 1, **spec: Any) -> Observed:
    policy = PolicyRef("p", "uid-p", generation, "2026-01-01T00:00:00Z", spec, {})
    nodes = [gpu_node(), NodeInfo("cpu-0", {})]
    return Observed(
        policies=(policy,),
        nodes={n.name: n for n in nodes},
        pods=(),
        daemonsets={},
        objects={},
        namespace=NAMESPACE,
    )


Answering = Callable[[Question], Answer]


def nothing_there_all_accepted(question: Question) -> Answer:
    """None of the objects to write is there yet, what they name is (the default priority class), and
    every dry run passes."""
    if isinstance(question, LookUp):
        return {
            key: {"metadata": {"name": key[3]}} if key[1] == "PriorityClass" else None
            for key in question.keys
        }
    return {object_key(body): None for body in question.bodies}


def refusing(name: str, then: Answering = nothing_there_all_accepted) -> Answering:
    """Every dry run of the object `name` refused, the rest as `then` answers."""

    def answer(question: Question) -> Answer:
        found = dict(then(question))
        if isinstance(question, DryRun):
            found.update({object_key(b): REFUSED for b in question.bodies if b["metadata"]["name"] == name})
        return found

    return answer


def run(proof: Proof, answer: Answering) -> tuple[Proven, list[Question]]:
    """Drive the proof as the runtime does; what it decided and what it asked, in order."""
    asked: list[Question] = []
    try:
        question = next(proof)
        while True:
            asked.append(question)
            question = proof.send(answer(question))
    except StopIteration as done:
        return done.value, asked


def written(proven: Proven, name: str) -> dict[str, Any]:
    return next(b for b in proven.verdict.writes if b["metadata"]["name"] == name)


def test_a_change_is_looked_up_then_dry_run_then_written_whole() -> None:
    proven, asked = run(prove(observed(), NOW, CLOCK, Memory(), NAMESPACE), nothing_there_all_accepted)
    assert [type(q) for q in asked] == [LookUp, DryRun], "lookups first, then the dry runs"
    lookup, dry_run = asked
    assert isinstance(lookup, LookUp) and isinstance(dry_run, DryRun)
    writes = {object_key(b) for b in proven.verdict.writes}
    assert writes == {object_key(b) for b in dry_run.bodies}
    assert writes < set(lookup.keys), "the objects to write, and what they name (the priority class)"
    assert proven.plan.problems is None and proven.verdict.proven and proven.unchecked == ()


def test_a_refused_generation_falls_back_to_the_last_one_written() -> None:
    memory = Memory()
    first, _ = run(prove(observed(1), NOW, CLOCK, memory, NAMESPACE), nothing_there_all_accepted)
    memory.written(first.plan, {})
    bad = observed(2, devicePlugin={"env": [{"name": "MARK", "value": "v9.9.9"}]})
    proven, asked = run(prove(bad, NOW, CLOCK, memory, NAMESPACE), refusing(PLUGIN))
    assert [type(q) for q in asked] == [LookUp, DryRun, LookUp, DryRun], "the new one, then the last good"
    refused = asked[1]
    assert isinstance(refused, DryRun) and any("v9.9.9" in str(b) for b in refused.bodies)
    # The plugin's dry run is refused in the second round too (this fake refuses it by name), so the
    # last good generation cannot take it either: nothing is written, and the status says why.
    assert proven.verdict.writes == () and proven.plan.problems


def test_the_last_good_generation_is_written_when_only_the_new_one_is_refused() -> None:
    memory = Memory()
    first, _ = run(prove(observed(1), NOW, CLOCK, memory, NAMESPACE), nothing_there_all_accepted)
    memory.written(first.plan, {})
    bad = observed(2, devicePlugin={"env": [{"name": "MARK", "value": "v9.9.9"}]})

    def only_the_new_version(question: Question) -> Answer:
        found = dict(nothing_there_all_accepted(question))
        if isinstance(question, DryRun):
            found.update({object_key(b): REFUSED for b in question.bodies if "v9.9.9" in str(b)})
        return found

    proven, asked = run(prove(bad, NOW, CLOCK, memory, NAMESPACE), only_the_new_version)
    assert len(asked) == 4 and proven.verdict.proven
    assert "v9.9.9" not in str(written(proven, PLUGIN)) and written(proven, PLUGIN) == written(first, PLUGIN)
    assert proven.plan.problems, "the refused generation is reported"


def test_without_a_generation_written_a_refused_one_changes_nothing_and_asks_nothing_more() -> None:
    proven, asked = run(prove(observed(), NOW, CLOCK, Memory(), NAMESPACE), refusing(PLUGIN))
    assert [type(q) for q in asked] == [LookUp, DryRun]
    assert proven.verdict.writes == () and proven.verdict.deletes == ()
    assert proven.plan.problems and proven.plan.problems.invalid


def test_a_lookup_the_operator_may_not_make_is_reported_and_holds_nothing_back() -> None:
    forbidden = Failure(403, "Forbidden", "cannot get secrets")

    def no_secrets(question: Question) -> Answer:
        found: dict[ObjectKey, Any] = dict(nothing_there_all_accepted(question))
        if isinstance(question, LookUp):
            found.update({key: forbidden for key in question.keys if key[1] == "Secret"})
        return found

    pulling = observed(driver={"imagePullSecrets": ["registry"]})
    proven, asked = run(prove(pulling, NOW, CLOCK, Memory(), NAMESPACE), no_secrets)
    assert proven.unchecked == (("Secret registry", forbidden),)
    assert [type(q) for q in asked] == [LookUp, DryRun] and proven.verdict.proven


def test_without_a_policy_nothing_is_asked() -> None:
    empty = replace(observed(), policies=())
    proven, asked = run(prove(empty, NOW, CLOCK, Memory(), NAMESPACE), nothing_there_all_accepted)
    assert asked == [] and proven.verdict.writes == () and proven.verdict.proven
