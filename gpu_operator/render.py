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

import hashlib
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
from gpu_operator.api.spec import ClusterPolicySpec, DCGMExporterSpec
from gpu_operator.components import (
    BY_NAME,
    COMPONENTS,
    DRIVER_MANAGER,
    DRIVER_MANAGER_ENV,
    GDRCOPY,
    GDRCOPY_ENV,
    GDS,
    GDS_ENV,
    RUNTIME_LABEL,
    Component,
    Image,
)
from gpu_operator.images import KERNEL_LABEL
from gpu_operator.runtime_config import runtime_setup

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


RUNTIME_ORDER = ("containerd", "crio", "docker")
"""NVIDIA's preference when a cluster mixes runtimes (getRuntime: containerd wins); ours names the
toolkit DaemonSet of the first runtime present `nvidia-container-toolkit-daemonset`."""


def runtimes_in_order(found: Iterable[str]) -> tuple[str, ...]:
    rank = {name: index for index, name in enumerate(RUNTIME_ORDER)}
    return tuple(sorted(set(found), key=lambda r: (rank.get(r, len(rank)), r)))


@dataclass(frozen=True)
class ClusterFacts:
    """What rendering needs to know about the cluster (gpu_operator.nodes.cluster_facts builds it)."""

    namespace: str = "gpu-operator"
    os_tag: str | None = None
    """e.g. "ubuntu22.04" (from the first GPU node's NFD labels); None = no suffix."""
    kernels: tuple[tuple[str, str | None], ...] = ()
    """(kernel, OS tag) of the GPU nodes, e.g. ("5.15.0-105-generic", "ubuntu22.04"): one precompiled
    driver DaemonSet each."""
    runtimes: tuple[str, ...] = ()
    """Container runtimes of the GPU nodes, in RUNTIME_ORDER: one toolkit DaemonSet each. Empty when no
    GPU node is known (then `operator.defaultRuntime`, else containerd)."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The operator's environment: image fallbacks like DRIVER_IMAGE."""
    service_monitor_crd: bool = True
    """Whether the cluster serves the Prometheus operator's ServiceMonitor kind (NVIDIA skips it if not)."""
    config_maps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Keys of the ConfigMaps in the namespace whose files the driver mounts one by one (repoConfig,
    certConfig, kernelModuleConfig); a ConfigMap not in here is missing."""


@dataclass(frozen=True)
class Variant:
    """One DaemonSet of a component: most have one; the toolkit has one per container runtime, a
    precompiled driver one per kernel."""

    name: str
    """DaemonSet name."""
    runtime: str
    os_tag: str | None = None
    kernel: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)


def _sanitized_kernel(kernel: str) -> str:
    """NVIDIA's getSanitizedKernelVersion: no architecture, `_` as `.`, lower case (a valid name)."""
    without_arch = re.sub(r"x86_64(?:_64k)?|aarch64(?:_64k)?", "", kernel)
    return without_arch.replace("_", ".").rstrip(".").lower()


def variants(component: Component, policy: ClusterPolicySpec, facts: ClusterFacts) -> list[Variant]:
    """The DaemonSets of a component for these facts (may be none: precompiled drivers without any
    known kernel)."""
    runtimes = facts.runtimes or (policy.operator.defaultRuntime or "containerd",)
    if component.split == "runtime":
        return [
            Variant(
                component.daemonset if index == 0 else f"{component.daemonset}-{runtime}",
                runtime,
                facts.os_tag,
                node_selector={RUNTIME_LABEL: runtime},
            )
            for index, runtime in enumerate(runtimes)
        ]
    if component.split == "kernel" and policy.driver.usePrecompiled:
        return [
            Variant(
                "-".join(part for part in (component.daemonset, _sanitized_kernel(kernel), os) if part),
                runtimes[0],
                os,
                kernel,
                node_selector={KERNEL_LABEL: kernel},
            )
            for kernel, os in facts.kernels
        ]
    return [Variant(component.daemonset, runtimes[0], facts.os_tag)]


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


# --- values computed per render --------------------------------------------------------------------

# Package-manager directories of the driver container, by OS (NVIDIA's RepoConfigPathMap and
# CertConfigPathMap, controllers/object_controls.go:223-249; other distributions get Debian's).
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
    "sl-micro": _ZYPP,
    "opensuse": _ZYPP,
}


def _os_dirs(os_tag: str | None) -> tuple[str, str]:
    os_id = re.sub(r"[0-9.]+$", "", os_tag or "")
    return _OS_FAMILIES.get(os_id, _APT)


def _update_strategy(component: Component, policy: ClusterPolicySpec) -> dict[str, Any]:
    """NVIDIA's rule (applyUpdateStrategyConfig, controllers/object_controls.go:3876-3905): the driver
    is always OnDelete, because replacing a driver pod unloads the kernel module under running GPU
    workloads; its pods are replaced by the upgrade controller or by hand. Every other operand follows
    `daemonsets.updateStrategy`."""
    daemonsets = policy.daemonsets
    if component.name == "driver" or daemonsets.updateStrategy == "OnDelete":
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


def _image_of(triple: Any, default: Image, env_var: str, facts: ClusterFacts, os: str | None = None) -> str:
    """An image of a spec section that carries the image fields without being a ComponentSpec (the
    driver manager): resolve() reads only repository/image/version."""
    spec = ComponentSpec.model_construct(
        repository=getattr(triple, "repository", None),
        image=getattr(triple, "image", None),
        version=getattr(triple, "version", None),
    )
    return images.resolve(spec, default, env_var, facts.environ, os=os)


def config_maps_read(component: Component, policy: ClusterPolicySpec) -> list[tuple[str, str]]:
    """(field, ConfigMap name) of the user ConfigMaps a component mounts file by file, so it needs their
    keys: the driver's kernel module parameters, and for drivers built on the node the package
    repositories and CA certificates (NVIDIA's transformDriverContainer)."""
    if component.section != "driver":
        return []
    driver = policy.driver
    found = [
        (
            "spec.driver.kernelModuleConfig.name",
            driver.kernelModuleConfig.name if driver.kernelModuleConfig else None,
        )
    ]
    if not driver.usePrecompiled:
        found.append(
            (
                "spec.driver.repoConfig.configMapName",
                driver.repoConfig.configMapName if driver.repoConfig else None,
            )
        )
        found.append(("spec.driver.certConfig.name", driver.certConfig.name if driver.certConfig else None))
    return [(path, name) for path, name in found if name]


def missing_inputs(component: Component, policy: ClusterPolicySpec, facts: ClusterFacts) -> list[str]:
    """Why a component's DaemonSets cannot be rendered now: a ConfigMap it needs is not there. NVIDIA then
    leaves the DaemonSet as it is and reports the state not ready; so do we (see plan.py)."""
    return [
        f"{path}: ConfigMap {name!r} not found in namespace {facts.namespace!r}"
        for path, name in config_maps_read(component, policy)
        if name not in facts.config_maps
    ]


def runtime_class(policy: ClusterPolicySpec, facts: ClusterFacts) -> str | None:
    """The RuntimeClass GPU operands run with; None where there is no `nvidia` handler: NRI mode (the
    toolkit configures no runtime) and CRI-O-only clusters without CDI, where the toolkit installs the
    OCI hook instead (NVIDIA's setRuntimeClassName, controllers/object_controls.go:2747-2753)."""
    if policy.cdi.nriPluginEnabled:
        return None
    if not policy.cdi.enabled and set(facts.runtimes) == {"crio"}:
        return None
    return policy.operator.runtimeClass


def _context(
    component: Component, policy: ClusterPolicySpec, facts: ClusterFacts, variant: Variant
) -> dict[str, Any]:
    spec = component.spec(policy)
    validator = BY_NAME["operator-validator"]
    device_plugin = BY_NAME["device-plugin"]
    repo_config_dir, cert_config_dir = _os_dirs(variant.os_tag)
    # Every operand but the driver runs validator-image init containers, so it needs the validator's
    # pull secrets as well as its own.
    secrets = pull_secrets(spec) if component.name == "driver" else pull_secrets(spec, policy.validator)
    os = variant.os_tag if component.os_specific_tag else None
    return {
        "component": component,
        "variant": variant,
        "policy": policy,
        "spec": spec,
        "facts": facts,
        "namespace": facts.namespace,
        "image": images.resolve(
            spec,
            component.default_image,
            component.image_env,
            facts.environ,
            os=os,
            kernel=variant.kernel,
            precompiled=bool(policy.driver.usePrecompiled),
        ),
        "pull_policy": spec.imagePullPolicy or DEFAULT_PULL_POLICY,
        "pull_secrets": secrets,
        "validator_image": images.resolve(
            policy.validator, validator.default_image, validator.image_env, facts.environ
        ),
        "validator_pull_policy": policy.validator.imagePullPolicy or DEFAULT_PULL_POLICY,
        "driver_manager_image": _image_of(policy.driver.manager, DRIVER_MANAGER, DRIVER_MANAGER_ENV, facts),
        "gds_image": _image_of(policy.gds, GDS, GDS_ENV, facts, os=variant.os_tag),
        "gdrcopy_image": _image_of(policy.gdrcopy, GDRCOPY, GDRCOPY_ENV, facts, os=variant.os_tag),
        "update_strategy": _update_strategy(component, policy),
        "tolerations": _tolerations(policy),
        "runtime_class": runtime_class(policy, facts),
        "repo_config_dir": repo_config_dir,
        "cert_config_dir": cert_config_dir,
        "device_plugin_image": images.resolve(
            policy.devicePlugin, device_plugin.default_image, device_plugin.image_env, facts.environ
        ),
        "config_keys": lambda name: sorted(facts.config_maps.get(name, ())),
        "config_items": lambda name: [{"key": k, "path": k} for k in sorted(facts.config_maps.get(name, ()))],
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
        env_values=env_values,
        mig_env=mig_env,
        exporter_pod_metadata=exporter_pod_metadata,
        exporter_reads_api=exporter_reads_api,
        runtime_setup=runtime_setup,
        openshift_scc=OPENSHIFT_SCC_RULE,
    )
    return env


OPENSHIFT_SCC_RULE = {
    "apiGroups": ["security.openshift.io"],
    "resources": ["securitycontextconstraints"],
    "verbs": ["use"],
    "resourceNames": ["privileged"],
}
"""Every operand Role of NVIDIA's grants this: OpenShift admits privileged pods only with it; elsewhere it
names a resource that does not exist and grants nothing."""

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


def _standard_labels(label: str) -> dict[str, str]:
    return {MANAGED_BY: OPERATOR_NAME, COMPONENT: label, PART_OF: OPERATOR_NAME}


def _finish_metadata(obj: dict[str, Any], standard: dict[str, str], namespace: str) -> dict[str, Any]:
    old = obj["metadata"]
    metadata: dict[str, Any] = {"name": old["name"]}
    if obj["kind"] not in CLUSTER_SCOPED_KINDS:
        metadata["namespace"] = namespace
    metadata.update((k, v) for k, v in old.items() if k not in ("name", "namespace"))
    # A template's own labels win: they include the DaemonSet selector (NVIDIA's GFD and validator
    # select on app.kubernetes.io/part-of), and user labels never reach them with a reserved key.
    metadata["labels"] = {**standard, **(old.get("labels") or {})}
    obj["metadata"] = metadata
    if obj["kind"] == "DaemonSet":
        template_meta = obj["spec"]["template"].setdefault("metadata", {})
        template_meta["labels"] = {**standard, **(template_meta.get("labels") or {})}
    return obj


def _render_folder(
    folder: str, label: str, context: Mapping[str, Any], namespace: str
) -> list[dict[str, Any]]:
    env = environment()
    objects: list[dict[str, Any]] = []
    for name in templates_of(folder):
        try:
            text = env.get_template(name).render(context)
        except jinja2.TemplateError as exc:
            raise RenderError(f"template {name} failed: {exc}") from exc
        objects.extend(
            _finish_metadata(obj, _standard_labels(label), namespace) for obj in _parse(name, text)
        )
    return objects


def render_component(
    component: Component, policy: ClusterPolicySpec, facts: ClusterFacts
) -> list[dict[str, Any]]:
    """All objects of one component, in apply order (ServiceAccount and RBAC, ConfigMaps, Services,
    DaemonSets last). Rendered whether or not the component is enabled; the caller decides.

    The folder renders once per DaemonSet variant; the objects the variants share (ServiceAccount,
    RBAC, ConfigMaps) come out once. Without any variant (precompiled drivers, no kernel known yet) the
    shared objects are still rendered, the DaemonSet is not; nor while an input it needs is missing
    (missing_inputs)."""
    found = [] if missing_inputs(component, policy, facts) else variants(component, policy, facts)
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for variant in found or [Variant(component.daemonset, "containerd")]:
        context = _context(component, policy, facts, variant)
        for obj in _render_folder(component.name, component.component_label, context, facts.namespace):
            if obj["kind"] == "DaemonSet" and not found:
                continue
            key = (obj["kind"], obj["metadata"]["name"])
            if key in objects and objects[key] != obj:
                raise RenderError(f"{key[0]} {key[1]} renders differently per DaemonSet of {component.name}")
            objects[key] = obj
    result = list(objects.values())
    result.sort(key=lambda o: o["kind"] == "DaemonSet")  # stable: apply order, DaemonSets last
    for obj in result:
        if obj["kind"] == "DaemonSet":
            pod = obj["spec"]["template"]["spec"]
            _set_host_root(pod, policy.hostPaths.rootFS)
            stamp_driver_config_digest(pod)
    return result


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = [e for e in container.get("env", []) if e["name"] != name]
    container["env"] = [*env, {"name": name, "value": value}]


def _set_host_root(pod: dict[str, Any], root: str) -> None:
    """Operands that mount the host's root get HOST_ROOT when it is not `/`; nvidia-validator writes it
    into driver-ready, so the toolkit and device plugin find the host's driver there (NVIDIA's
    transformForHostRoot)."""
    if root in ("", "/") or not any(v["name"] == "host-root" for v in pod.get("volumes", [])):
        return
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        _set_env(container, "HOST_ROOT", root)


DRIVER_CONFIG_DIGEST = "DRIVER_CONFIG_DIGEST"
_DIGEST_CONTAINERS = ("k8s-driver-manager", "nvidia-driver-ctr")


def stamp_driver_config_digest(pod: dict[str, Any]) -> None:
    """Set DRIVER_CONFIG_DIGEST on the driver manager and the driver container, as NVIDIA does
    (TransformDriver, controllers/object_controls.go:1053-1075): k8s-driver-manager skips the driver
    reinstall (and GPU pod eviction) when a restarted pod carries the digest the running driver was
    installed with (k8s-driver-manager cmd/driver-manager/main.go:846-883).

    The inputs are NVIDIA's (extractDriverInstallConfig, l.2688-2738): images, command, args, plain env
    values, envFrom secret, mounts and volume sources of the driver containers and the host root, so it
    changes exactly when the driver's configuration does. The value is ours (a hash of the same inputs,
    not NVIDIA's hashstructure), which only matters when comparing with an NVIDIA-rendered pod."""
    containers = {c["name"]: c for c in pod.get("initContainers", []) + pod.get("containers", [])}
    if not all(name in containers for name in _DIGEST_CONTAINERS):
        return

    def plain_env(ctr: Mapping[str, Any]) -> list[tuple[str, str]]:
        return sorted(
            (e["name"], e.get("value", ""))
            for e in ctr.get("env", [])
            if "valueFrom" not in e and e["name"] != DRIVER_CONFIG_DIGEST
        )

    manager, driver = (containers[name] for name in _DIGEST_CONTAINERS)
    inputs = {
        "manager": [manager.get("image"), plain_env(manager)],
        "driver": [
            driver.get("image"),
            driver.get("command"),
            driver.get("args"),
            plain_env(driver),
            driver.get("envFrom"),
            sorted(
                (m["name"], m["mountPath"], m.get("subPath", ""), bool(m.get("readOnly")))
                for m in driver.get("volumeMounts", [])
            ),
        ],
        "sidecars": sorted(
            (name, c.get("image")) for name, c in containers.items() if name not in _DIGEST_CONTAINERS
        ),
        "volumes": sorted(json.dumps(v, sort_keys=True) for v in pod.get("volumes", [])),
    }
    digest = str(int(hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:8], 16))
    for name in _DIGEST_CONTAINERS:
        _set_env(containers[name], DRIVER_CONFIG_DIGEST, digest)


def render_prerequisites(policy: ClusterPolicySpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """Objects every enabled operand relies on, whichever components are enabled (the RuntimeClasses)."""
    context = {"policy": policy, "namespace": facts.namespace, "runtime_class": runtime_class(policy, facts)}
    return _render_folder(PREREQUISITES, PREREQUISITES, context, facts.namespace)


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
