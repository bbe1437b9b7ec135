"""The `nvidia.com/v1alpha1 GPUCluster` API: the DRA stack (NVIDIA's DRA driver for GPUs and
ComputeDomains, its DeviceClasses, DCGM and its exporter, the DRA validator), with NVIDIA's field names,
defaults and rules, so that NVIDIA's own GPUCluster objects are accepted unchanged.

Followed: NVIDIA gpu-operator v26.7.0, api/nvidia/v1alpha1/gpucluster_types.go and the controller's
reading of it (internal/state/gpucluster.go, dra_driver.go, dcgm_exporter.go). What the defaults mean
there, kept here:

- `draDriver.computeDomains` absent: the capability is off (IsComputeDomainsEnabled reads a nil
  `enabled` as false); present, `enabled` defaults to true (the CRD's default applies once the section
  exists). The same for a kubelet plugin's `healthcheck`.
- `dcgm` absent or without `enabled: true`: off (the standalone hostengine is opt-in, dcgmEnabled).
  `dcgmExporter` absent: off; present, on unless `enabled: false` (the reused v1 IsEnabled).
- `hostPaths` has no `rootFS`: the DRA stack always reads the host's root at `/`. NVIDIA's own sample
  sets `rootFS: "/"` anyway (its API server prunes it); ours accepts it and reports any other value as
  ignored (`ignored_fields`), so the sample is accepted as is.
- NVIDIA's CRD refuses any name but `gpu-cluster` (a CEL rule on the object, kept in our CRD).

One addition, not in NVIDIA's API: `spec.nodeSelector`. Absent, the GPUCluster takes every GPU node, as
NVIDIA's does; set, only the GPU nodes with those labels, and the rest keep the ClusterPolicy's device
plugin (core/allocators.py decides which node is whose).

DCGM, the exporter, the shared DaemonSet settings, env and resources are the ClusterPolicy's models, so
both APIs accept and refuse the same values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from gpu_operator.api import GROUP, FieldError, PolicyError, parse_model, parse_whole
from gpu_operator.api.common import (
    IMAGE_RULES,
    EnvList,
    HostDir,
    HostPath,
    ImageVersion,
    Labels,
    Model,
    PullSecrets,
    Repository,
    ResourceRequirements,
    check_image,
    crd_schema,
)
from gpu_operator.api.quoting import quoted
from gpu_operator.api.spec import DaemonsetsSpec, DCGMExporterSpec, DCGMSpec, without_registry
from gpu_operator.api.status import Condition

VERSION = "v1alpha1"
KIND = "GPUCluster"
PLURAL = "gpuclusters"
SHORT_NAMES = ("gc",)
API_VERSION = f"{GROUP}/{VERSION}"

SINGLETON_NAME = "gpu-cluster"
SINGLETON_RULE = f"self.metadata.name == '{SINGLETON_NAME}'"
"""NVIDIA's CEL rule on the object (gpucluster_types.go), verbatim."""
SINGLETON_MESSAGE = f"GPUCluster is a singleton, metadata.name must be '{SINGLETON_NAME}'"

GPUS_HEALTHCHECK_PORT = 51516
COMPUTE_DOMAINS_HEALTHCHECK_PORT = 51515
"""The kubelet plugins' gRPC health ports when none is set (dra_driver.go, from NVIDIA's DRA driver
chart)."""

DRA_IMAGE_NAME = r"^[a-zA-Z0-9\-]+$"
"""NVIDIA's pattern for `draDriver.image`: a bare name, the registry path goes in `repository`."""

State = Literal["ready", "notReady", "disabled"]


class HealthcheckSpec(Model):
    """The gRPC health service of a kubelet plugin container, checked by its startup and liveness
    probes."""

    enabled: bool = True
    """Serve the health service and probe it (default true); false turns both off."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Port of the health service (default 51516 for the gpus container, 51515 for computeDomains)."""


class KubeletPluginSpec(Model):
    """One container of the DRA kubelet plugin DaemonSet (gpus or computeDomains)."""

    env: EnvList | None = None
    """Environment variables added to the container."""
    resources: ResourceRequirements | None = None
    """Resources of the container."""
    healthcheck: HealthcheckSpec | None = None
    """Its gRPC health service and probes (default: on, at the container's default port)."""

    def healthcheck_port(self, default: int) -> int:
        """The port the probes check; -1 when the health service is off (the plugin reads -1 as off,
        and the template then renders no probe)."""
        if self.healthcheck is None:
            return default
        if not self.healthcheck.enabled:
            return -1
        return self.healthcheck.port or default


class ControllerSpec(Model):
    """The ComputeDomain controller Deployment; where it runs is not configurable (NVIDIA's)."""

    env: EnvList | None = None
    """Environment variables added to the controller container."""
    resources: ResourceRequirements | None = None
    """Resources of the controller container."""


class GPUsSpec(Model):
    """The gpu.nvidia.com capability (whole GPUs, MIG devices, vfio GPUs): always deployed."""

    kubeletPlugin: KubeletPluginSpec = Field(default_factory=KubeletPluginSpec)
    """The gpus container of the kubelet plugin."""


class ComputeDomainsSpec(Model):
    """The compute-domain.nvidia.com capability (multi-node NVLink): the kubelet plugin's
    computeDomains container and the ComputeDomain controller."""

    enabled: bool = True
    """Deploy the capability (default true once this section is given; absent, it is off)."""
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    """The ComputeDomain controller Deployment."""
    kubeletPlugin: KubeletPluginSpec = Field(default_factory=KubeletPluginSpec)
    """The computeDomains container of the kubelet plugin."""


class DRADriverSpec(Model):
    """NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): its kubelet plugin on every node of the
    GPUCluster, and the ComputeDomain controller when computeDomains is enabled."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": IMAGE_RULES})

    repository: Repository | None = None
    """Image registry and path, e.g. nvcr.io/nvidia."""
    image: (
        Annotated[
            str,
            Field(max_length=128, pattern=DRA_IMAGE_NAME),
            crd_schema(pattern=DRA_IMAGE_NAME),
        ]
        | None
    ) = None
    """Image name (letters, digits and '-'), e.g. dra-driver-nvidia-gpu."""
    version: ImageVersion | None = None
    """Image tag, or a digest 'sha256:...'."""
    imagePullPolicy: Literal["Always", "Never", "IfNotPresent"] | None = None
    """Image pull policy of the DRA driver and its validator containers."""
    imagePullSecrets: PullSecrets | None = None
    """Names of Secrets in the operand namespace used to pull the images."""
    featureGates: Annotated[dict[str, bool], Field(max_length=64)] | None = None
    """The DRA driver's feature gates (e.g. MPSSupport: true), given to it as FEATURE_GATES."""
    gpus: GPUsSpec = Field(default_factory=GPUsSpec)
    """The gpu.nvidia.com capability."""
    computeDomains: ComputeDomainsSpec | None = None
    """The compute-domain capability; absent, it is off."""

    def compute_domains_enabled(self) -> bool:
        return self.computeDomains is not None and self.computeDomains.enabled

    def feature_gate(self, name: str) -> bool:
        return bool((self.featureGates or {}).get(name))

    @model_validator(mode="after")
    def _complete_image(self) -> DRADriverSpec:
        check_image(self.repository, self.image, self.version)
        return self


class HostPathsSpec(Model):
    """Host paths of the DRA stack's volumes."""

    driverInstallDir: HostDir = "/run/nvidia/driver"
    """Where the driver's files are on the host (a containerized driver's root)."""
    kubeletRootDir: HostDir = "/var/lib/kubelet"
    """The kubelet's root directory (its plugins, plugin registry and pod-resources are below it)."""
    rootFS: HostPath | None = None
    """Not in NVIDIA's GPUCluster API (its API server drops it): the DRA stack reads the host's root at
    `/`. Accepted so that NVIDIA's sample, which sets it to "/", is valid; any other value is ignored and
    reported."""


class GPUClusterSpec(Model):
    """Desired state of the DRA stack: NVIDIA's DRA driver (its kubelet plugin, DeviceClasses and the
    ComputeDomain controller), DCGM, DCGM exporter and the DRA validator, on the GPU nodes it selects.
    The driver itself is not part of it: it comes from the ClusterPolicy, NVIDIADrivers or the host, and
    the DRA kubelet plugin waits for it on each node."""

    draDriver: DRADriverSpec = Field(default_factory=DRADriverSpec)
    """NVIDIA's DRA driver for GPUs and ComputeDomains."""
    dcgm: DCGMSpec | None = None
    """The standalone DCGM hostengine; off unless enabled is true (the exporter then uses it instead of
    its embedded hostengine)."""
    dcgmExporter: DCGMExporterSpec | None = None
    """DCGM exporter; absent, it is off; given, on unless enabled is false."""
    hostPaths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    """Host paths of the DRA stack's volumes."""
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    """Settings common to every DaemonSet of the DRA stack (and the ComputeDomain controller)."""
    nodeSelector: Labels | None = None
    """Not in NVIDIA's API: the GPU nodes this GPUCluster takes (those with all these labels). Absent or
    {}: every GPU node, as NVIDIA's. The other GPU nodes keep the ClusterPolicy's device plugin."""

    def dcgm_enabled(self) -> bool:
        return self.dcgm is not None and self.dcgm.enabled is True

    def exporter_enabled(self) -> bool:
        return self.dcgmExporter is not None and self.dcgmExporter.enabled is not False

    def images_without_registry(self) -> list[str]:
        """The deployed images named without a registry host (ClusterPolicySpec's check: the pods would
        wait on a Docker Hub image that does not exist)."""
        sections: list[tuple[str, DRADriverSpec | DCGMSpec | DCGMExporterSpec]] = [
            ("spec.draDriver", self.draDriver)
        ]
        if self.dcgm is not None and self.dcgm_enabled():
            sections.append(("spec.dcgm", self.dcgm))
        if self.dcgmExporter is not None and self.exporter_enabled():
            sections.append(("spec.dcgmExporter", self.dcgmExporter))
        found = (without_registry(path, s.repository, s.image, s.version) for path, s in sections)
        return [problem for problem in found if problem is not None]

    def ignored_fields(self) -> list[str]:
        """Fields the user set that are accepted but not acted on, each with the reason."""
        root = self.hostPaths.rootFS
        if root is not None and root.rstrip("/") != "":
            return [
                f"spec.hostPaths.rootFS: {quoted(root)} is ignored: the DRA stack reads the host's root at "
                "/ (NVIDIA's GPUCluster has no rootFS)"
            ]
        return []


class GPUClusterStatus(Model):
    """Observed state of the DRA stack, as NVIDIA's operator writes it."""

    state: State | None = None
    """ready, notReady or disabled."""
    namespace: str | None = None
    """Namespace of the DRA stack's pods."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready and Error, as NVIDIA's operator writes them."""


def parse_gpucluster_spec(spec: Any) -> GPUClusterSpec:
    """Validate a GPUCluster `spec`; raise PolicyError naming every bad field."""
    return parse_model(GPUClusterSpec, spec)


def parse_gpucluster_document(doc: Any) -> GPUClusterSpec:
    """Validate a whole GPUCluster document (apiVersion, kind, metadata.name, spec). The name rule is
    NVIDIA's CRD's (a singleton): checked here too, so `gpu-operator validate` says it first."""
    errors: list[FieldError] = []
    spec: GPUClusterSpec | None = None
    try:
        spec = parse_whole(doc, API_VERSION, KIND, parse_gpucluster_spec)
    except PolicyError as exc:
        errors.extend(exc.errors)
    metadata = doc.get("metadata") if isinstance(doc, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if name and name != SINGLETON_NAME:
        errors.append(FieldError("metadata.name", f"{quoted(name)}: {SINGLETON_MESSAGE}"))
    if errors or spec is None:
        raise PolicyError(errors)
    return spec
