"""Rendering: a ClusterPolicy and a few cluster facts in, Kubernetes objects out.

Each component has a template folder (`manifests/templates/<component>/`) whose files render, in
name order, to the objects of that component; DaemonSets share one skeleton macro
(`_macros/daemonset.j2`). Templates hold structure; every value they insert that came from the user
goes through `tojson`, which emits a JSON scalar, list or mapping (YAML is a superset of JSON), so a
value can never turn into YAML structure, however many quotes, newlines or `---` it holds.

Python computes only what would be awkward or repeated in Jinja: resolved images, the update
strategy, the DaemonSet variants (gpu_operator/core/template_functions.py holds what the templates call).
Labels that every object carries are added here after parsing, so no template can forget them. The
text side (tojson, the YAML that `render` prints) is gpu_operator/core/yaml_text.py.
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

from gpu_operator.api import FieldError
from gpu_operator.api.common import ComponentSpec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core import images
from gpu_operator.core.components import (
    BY_NAME,
    COMPONENTS,
    DRIVER_MANAGER,
    DRIVER_MANAGER_ENV,
    GDRCOPY,
    GDRCOPY_ENV,
    GDS,
    GDS_ENV,
    RUNTIME_LABEL,
    VGPU_HOST_MANAGER_LABEL,
    VGPU_MANAGER_DEPLOY_LABEL,
    Component,
    Image,
)
from gpu_operator.core.container_runtime import runtime_setup
from gpu_operator.core.images import KERNEL_LABEL
from gpu_operator.core.ownership import COMPONENT_LABEL, FIELD_MANAGER, MANAGED_BY_LABEL, PART_OF_LABEL
from gpu_operator.core.template_functions import (
    OPENSHIFT_SCC_RULE,
    env_values,
    exporter_pod_metadata,
    exporter_reads_api,
    field_env,
    merge,
    merge_env,
    mig_env,
    probe,
    pull_secrets,
    user_labels,
)
from gpu_operator.core.yaml_text import tojson

__all__ = ["ClusterFacts", "RenderError", "render", "render_component"]

CLUSTER_SCOPED_KINDS = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "RuntimeClass",
        # The GPUCluster's (core/gpucluster_render.py).
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)

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
    """What rendering needs to know about the cluster (gpu_operator.core.node_labels.cluster_facts builds
    it)."""

    namespace: str = "gpu-operator"
    os_tag: str | None = None
    """e.g. "ubuntu22.04" (from the first GPU node's NFD labels); None = no suffix."""
    kernels: tuple[tuple[str, str | None], ...] = ()
    """(kernel, OS name) of the GPU nodes, e.g. ("5.14.0-427.el9.x86_64", "rhel9.4"): one precompiled
    driver DaemonSet each, named after both (NVIDIA's kernelVersionMap); its image tag ends in the OS
    tag (images.tag_of: "rhel9")."""
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
    app: str | None = None
    """The pods' `app` label and the DaemonSet's selector; None: the component's DaemonSet name. An
    NVIDIADriver's pool selects on its own (NVIDIA's AppName, the DaemonSet's name)."""
    account: str | None = None
    """The ServiceAccount and RBAC objects' name, where it is not the component's own (an NVIDIADriver's
    pool has its own, NVIDIA's getDriverName)."""
    driver_type: str = "gpu"
    """An NVIDIADriver's `driverType`: `vgpu-host-manager` renders the driver's pod as NVIDIA's vGPU host
    manager (driver/0500_daemonset.yaml.j2); the ClusterPolicy's driver is `gpu`."""


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
                images.tag_of(os) if os else None,
                kernel,
                node_selector={KERNEL_LABEL: kernel},
            )
            for kernel, os in facts.kernels
        ]
    return [Variant(component.daemonset, runtimes[0], facts.os_tag)]


class RenderError(RuntimeError):
    """A template produced something that is not a Kubernetes object: always a bug in the template."""


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


def _os_id(os_tag: str | None) -> str:
    return re.sub(r"[0-9.]+$", "", os_tag or "")


def _os_dirs(os_tag: str | None) -> tuple[str, str]:
    return _OS_FAMILIES.get(_os_id(os_tag), _APT)


# Host files that entitle a driver container to its distribution's package repositories (it installs
# the kernel headers from them), as mount path → (host path, hostPath type): NVIDIA's
# SubscriptionPathMap (controllers/object_controls.go:254-330).
_RHEL_SUBSCRIPTION = {
    "/run/secrets/etc-pki-entitlement": ("/etc/pki/entitlement", "Directory"),
    "/run/secrets/redhat.repo": ("/etc/yum.repos.d/redhat.repo", "File"),
    "/run/secrets/rhsm": ("/etc/rhsm", "Directory"),
}
_SUSE_SUBSCRIPTION = {
    "/etc/SUSEConnect": ("/etc/SUSEConnect", "FileOrCreate"),
    "/etc/zypp/credentials.d": ("/etc/zypp/credentials.d", "Directory"),
}


def subscription_mounts(policy: ClusterPolicySpec, variant: Variant) -> list[tuple[str, str, str]]:
    """(mount path, host path, type) of the subscription files the driver container gets, sorted by
    mount path (NVIDIA's rule, object_controls.go:3744-3777): on SLES and SL Micro always; on RHEL
    unless the runtime is CRI-O (which injects them itself, containers-common's mounts.conf) or a
    repoConfig replaces Red Hat's repositories; never for precompiled drivers, which install nothing."""
    if policy.driver.usePrecompiled:
        return []
    os_id = _os_id(variant.os_tag)
    repo_config = policy.driver.repoConfig and policy.driver.repoConfig.configMapName
    if os_id == "rhel" and variant.runtime != "crio" and not repo_config:
        paths = _RHEL_SUBSCRIPTION
    elif os_id in ("sles", "sl-micro"):
        paths = _SUSE_SUBSCRIPTION
    else:
        return []
    return [(mount, *paths[mount]) for mount in sorted(paths)]


def _update_strategy(component: Component, policy: ClusterPolicySpec) -> dict[str, Any]:
    """`daemonsets.updateStrategy`, except for components that are always OnDelete (the driver)."""
    daemonsets = policy.daemonsets
    if component.always_on_delete or daemonsets.updateStrategy == "OnDelete":
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


def missing_inputs(component: Component, policy: ClusterPolicySpec, facts: ClusterFacts) -> list[FieldError]:
    """Why a component's DaemonSets cannot be rendered now: a ConfigMap it needs is not there, or it has
    no image at all. NVIDIA then leaves the DaemonSet as it is and reports the state not ready; so do we
    (see plan.py)."""
    found = [
        FieldError(path, f"ConfigMap {name!r} not found in namespace {facts.namespace!r}")
        for path, name in component.config_maps(policy)
        if name not in facts.config_maps
    ]
    if (
        component.image_required
        and not component.spec(policy).image
        and not facts.environ.get(component.image_env)
    ):
        found.append(
            FieldError(
                f"spec.{component.section}.image",
                f"no image: NVIDIA publishes none for {component.name}; name yours (repository, image and "
                f"version), or set {component.image_env} in the operator's environment",
            )
        )
    return found


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
    secrets = pull_secrets(spec, policy.validator) if component.validator_init else pull_secrets(spec)
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
        # The sandbox validator's CC step runs only where the CC manager does (sandbox-validator template).
        "cc_manager_deployed": BY_NAME["cc-manager"].enabled(policy),
        # The VFIO and vGPU managers' own k8s-driver-manager (vfioManager/vgpuManager.driverManager).
        "own_driver_manager": getattr(spec, "driverManager", None),
        "own_driver_manager_image": _image_of(
            getattr(spec, "driverManager", None), DRIVER_MANAGER, DRIVER_MANAGER_ENV, facts
        ),
        "gds_image": _image_of(policy.gds, GDS, GDS_ENV, facts, os=variant.os_tag),
        "gdrcopy_image": _image_of(policy.gdrcopy, GDRCOPY, GDRCOPY_ENV, facts, os=variant.os_tag),
        "update_strategy": _update_strategy(component, policy),
        "tolerations": _tolerations(policy),
        "runtime_class": runtime_class(policy, facts),
        "repo_config_dir": repo_config_dir,
        "cert_config_dir": cert_config_dir,
        "subscription_mounts": subscription_mounts(policy, variant),
        # SUSE's precompiled driver images load the host's own modules (object_controls.go:3680-3699).
        "host_lib_modules": bool(policy.driver.usePrecompiled)
        and _os_id(variant.os_tag) in ("sles", "sl-micro"),
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
    package = Path(__file__).resolve().parents[1]  # gpu_operator, above core/
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
        vgpu_host_manager_label=VGPU_HOST_MANAGER_LABEL,
        vgpu_manager_deploy_label=VGPU_MANAGER_DEPLOY_LABEL,
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


def _standard_labels(label: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: FIELD_MANAGER, COMPONENT_LABEL: label, PART_OF_LABEL: FIELD_MANAGER}


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


def warm() -> None:
    """Compile every template now. Compiling them is most of the first render's CPU (about 0.8 s on
    this machine, against 0.05 to 0.08 s for a render after it), and on an operator just started the
    first render is the first pass of the first policy: the first stage of its rollout. The operator
    calls this at start-up, beside Kopf's initial listings; a template that does not compile is left
    for the pass to report (RenderError)."""
    env = environment()
    for name in env.list_templates():
        try:
            env.get_template(name)
        except jinja2.TemplateError:
            continue


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


render_folder = _render_folder
"""A template folder's objects for `context`, labelled as `label` (the GPUCluster's states use it)."""


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
    return render_variants(component, policy, facts, found)


def render_variants(
    component: Component, policy: ClusterPolicySpec, facts: ClusterFacts, found: list[Variant]
) -> list[dict[str, Any]]:
    """The objects of one component for the DaemonSets `found` (render_component's, or an NVIDIADriver's
    pools): see render_component."""
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
_NOT_INSTALL = ("NVIDIA_VISIBLE_DEVICES",)
"""Driver container env that changes no installed driver: the container runtime's device hint, which
NVIDIADriver pods set ("void") and the ClusterPolicy's do not, so the same driver from either keeps
the same digest and a switch between them restarts the pod without reinstalling the driver."""


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

    def plain_env(ctr: Mapping[str, Any], *ignored: str) -> list[tuple[str, str]]:
        return sorted(
            (e["name"], e.get("value", ""))
            for e in ctr.get("env", [])
            if "valueFrom" not in e and e["name"] not in (DRIVER_CONFIG_DIGEST, *ignored)
        )

    manager, driver = (containers[name] for name in _DIGEST_CONTAINERS)
    inputs = {
        "manager": [manager.get("image"), plain_env(manager)],
        "driver": [
            driver.get("image"),
            driver.get("command"),
            driver.get("args"),
            plain_env(driver, *_NOT_INSTALL),
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
