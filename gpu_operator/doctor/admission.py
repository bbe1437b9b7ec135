"""Findings about pods the API server refuses to create (their controllers' FailedCreate Events):
GPU quota exhausted, GPU requests that fail validation, a missing RuntimeClass; and GPU quotas that
cannot work."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator.doctor import checklist
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.cluster import Cluster, name_of, ref_of
from gpu_operator.doctor.scheduling import (
    GPU,
    gpu_request,
    quantity,
    show,
)
from gpu_operator.doctor.state import (
    NOT_EQUAL_MESSAGE,
    NOT_INTEGER_MESSAGE,
    QUOTA_MESSAGE,
    RUNTIME_CLASS_MESSAGE,
    Finding,
    Obj,
    rejection,
)


def _amounts(text: str) -> dict[str, str]:
    """The quota admission's "requests.nvidia.com/gpu=1,requests.cpu=2" → {resource: amount}; a bare
    name (the quota's) → {name: ""}."""
    return dict([*part.split("=", 1), ""][:2] for part in text.split(",")) if text else {}


def _quota_fits_now(cluster: Cluster, namespace: str, name: str, requested: Mapping[str, str]) -> bool:
    """An old Event: the quota is gone, or has room now for what was refused."""
    quota = next((q for q in cluster.state.quotas if ref_of(q) == f"{namespace}/{name}"), None)
    if quota is None:
        return True
    status = quota.get("status") or {}
    used, hard = status.get("used") or {}, status.get("hard") or {}
    return all(
        resource in hard and quantity(used.get(resource, 0)) + quantity(amount) <= quantity(hard[resource])
        for resource, amount in requested.items()
    )


REFUSED = "the API server refuses its pods: "


def _operand_gone(cluster: Cluster, involved: Obj) -> bool:
    """An Event of an operand DaemonSet that no longer exists (Events outlive it by an hour)."""
    return (
        involved.get("kind") == "DaemonSet"
        and involved.get("namespace") == cluster.namespace
        and not any(name_of(d) == involved.get("name") for d in cluster.state.daemonsets)
    )


def rejection_findings(cluster: Cluster) -> list[Finding]:
    """Workloads whose pods the API server refuses to create (their controllers' FailedCreate Events)."""
    latest: dict[tuple[str, str], tuple[Obj, int]] = {}
    for events in cluster.events.values():
        for event in events:
            code = rejection(str(event.get("message") or ""))
            if code is None:
                continue
            involved = event.get("involvedObject") or {}
            if _operand_gone(cluster, involved):
                continue
            kind = str(involved.get("kind", "")).lower()
            what = f"{kind} {involved.get('namespace', '')}/{involved.get('name', '')}"
            stamp = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            previous, count = latest.get((what, code), ({}, 0))
            newer = stamp >= str(previous.get("lastTimestamp") or previous.get("eventTime") or "")
            latest[(what, code)] = (event if newer else previous, count + int(event.get("count") or 1))
    findings: list[Finding] = []
    for (what, code), (event, count) in sorted(latest.items()):
        message = str(event.get("message") or "")
        involved = event.get("involvedObject") or {}
        namespace = str(involved.get("namespace") or "")
        describe = checklist.kubectl(
            "describe", str(involved.get("kind", "")).lower(), "-n", namespace, str(involved.get("name", ""))
        )
        commands: list[Command] = [describe]
        details = [f"{count} failed create(s), last: {message}"]
        if code == "GPUQuotaExceeded":
            parsed = QUOTA_MESSAGE.search(message)
            assert parsed is not None  # rejection() matched it
            quota, requested, used, limited = (_amounts(part) for part in parsed.groups())
            name = next(iter(quota))
            if _quota_fits_now(cluster, namespace, name, requested):
                continue
            gpus = sorted(r for r in requested if GPU in r)
            cause = f"cannot create pods: ResourceQuota {name} in {namespace} allows " + ", ".join(
                f"{r}={limited.get(r, '?')}, {used.get(r, '?')} in use, {requested[r]} more requested"
                for r in gpus
            )
            holders = [
                f"{ref_of(p)} ({(p.get('status') or {}).get('phase')}) counts {show(gpu_request(p))} "
                "against it"
                for p in cluster.workloads
                if (p.get("metadata") or {}).get("namespace") == namespace
                and gpu_request(p) > 0
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            details += holders
            commands.append(checklist.kubectl("describe", "resourcequota", "-n", namespace, name))
        elif code == "RuntimeClassNotFound":
            name = RUNTIME_CLASS_MESSAGE.search(message)[1]  # type: ignore[index]
            if any(name_of(rc) == name for rc in cluster.state.runtime_classes):
                continue  # an old Event: the RuntimeClass is back
            ours = (
                " (the ClusterPolicy's: the operator creates it)" if name == cluster.runtime_class() else ""
            )
            cause = f"cannot create pods: they ask for RuntimeClass {name}, which does not exist{ours}"
            commands.append(checklist.kubectl("get", "runtimeclasses"))
        elif NOT_EQUAL_MESSAGE in message:
            cause = REFUSED + "nvidia.com/gpu requests must equal limits (GPUs are not overcommitted)"
        elif NOT_INTEGER_MESSAGE in message:
            cause = REFUSED + "a fractional nvidia.com/gpu (GPUs are whole; share one by time-slicing or MIG)"
        else:
            cause = REFUSED + "an extended resource such as nvidia.com/gpu requested without a limit"
        findings.append(Finding("error", code, what, cause, details=tuple(details), commands=tuple(commands)))
    return findings


def quota_findings(cluster: Cluster) -> list[Finding]:
    findings: list[Finding] = []
    for quota in cluster.state.quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        ignored = sorted(key for key in hard if key.startswith(f"limits.{GPU}"))
        if not ignored:
            continue
        ref = ref_of(quota)
        findings.append(
            Finding(
                "warning",
                "GPUQuotaLimitIgnored",
                f"resourcequota {ref}",
                f"{', '.join(ignored)} has no effect: Kubernetes quotas extended resources only as "
                f"requests.{GPU} (set that instead)",
                commands=(checklist.kubectl("describe", "resourcequota", "-n", *ref.split("/", 1)),),
            )
        )
    return findings
