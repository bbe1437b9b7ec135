"""A GPUCluster's objects: the DRA stack as NVIDIA's GPUCluster controller renders it (pure, no I/O).

NVIDIA's controller at v26.7.0 syncs four states per GPUCluster, in this order (internal/state/
manager.go newGPUClusterStates): the DRA driver (state-dra-driver), DCGM (state-dcgm), DCGM exporter
(state-dcgm-exporter) and the DRA validator (state-dra-validation). Ours renders the same objects from
one template folder each (`FOLDERS`), with the values NVIDIA's controller computes for its templates
computed here (dra_driver.go, dcgm_exporter.go):

- Images: the section's repository/image/version, else the operator's environment (DRA_DRIVER_IMAGE,
  DCGM_IMAGE, DCGM_EXPORTER_IMAGE), else our built-in default. The DRA driver's driver-validation init
  container and the DRA validator run the validator image (VALIDATOR_IMAGE), which has no field in the
  GPUCluster, as in NVIDIA's.
- FEATURE_GATES: the gates sorted by name, `name=true|false`, so that a pass never churns the pod.
- The health ports: the spec's, else 51516 (gpus) and 51515 (computeDomains); -1 with the health
  service off, and then no probes.
- The driver-validation init container's resources: the largest of each amount over the kubelet plugin
  containers that run (maxResourceRequirements), a limit raised to a larger request.
- The exporter: collectors file, HPC job-mapping directory, pod-resources directory under the kubelet's
  root, the standalone hostengine's Service when DCGM runs, the ServiceMonitor only where its CRD is
  served.
- `resource_api`: the resource.k8s.io version the cluster serves (NVIDIA asks discovery); v1beta1
  ResourceClaimTemplates have no `exactly` level.

The DaemonSets select their nodes by NVIDIA's deploy labels only (`nvidia.com/gpu.deploy.dra-driver`,
...), never by `spec.nodeSelector`: which node is the GPUCluster's is decided per node, with its GPU
pods in mind (core/allocators.py), and a node leaving the pool keeps the kubelet plugin until the pods
whose claims it must unprepare are gone. Where ours differs from NVIDIA's render (see
tests/data/nvidia-conformance/deliberate-differences.yaml): without `daemonsets.tolerations` the pods
tolerate `nvidia.com/gpu`, as the ClusterPolicy's operands do (NVIDIA's render has none then);
`daemonsets.priorityClassName` applies to every pod (NVIDIA's DCGM, exporter and validator assets
hard-code system-node-critical, its default). OpenShift's SecurityContextConstraints are not rendered,
as nowhere in this operator.

The DRA kubelet plugin waits on each node for the driver, whoever installs it (the ClusterPolicy, an
NVIDIADriver or the host): its init container is NVIDIA's driver validation with WITH_WAIT, and its
containers start from the driver-ready file it writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.api.common import ResourceRequirements, quantity_value
from gpu_operator.api.gpucluster import (
    COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    GPUS_HEALTHCHECK_PORT,
    GPUClusterSpec,
)
from gpu_operator.core import images
from gpu_operator.core.components import BY_NAME, Image
from gpu_operator.core.psa import ADMIN_ACCESS_LABEL
from gpu_operator.core.render import ClusterFacts, environment, render_folder
from gpu_operator.core.template_functions import pull_secrets, user_labels

RESOURCE_API = "resource.k8s.io/v1"
"""The resource.k8s.io version of DeviceClasses and ResourceClaimTemplates (GA since Kubernetes 1.34)."""

DRA_DRIVER_IMAGE_ENV = "DRA_DRIVER_IMAGE"
DRA_DRIVER = Image("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0")
"""NVIDIA's chart default (deployments/gpu-operator/values.yaml, draDriver)."""

DRA_DRIVER_FOLDER = "dra-driver"
DCGM_FOLDER = "dcgm-dra"
EXPORTER_FOLDER = "dcgm-exporter-dra"
VALIDATOR_FOLDER = "dra-validator"
FOLDERS = (DRA_DRIVER_FOLDER, DCGM_FOLDER, EXPORTER_FOLDER, VALIDATOR_FOLDER)
"""NVIDIA's state order; each folder is also the component label and the suffix of the deploy label
its DaemonSet selects (`nvidia.com/gpu.deploy.<folder>`)."""

REMOTE_HOSTENGINE = "nvidia-dcgm-dra:5555"
DEFAULT_COLLECTORS = "/etc/dcgm-exporter/dcp-metrics-included.csv"
CUSTOM_COLLECTORS = "/etc/dcgm-exporter/dcgm-metrics.csv"
DEFAULT_JOB_MAPPING_DIR = "/var/lib/dcgm-exporter/job-mapping"
NAMESPACE_LABELS = {ADMIN_ACCESS_LABEL: "true"}
"""What the operand namespace must carry before the DRA stack's admin-access claims (DCGM, the exporter,
the validator) exist: the API server refuses a ResourceClaim or ResourceClaimTemplate with an adminAccess
request, dry runs included, in a namespace not labelled so. NVIDIA's controller sets it before each sync
and never takes it back (gpucluster_controller.go ensureAdminAccessLabel): other admin-access users of the
namespace may rely on it."""
DEFAULT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NOT_ON_PODS = frozenset({"app", "app.kubernetes.io/part-of"})
"""`daemonsets.labels` keys NVIDIA's assets leave off the pods (they would break the selectors)."""


def feature_gates(gates: Mapping[str, bool] | None) -> str | None:
    """FEATURE_GATES as NVIDIA writes it (convertStringMapToCommaSeparatedString): sorted by name."""
    if not gates:
        return None
    return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))


def _largest(lists: Iterable[Mapping[str, int | str] | None]) -> dict[str, int | str]:
    found: dict[str, int | str] = {}
    for amounts in lists:
        for name, amount in (amounts or {}).items():
            if name not in found or quantity_value(amount) > quantity_value(found[name]):
                found[name] = amount
    return found


def largest_resources(requirements: Iterable[ResourceRequirements | None]) -> dict[str, Any] | None:
    """NVIDIA's maxResourceRequirements (dra_driver.go): per resource the largest request and the largest
    limit over the containers, a limit raised to a larger request so that the result stays valid, and no
    limit added for a resource that none of them limited."""
    given = [r for r in requirements if r is not None]
    requests = _largest(r.requests for r in given)
    limits = _largest(r.limits for r in given)
    for name, request in requests.items():
        if name in limits and quantity_value(request) > quantity_value(limits[name]):
            limits[name] = request
    result = {key: value for key, value in (("limits", limits), ("requests", requests)) if value}
    return result or None


def _image(section: Any, default: Image, env_var: str, facts: ClusterFacts) -> str:
    return images.resolve(section, default, env_var, facts.environ)


def _validator_image(facts: ClusterFacts) -> str:
    validator = BY_NAME["operator-validator"]
    return images.resolve(_NO_IMAGE, validator.default_image, validator.image_env, facts.environ)


class _NoImage:
    repository = image = version = None


_NO_IMAGE: Any = _NoImage()


def _dump(model: Any) -> dict[str, Any]:
    return {} if model is None else dict(model.model_dump(mode="json", exclude_none=True))


def _kubelet_dir(spec: GPUClusterSpec) -> str:
    return spec.hostPaths.kubeletRootDir.rstrip("/") or "/"


def context(spec: GPUClusterSpec, facts: ClusterFacts, resource_api: str = RESOURCE_API) -> dict[str, Any]:
    """The values the GPUCluster's templates read."""
    dra = spec.draDriver
    compute_domains = dra.computeDomains if dra.compute_domains_enabled() else None
    daemonsets = spec.daemonsets
    labels = user_labels(daemonsets.labels)
    exporter = spec.dcgmExporter
    dcgm, exporter_component = BY_NAME["dcgm"], BY_NAME["dcgm-exporter"]
    kubelet = _kubelet_dir(spec)
    tolerations: list[Any] = list(daemonsets.tolerations or ()) or [DEFAULT_TOLERATION]
    job_mapping = exporter.hpcJobMapping if exporter is not None else None
    return {
        "spec": spec,
        "dra": dra,
        "compute_domains": compute_domains,
        "namespace": facts.namespace,
        "resource_api": resource_api,
        "labels": labels,
        "pod_labels": {k: v for k, v in labels.items() if k not in NOT_ON_PODS},
        "annotations": daemonsets.annotations or {},
        "tolerations": tolerations,
        "priority_class": daemonsets.priorityClassName,
        "dra_image": _image(dra, DRA_DRIVER, DRA_DRIVER_IMAGE_ENV, facts),
        "dra_pull_secrets": [{"name": name} for name in dra.imagePullSecrets or ()],
        "validator_image": _validator_image(facts),
        "feature_gates": feature_gates(dra.featureGates),
        "passthrough": dra.feature_gate("PassthroughSupport"),
        "mps": dra.feature_gate("MPSSupport"),
        "gpus_port": dra.gpus.kubeletPlugin.healthcheck_port(GPUS_HEALTHCHECK_PORT),
        "cd_port": (
            compute_domains.kubeletPlugin.healthcheck_port(COMPUTE_DOMAINS_HEALTHCHECK_PORT)
            if compute_domains
            else None
        ),
        "init_resources": largest_resources(
            [dra.gpus.kubeletPlugin.resources]
            + ([compute_domains.kubeletPlugin.resources] if compute_domains else [])
        ),
        "kubelet_dir": kubelet,
        "dcgm_spec": spec.dcgm,
        "dcgm_image": _image(spec.dcgm, dcgm.default_image, dcgm.image_env, facts) if spec.dcgm else None,
        "exporter": exporter,
        "exporter_image": (
            _image(exporter, exporter_component.default_image, exporter_component.image_env, facts)
            if exporter is not None
            else None
        ),
        "exporter_pull_secrets": pull_secrets(exporter) if exporter is not None else [],
        "pull_secrets_of": pull_secrets,
        "dump": _dump,
        "remote_hostengine": REMOTE_HOSTENGINE if spec.dcgm_enabled() else None,
        "collectors": (
            CUSTOM_COLLECTORS if exporter and exporter.config and exporter.config.name else DEFAULT_COLLECTORS
        ),
        "job_mapping_dir": (
            (job_mapping.directory or DEFAULT_JOB_MAPPING_DIR)
            if job_mapping and job_mapping.enabled
            else None
        ),
        "pod_resources_dir": f"{kubelet.rstrip('/')}/pod-resources",
        "service_monitor": bool(
            exporter is not None and exporter.service_monitor_enabled() and facts.service_monitor_crd
        ),
    }


def enabled_folders(spec: GPUClusterSpec) -> list[str]:
    """The states that render objects for this spec (NVIDIA's isEnabled of each)."""
    wanted = {
        DRA_DRIVER_FOLDER: True,
        DCGM_FOLDER: spec.dcgm_enabled(),
        EXPORTER_FOLDER: spec.exporter_enabled(),
        VALIDATOR_FOLDER: True,
    }
    return [folder for folder in FOLDERS if wanted[folder]]


def render_gpucluster(
    spec: GPUClusterSpec,
    facts: ClusterFacts,
    resource_api: str = RESOURCE_API,
    folders: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """The objects of a GPUCluster, state by state in NVIDIA's order, each state's in apply order
    (ServiceAccount and RBAC, DeviceClasses, ResourceClaimTemplates, Services, workloads, admission
    policy). `folders`: only these states (default: every enabled one)."""
    environment()  # compiled once, shared with the ClusterPolicy's templates
    values = context(spec, facts, resource_api)
    objects: list[dict[str, Any]] = []
    for folder in enabled_folders(spec) if folders is None else folders:
        objects.extend(render_folder(folder, folder, values, facts.namespace))
    return objects


__all__ = [
    "FOLDERS",
    "NAMESPACE_LABELS",
    "RESOURCE_API",
    "context",
    "feature_gates",
    "largest_resources",
    "render_gpucluster",
]
