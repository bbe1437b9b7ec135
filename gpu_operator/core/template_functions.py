"""Functions and constants the templates call: small computations that would be awkward or repeated in
Jinja (merged env lists, probes, user labels, pull secrets). Pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.api.common import ComponentSpec, EnvVar, ProbeSpec
from gpu_operator.api.spec import DCGMExporterSpec
from gpu_operator.core.ownership import COMPONENT_LABEL, MANAGED_BY_LABEL, PART_OF_LABEL

# Labels the operator owns on every object; user labels (`daemonsets.labels`) never override them, nor
# `app`, which is the DaemonSet selector and cannot change once the DaemonSet exists.
RESERVED_LABELS = frozenset({"app", MANAGED_BY_LABEL, COMPONENT_LABEL, PART_OF_LABEL})


def merge_env(
    defaults: Iterable[Mapping[str, Any]], *overrides: Iterable[EnvVar | Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Defaults first, then each override list; a later entry replaces an earlier one of the same name
    in place, so every name appears once and the container's order stays recognisable."""
    merged: dict[str, dict[str, Any]] = {}
    for entry in defaults:
        merged[entry["name"]] = dict(entry)
    for override in overrides:
        for var in override or ():
            entry = dict(var) if isinstance(var, Mapping) else {"name": var.name, "value": var.value}
            merged[entry["name"]] = entry
    return list(merged.values())


def mig_env(strategy: str) -> list[dict[str, str]]:
    """MIG_STRATEGY, and the MIG monitor capability where MIG devices are exposed (NVIDIA's
    applyMIGConfiguration): the legacy runtime hook grants it only with this variable."""
    env = [{"name": "MIG_STRATEGY", "value": strategy}]
    if strategy != "none":
        env.append({"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})
    return env


def exporter_pod_metadata(spec: DCGMExporterSpec) -> bool:
    """dcgm-exporter labels metrics with pod labels or UIDs, so it watches pods (NVIDIA's rbacGates)."""
    user = env_values(spec.env)
    by_env = any(
        user.get(name, "").lower() == "true"
        for name in ("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID")
    )
    return bool(spec.enablePodLabels or spec.enablePodUID or by_env)


def exporter_reads_api(spec: DCGMExporterSpec) -> bool:
    """Whether dcgm-exporter talks to the API server (pod metadata, or its config from a ConfigMap);
    otherwise its pods get no ServiceAccount token, as NVIDIA's."""
    config_map = env_values(spec.env).get("DCGM_EXPORTER_CONFIGMAP_DATA", "")
    return exporter_pod_metadata(spec) or config_map not in ("", "none")


def env_values(env: Iterable[EnvVar] | None) -> dict[str, str]:
    """A user env list as a mapping (the last of a name wins, as in the container)."""
    return {var.name: var.value for var in env or ()}


def field_env(name: str, path: str) -> dict[str, Any]:
    """An env entry read from the pod's own fields (downward API)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def probe(
    handler: Mapping[str, Any], defaults: Mapping[str, int], override: ProbeSpec | None
) -> dict[str, Any]:
    """A probe: the handler, the default timings, and whichever timings the user set."""
    timings = dict(defaults)
    if override is not None:
        timings.update(override.model_dump(exclude_none=True))
    return {**handler, **timings}


def user_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """`daemonsets.labels` without the keys the operator owns."""
    return {k: v for k, v in (labels or {}).items() if k not in RESERVED_LABELS}


def merge(*mappings: Mapping[str, Any] | None) -> dict[str, Any]:
    """One mapping from several; later keys win, None counts as empty."""
    result: dict[str, Any] = {}
    for mapping in mappings:
        result.update(mapping or {})
    return result


def pull_secrets(*specs: ComponentSpec) -> list[dict[str, str]]:
    """`imagePullSecrets` entries of the given specs, each name once, in order."""
    names: dict[str, None] = {}
    for spec in specs:
        names.update(dict.fromkeys(spec.imagePullSecrets or ()))
    return [{"name": name} for name in names]


OPENSHIFT_SCC_RULE = {
    "apiGroups": ["security.openshift.io"],
    "resources": ["securitycontextconstraints"],
    "verbs": ["use"],
    "resourceNames": ["privileged"],
}
"""Every operand Role of NVIDIA's grants this: OpenShift admits privileged pods only with it; elsewhere it
names a resource that does not exist and grants nothing."""
