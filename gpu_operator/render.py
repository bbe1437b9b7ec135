"""Rendering: a ClusterPolicy and a few cluster facts in, Kubernetes objects out.

Each component has a template folder (`manifests/templates/<component>/`) whose files render, in
name order, to the objects of that component; DaemonSets share one skeleton macro
(`_macros/daemonset.j2`). Templates hold structure; every value they insert that came from the user
goes through `tojson`, which emits a JSON scalar, list or mapping (YAML is a superset of JSON), so a
value can never turn into YAML structure, however many quotes, newlines or `---` it holds.

Python computes only what would be awkward or repeated in Jinja: resolved images, the update
strategy, merged environment lists, probe timings. Labels that every object carries are added here
after parsing, so no template can forget them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel

from gpu_operator import images
from gpu_operator.api.common import ComponentSpec, EnvVar, ProbeSpec
from gpu_operator.api.spec import ClusterPolicySpec, DriverManagerSpec
from gpu_operator.components import (
    BY_NAME,
    COMPONENTS,
    DRIVER_MANAGER,
    DRIVER_MANAGER_ENV,
    Component,
)

__all__ = ["ClusterFacts", "RenderError", "render", "render_component", "to_yaml"]

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
OPERATOR_NAME = "gpu-operator"

# Labels the operator owns on every object; user labels (`daemonsets.labels`) never override them, nor
# `app`, which is the DaemonSet selector and cannot change once the DaemonSet exists.
RESERVED_LABELS = frozenset({"app", MANAGED_BY, COMPONENT, PART_OF})

CLUSTER_SCOPED_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding", "RuntimeClass"})

DEFAULT_PULL_POLICY = "IfNotPresent"
DEFAULT_MAX_UNAVAILABLE = 1


@dataclass(frozen=True)
class ClusterFacts:
    """What rendering needs to know about the cluster."""

    namespace: str = "gpu-operator"
    os_tag: str | None = None
    """e.g. "ubuntu22.04" (from the first GPU node's NFD labels); None = no suffix."""
    kernel: str | None = None
    """e.g. "5.15.0-105-generic", for usePrecompiled driver tags."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The operator's environment: image fallbacks like DRIVER_IMAGE."""
    runtime: str = "containerd"
    service_monitor_crd: bool = True
    """Whether the cluster serves the Prometheus operator's ServiceMonitor kind (NVIDIA skips it if not)."""


class RenderError(RuntimeError):
    """A template produced something that is not a Kubernetes object: always a bug in the template."""


# --- JSON that is also safe YAML -----------------------------------------------------------------

# json.dumps(ensure_ascii=False) leaves characters that YAML reads differently inside a double-quoted
# scalar: C1 controls and DEL are not printable for YAML, NEL/LS/PS are line breaks (and get folded),
# and `ensure_ascii=True` would not help because PyYAML does not join `\ud83d\ude00` surrogate pairs.
# So: keep printable characters raw, escape the rest as \uXXXX (all of them are in the BMP).
_NOT_YAML_SAFE = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def _model_default(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def tojson(value: Any) -> str:
    """A JSON text (one line) that YAML parses back to exactly `value`; pydantic models are dumped."""
    text = json.dumps(value, ensure_ascii=False, default=_model_default)
    return _NOT_YAML_SAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# --- helpers the templates call --------------------------------------------------------------------


def merge_env(
    defaults: Iterable[Mapping[str, Any]], *overrides: Iterable[EnvVar] | None
) -> list[dict[str, Any]]:
    """Defaults first, then each override list; a later entry replaces an earlier one of the same name
    in place, so every name appears once and the container's order stays recognisable."""
    merged: dict[str, dict[str, Any]] = {}
    for entry in defaults:
        merged[entry["name"]] = dict(entry)
    for override in overrides:
        for var in override or ():
            merged[var.name] = {"name": var.name, "value": var.value}
    return list(merged.values())


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


# --- values computed per render --------------------------------------------------------------------

# Where each container runtime keeps its config and socket on the host (NVIDIA's toolkit transform).
_RUNTIMES: dict[str, dict[str, str]] = {
    "containerd": {
        "name": "containerd",
        "config_dir": "/etc/containerd",
        "config_file": "config.toml",
        "socket_dir": "/run/containerd",
        "socket_file": "containerd.sock",
    },
    "crio": {
        "name": "crio",
        "config_dir": "/etc/crio",
        "config_file": "crio.conf",
        "socket_dir": "/var/run/crio",
        "socket_file": "crio.sock",
    },
    "docker": {
        "name": "docker",
        "config_dir": "/etc/docker",
        "config_file": "daemon.json",
        "socket_dir": "/var/run",
        "socket_file": "docker.sock",
    },
}

# Package-manager directories of the driver container, by OS family (repoConfig / certConfig mounts).
_APT = ("/etc/apt/sources.list.d", "/usr/local/share/ca-certificates")
_YUM = ("/etc/yum.repos.d", "/etc/pki/ca-trust/extracted/pem")
_ZYPP = ("/etc/zypp/repos.d", "/etc/pki/trust/anchors")
_OS_FAMILIES = {
    "ubuntu": _APT,
    "debian": _APT,
    "rhel": _YUM,
    "rhcos": _YUM,
    "centos": _YUM,
    "rocky": _YUM,
    "ol": _YUM,
    "almalinux": _YUM,
    "fedora": _YUM,
    "amzn": _YUM,
    "sles": _ZYPP,
    "sle": _ZYPP,
    "opensuse": _ZYPP,
}


def _os_dirs(os_tag: str | None) -> tuple[str, str]:
    os_id = re.sub(r"[0-9.]+$", "", os_tag or "")
    return _OS_FAMILIES.get(os_id, _APT)


def _update_strategy(component: Component, policy: ClusterPolicySpec) -> dict[str, Any]:
    """NVIDIA's driver DaemonSet is always OnDelete: replacing a driver pod unloads the kernel module
    under running GPU workloads, so pods are replaced only by the upgrade controller (autoUpgrade) or by
    hand. We keep that, with one opt-in: a user who explicitly sets `daemonsets.updateStrategy:
    RollingUpdate` while autoUpgrade is off asks the kubelet to roll drivers node by node itself.
    Every other operand follows `daemonsets.updateStrategy`."""
    daemonsets = policy.daemonsets
    if component.name == "driver":
        auto_upgrade = policy.driver.upgradePolicy is not None and policy.driver.upgradePolicy.autoUpgrade
        explicit = (
            "updateStrategy" in daemonsets.model_fields_set and daemonsets.updateStrategy == "RollingUpdate"
        )
        if auto_upgrade or not explicit:
            return {"type": "OnDelete"}
    if daemonsets.updateStrategy == "OnDelete":
        return {"type": "OnDelete"}
    max_unavailable: int | str = DEFAULT_MAX_UNAVAILABLE
    if daemonsets.rollingUpdate is not None and daemonsets.rollingUpdate.maxUnavailable is not None:
        max_unavailable = daemonsets.rollingUpdate.maxUnavailable
    # NVIDIA's field is a string; Kubernetes accepts a bare number only as an integer ("1" is invalid).
    if isinstance(max_unavailable, str) and max_unavailable.isdigit():
        max_unavailable = int(max_unavailable)
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}}


def _tolerations(policy: ClusterPolicySpec) -> list[Any]:
    if policy.daemonsets.tolerations is not None:
        return list(policy.daemonsets.tolerations)
    return [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _driver_manager_image(manager: DriverManagerSpec | None, environ: Mapping[str, str]) -> str:
    # DriverManagerSpec carries the image triple but is not a ComponentSpec; resolve() reads only
    # repository/image/version, so an unvalidated ComponentSpec carrying them is enough.
    triple = ComponentSpec.model_construct(
        repository=manager.repository if manager else None,
        image=manager.image if manager else None,
        version=manager.version if manager else None,
    )
    return images.resolve(triple, DRIVER_MANAGER, DRIVER_MANAGER_ENV, environ)


def _driver_manager_env(policy: ClusterPolicySpec) -> list[dict[str, Any]]:
    """k8s-driver-manager's eviction and drain settings, derived from `driver.upgradePolicy`.

    With autoUpgrade the upgrade controller evicts and drains node by node, so the node-local manager
    must not do it too (NVIDIA turns both off); otherwise the manager evicts GPU pods before it unloads
    the old driver and drains only if `drain.enable` is set."""
    upgrade = policy.driver.upgradePolicy
    drain = upgrade.drain if upgrade is not None else None
    auto = upgrade is not None and upgrade.autoUpgrade

    def flag(value: bool) -> str:
        return "true" if value else "false"

    return [
        {"name": "ENABLE_GPU_POD_EVICTION", "value": flag(not auto)},
        {"name": "ENABLE_AUTO_DRAIN", "value": flag(not auto and drain is not None and drain.enable)},
        {"name": "DRAIN_USE_FORCE", "value": flag(drain is not None and drain.force)},
        {"name": "DRAIN_POD_SELECTOR_LABEL", "value": (drain.podSelector if drain else None) or ""},
        {"name": "DRAIN_TIMEOUT_SECONDS", "value": f"{drain.timeoutSeconds if drain else 300}s"},
        {"name": "DRAIN_DELETE_EMPTYDIR_DATA", "value": flag(drain is not None and drain.deleteEmptyDir)},
    ]


def _context(component: Component, policy: ClusterPolicySpec, facts: ClusterFacts) -> dict[str, Any]:
    spec = component.spec(policy)
    validator = BY_NAME["operator-validator"]
    repo_config_dir, cert_config_dir = _os_dirs(facts.os_tag)
    # Every operand but the driver runs validator-image init containers, so it needs the validator's
    # pull secrets as well as its own.
    secrets = pull_secrets(spec) if component.name == "driver" else pull_secrets(spec, policy.validator)
    return {
        "component": component,
        "policy": policy,
        "spec": spec,
        "facts": facts,
        "namespace": facts.namespace,
        "image": images.resolve(
            spec,
            component.default_image,
            component.image_env,
            facts.environ,
            os=facts.os_tag if component.os_specific_tag else None,
            kernel=facts.kernel,
            precompiled=bool(policy.driver.usePrecompiled),
        ),
        "pull_policy": spec.imagePullPolicy or DEFAULT_PULL_POLICY,
        "pull_secrets": secrets,
        "validator_image": images.resolve(
            policy.validator, validator.default_image, validator.image_env, facts.environ
        ),
        "validator_pull_policy": policy.validator.imagePullPolicy or DEFAULT_PULL_POLICY,
        "driver_manager_image": _driver_manager_image(policy.driver.manager, facts.environ),
        "driver_manager_env": _driver_manager_env(policy),
        "update_strategy": _update_strategy(component, policy),
        "tolerations": _tolerations(policy),
        "runtime": _RUNTIMES.get(facts.runtime, _RUNTIMES["containerd"]),
        "repo_config_dir": repo_config_dir,
        "cert_config_dir": cert_config_dir,
    }


# --- the Jinja environment -------------------------------------------------------------------------


def template_dir() -> Path:
    """Templates ship inside the wheel as gpu_operator/templates; a source checkout has them in
    manifests/templates."""
    package = Path(__file__).resolve().parent
    installed = package / "templates"
    if installed.is_dir():
        return installed
    return package.parent / "manifests" / "templates"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        merge=merge,
        merge_env=merge_env,
        field_env=field_env,
        probe=probe,
        user_labels=user_labels,
    )
    return env


PREREQUISITES = "pre-requisites"
"""Template folder (and component label) of the shared objects every operand needs (RuntimeClass)."""


def templates_of(folder: str) -> list[str]:
    """A template folder's files, in apply order (their names start with a number)."""
    prefix = f"{folder}/"
    names = environment().list_templates(
        filter_func=lambda n: n.startswith(prefix) and n.endswith(".yaml.j2")
    )
    return sorted(names)


# --- rendering ------------------------------------------------------------------------------------


# libyaml when PyYAML was built with it: parsing is most of the rendering time.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse(name: str, text: str) -> list[dict[str, Any]]:
    try:
        documents = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise RenderError(f"template {name} rendered invalid YAML: {exc}") from exc
    for doc in documents:
        metadata = doc.get("metadata") if isinstance(doc, dict) else None
        if not (
            isinstance(doc, dict)
            and doc.get("apiVersion")
            and doc.get("kind")
            and isinstance(metadata, dict)
            and metadata.get("name")
        ):
            raise RenderError(f"template {name} rendered something that is not a Kubernetes object: {doc!r}")
    return documents


def _standard_labels(name: str) -> dict[str, str]:
    return {MANAGED_BY: OPERATOR_NAME, COMPONENT: name, PART_OF: OPERATOR_NAME}


def _finish_metadata(obj: dict[str, Any], standard: dict[str, str], namespace: str) -> dict[str, Any]:
    old = obj["metadata"]
    metadata: dict[str, Any] = {"name": old["name"]}
    if obj["kind"] not in CLUSTER_SCOPED_KINDS:
        metadata["namespace"] = namespace
    metadata.update((k, v) for k, v in old.items() if k not in ("name", "namespace"))
    metadata["labels"] = {**(old.get("labels") or {}), **standard}
    obj["metadata"] = metadata
    if obj["kind"] == "DaemonSet":
        template_meta = obj["spec"]["template"].setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **standard}
    return obj


def _render_folder(folder: str, context: Mapping[str, Any], namespace: str) -> list[dict[str, Any]]:
    env = environment()
    objects: list[dict[str, Any]] = []
    for name in templates_of(folder):
        try:
            text = env.get_template(name).render(context)
        except jinja2.TemplateError as exc:
            raise RenderError(f"template {name} failed: {exc}") from exc
        objects.extend(
            _finish_metadata(obj, _standard_labels(folder), namespace) for obj in _parse(name, text)
        )
    return objects


def render_component(
    component: Component, policy: ClusterPolicySpec, facts: ClusterFacts
) -> list[dict[str, Any]]:
    """All objects of one component, in apply order (ServiceAccount and RBAC, ConfigMaps, Services,
    DaemonSet last). Rendered whether or not the component is enabled; the caller decides."""
    return _render_folder(component.name, _context(component, policy, facts), facts.namespace)


def render_prerequisites(policy: ClusterPolicySpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """Objects every enabled operand relies on, whichever components are enabled (the RuntimeClass)."""
    return _render_folder(PREREQUISITES, {"policy": policy, "namespace": facts.namespace}, facts.namespace)


def render(policy: ClusterPolicySpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The prerequisites, then the objects of every enabled component, in registry (dependency) order."""
    objects = render_prerequisites(policy, facts)
    for component in COMPONENTS:
        if component.enabled(policy):
            objects.extend(render_component(component, policy, facts))
    return objects


# --- output ---------------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style with sequences indented under their key; short lists of plain values (commands,
    RBAC verbs) on one line; multi-line strings (scripts, config files) as literal blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


# With allow_unicode, PyYAML writes these raw in plain, single-quoted and block scalars, where a
# reader takes them for line breaks; only a double-quoted scalar escapes them.
_UNICODE_BREAKS = frozenset("\x85\u2028\u2029\ufeff")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style: str | None = None
    if not _UNICODE_BREAKS.isdisjoint(value):
        style = '"'
    elif "\n" in value:
        style = "|"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
    short = (
        bool(value)
        and all(isinstance(item, str | int | float | bool) and "\n" not in str(item) for item in value)
        and sum(len(str(item)) + 4 for item in value) <= _FLOW_WIDTH
    )
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=short)


_FLOW_WIDTH = 72
_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(list, _represent_list)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, each document starting with `---`, keys in rendered order."""
    return yaml.dump_all(
        objects,
        Dumper=_Dumper,
        explicit_start=True,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=10_000,
    )
