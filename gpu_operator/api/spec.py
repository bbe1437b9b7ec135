"""The `nvidia.com/v1 ClusterPolicy` spec with NVIDIA's field names, defaults and semantics.

Every section is optional: `spec: {}` means "all defaults". Defaults of `enabled` follow NVIDIA's
Go `IsEnabled()` helpers (not their Helm values): driver, toolkit, device plugin, DCGM, DCGM exporter,
GFD and MIG manager are on; node-status exporter and the sandbox/vGPU/kata/cc/GDS/GDRCopy sections off.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from gpu_operator.api import image_reference
from gpu_operator.api.common import (
    IMAGE_RULES,
    LIST_MAX,
    PULL_SECRETS_MAX,
    Annotations,
    ComponentSpec,
    ConfigMapRef,
    ConfigWithDefault,
    DNSLabel,
    EnvList,
    FreeForm,
    HostDir,
    HostPath,
    ImageName,
    ImageVersion,
    IntOrPercent,
    Labels,
    Model,
    NameRef,
    OffByDefault,
    PodSecurityContext,
    ProbeSpec,
    Repository,
    ShortText,
    Toleration,
    check_image,
    crd_schema,
)
from gpu_operator.api.quoting import quoted
from gpu_operator.api.upgrade_policy import UpgradePolicySpec


class InitContainerSpec(Model):
    """Deprecated image spec of the operator's init container (accepted, unused)."""

    repository: ShortText | None = None
    """Image registry and path."""
    image: ShortText | None = None
    """Image name."""
    version: ShortText | None = None
    """Image tag."""
    imagePullPolicy: ShortText | None = None
    """Image pull policy."""
    imagePullSecrets: Annotated[list[ShortText], Field(max_length=PULL_SECRETS_MAX)] | None = None
    """Pull secret names."""


# monitoring.coreos.com/v1 Duration, as the Prometheus operator's CRD checks it.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


def _duration(value: str) -> str:
    if not value or not re.fullmatch(_DURATION, value, re.ASCII):
        raise ValueError(f"{quoted(value)} is not a Prometheus duration such as '15s' or '1m30s'")
    return value


Duration = Annotated[
    str, Field(max_length=64), AfterValidator(_duration), crd_schema(pattern=_DURATION, minLength=1)
]


class ServiceMonitorConfig(Model):
    """A Prometheus-operator ServiceMonitor for the component's metrics Service."""

    enabled: bool | None = None
    """Create the ServiceMonitor (default false)."""
    interval: Duration | None = None
    """Scrape interval, e.g. 15s."""
    scrapeTimeout: Duration | None = None
    """Scrape timeout."""
    honorLabels: bool | None = None
    """Keep the scraped labels on conflict."""
    additionalLabels: Labels | None = None
    """Extra labels on the ServiceMonitor (e.g. to match a Prometheus selector)."""
    relabelings: list[FreeForm] | None = Field(default=None, max_length=64)
    """Prometheus relabel configs, passed through unchanged."""


class OperatorMetrics(Model):
    """Metrics of the operator itself."""

    serviceMonitor: ServiceMonitorConfig | None = None
    """ServiceMonitor for the operator's metrics."""


class OperatorSpec(Model):
    """Settings of the operator itself."""

    defaultRuntime: Literal["docker", "crio", "containerd"] | None = None
    """Container runtime of GPU nodes whose kubelet does not report one (each node's runtime is detected
    from status.nodeInfo; default containerd)."""
    runtimeClass: DNSLabel = "nvidia"
    """Name (and handler) of the RuntimeClass the operands that need the NVIDIA runtime use."""
    initContainer: InitContainerSpec | None = None
    """Deprecated and unused (also by NVIDIA's operator)."""
    labels: Labels | None = None
    """Accepted, not acted on (reported in the status): the operator's own Deployment comes from its Helm
    chart, which sets its labels."""
    annotations: Annotations | None = None
    """Accepted, not acted on (reported in the status): set the operator's annotations in its Helm chart."""
    metrics: OperatorMetrics | None = None
    """Accepted, not acted on (reported in the status when its ServiceMonitor is enabled)."""
    use_ocp_driver_toolkit: bool | None = None
    """OpenShift Driver Toolkit: accepted, not acted on (reported; OpenShift is not supported)."""


_ZERO = re.compile(r"^0+%?$")
_NOT_ZERO = "must be at least 1 (or 1%): a DaemonSet cannot update with no pod unavailable"


def _not_zero(value: int | str | None) -> int | str | None:
    # The API server refuses a DaemonSet that may have no pod unavailable and none surge (maxSurge 0).
    if value is not None and _ZERO.fullmatch(str(value)):
        raise ValueError(_NOT_ZERO)
    return value


class RollingUpdateSpec(Model):
    """Rolling update parameters of the operand DaemonSets."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxUnavailable) || !string(self.maxUnavailable).matches('^0+%?$')",
                    "message": _NOT_ZERO,
                    "fieldPath": ".maxUnavailable",
                }
            ]
        }
    )

    maxUnavailable: Annotated[IntOrPercent | None, AfterValidator(_not_zero)] = None
    """Nodes that may lack a ready pod during an update: a count or a percentage like '25%' (default 1)."""


class DaemonsetsSpec(Model):
    """Settings common to every operand DaemonSet."""

    labels: Labels | None = None
    """Labels added to every operand DaemonSet and its pods."""
    annotations: Annotations | None = None
    """Annotations added to every operand DaemonSet and its pods."""
    tolerations: Annotated[list[Toleration], Field(max_length=LIST_MAX)] | None = None
    """Tolerations of every operand pod; when set they replace the default nvidia.com/gpu toleration."""
    priorityClassName: NameRef = "system-node-critical"
    """PriorityClass of every operand pod."""
    updateStrategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    """Update strategy of the operand DaemonSets (the driver keeps OnDelete, see the README)."""
    rollingUpdate: RollingUpdateSpec | None = None
    """Rolling update parameters."""
    podSecurityContext: PodSecurityContext | None = None
    """Applied to every operand pod."""


class RDMASpec(Model):
    """GPUDirect RDMA."""

    enabled: bool = False
    """Load nvidia-peermem."""
    useHostMofed: bool = False
    """MOFED is installed on the host."""


class DriverManagerSpec(Model):
    """The k8s-driver-manager init container that prepares a node for a driver (re)install."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": IMAGE_RULES})

    repository: Repository | None = None
    """Image registry and path."""
    image: ImageName | None = None
    """Image name (alone: a full reference)."""
    version: ImageVersion | None = None
    """Image tag or digest."""
    imagePullPolicy: Literal["Always", "Never", "IfNotPresent"] | None = None
    """Image pull policy."""
    env: EnvList | None = None
    """Environment of the driver manager (eviction and drain settings)."""

    @model_validator(mode="after")
    def _complete_image(self) -> DriverManagerSpec:
        check_image(self.repository, self.image, self.version)
        return self


class RepoConfigSpec(Model):
    """Custom package repositories for the driver container."""

    configMapName: NameRef | None = None
    """ConfigMap with repository files."""


class LicensingConfigSpec(Model):
    """vGPU guest licensing."""

    configMapName: NameRef | None = None
    """ConfigMap with gridd.conf."""
    secretName: NameRef | None = None
    """Secret with the client token."""
    nlsEnabled: bool | None = None
    """Use NVIDIA License System."""


class VirtualTopologySpec(Model):
    """Virtual topology daemon configuration."""

    config: NameRef | None = None
    """ConfigMap name."""


class DriverSpec(ComponentSpec):
    """The containerized NVIDIA driver."""

    useNvidiaDriverCRD: bool | None = None
    """Use NVIDIADriver objects instead (reported; this operator manages the driver from this policy)."""
    usePrecompiled: bool | None = None
    """Use precompiled driver images (tag <version>-<kernel>-<os>)."""
    useOpenKernelModules: bool | None = None
    """Deprecated and ignored, as by NVIDIA's operator (reported): use kernelModuleType: open."""
    kernelModuleType: Literal["auto", "open", "proprietary"] = "auto"
    """Which kernel modules to build and load."""
    startupProbe: ProbeSpec | None = None
    """Startup probe timing of the driver container."""
    livenessProbe: ProbeSpec | None = None
    """Liveness probe timing of the driver container."""
    readinessProbe: ProbeSpec | None = None
    """Readiness probe timing of the driver container."""
    rdma: RDMASpec | None = None
    """GPUDirect RDMA."""
    upgradePolicy: UpgradePolicySpec | None = None
    """Driver upgrade policy. The driver DaemonSet is always OnDelete: with autoUpgrade the operator
    replaces its pods node by node (status.driverUpgrade says where each node is); without it a changed
    driver reaches a node when its driver pod is deleted."""
    manager: DriverManagerSpec | None = None
    """k8s-driver-manager init container."""
    repoConfig: RepoConfigSpec | None = None
    """Custom package repositories."""
    certConfig: ConfigMapRef | None = None
    """ConfigMap with extra CA certificates for package repositories."""
    licensingConfig: LicensingConfigSpec | None = None
    """vGPU licensing."""
    virtualTopology: VirtualTopologySpec | None = None
    """Virtual topology configuration."""
    kernelModuleConfig: ConfigMapRef | None = None
    """ConfigMap with kernel module parameters."""
    secretEnv: NameRef | None = None
    """Secret whose keys become environment variables of the driver container."""


class ToolkitSpec(ComponentSpec):
    """The NVIDIA container toolkit, which configures the container runtime."""

    installDir: HostDir = "/usr/local/nvidia"
    """Host directory the toolkit is installed into."""


class MPSSpec(Model):
    """CUDA MPS sharing."""

    root: HostDir = "/run/nvidia/mps"
    """Host directory for MPS pipes and logs."""


class DevicePluginSpec(ComponentSpec):
    """The NVIDIA device plugin, which advertises nvidia.com/gpu to the kubelet."""

    config: ConfigWithDefault | None = None
    """ConfigMap of device-plugin configurations (time-slicing, MPS, ...), also read by GFD."""
    mps: MPSSpec | None = None
    """MPS settings."""


class ServiceSpec(Model):
    """The metrics Service."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    """Service type (default ClusterIP)."""
    internalTrafficPolicy: Literal["Cluster", "Local"] | None = None
    """Route to endpoints on the same node only (Local) or anywhere (Cluster)."""


class HPCJobMappingSpec(Model):
    """HPC job mapping of metrics."""

    enabled: bool | None = None
    """Enable job mapping."""
    directory: HostDir | None = None
    """Host directory with job mapping files."""


class DCGMExporterSpec(ComponentSpec):
    """DCGM exporter: GPU metrics for Prometheus."""

    config: ConfigMapRef | None = None
    """ConfigMap with the metrics CSV."""
    serviceMonitor: ServiceMonitorConfig | None = None
    """ServiceMonitor for the exporter."""
    serviceMonitoring: bool | None = Field(default=None, deprecated=True)
    """Deprecated alias of serviceMonitor.enabled (from copied samples); serviceMonitor.enabled wins."""
    service: ServiceSpec | None = None
    """Metrics Service settings."""
    hostPID: bool | None = None
    """Share the host PID namespace (per-process metrics)."""
    hpcJobMapping: HPCJobMappingSpec | None = None
    """HPC job mapping."""
    enablePodLabels: bool | None = None
    """Add pod labels to metrics (needs read access to pods)."""
    enablePodUID: bool | None = None
    """Add pod UIDs to metrics (needs read access to pods)."""
    podLabelAllowlistRegex: Annotated[list[ShortText], Field(max_length=LIST_MAX)] | None = None
    """Only pod labels matching these regexes are added."""
    annotations: Annotations | None = None
    """Annotations of the exporter pods."""

    def service_monitor_enabled(self) -> bool:
        if self.serviceMonitor is not None and self.serviceMonitor.enabled is not None:
            return self.serviceMonitor.enabled
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(self.serviceMonitoring)


class DCGMSpec(ComponentSpec):
    """Standalone DCGM host engine (nv-hostengine)."""

    hostPort: int | None = Field(default=None, ge=1, le=65535)
    """Host port of nv-hostengine (default 5555)."""


class GFDSpec(ComponentSpec):
    """GPU Feature Discovery: labels nodes with GPU model, memory, MIG and CUDA facts."""


class MIGSpec(Model):
    """MIG exposure strategy."""

    strategy: Literal["none", "single", "mixed"] = "single"
    """How MIG devices are advertised: none, single (nvidia.com/gpu) or mixed (nvidia.com/mig-<profile>)."""


class MIGManagerConfig(Model):
    """MIG partitioning configurations."""

    name: NameRef | None = None
    """ConfigMap with mig-parted configurations (default: the operator's default-mig-parted-config)."""
    default: Literal["all-disabled", ""] = "all-disabled"
    """Configuration applied to MIG-capable nodes without an nvidia.com/mig.config label."""


class MIGManagerSpec(ComponentSpec):
    """MIG manager: applies the nvidia.com/mig.config partitioning on MIG-capable nodes."""

    config: MIGManagerConfig | None = None
    """MIG configurations."""
    gpuClientsConfig: ConfigMapRef | None = None
    """ConfigMap listing GPU clients restarted around a MIG change."""


class NodeStatusExporterSpec(OffByDefault):
    """Node status exporter: per-node validation metrics."""


class ValidatorComponentSpec(Model):
    """Settings of one validation step."""

    env: EnvList | None = None
    """Environment of this validation step."""


class ValidatorSpec(ComponentSpec):
    """Operator validator: checks driver, toolkit, CUDA and device plugin on every node."""

    plugin: ValidatorComponentSpec | None = None
    """Device plugin validation."""
    toolkit: ValidatorComponentSpec | None = None
    """Toolkit validation."""
    driver: ValidatorComponentSpec | None = None
    """Driver validation."""
    cuda: ValidatorComponentSpec | None = None
    """CUDA workload validation."""
    vfioPCI: ValidatorComponentSpec | None = None
    """VFIO-PCI validation (the sandbox validator's)."""
    vgpuManager: ValidatorComponentSpec | None = None
    """vGPU manager validation (the sandbox validator's)."""
    vgpuDevices: ValidatorComponentSpec | None = None
    """vGPU devices validation (the sandbox validator's)."""


class EnabledSpec(Model):
    """An on/off switch."""

    enabled: bool = False
    """Enable it."""


class CDIConfigSpec(Model):
    """Container Device Interface."""

    # ClusterPolicySpec._nri_needs_cdi, as an admission rule.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.nriPluginEnabled) || !self.nriPluginEnabled"
                        " || !has(self.enabled) || self.enabled"
                    ),
                    "message": "cdi.nriPluginEnabled requires cdi.enabled",
                    "fieldPath": ".nriPluginEnabled",
                }
            ]
        }
    )

    enabled: bool = True
    """Generate CDI specs and use CDI for GPU injection."""
    default: bool | None = None
    """Deprecated and ignored, as by NVIDIA's operator (reported when true)."""
    nriPluginEnabled: bool = False
    """Use the NRI plugin for injection (requires CDI)."""


class HostPathsSpec(Model):
    """Host paths the operands use."""

    rootFS: HostPath = "/"
    """Host root filesystem."""
    driverInstallDir: HostDir = "/run/nvidia/driver"
    """Where the containerized driver is installed on the host."""
    kubeletRootDir: HostDir = "/var/lib/kubelet"
    """Kubelet root directory (device plugin sockets live below it)."""


# The sandbox stacks: deployed only with sandboxWorkloads.enabled, on the nodes of their workload type
# (gpu_operator/core/workloads.py).


class SandboxWorkloadsSpec(Model):
    """Sandboxed (VM) workloads: each GPU node runs containers, VMs with its GPUs passed through, or
    VMs with vGPUs, as its label nvidia.com/gpu.workload.config says."""

    enabled: bool = False
    """Enable sandbox workloads (else every GPU node runs containers)."""
    defaultWorkload: Literal["container", "vm-passthrough", "vm-vgpu"] = "container"
    """Workload type of nodes without a valid nvidia.com/gpu.workload.config label."""
    mode: Literal["kubevirt", "kata"] = "kubevirt"
    """Sandbox technology: kubevirt (the KubeVirt sandbox device plugin) or kata (the Kata sandbox
    device plugin on vm-passthrough nodes, and the CC manager)."""


class VFIOManagerSpec(OffByDefault):
    """VFIO manager: binds the GPUs of vm-passthrough nodes to vfio-pci."""

    driverManager: DriverManagerSpec | None = None
    """Driver manager init container."""


class VGPUManagerSpec(OffByDefault):
    """vGPU manager: the vGPU host driver of vm-vgpu nodes. NVIDIA publishes no image: name yours."""

    driverManager: DriverManagerSpec | None = None
    """Driver manager init container."""
    kernelModuleConfig: ConfigMapRef | None = None
    """Kernel module parameters."""


class VGPUDeviceManagerSpec(OffByDefault):
    """vGPU device manager: creates the vGPU devices of vm-vgpu nodes (label nvidia.com/vgpu.config)."""

    config: ConfigWithDefault | None = None
    """vGPU device configurations."""


class KataManagerSpec(OffByDefault):
    """Kata manager: deprecated by NVIDIA, whose operator never deploys it; neither does this one."""

    config: FreeForm | None = None
    """Kata manager configuration, passed through."""


class CCManagerSpec(OffByDefault):
    """Confidential computing manager (sandboxWorkloads.mode kata only)."""

    defaultMode: Literal["on", "off", "devtools"] | None = None
    """Default CC mode of the GPUs (DEFAULT_CC_MODE)."""


class SandboxDevicePluginSpec(OffByDefault):
    """KubeVirt sandbox device plugin: advertises the passed-through GPUs and vGPUs to KubeVirt
    (sandboxWorkloads.mode kubevirt)."""


class KataDevicePluginSpec(OffByDefault):
    """Kata sandbox device plugin: advertises the passed-through GPUs to Kata (sandboxWorkloads.mode
    kata)."""


class GDSSpec(OffByDefault):
    """GPUDirect Storage: the nvidia-fs module, built by a sidecar of the driver pod (image tag gets the
    node OS suffix; not with precompiled drivers)."""


class GDRCopySpec(OffByDefault):
    """GDRCopy: the gdrdrv module, built by a sidecar of the driver pod (image tag gets the node OS
    suffix; not with precompiled drivers)."""


class ClusterPolicySpec(Model):
    """Desired state of the NVIDIA GPU software stack on every GPU node."""

    SANDBOX: ClassVar[tuple[str, ...]] = (
        "vfioManager",
        "vgpuManager",
        "vgpuDeviceManager",
        "sandboxDevicePlugin",
        "kataManager",
        "kataSandboxDevicePlugin",
        "ccManager",
    )
    """Deployed by NVIDIA only with sandboxWorkloads.enabled (state_manager.go:1030-1046): their own
    `enabled` means nothing without it (NVIDIA's chart turns several on by default)."""
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        "kataManager": "NVIDIA deprecated the Kata manager and its operator never deploys it "
        "(isStateEnabled, controllers/state_manager.go:1033-1036); neither does this one",
    }
    """Sections this operator accepts and does not deploy, each with the reason."""

    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    """Operator settings."""
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    """Settings common to all operand DaemonSets."""
    driver: DriverSpec = Field(default_factory=DriverSpec)
    """NVIDIA driver."""
    toolkit: ToolkitSpec = Field(default_factory=ToolkitSpec)
    """NVIDIA container toolkit."""
    devicePlugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec)
    """NVIDIA device plugin."""
    dcgmExporter: DCGMExporterSpec = Field(default_factory=DCGMExporterSpec)
    """DCGM exporter."""
    dcgm: DCGMSpec = Field(default_factory=DCGMSpec)
    """Standalone DCGM."""
    nodeStatusExporter: NodeStatusExporterSpec = Field(default_factory=NodeStatusExporterSpec)
    """Node status exporter."""
    gfd: GFDSpec = Field(default_factory=GFDSpec)
    """GPU Feature Discovery."""
    mig: MIGSpec = Field(default_factory=MIGSpec)
    """MIG strategy."""
    migManager: MIGManagerSpec = Field(default_factory=MIGManagerSpec)
    """MIG manager."""
    validator: ValidatorSpec = Field(default_factory=ValidatorSpec)
    """Operator validator."""
    psa: EnabledSpec = Field(default_factory=EnabledSpec)
    """Label the operand namespace for the privileged Pod Security Admission level."""
    psp: EnabledSpec = Field(default_factory=EnabledSpec)
    """PodSecurityPolicy: removed from Kubernetes in 1.25; accepted, not acted on (reported when enabled)."""
    cdi: CDIConfigSpec = Field(default_factory=CDIConfigSpec)
    """Container Device Interface."""
    hostPaths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    """Host paths."""
    sandboxWorkloads: SandboxWorkloadsSpec = Field(default_factory=SandboxWorkloadsSpec)
    """Sandbox workloads: GPU nodes for VMs (VM passthrough, vGPU) beside container nodes."""
    vfioManager: VFIOManagerSpec = Field(default_factory=VFIOManagerSpec)
    """VFIO manager (vm-passthrough nodes)."""
    vgpuManager: VGPUManagerSpec = Field(default_factory=VGPUManagerSpec)
    """vGPU manager (vm-vgpu nodes)."""
    vgpuDeviceManager: VGPUDeviceManagerSpec = Field(default_factory=VGPUDeviceManagerSpec)
    """vGPU device manager (vm-vgpu nodes)."""
    sandboxDevicePlugin: SandboxDevicePluginSpec = Field(default_factory=SandboxDevicePluginSpec)
    """KubeVirt sandbox device plugin (VM nodes, mode kubevirt)."""
    kataManager: KataManagerSpec = Field(default_factory=KataManagerSpec)
    """Kata manager: deprecated by NVIDIA and never deployed (accepted, reported when enabled)."""
    kataSandboxDevicePlugin: KataDevicePluginSpec = Field(default_factory=KataDevicePluginSpec)
    """Kata sandbox device plugin (vm-passthrough nodes, mode kata)."""
    ccManager: CCManagerSpec = Field(default_factory=CCManagerSpec)
    """Confidential computing manager (VM nodes, mode kata)."""
    gds: GDSSpec = Field(default_factory=GDSSpec)
    """GPUDirect Storage."""
    gdrcopy: GDRCopySpec = Field(default_factory=GDRCopySpec)
    """GDRCopy."""

    @model_validator(mode="after")
    def _nri_needs_cdi(self) -> ClusterPolicySpec:
        if self.cdi.nriPluginEnabled and not self.cdi.enabled:
            raise ValueError("cdi.nriPluginEnabled requires cdi.enabled")
        return self

    @model_validator(mode="after")
    def _sidecars_build_on_the_node(self) -> ClusterPolicySpec:
        # Their modules are built against the driver installed on the node (NVIDIA refuses the same).
        if self.driver.usePrecompiled and self.driver.is_enabled():
            for name in ("gds", "gdrcopy"):
                if getattr(self, name).is_enabled():
                    raise ValueError(f"{name}.enabled is not supported with driver.usePrecompiled")
        return self

    def ignored_fields(self) -> list[str]:
        """Fields the user set that this operator accepts but does not act on, each with the reason (the
        planner reports them; their CRD descriptions say so too)."""
        operator, driver = self.operator, self.driver
        checks = [
            (
                bool(driver.useOpenKernelModules),
                "spec.driver.useOpenKernelModules",
                "deprecated and ignored, as by NVIDIA's operator; use kernelModuleType: open",
            ),
            (bool(operator.labels), "spec.operator.labels", "set the operator's labels in its Helm chart"),
            (
                bool(operator.annotations),
                "spec.operator.annotations",
                "set the operator's annotations in its Helm chart",
            ),
            (
                bool(
                    operator.metrics
                    and operator.metrics.serviceMonitor
                    and operator.metrics.serviceMonitor.enabled
                ),
                "spec.operator.metrics.serviceMonitor",
                "the operator serves no metrics",
            ),
            (
                bool(operator.use_ocp_driver_toolkit),
                "spec.operator.use_ocp_driver_toolkit",
                "OpenShift is not supported",
            ),
            (self.psp.enabled, "spec.psp.enabled", "PodSecurityPolicy was removed from Kubernetes in 1.25"),
            (bool(self.cdi.default), "spec.cdi.default", "deprecated and ignored, as by NVIDIA's operator"),
        ]
        checks += [
            (
                bool(getattr(self.validator, step) and getattr(self.validator, step).env)
                and not self.sandboxWorkloads.enabled,
                f"spec.validator.{step}.env",
                "the sandbox validator runs only with sandboxWorkloads.enabled",
            )
            for step in ("vfioPCI", "vgpuManager", "vgpuDevices")
        ]
        return [f"{path}: {why}" for found, path, why in checks if found]

    def images_without_registry(self) -> list[str]:
        """The images this policy names without a registry host, each with its field and the Docker Hub
        reference a container runtime makes of it. NVIDIA publishes its operand images on nvcr.io, not
        on Docker Hub, so such a name is nearly always a sample copied without its registry
        (`image: nvidia/driver`) and every operand's pods would wait on an image that does not exist:
        `validate` refuses it (exit 2) and the operator says so on the policy. Whoever does mean Docker
        Hub, or a mirror of it, names it (`docker.io/...`). Only images that are deployed count: those of
        enabled, supported components, the validator's (every operand's init containers run it) and the
        driver manager's."""
        sections: list[tuple[str, ComponentSpec | DriverManagerSpec]] = [("validator", self.validator)]
        for name in type(self).model_fields:
            section = getattr(self, name)
            if name in self.UNSUPPORTED or name == "validator" or not isinstance(section, ComponentSpec):
                continue
            if name in self.SANDBOX and not self.sandboxWorkloads.enabled:
                continue
            if section.is_enabled():
                sections.append((name, section))
        if self.driver.is_enabled() and self.driver.manager is not None:
            sections.append(("driver.manager", self.driver.manager))
        found = (
            without_registry(f"spec.{path}", spec.repository, spec.image, spec.version)
            for path, spec in sections
        )
        return [problem for problem in found if problem is not None]

    @cached_property
    def enabled_sections(self) -> frozenset[str]:
        """The component sections (ComponentSpec fields) this policy enables. Kept on the spec once
        asked, because a pass asks it for every component on every node: a parsed spec is never changed
        in place (a new ClusterPolicy is parsed anew), so the answer cannot go stale, and it lives and
        dies with the spec rather than in a cache of its own."""
        return frozenset(
            name
            for name in type(self).model_fields
            if isinstance(section := getattr(self, name), ComponentSpec) and section.is_enabled()
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, without what was kept of the original (enabled_sections): `update` may change it."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("enabled_sections", None)
        return copy

    def unsupported_enabled(self) -> list[str]:
        """Names of unsupported sections the user switched on (reported, never silently ignored, each
        with its reason in UNSUPPORTED)."""
        found = []
        for name in self.UNSUPPORTED:
            if name in self.SANDBOX and not self.sandboxWorkloads.enabled:
                continue
            section = getattr(self, name)
            if isinstance(section, ComponentSpec) and section.is_enabled():
                found.append(name)
        return found


def without_registry(
    section: str, repository: str | None, image: str | None, version: str | None
) -> str | None:
    """The problem with an image that names no registry host (see images_without_registry), on the
    field of `section` (a dotted path) that says it; None when the image names one, or no image is
    given."""
    reference = _reference(repository, image, version)
    if reference is None or image_reference.registry_of(image_reference.name_of(reference)):
        return None
    field = f"{section}.{'repository' if repository else 'image'}"
    return (
        f"{field}: {quoted(reference, image_reference.REAL_REFERENCE_MAX)} names no registry host, "
        "so a container runtime pulls "
        f"{image_reference.on_docker_hub(reference)}; NVIDIA's images are on nvcr.io (e.g. "
        "repository: nvcr.io/nvidia): name the registry (docker.io/... if Docker Hub is meant)"
    )


def _reference(repository: str | None, image: str | None, version: str | None) -> str | None:
    """The reference the policy's three fields make (NVIDIA's imagePath, without the driver's OS
    suffix); None where they name no image (the default, or the operator's env var, applies)."""
    if not image:
        return None
    name = f"{repository}/{image}" if repository else image
    if not version:
        return name
    return f"{name}@{version}" if version.startswith("sha256:") else f"{name}:{version}"
