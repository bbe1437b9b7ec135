"""What the API server's answers mean (pure).

The runtime performs a call and reports what came back: nothing (it succeeded) or a `Failure` with the
status code, reason, message and refused fields. Whether that failure is a refused spec, a write left to
the next pass, an object already gone or a fact for the upgrade's state machine is decided here, in one
place, and unit-tested without an API server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_operator.core.upgrade import EvictionResult


@dataclass(frozen=True)
class Failure:
    """What the API server answered to a request that did not succeed."""

    status: int
    """HTTP status; 0: no answer at all."""
    reason: str
    message: str
    causes: tuple[tuple[str, str], ...] = ()
    """(field path, message) pairs of a refused object (the Status' details.causes)."""

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}".replace("  ", " ")


TYPED_PATCH = "failed to create typed patch object"
"""A 500 the API server answers when a value has the wrong type for the field (runAsUser "root"): the
content is at fault, not the server, and retrying cannot help."""
_TYPED_PATCH_FIELD = re.compile(TYPED_PATCH + r" \([^)]*\): (\.?[^:\s]+): (.*)", re.DOTALL)


def is_refusal(failure: Failure) -> bool:
    """The server refused the content (a spec problem) rather than failing to answer: 4xx but not a
    missing namespace or kind (404), a conflict or timeout (409, 408) or throttling (429), and not
    the operator's own permissions (403 naming the user); and the typed-patch 500."""
    if failure.status == 500:
        return TYPED_PATCH in failure.message
    if failure.status == 403:
        return not ('User "' in failure.message and " cannot " in failure.message)
    return 400 <= failure.status < 500 and failure.status not in (404, 408, 409, 429)


def refused_fields(failure: Failure) -> list[tuple[str, str]]:
    """(field path of the object, message) of everything a refusal names; ('', message) when it names
    no field."""
    if failure.causes:
        return [(path, message) for path, message in failure.causes]
    typed = _TYPED_PATCH_FIELD.search(failure.message)
    if typed:
        return [(typed.group(1).lstrip("."), typed.group(2).strip())]
    return [("", failure.message)]


def changed_since_read(failure: Failure) -> bool:
    """Whether a write that carried the uid and resourceVersion the pass read failed only because its
    object is not as read: changed since (409), deleted (409 "uid mismatch ... no existing object"), or
    deleted and created anew under the same name (422 on the immutable metadata.uid). The write is
    left to the next pass, which decides again on the object as it is then."""
    return failure.status == 409 or (failure.status == 422 and "metadata.uid" in failure.message)


def gone(failure: Failure) -> bool:
    """The object is not there (404): a ClusterPolicy deleted between the pass's read and its status
    write (its DELETED event is on the way), a CRD not installed."""
    return failure.status == 404


def nothing_to_delete(failure: Failure) -> bool:
    """A pod delete with the pod's uid as precondition: gone already (404) or the name is another
    pod's now (409): either way the pod the upgrade meant is not there any more."""
    return failure.status in (404, 409)


def eviction_result(failure: Failure | None, at: float) -> EvictionResult:
    """An eviction's answer as a fact for the upgrade's next pass, never a failure of this one: the
    state machine retries, waits or times out. A PodDisruptionBudget's 429 names the budget only in
    its causes ("The disruption budget guarded needs 1 healthy pods and has 1 currently"), so the
    message carries them for the status and `doctor`."""
    if failure is None:
        return EvictionResult(201, "", at)
    said = "; ".join(message for _, message in failure.causes if message)
    message = f"{failure.message} ({said})" if said else failure.message
    return EvictionResult(failure.status, message or failure.reason, at)
