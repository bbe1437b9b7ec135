"""The component registry: one record per operand, shared by the renderer, the planner and the CLI.

Adding an operand is a template folder plus one entry here. Order is dependency order (NVIDIA's
state order): driver → container toolkit → validator, device plugin and the rest; every component
comes after its dependencies (gpu_operator/core/node_labels.py decides the labels of a node in this order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from gpu_operator.api.common import ComponentSpec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.workloads import CONTAINERS, SANDBOXED, VM_PASSTHROUGH, VM_VGPU

NodeLabels = Mapping[str, str]

MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
VGPU_HOST_LABEL = "nvidia.com/vgpu.host-driver-version"
RUNTIME_LABEL = "nvidia.com/gpu-operator.runtime"
"""The node's container runtime as the operator detected it; each toolkit DaemonSet selects one value."""
MIG_CONFIG_LABEL = "nvidia.com/mig.config"


def any_gpu_node(labels: NodeLabels) -> bool:
    return True


def mps_capable(labels: NodeLabels) -> bool:
    """GFD labels nodes whose device-plugin config shares GPUs through MPS."""
    return labels.get(MPS_CAPABLE_LABEL) == "true"


def mig_capable(labels: NodeLabels) -> bool:
    """NVIDIA's rule: GFD's mig.capable label, else a product name of a MIG-capable GPU; never a vGPU host."""
    if VGPU_HOST_LABEL in labels:
        return False
    if MIG_CAPABLE_LABEL in labels:
        return labels[MIG_CAPABLE_LABEL] == "true"
    product = labels.get(GPU_PRODUCT_LABEL, "").lower()
    return any(model in product for model in ("h100", "h200", "a100", "a30", "b200", "gb200"))


def no_config_maps(policy: ClusterPolicySpec) -> list[tuple[str, str]]:
    return []


def no_node_labels(policy: ClusterPolicySpec) -> dict[str, str]:
    return {}


def driver_config_maps(policy: ClusterPolicySpec) -> list[tuple[str, str]]:
    """(field, ConfigMap name) of the user ConfigMaps the driver mounts file by file, so it needs their
    keys: the kernel module parameters, and for drivers built on the node the package repositories and
    CA certificates (NVIDIA's transformDriverContainer)."""
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


def device_plugin_config_keys(policy: ClusterPolicySpec) -> list[tuple[str, str, str | None]]:
    """What config-manager needs of devicePlugin.config's ConfigMap (device-plugin v0.20.0
    cmd/config-manager/main.go:342-365): at least one entry, and the `default` one when it is named."""
    config = policy.devicePlugin.config
    if config is None or not config.name:
        return []
    if config.default:
        return [("spec.devicePlugin.config.default", config.name, config.default)]
    return [("spec.devicePlugin.config.name", config.name, None)]


def no_config_keys(policy: ClusterPolicySpec) -> list[tuple[str, str, str | None]]:
    return []


def mig_default_layout(policy: ClusterPolicySpec) -> dict[str, str]:
    """NVIDIA's rule: MIG-capable nodes without a MIG layout get the default one, for mig-manager to
    apply; only the `all-disabled` default is written by the operator."""
    default = policy.migManager.config.default if policy.migManager.config else "all-disabled"
    return {MIG_CONFIG_LABEL: "all-disabled"} if default == "all-disabled" else {}


@dataclass(frozen=True)
class Image:
    """A built-in default image, used when neither the policy nor the operator's env names one."""

    repository: str
    name: str
    version: str


@dataclass(frozen=True)
class Component:
    """One operand: its spec section, DaemonSet, dependencies and where it runs."""

    name: str
    """Also the template folder, the `app.kubernetes.io/component` label and the deploy label suffix."""
    section: str
    """Attribute of ClusterPolicySpec holding its settings."""
    daemonset: str
    """DaemonSet name (NVIDIA's, so existing dashboards and scripts keep working)."""
    image_env: str
    """Operator environment variable that supplies the image when the policy gives none (OLM style)."""
    default_image: Image
    depends_on: tuple[str, ...] = ()
    waits_for: tuple[str, ...] = ()
    """Those of `depends_on` its own pods wait for on the node (an init container that retries until the
    dependency works, where others fail): it is labelled once their pods have started there (past their
    init containers), not once they are ready, so that its pod is created, scheduled and pulled while
    they come up, and waits in Init until then (gpu_operator/core/node_labels.py unmet_dependencies)."""
    node_filter: Callable[[NodeLabels], bool] = field(default=any_gpu_node)
    os_specific_tag: bool = False
    """The image tag gets the node OS suffix (`-ubuntu22.04`), as NVIDIA's driver images do."""
    label: str = ""
    """Value of `app.kubernetes.io/component` on its objects and pods, when not the name: NVIDIA's
    validator finds the driver DaemonSet by `nvidia-driver` (cmd/nvidia-validator/main.go:723)."""
    deploys_with: str = ""
    """Shares this component's deploy label (NVIDIA's MPS control daemon runs where the plugin does)."""
    split: Literal["", "runtime", "kernel"] = ""
    """One DaemonSet per container runtime of the GPU nodes, or per kernel (precompiled drivers only).
    A component split per runtime needs the node's runtime label (RUNTIME_LABEL)."""
    always_on_delete: bool = False
    """Its DaemonSet is OnDelete whatever `daemonsets.updateStrategy` says: replacing a driver pod unloads
    the kernel module under running GPU workloads (NVIDIA's applyUpdateStrategyConfig,
    controllers/object_controls.go:3876-3905); its pods are replaced by the upgrade controller or by hand."""
    validator_init: bool = True
    """Its pods run validator-image init containers, so they also need the validator's pull secrets."""
    host_installed: bool = False
    """Its deploy label may say `pre-installed`: k8s-driver-manager found it on the host, and it counts as
    satisfied for its dependents (cmd/driver-manager/main.go:549)."""
    config_maps: Callable[[ClusterPolicySpec], list[tuple[str, str]]] = no_config_maps
    """(policy field, name) of the user ConfigMaps it mounts key by key (see missing_inputs)."""
    node_labels: Callable[[ClusterPolicySpec], dict[str, str]] = no_node_labels
    """Labels the operator sets on the nodes it runs on (node_filter), unless someone else owns them."""
    config_keys: Callable[[ClusterPolicySpec], list[tuple[str, str, str | None]]] = no_config_keys
    """(policy field, ConfigMap, key) its pods need beyond what their volumes say: a key its image looks
    up (None: any key at all). Checked before its DaemonSet is written (gpu_operator/core/vetting.py)."""
    workloads: frozenset[str] = CONTAINERS
    """The GPU workload types of the nodes it runs on (gpu_operator/core/workloads.py): the container
    stack's components run on container nodes, the sandbox stacks' on VM nodes."""
    enable_rule: Callable[[ClusterPolicySpec], bool] | None = None
    """Whether the policy deploys it, where that is more than its section's `enabled` (the sandbox
    stacks: NVIDIA's isStateEnabled, controllers/state_manager.go:1005-1055)."""
    image_required: bool = False
    """NVIDIA publishes no image for it: the policy or the operator's env must name one, else its
    DaemonSet is withheld and the field named (render.missing_inputs)."""

    # Kept once asked: a pass asks these for every component on every node, so a large cluster asks
    # them hundreds of thousands of times.
    @cached_property
    def deploy_label(self) -> str:
        return f"nvidia.com/gpu.deploy.{self.deploys_with or self.name}"

    @cached_property
    def component_label(self) -> str:
        return self.label or self.name

    def spec(self, policy: ClusterPolicySpec) -> ComponentSpec:
        section = getattr(policy, self.section)
        assert isinstance(section, ComponentSpec)
        return section

    def enabled(self, policy: ClusterPolicySpec) -> bool:
        if self.enable_rule is not None:
            return self.enable_rule(policy)
        return self.section in policy.enabled_sections


def _sandboxed(section: str, mode: str | None = None) -> Callable[[ClusterPolicySpec], bool]:
    """NVIDIA's rule for a sandbox state: sandboxWorkloads.enabled and its own section enabled, and for
    the device plugins and the CC manager the sandbox mode they serve."""

    def rule(policy: ClusterPolicySpec) -> bool:
        sandbox = policy.sandboxWorkloads
        return (
            sandbox.enabled and section in policy.enabled_sections and (mode is None or sandbox.mode == mode)
        )

    return rule


def vgpu_manager_enabled(policy: ClusterPolicySpec) -> bool:
    """NVIDIA skips its vGPU manager state while NVIDIADrivers run the drivers (driver.useNvidiaDriverCRD,
    state_manager.go:965): an NVIDIADriver of driverType vgpu-host-manager deploys it then."""
    sandbox = policy.sandboxWorkloads.enabled
    return sandbox and "vgpuManager" in policy.enabled_sections and not policy.driver.useNvidiaDriverCRD


def sandbox_validator_enabled(policy: ClusterPolicySpec) -> bool:
    """NVIDIA deploys the sandbox validator whenever sandbox workloads are on."""
    return policy.sandboxWorkloads.enabled


def vgpu_manager_config_maps(policy: ClusterPolicySpec) -> list[tuple[str, str]]:
    """The kernel module parameters ConfigMap the vGPU manager mounts file by file
    (transformVGPUManagerContainer)."""
    config = policy.vgpuManager.kernelModuleConfig
    return [("spec.vgpuManager.kernelModuleConfig.name", config.name)] if config and config.name else []


def vgpu_devices_config_keys(policy: ClusterPolicySpec) -> list[tuple[str, str, str | None]]:
    """vgpu-device-manager reads /vgpu-config/config.yaml (CONFIG_FILE) from the ConfigMap it is given."""
    config = policy.vgpuDeviceManager.config
    if config is None or not config.name:
        return []
    return [("spec.vgpuDeviceManager.config.name", config.name, "config.yaml")]


_NVCR = "nvcr.io/nvidia"
_CLOUD_NATIVE = "nvcr.io/nvidia/cloud-native"
# Defaults of NVIDIA's v26.7.0 chart (deployments/gpu-operator/values.yaml). The validator ships in
# the operator image since v25.10.0, tagged with the release (the chart's appVersion, which the
# release workflow sets: .github/workflows/release-rc-assets.yaml:274).
_VALIDATOR = Image(_NVCR, "gpu-operator", "v26.7.0")
_DEVICE_PLUGIN = Image(_NVCR, "k8s-device-plugin", "v0.20.0")
_DRIVER_MANAGER = Image(_CLOUD_NATIVE, "k8s-driver-manager", "v0.12.0")

COMPONENTS: tuple[Component, ...] = (
    Component(
        "driver",
        "driver",
        "nvidia-driver-daemonset",
        "DRIVER_IMAGE",
        Image(_NVCR, "driver", "595.91.07"),
        os_specific_tag=True,
        label="nvidia-driver",
        split="kernel",
        always_on_delete=True,
        validator_init=False,
        host_installed=True,
        config_maps=driver_config_maps,
    ),
    Component(
        "container-toolkit",
        "toolkit",
        "nvidia-container-toolkit-daemonset",
        "CONTAINER_TOOLKIT_IMAGE",
        Image(f"{_NVCR}/k8s", "container-toolkit", "v1.20.0"),
        depends_on=("driver",),
        # Its driver-validation init container runs nvidia-validator with WITH_WAIT=true (NVIDIA's
        # assets/state-container-toolkit/0500_daemonset.yaml:29-36; ours: driver_validation() in
        # _macros/containers.j2), which retries every 5 s until the driver container reports ready
        # (.driver-ctr-ready) and its nvidia-smi runs (gpu-operator v26.7.0 cmd/nvidia-validator/main.go:
        # 152, 677-694, 698-706, 830-842). The validator does not wait for the toolkit: its toolkit check
        # has WITH_WAIT=false and fails (l.1154-1162), so it stays behind the toolkit's readiness.
        waits_for=("driver",),
        split="runtime",
    ),
    Component(
        "operator-validator",
        "validator",
        "nvidia-operator-validator",
        "VALIDATOR_IMAGE",
        _VALIDATOR,
        depends_on=("container-toolkit",),
    ),
    Component(
        "device-plugin",
        "devicePlugin",
        "nvidia-device-plugin-daemonset",
        "DEVICE_PLUGIN_IMAGE",
        _DEVICE_PLUGIN,
        depends_on=("container-toolkit",),
        config_keys=device_plugin_config_keys,
    ),
    Component(
        "mps-control-daemon",
        "devicePlugin",
        "nvidia-device-plugin-mps-control-daemon",
        "DEVICE_PLUGIN_IMAGE",
        _DEVICE_PLUGIN,
        depends_on=("container-toolkit",),
        node_filter=mps_capable,
        deploys_with="device-plugin",
        config_keys=device_plugin_config_keys,
    ),
    Component(
        "dcgm",
        "dcgm",
        "nvidia-dcgm",
        "DCGM_IMAGE",
        Image(_CLOUD_NATIVE, "dcgm", "4.6.0-1-ubuntu24.04"),
        depends_on=("container-toolkit",),
    ),
    Component(
        "dcgm-exporter",
        "dcgmExporter",
        "nvidia-dcgm-exporter",
        "DCGM_EXPORTER_IMAGE",
        Image(f"{_NVCR}/k8s", "dcgm-exporter", "4.6.0-4.8.3-distroless"),
        depends_on=("container-toolkit", "dcgm"),
    ),
    Component(
        "gpu-feature-discovery",
        "gfd",
        "gpu-feature-discovery",
        "GFD_IMAGE",
        _DEVICE_PLUGIN,
        depends_on=("container-toolkit",),
        config_keys=device_plugin_config_keys,
    ),
    Component(
        "mig-manager",
        "migManager",
        "nvidia-mig-manager",
        "MIG_MANAGER_IMAGE",
        Image(_CLOUD_NATIVE, "k8s-mig-manager", "v0.15.0"),
        depends_on=("container-toolkit",),
        node_filter=mig_capable,
        node_labels=mig_default_layout,
    ),
    Component(
        "node-status-exporter",
        "nodeStatusExporter",
        "nvidia-node-status-exporter",
        "VALIDATOR_IMAGE",
        _VALIDATOR,
        depends_on=("driver",),
    ),
    # The sandbox stacks (sandboxWorkloads.enabled). Their first components bind or load what the VMs
    # use; the sandbox validator's init containers wait for each of them (WITH_WAIT=true, nvidia-validator
    # cmd/nvidia-validator/main.go VfioPCI, VGPUManager, CCManager), so it is labelled once their pods
    # have started; the sandbox device plugins advertise the GPUs once it is ready.
    Component(
        "vgpu-manager",
        "vgpuManager",
        "nvidia-vgpu-manager-daemonset",
        "VGPU_MANAGER_IMAGE",
        # Built by its user from NVIDIA's licensed vGPU host driver package (image_required).
        Image("", "vgpu-manager", ""),
        os_specific_tag=True,
        validator_init=False,
        workloads=frozenset({VM_VGPU}),
        enable_rule=vgpu_manager_enabled,
        image_required=True,
        config_maps=vgpu_manager_config_maps,
    ),
    Component(
        "vfio-manager",
        "vfioManager",
        "nvidia-vfio-manager",
        "VFIO_MANAGER_IMAGE",
        _DRIVER_MANAGER,
        validator_init=False,
        workloads=frozenset({VM_PASSTHROUGH}),
        enable_rule=_sandboxed("vfioManager"),
    ),
    Component(
        "cc-manager",
        "ccManager",
        "nvidia-cc-manager",
        "CC_MANAGER_IMAGE",
        Image(_CLOUD_NATIVE, "k8s-cc-manager", "v0.4.3"),
        validator_init=False,
        workloads=SANDBOXED,
        enable_rule=_sandboxed("ccManager", "kata"),
    ),
    Component(
        "vgpu-device-manager",
        "vgpuDeviceManager",
        "nvidia-vgpu-device-manager",
        "VGPU_DEVICE_MANAGER_IMAGE",
        Image(_CLOUD_NATIVE, "vgpu-device-manager", "v0.5.0"),
        # Its init container waits for vgpu-manager-ready, which the sandbox validator's vgpu-manager
        # step writes (NVIDIA's assets/state-vgpu-device-manager/0600_daemonset.yaml). The validator
        # itself waits in its vgpu-devices step for the devices this creates, so neither may wait for
        # the other's readiness: both come once the vGPU manager's pod has started.
        depends_on=("vgpu-manager",),
        waits_for=("vgpu-manager",),
        workloads=frozenset({VM_VGPU}),
        enable_rule=_sandboxed("vgpuDeviceManager"),
        config_keys=vgpu_devices_config_keys,
    ),
    Component(
        "sandbox-validator",
        "validator",
        "nvidia-sandbox-validator",
        "VALIDATOR_IMAGE",
        _VALIDATOR,
        depends_on=("vfio-manager", "vgpu-manager", "cc-manager"),
        waits_for=("vfio-manager", "vgpu-manager", "cc-manager"),
        workloads=SANDBOXED,
        enable_rule=sandbox_validator_enabled,
    ),
    Component(
        "sandbox-device-plugin",
        "sandboxDevicePlugin",
        "nvidia-sandbox-device-plugin-daemonset",
        "SANDBOX_DEVICE_PLUGIN_IMAGE",
        Image(_NVCR, "kubevirt-gpu-device-plugin", "v1.6.0"),
        depends_on=("sandbox-validator",),
        workloads=SANDBOXED,
        enable_rule=_sandboxed("sandboxDevicePlugin", "kubevirt"),
    ),
    Component(
        "kata-sandbox-device-plugin",
        "kataSandboxDevicePlugin",
        "nvidia-kata-sandbox-device-plugin-daemonset",
        "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
        Image(_CLOUD_NATIVE, "nvidia-sandbox-device-plugin", "v0.0.5"),
        depends_on=("sandbox-validator",),
        # NVIDIA labels vm-vgpu nodes for the KubeVirt plugin only, whatever the mode
        # (getEffectiveStateLabels): in Kata mode they get no sandbox device plugin.
        workloads=frozenset({VM_PASSTHROUGH}),
        enable_rule=_sandboxed("kataSandboxDevicePlugin", "kata"),
    ),
)

BY_NAME: dict[str, Component] = {c.name: c for c in COMPONENTS}
SANDBOX_COMPONENTS = frozenset(c.name for c in COMPONENTS if not c.workloads & CONTAINERS)
# An NVIDIADriver of driverType vgpu-host-manager: NVIDIA's vGPU host driver, rendered by the driver's
# templates (driver/0500_daemonset.yaml.j2) as NVIDIA's manifests/state-driver/0500_daemonset.yaml.
VGPU_HOST_MANAGER_LABEL = "nvidia-vgpu-host-manager"
"""`app.kubernetes.io/component` of its DaemonSets and pods: still the driver component's."""
VGPU_MANAGER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.vgpu-manager"
"""The node label its DaemonSets select on in place of the driver's deploy label: the vgpu-manager
component's, set on vm-vgpu nodes while the ClusterPolicy deploys that component. Not while NVIDIADrivers
run the drivers (vgpu_manager_enabled is then false): NVIDIA's labeller sets it on every vm-vgpu node,
this operator does not yet for NVIDIADriver pools."""
BY_LABEL: dict[str, Component] = {c.component_label: c for c in COMPONENTS} | {
    VGPU_HOST_MANAGER_LABEL: BY_NAME["driver"]
}

# Images of containers that run inside another component's pods (the driver's).
DRIVER_MANAGER = Image(_CLOUD_NATIVE, "k8s-driver-manager", "v0.12.0")
DRIVER_MANAGER_ENV = "DRIVER_MANAGER_IMAGE"
GDS = Image(_CLOUD_NATIVE, "nvidia-fs", "2.29.4")
GDS_ENV = "GDS_IMAGE"
GDRCOPY = Image(_CLOUD_NATIVE, "gdrdrv", "v2.6")
GDRCOPY_ENV = "GDRCOPY_IMAGE"
