"""The `nvidia.com/v1alpha1 NVIDIADriver` API: one driver (type, image, settings) per pool of GPU nodes,
with NVIDIA's field names, defaults and rules, so that NVIDIA's own NVIDIADriver objects are accepted
unchanged.

Followed: NVIDIA gpu-operator v26.7.0, api/nvidia/v1alpha1/nvidiadriver_types.go. Three kinds of rule:

- NVIDIA's CRD rules (kubebuilder markers and CEL): the enums and defaults, `driverType` and
  `usePrecompiled` immutable, a `default: true` driver without nodeSelector. The CEL rules go into our
  CRD with NVIDIA's messages; the others are checked here too.
- What NVIDIA's controller refuses about one object when it reconciles it (ValidateNodeSelector, and
  controllers/nvidiadriver_controller.go): the reserved owner label in nodeSelector, GDS or GDRCopy with
  precompiled drivers, a GDS that needs the open kernel modules. Checked here, so `gpu-operator validate`
  and the status say so before anything is deployed; the CRD does not refuse them, as NVIDIA's does not.
- What is wrong across objects (two default drivers, two drivers selecting one node) is not a property
  of one document: the controller decides it.

Every other shape (images, probes, env, resources, tolerations, upgrade policy) is the ClusterPolicy's
model, so the two APIs accept and refuse the same values.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpu_operator.api import GROUP, image_reference, parse_model, parse_whole
from gpu_operator.api.affinity import NodeAffinity
from gpu_operator.api.common import (
    IMAGE_RULES,
    LIST_MAX,
    Annotations,
    Args,
    ComponentSpec,
    ConfigMapRef,
    EnvList,
    ImageName,
    ImageVersion,
    Labels,
    Model,
    NameRef,
    PodSecurityContext,
    ProbeSpec,
    PullSecrets,
    Repository,
    ResourceRequirements,
    Toleration,
    check_image,
    crd_schema,
)
from gpu_operator.api.quoting import quoted
from gpu_operator.api.spec import (
    DriverManagerSpec,
    GDRCopySpec,
    GDSSpec,
    RDMASpec,
    without_registry,
)
from gpu_operator.api.status import Condition, DriverUpgradeStatus
from gpu_operator.api.upgrade_policy import UpgradePolicySpec

VERSION = "v1alpha1"
KIND = "NVIDIADriver"
PLURAL = "nvidiadrivers"
SHORT_NAMES = ("nvd", "nvdriver", "nvdrivers")
API_VERSION = f"{GROUP}/{VERSION}"

OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"
"""The node label NVIDIA's operator sets to the name of the NVIDIADriver that owns the node's driver
(internal/consts/consts.go:71); a nodeSelector may not use it (nvidiadriver_types.go:563)."""
DEFAULT_IMAGE = "nvcr.io/nvidia/driver"
"""NVIDIA's default for `image` (nvidiadriver_types.go:107)."""
GDS_NEEDS_OPEN_MODULES = (2, 17, 5)
"""GDS from this version on works with the open kernel modules only (MinimumGDSVersionForOpenRM,
internal/consts/consts.go:74)."""

DriverType = Literal["gpu", "vgpu", "vgpu-host-manager"]
State = Literal["ignored", "ready", "notReady", "disabled"]

# Condition reasons NVIDIA's NVIDIADriver controller writes besides the ClusterPolicy's
# (internal/conditions/nvidiadriver.go, consts.go).
REASON_CONFLICTING_NODE_SELECTOR = "ConflictingNodeSelector"
REASON_DRIVER_NOT_READY = "DriverNotReady"


def _immutable(field: str) -> Any:
    """NVIDIA's transition rule (nvidiadriver_types.go:57 and :64): the API server refuses an update that
    changes the field; pydantic sees one object at a time, so only the CRD can say it."""
    message = (
        f"{field} is an immutable field. Please create a new NvidiaDriver resource instead when you "
        "want to change this setting."
    )
    return crd_schema(**{"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]})


DEFAULT_WITHOUT_SELECTOR_RULE = (
    "has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 : true"
)
"""NVIDIA's CEL rule on the spec (nvidiadriver_types.go:45), verbatim."""
DEFAULT_WITHOUT_SELECTOR_MESSAGE = "default NVIDIADriver must not use nodeSelector"


class DriverManagerWithSecrets(DriverManagerSpec):
    """The k8s-driver-manager init container that prepares a node for a driver (re)install."""

    # The ClusterPolicy's driver manager has no pull secrets of its own (NVIDIA's v1 type has the field
    # but no transform reads it); NVIDIA's NVIDIADriver controller adds these to the driver pod's
    # (internal/state/testdata/golden/driver-full-spec.yaml).
    imagePullSecrets: PullSecrets | None = None
    """Names of Secrets used to pull the driver manager image (added to the driver pod's)."""


class LicensingConfig(Model):
    """vGPU guest licensing."""

    secretName: NameRef | None = None
    """Secret with the licensing configuration (gridd.conf) and client token."""
    name: NameRef | None = None
    """Deprecated: ConfigMap with gridd.conf; use secretName, which keeps the token out of ConfigMaps."""
    nlsEnabled: bool | None = None
    """License through the NVIDIA License System (default true)."""


class DriverUpgradePolicy(UpgradePolicySpec):
    """Automatic, rolling driver upgrades of this driver's nodes, node by node: cordon, wait for jobs,
    evict GPU pods, drain, restart the driver pod, validate, uncordon. The ClusterPolicy's policy with
    one difference, NVIDIA's: automatic upgrades are on by default."""

    autoUpgrade: bool = True
    """Let the operator upgrade the driver node by node (default true, NVIDIA's for NVIDIADriver); when
    false each node waits for you to delete its driver pod, and all other fields are ignored."""


class NVIDIADriverSpec(Model):
    """Desired state of one NVIDIA driver, deployed on the GPU nodes its nodeSelector selects (or, for the
    default driver, on every GPU node no other NVIDIADriver selects)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": DEFAULT_WITHOUT_SELECTOR_RULE,
                    "message": DEFAULT_WITHOUT_SELECTOR_MESSAGE,
                    "fieldPath": ".nodeSelector",
                },
                *IMAGE_RULES,
            ]
        }
    )

    default: bool = False
    """This driver is the fallback: it serves every GPU node that no other NVIDIADriver's nodeSelector
    selects. At most one NVIDIADriver is the default, and it has no nodeSelector."""
    driverType: Annotated[DriverType, _immutable("driverType")] = "gpu"
    """gpu (the data-center driver), vgpu (the vGPU guest driver) or vgpu-host-manager (the vGPU host
    manager). Immutable: create another NVIDIADriver to change it."""
    usePrecompiled: Annotated[bool | None, _immutable("usePrecompiled")] = None
    """Use precompiled driver images (tag <version>-<kernel>-<os>; version is then the driver branch, e.g.
    595). Immutable: create another NVIDIADriver to change it."""
    useOpenKernelModules: bool | None = None
    """Deprecated and ignored, as by NVIDIA's operator: use kernelModuleType: open."""
    kernelModuleType: Literal["auto", "open", "proprietary"] = "auto"
    """Which kernel modules to build and load; auto picks what the GPUs and the driver branch need."""
    startupProbe: ProbeSpec | None = None
    """Startup probe timing of the driver container."""
    livenessProbe: ProbeSpec | None = None
    """Liveness probe timing of the driver container."""
    readinessProbe: ProbeSpec | None = None
    """Readiness probe timing of the driver container."""
    rdma: RDMASpec | None = None
    """GPUDirect RDMA (nvidia-peermem)."""
    gds: GDSSpec | None = None
    """GPUDirect Storage (nvidia-fs); not with usePrecompiled."""
    gdrcopy: GDRCopySpec | None = None
    """GDRCopy (gdrdrv); not with usePrecompiled."""
    repository: Repository | None = None
    """Image registry and path, e.g. nvcr.io/nvidia."""
    image: ImageName = DEFAULT_IMAGE
    """Image name; alone (without repository and version) the whole image reference."""
    version: ImageVersion | None = Field(default=None, validate_default=True)
    """Driver version (the image tag before its -<os> suffix), or a digest 'sha256:...'; the driver
    branch (e.g. 595) with usePrecompiled."""
    imagePullPolicy: Literal["Always", "Never", "IfNotPresent"] | None = None
    """Image pull policy (default IfNotPresent)."""
    imagePullSecrets: PullSecrets | None = None
    """Names of Secrets in the operand namespace used to pull the images."""
    manager: DriverManagerWithSecrets | None = None
    """k8s-driver-manager init container."""
    resources: ResourceRequirements | None = None
    """Resources of the driver container."""
    args: Args | None = None
    """Arguments that replace the driver container's default arguments."""
    env: EnvList | None = None
    """Environment variables set on the driver container."""
    repoConfig: ConfigMapRef | None = None
    """ConfigMap with package repository files for the driver container (a private mirror)."""
    certConfig: ConfigMapRef | None = None
    """ConfigMap with extra CA certificates for package repositories."""
    licensingConfig: LicensingConfig | None = None
    """vGPU guest licensing."""
    virtualTopologyConfig: ConfigMapRef | None = None
    """ConfigMap with the vGPU virtual topology daemon configuration (nvidia-topologyd.conf)."""
    kernelModuleConfig: ConfigMapRef | None = None
    """ConfigMap with kernel module parameters."""
    secretEnv: NameRef | None = None
    """Secret whose keys become environment variables of the driver container."""
    upgradePolicy: DriverUpgradePolicy | None = None
    """Driver upgrade policy; absent, upgrades are automatic with the defaults (autoUpgrade true)."""
    nodeSelector: Labels | None = None
    """The GPU nodes this driver serves: those with all these labels (absent or {}: every GPU node).
    Two NVIDIADrivers may not select the same node; the default driver has none."""
    nodeAffinity: NodeAffinity | None = None
    """Node affinity of the driver pods."""
    labels: Labels | None = None
    """Labels added to the driver DaemonSet and its pods."""
    annotations: Annotations | None = None
    """Annotations added to the driver DaemonSet and its pods."""
    tolerations: Annotated[list[Toleration], Field(max_length=LIST_MAX)] | None = None
    """Tolerations of the driver pods, added to the default nvidia.com/gpu toleration."""
    priorityClassName: NameRef | None = None
    """PriorityClass of the driver pods (default system-node-critical)."""
    podSecurityContext: PodSecurityContext | None = None
    """Pod-level security context of the driver pods."""
    hostNetwork: bool | None = None
    """Run the driver pods in the host's network namespace."""

    SIDECARS: ClassVar[tuple[str, ...]] = ("gds", "gdrcopy")

    @model_validator(mode="after")
    def _complete_image(self) -> NVIDIADriverSpec:
        check_image(self.repository, self.image, self.version)
        return self

    @field_validator("version", mode="after")
    @classmethod
    def _a_tag_to_build_on(cls, version: str | None, info: ValidationInfo) -> str | None:
        # NVIDIA appends the node's OS (and kernel, with precompiled drivers) to the tag (GetImagePath,
        # GetPrecompiledImagePath: nvidiadriver_types.go:594-696). Without a tag there is nothing to
        # append to (it would go on the image name: no such image exists); precompiled tags cannot come
        # from a digest, and NVIDIA refuses one (:683).
        image = info.data.get("image")
        if not isinstance(image, str):
            return version  # already reported
        if version is None and image_reference.name_of(image) == image:
            raise ValueError(
                f"required: image {quoted(image)} has no tag, so version must give the driver version "
                "(e.g. 595.91.07, or the branch 595 with usePrecompiled)"
            )
        if info.data.get("usePrecompiled") and "sha256:" in f"{image}@{version}":
            raise ValueError(
                "a digest cannot be used with usePrecompiled (the tag is <version>-<kernel>-<os>)"
            )
        return version

    @field_validator("gds", "gdrcopy", mode="after")
    @classmethod
    def _sidecars_build_on_the_node(
        cls, section: ComponentSpec | None, info: ValidationInfo
    ) -> ComponentSpec | None:
        # nvidiadriver_controller.go:163: their modules are built against the driver on the node.
        if section is not None and section.is_enabled() and info.data.get("usePrecompiled"):
            raise ValueError("enabled is not supported with usePrecompiled (precompiled drivers)")
        return section

    @field_validator("gds", mode="after")
    @classmethod
    def _gds_kernel_modules(cls, gds: GDSSpec | None, info: ValidationInfo) -> GDSSpec | None:
        # nvidiadriver_controller.go:173 (IsOpenKernelModulesRequired, nvidiadriver_types.go:722).
        if gds is None or not gds.is_enabled() or info.data.get("kernelModuleType") == "open":
            return gds
        version = gds.version or ""
        if version.startswith("sha256") or _semver_at_least(version, GDS_NEEDS_OPEN_MODULES):
            minimum = ".".join(map(str, GDS_NEEDS_OPEN_MODULES))
            raise ValueError(
                f"version {quoted(version)} (a digest, or {minimum} or later) works with the open kernel "
                "modules only: set kernelModuleType: open"
            )
        return gds

    @field_validator("nodeSelector", mode="after")
    @classmethod
    def _selector(cls, selector: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        if not selector:
            return selector
        if info.data.get("default"):
            # NVIDIA's CEL rule (nvidiadriver_types.go:45) and ValidateNodeSelector (:560).
            raise ValueError(
                f"{DEFAULT_WITHOUT_SELECTOR_MESSAGE}: the default driver serves every GPU node no other "
                "NVIDIADriver selects"
            )
        if OWNER_LABEL in selector:
            raise ValueError(
                f"cannot use the reserved label {OWNER_LABEL}: the operator sets it to the NVIDIADriver "
                "that owns the node"
            )
        return selector

    def upgrade_policy(self) -> DriverUpgradePolicy:
        """The upgrade policy with NVIDIA's defaults where absent (GetUpgradePolicyWithDefaults)."""
        return self.upgradePolicy or DriverUpgradePolicy()

    def images_without_registry(self) -> list[str]:
        """The images this driver deploys that name no registry host (ClusterPolicySpec's check)."""
        sections: list[tuple[str, ComponentSpec | DriverManagerSpec | NVIDIADriverSpec]] = [("spec", self)]
        if self.manager is not None:
            sections.append(("spec.manager", self.manager))
        sections += [
            (f"spec.{name}", section)
            for name in self.SIDECARS
            if isinstance(section := getattr(self, name), ComponentSpec) and section.is_enabled()
        ]
        found = (without_registry(path, spec.repository, spec.image, spec.version) for path, spec in sections)
        return [problem for problem in found if problem is not None]

    def ignored_fields(self) -> list[str]:
        """Fields the user set that are accepted but not acted on, each with the reason."""
        if self.useOpenKernelModules:
            return [
                "spec.useOpenKernelModules: deprecated and ignored, as by NVIDIA's operator; use "
                "kernelModuleType: open"
            ]
        return []


_SEMVER = re.compile(r"^v?([0-9]+)(?:\.([0-9]+)(?:\.([0-9]+)(-[0-9A-Za-z.-]+)?)?)?(\+[0-9A-Za-z.-]+)?$")


def _semver_at_least(version: str, minimum: tuple[int, int, int]) -> bool:
    """golang.org/x/mod/semver's Compare(v+version, minimum) >= 0, as NVIDIA compares GDS versions: a
    version that does not parse is older than any that does, and a pre-release older than its release."""
    found = _SEMVER.fullmatch(version)
    if found is None:
        return False
    numbers = tuple(int(part or 0) for part in found.group(1, 2, 3))
    if numbers != minimum:
        return numbers > minimum
    return found.group(4) is None


# `nodesDesired`, `nodesReady` and `driverUpgrade` are additions: NVIDIA's NVIDIADriverStatus has no
# such fields. `kubectl get nvidiadrivers` shows how far each pool is, and each NVIDIADriver's
# upgradePolicy upgrades its own nodes (core/driver_pool_upgrade.py), so its status says where that
# upgrade stands, as the ClusterPolicy's status.driverUpgrade does for its driver.
class NVIDIADriverStatus(Model):
    """Observed state of the driver, as NVIDIA's operator writes it, its nodes and their upgrade
    (nodesDesired, nodesReady and driverUpgrade: additions of this operator)."""

    state: State | None = None
    """ready, notReady, disabled (the ClusterPolicy does not delegate its driver to NVIDIADrivers) or
    ignored."""
    namespace: str | None = None
    """Namespace of the driver pods."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready and Error, as NVIDIA's operator writes them."""
    nodesDesired: int | None = None
    """GPU nodes this driver owns (its pool); absent while the ClusterPolicy does not delegate its
    driver. Not in NVIDIA's operator's status."""
    nodesReady: int | None = None
    """Nodes where one of its driver pods is ready. Not in NVIDIA's operator's status."""
    driverUpgrade: DriverUpgradeStatus | None = None
    """Driver upgrades of this driver's nodes (spec.upgradePolicy): per node step, since when and why;
    absent while the ClusterPolicy does not delegate its driver. Not in NVIDIA's operator's status."""


def parse_driver_spec(spec: Any) -> NVIDIADriverSpec:
    """Validate an NVIDIADriver `spec`; raise PolicyError naming every bad field."""
    return parse_model(NVIDIADriverSpec, spec)


def parse_driver_document(doc: Any) -> NVIDIADriverSpec:
    """Validate a whole NVIDIADriver document (apiVersion, kind, metadata.name, spec)."""
    return parse_whole(doc, API_VERSION, KIND, parse_driver_spec, article="an")
