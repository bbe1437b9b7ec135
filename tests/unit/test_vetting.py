"""What the lookups before a change tell the judge (core/vetting.py): decisions alone, no API."""

from __future__ import annotations

from gpu_operator.core.answers import Failure
from gpu_operator.core.observed import ObjectKey
from gpu_operator.core.vetting import Lookup, Reference, Requests, lookup_answers, to_look_up

NAMESPACE = "gpu-operator"
DAEMONSET: ObjectKey = ("apps/v1", "DaemonSet", NAMESPACE, "nvidia-driver-daemonset")
ROLE: ObjectKey = ("rbac.authorization.k8s.io/v1", "Role", NAMESPACE, "nvidia-driver")
SECRET = Reference("Secret", "registry", "spec.driver.imagePullSecrets")
PRIORITY = Reference("PriorityClass", "gpu-critical", "spec.daemonsets.priorityClassName")
FORBIDDEN = Failure(403, "Forbidden", 'User "system:serviceaccount:gpu-operator:op" cannot get secrets')
UNAVAILABLE = Failure(503, "ServiceUnavailable", "etcd leader changed")


def test_the_objects_are_looked_up_where_they_are_the_secrets_in_the_operand_namespace() -> None:
    asks = Requests(lookups=(DAEMONSET, ROLE), references=(SECRET, PRIORITY))
    assert to_look_up(asks, NAMESPACE) == [
        DAEMONSET,
        ROLE,
        ("v1", "Secret", NAMESPACE, "registry"),
        ("scheduling.k8s.io/v1", "PriorityClass", "", "gpu-critical"),
    ]


def answers_to(asks: Requests, *got: Lookup) -> dict[ObjectKey, Lookup]:
    return dict(zip(to_look_up(asks, NAMESPACE), got, strict=True))


def test_an_answer_says_whether_the_object_or_reference_is_there() -> None:
    asks = Requests(lookups=(DAEMONSET, ROLE), references=(SECRET, PRIORITY))
    someone_elses = {"metadata": {"name": ROLE[3], "managedFields": [{"manager": "kubectl"}]}}
    answers, unchecked = lookup_answers(asks, NAMESPACE, answers_to(asks, None, someone_elses, None, {}))
    assert answers.found[DAEMONSET] is None
    role = answers.found[ROLE]
    assert role is not None and role.key == ROLE and role.managers == ("kubectl",)
    assert answers.present == {("Secret", "registry"): False, ("PriorityClass", "gpu-critical"): True}
    assert not answers.failed and unchecked == []


def test_a_forbidden_lookup_proves_nothing_and_holds_nothing_back_any_other_failure_does() -> None:
    asks = Requests(lookups=(DAEMONSET, ROLE), references=(SECRET, PRIORITY))
    got = answers_to(asks, FORBIDDEN, UNAVAILABLE, FORBIDDEN, UNAVAILABLE)
    answers, unchecked = lookup_answers(asks, NAMESPACE, got)
    assert DAEMONSET not in answers.found, "counts as not there"
    assert ("Secret", "registry") not in answers.present, "not checked: never reported missing"
    assert unchecked == [("DaemonSet nvidia-driver-daemonset", FORBIDDEN), ("Secret registry", FORBIDDEN)]
    assert answers.failed == {
        "looking up Role nvidia-driver": UNAVAILABLE,
        "looking up PriorityClass gpu-critical": UNAVAILABLE,
    }, "no answer: the change waits for a retry"
    assert ROLE not in answers.found and ("PriorityClass", "gpu-critical") not in answers.present
