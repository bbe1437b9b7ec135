"""Proving a change before any of it is written (pure): what to ask the API server, and the verdict.

All or nothing per generation. When a pass would create or update objects (a new ClusterPolicy
generation, or new facts such as a node with a new kernel), nothing of the change is written unless
all of it passes, so that running operands never end up half on the old and half on a refused new
configuration (NVIDIA applies object by object and stops at the first refusal):

1. `requests`: the objects to write that the watch caches do not show are looked up (a user's object
   may carry one of our names without our labels), and so are the Secrets and PriorityClasses the new
   pods name; ConfigMaps and their keys are in the caches already.
2. `judge` with those answers: an existing object the operator did not create is a conflict (its
   component waits and says so, the others go on); a missing ConfigMap, key, Secret or PriorityClass
   refuses the change (PrerequisiteNotMet); the rest is to be applied with dryRun=All.
3. `judge` again with the dry-run answers: a refusal (InvalidSpec) names the policy field, followed
   back from the field the server names (gpu_operator/core/policy_fields.py), and the server's words; an
   API failure (5xx, timeout, conflict) leaves the change for a retry (ReconcileFailed).

Nothing is asked when nothing is to be written, so a cluster at rest costs the API server nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.api import FieldError
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.answers import Failure, is_refusal, refused_fields
from gpu_operator.core.components import BY_NAME, COMPONENTS
from gpu_operator.core.observed import (
    ADOPT_ANNOTATION,
    ObjectInfo,
    ObjectKey,
    component_of,
    may_rewrite,
    object_info,
    object_key,
)
from gpu_operator.core.policy_fields import fields_named, policy_field, spec_values, string_fields
from gpu_operator.core.render import PREREQUISITES

LOOKED_UP_KINDS = {"Secret": ("v1", ""), "PriorityClass": ("scheduling.k8s.io/v1", "")}
"""Kinds of references read from the API server (apiVersion; namespaced ones in the operand namespace)."""


@dataclass(frozen=True)
class Reference:
    """Something an object to write needs that it does not create: a ConfigMap, Secret or PriorityClass."""

    kind: str
    name: str
    field: str
    """The policy field that names it."""
    keys: tuple[str, ...] = ()
    """ConfigMap keys it must have."""
    any_key: bool = False
    """The ConfigMap must have at least one key."""
    key_field: str = ""
    """The policy field that names a key it must have (default: `field`)."""


@dataclass(frozen=True)
class Requests:
    """What to ask the API server before a change can be judged."""

    lookups: tuple[ObjectKey, ...] = ()
    """Objects to write that the caches do not show: are they there after all (someone else's)?"""
    references: tuple[Reference, ...] = ()
    """Secrets and PriorityClasses the objects to write name."""


@dataclass(frozen=True)
class Answers:
    found: Mapping[ObjectKey, ObjectInfo | None] = field(default_factory=dict)
    """The looked-up objects (None: not there)."""
    present: Mapping[tuple[str, str], bool] = field(default_factory=dict)
    """(kind, name) of a reference → whether it exists; absent when it could not be checked (403)."""
    dry_run: Mapping[ObjectKey, Failure | None] | None = None
    """What the dry run of each object said (None: accepted); None until the dry run is made."""
    failed: Mapping[str, Failure] = field(default_factory=dict)
    """Lookups that got no answer: what was asked → the failure."""


@dataclass(frozen=True)
class Problems:
    """Why a generation (or a change of facts) is not written, in the three kinds the status tells apart."""

    invalid: tuple[FieldError, ...] = ()
    """Spec problems: the models or the API server refuse what the policy asks for (InvalidSpec)."""
    missing: tuple[FieldError, ...] = ()
    """What the policy names is not there: a ConfigMap, key, Secret or PriorityClass (PrerequisiteNotMet)."""
    failures: tuple[str, ...] = ()
    """API failures while proving the change (ReconcileFailed); retried with backoff."""

    def __bool__(self) -> bool:
        return bool(self.invalid or self.missing or self.failures)

    def lines(self) -> list[str]:
        return [str(e) for e in (*self.invalid, *self.missing)] + list(self.failures)

    def __add__(self, other: Problems) -> Problems:
        return Problems(
            self.invalid + other.invalid, self.missing + other.missing, self.failures + other.failures
        )


@dataclass(frozen=True)
class Verdict:
    writes: tuple[dict[str, Any], ...] = ()
    """The objects to write now (none unless the whole change is proven)."""
    deletes: tuple[ObjectKey, ...] = ()
    """The objects to delete once every write succeeded."""
    dry_run: tuple[dict[str, Any], ...] = ()
    """The objects to prove by dry run (the judge asks for it when nothing refused the change before)."""
    problems: Problems = Problems()
    conflicts: Mapping[str, str] = field(default_factory=dict)
    """Component → the objects of its names that are someone else's, and what to do."""

    @property
    def proven(self) -> bool:
        return not self.problems


def _section(obj: Mapping[str, Any]) -> str:
    component = BY_NAME.get(component_of(obj["metadata"]))
    return component.section if component is not None else "operator"  # the RuntimeClass


def _pod(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if obj["kind"] != "DaemonSet":
        return {}
    return dict(obj["spec"]["template"].get("spec") or {})


def _pod_references(pod: Mapping[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(kind, name, keys) of every ConfigMap, Secret and PriorityClass a pod spec needs to start."""
    for volume in pod.get("volumes") or []:
        sources = [volume, *((volume.get("projected") or {}).get("sources") or [])]
        for source in sources:
            config_map, secret = source.get("configMap"), source.get("secret")
            if config_map and not config_map.get("optional"):
                keys = tuple(i["key"] for i in config_map.get("items") or [])
                yield "ConfigMap", config_map["name"], keys
            if secret and not secret.get("optional"):
                yield "Secret", secret.get("secretName") or secret.get("name") or "", ()
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for source in container.get("envFrom") or []:
            for kind, ref in (("ConfigMap", source.get("configMapRef")), ("Secret", source.get("secretRef"))):
                if ref and not ref.get("optional"):
                    yield kind, ref["name"], ()
        for env in container.get("env") or []:
            value_from = env.get("valueFrom") or {}
            for kind, ref in (
                ("ConfigMap", value_from.get("configMapKeyRef")),
                ("Secret", value_from.get("secretKeyRef")),
            ):
                if ref and not ref.get("optional"):
                    yield kind, ref["name"], (ref["key"],) if kind == "ConfigMap" else ()
    for secret in pod.get("imagePullSecrets") or []:
        yield "Secret", secret["name"], ()
    if pod.get("priorityClassName"):
        yield "PriorityClass", pod["priorityClassName"], ()


_HINTS = {"ConfigMap": ("config",), "Secret": ("secret",), "PriorityClass": ("priorityClass",)}


def references(writes: Sequence[Mapping[str, Any]], spec: ClusterPolicySpec) -> list[Reference]:
    """What the objects to write need and do not create, each with the policy field naming it."""
    fields = string_fields(spec_values(spec))
    found: dict[tuple[str, str], Reference] = {}
    written = {component_of(o["metadata"]) for o in writes if o["kind"] == "DaemonSet"}
    for obj in writes:
        for kind, name, keys in _pod_references(_pod(obj)):
            before = found.get((kind, name))
            where = before.field if before else fields_named(fields, name, _HINTS[kind], _section(obj))
            merged = tuple(sorted({*keys, *(before.keys if before else ())}))
            found[kind, name] = Reference(kind, name, where, merged)
    for component in COMPONENTS:
        if component.name not in written:
            continue
        for path, name, key in component.config_keys(spec):
            before = found.get(("ConfigMap", name)) or Reference("ConfigMap", name, path)
            keys = tuple(sorted({*before.keys, *((key,) if key else ())}))
            found["ConfigMap", name] = replace(before, keys=keys, any_key=not key, key_field=path)
    return list(found.values())


def pending(
    plan_objects: Sequence[dict[str, Any]], in_sync: Mapping[ObjectKey, bool]
) -> tuple[dict[str, Any], ...]:
    """The desired objects to write: those not known to be in sync."""
    return tuple(o for o in plan_objects if not in_sync.get(object_key(o), False))


def requests(
    writes: Sequence[Mapping[str, Any]], cached: Mapping[ObjectKey, ObjectInfo], spec: ClusterPolicySpec
) -> Requests:
    return Requests(
        lookups=tuple(key for key in map(object_key, writes) if key not in cached),
        references=tuple(r for r in references(writes, spec) if r.kind in LOOKED_UP_KINDS),
    )


def reference_key(ref: Reference, namespace: str) -> ObjectKey:
    """Where a reference is looked up: a Secret in the operand namespace (`namespace`), where the pods
    that name it run; a PriorityClass in none."""
    api_version, _ = LOOKED_UP_KINDS[ref.kind]
    return api_version, ref.kind, namespace if ref.kind == "Secret" else "", ref.name


def to_look_up(asks: Requests, namespace: str) -> list[ObjectKey]:
    """The metadata lookups that answer `asks`: its objects, then its references."""
    return [*asks.lookups, *(reference_key(ref, namespace) for ref in asks.references)]


Lookup = Mapping[str, Any] | Failure | None
"""What the API server answered to a metadata lookup: the object's metadata (`{"metadata": ...}`),
None when there is no such object, or the failure."""


def lookup_answers(
    asks: Requests, namespace: str, got: Mapping[ObjectKey, Lookup]
) -> tuple[Answers, list[tuple[str, Failure]]]:
    """What the lookups of `asks` (`got`, by to_look_up's keys) tell the judge, and what could not be
    checked. A lookup the operator's ServiceAccount may not make (403: an older chart's RBAC, say)
    proves nothing either way, and must not hold every change back: the object counts as not there,
    the reference as not checked. Any other failure leaves the change unproven, for a retry."""
    found: dict[ObjectKey, ObjectInfo | None] = {}
    present: dict[tuple[str, str], bool] = {}
    failed: dict[str, Failure] = {}
    unchecked: list[tuple[str, Failure]] = []

    def answered(key: ObjectKey) -> tuple[bool, Mapping[str, Any] | None]:
        answer = got[key]
        if not isinstance(answer, Failure):
            return True, answer
        what = f"{key[1]} {key[3]}"
        if answer.status == 403:
            unchecked.append((what, answer))
        else:
            failed[f"looking up {what}"] = answer
        return False, None

    for key in asks.lookups:
        ok, body = answered(key)
        if ok:
            found[key] = None if body is None else object_info(body, key)
    for ref in asks.references:
        ok, body = answered(reference_key(ref, namespace))
        if ok:
            present[ref.kind, ref.name] = body is not None
    return Answers(found=found, present=present, failed=failed), unchecked


def conflict_message(info: ObjectInfo, policy: str) -> str:
    kind, namespace, name = info.key[1], info.key[2], info.key[3]
    who = ", ".join(m for m in info.managers if m) or "another client"
    owner = (
        "controlled by another ClusterPolicy"
        if info.owner_uid
        else f"not controlled by ClusterPolicy {policy!r}"
    )
    return (
        f"{kind} {namespace + '/' if namespace else ''}{name} exists and was not created by this operator "
        f"(written by {who}, {owner}): delete or rename it, or annotate it {ADOPT_ANNOTATION}=true to hand "
        "it over"
    )


@dataclass(frozen=True)
class Context:
    """What the judge knows besides the answers: the plan's side of the change."""

    policy: str
    policy_uid: str
    policy_uids: frozenset[str]
    spec: ClusterPolicySpec
    namespace: str
    cached: Mapping[ObjectKey, ObjectInfo]
    """The objects the watch caches show (our labels)."""
    config_maps: Mapping[str, tuple[str, ...]]
    """Every ConfigMap of the operand namespace → its keys, those the plan renders included (written
    with the change, or there already)."""
    missing_inputs: tuple[FieldError, ...] = ()
    """Inputs the plan lacks (a DaemonSet is withheld until they are there)."""


def judge(
    context: Context,
    writes: Sequence[dict[str, Any]],
    deletes: Sequence[ObjectKey],
    answers: Answers,
) -> Verdict:
    conflicts: dict[str, list[str]] = {}
    for obj in writes:
        key = object_key(obj)
        info = context.cached.get(key) or answers.found.get(key)
        if info is not None and not may_rewrite(info, context.policy_uid, context.policy_uids):
            component = component_of(obj["metadata"]) or PREREQUISITES
            conflicts.setdefault(component, []).append(conflict_message(info, context.policy))
    # A component with a conflict waits whole: its DaemonSet without its RBAC would not work either.
    blocked = set(conflicts)
    free = [o for o in writes if (component_of(o["metadata"]) or PREREQUISITES) not in blocked]
    summary = {name: "; ".join(messages) for name, messages in conflicts.items()}

    # A withheld DaemonSet refuses a change; with nothing to change it is only reported (its component).
    inputs = list(context.missing_inputs) if writes or deletes else []
    missing = inputs + _missing_references(context, free, answers)
    failures = [f"{what}: {failure}" for what, failure in answers.failed.items()]
    invalid: list[FieldError] = []
    if answers.dry_run is not None:
        values = spec_values(context.spec)
        for obj in free:
            failure = answers.dry_run.get(object_key(obj))
            if failure is None:
                continue
            what = f"{obj['kind']} {obj['metadata']['name']}"
            if not is_refusal(failure):
                failures.append(f"{what}: {failure}")
                continue
            for path, message in refused_fields(failure):
                where = policy_field(values, obj, path, _section(obj)) if path else f"spec.{_section(obj)}"
                invalid.append(FieldError(where, f"{message} (the API server refused {what})"))
    problems = Problems(tuple(_unique(invalid)), tuple(_unique(missing)), tuple(failures))
    if problems:
        return Verdict(problems=problems, conflicts=summary)
    if answers.dry_run is None:
        return Verdict(dry_run=tuple(free), conflicts=summary)
    kept = (
        [key for key in deletes if (context.cached[key].component or PREREQUISITES) not in blocked]
        if deletes
        else []
    )
    return Verdict(writes=tuple(free), deletes=tuple(kept), conflicts=summary)


def _missing_references(
    context: Context, writes: Sequence[dict[str, Any]], answers: Answers
) -> list[FieldError]:
    problems: list[FieldError] = []
    for ref in references(writes, context.spec):
        if ref.kind == "ConfigMap":
            keys = context.config_maps.get(ref.name)
            if keys is None:
                problems.append(
                    FieldError(
                        ref.field, f"ConfigMap {ref.name!r} not found in namespace {context.namespace!r}"
                    )
                )
                continue
            lacking = ", ".join(repr(k) for k in ref.keys if k not in keys)
            key_field = ref.key_field or ref.field
            if lacking:
                problems.append(FieldError(key_field, f"ConfigMap {ref.name!r} has no key {lacking}"))
            elif ref.any_key and not keys:
                problems.append(FieldError(key_field, f"ConfigMap {ref.name!r} is empty"))
        elif answers.present.get((ref.kind, ref.name)) is False:
            where = f" in namespace {context.namespace!r}" if ref.kind == "Secret" else ""
            problems.append(FieldError(ref.field, f"{ref.kind} {ref.name!r} not found{where}"))
    return problems


def _unique(errors: Sequence[FieldError]) -> list[FieldError]:
    return list(dict.fromkeys(errors))
