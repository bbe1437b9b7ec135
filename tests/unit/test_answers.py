"""What the API server's answers mean (core/answers.py): decisions alone, no API."""

from __future__ import annotations

import pytest

from gpu_operator.core.answers import (
    Failure,
    changed_since_read,
    eviction_result,
    gone,
    is_refusal,
    nothing_to_delete,
    refused_fields,
)

UID_MISMATCH = "Precondition failed: UID in precondition: abc, UID in object meta: "
REPLACED = 'Node "gpu-0" is invalid: metadata.uid: Invalid value: "abc": field is immutable'


@pytest.mark.parametrize(
    ("failure", "changed"),
    [
        (Failure(409, "Conflict", "the object has been modified"), True),
        (Failure(409, "Conflict", UID_MISMATCH), True),  # deleted meanwhile
        (Failure(422, "Invalid", REPLACED), True),  # deleted and created anew under the name
        (Failure(422, "Invalid", "spec.taints: Invalid value"), False),  # a real refusal
        (Failure(404, "NotFound", "nodes not found"), False),
        (Failure(500, "InternalError", "etcd"), False),
        (Failure(0, "", "no answer"), False),
    ],
)
def test_a_write_on_what_the_pass_read_is_left_to_the_next_pass_only_when_the_object_moved(
    failure: Failure, changed: bool
) -> None:
    assert changed_since_read(failure) is changed


def test_a_pod_to_delete_is_gone_on_404_or_409_and_nothing_else_means_so() -> None:
    assert nothing_to_delete(Failure(404, "NotFound", ""))
    assert nothing_to_delete(Failure(409, "Conflict", UID_MISMATCH))  # the name is another pod's now
    for status in (0, 403, 422, 429, 500):
        assert not nothing_to_delete(Failure(status, "", ""))
    assert gone(Failure(404, "NotFound", "")) and not gone(Failure(409, "Conflict", ""))


def test_an_eviction_answer_is_a_fact_and_a_budget_refusal_names_the_budget() -> None:
    assert eviction_result(None, 5.0).accepted
    refused = Failure(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        (("", "The disruption budget guarded needs 1 healthy pods and has 1 currently"),),
    )
    result = eviction_result(refused, 7.0)
    assert (result.status, result.at, result.accepted) == (429, 7.0, False)
    assert result.message.endswith("(The disruption budget guarded needs 1 healthy pods and has 1 currently)")
    # No message at all: its reason, so the status never says nothing.
    assert eviction_result(Failure(0, "no answer", ""), 8.0).message == "no answer"


def test_a_refusal_is_the_contents_fault_not_the_servers_or_the_operators_rights() -> None:
    assert is_refusal(Failure(422, "Invalid", "spec.template: Invalid"))
    assert is_refusal(Failure(403, "Forbidden", "violates PodSecurity"))  # an admission policy
    assert not is_refusal(Failure(403, "Forbidden", 'User "system:serviceaccount:x" cannot patch'))
    for status in (404, 408, 409, 429, 500, 503, 0):
        assert not is_refusal(Failure(status, "", "")), status
    typed = Failure(
        500, "InternalError", "failed to create typed patch object (/x): .spec.runAsUser: expected int"
    )
    assert is_refusal(typed)
    assert refused_fields(typed) == [("spec.runAsUser", "expected int")]
    assert refused_fields(Failure(422, "Invalid", "bad", (("spec.a", "no"),))) == [("spec.a", "no")]
    assert refused_fields(Failure(400, "BadRequest", "bad")) == [("", "bad")]
