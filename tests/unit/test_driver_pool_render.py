"""An NVIDIADriver's objects per OS pool: NVIDIA's names and node selectors (core/driver_pool_render.py)."""

from __future__ import annotations

from typing import Any

from builders import gpu_node

from gpu_operator.api.nvidiadriver import OWNER_LABEL, NVIDIADriverSpec
from gpu_operator.core.components import VGPU_HOST_MANAGER_LABEL
from gpu_operator.core.driver_pool_render import (
    OS_VERSION_MAJOR_LABEL,
    app_name,
    driver_name,
    os_tag,
    pools,
    render_driver,
)
from gpu_operator.core.driver_pools import DriverObject
from gpu_operator.core.images import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo
from gpu_operator.core.observed import component_of
from gpu_operator.core.ownership import COMPONENT_LABEL
from gpu_operator.core.render import ClusterFacts

UID = "bfac7359-6033-45ce-88d6-53db0078526e"
UBUNTU = {OS_ID_LABEL: "ubuntu", OS_VERSION_LABEL: "22.04"}
RHEL = {OS_ID_LABEL: "rhel", OS_VERSION_LABEL: "9.4", OS_VERSION_MAJOR_LABEL: "9"}


def driver(name: str = "h100", **spec: Any) -> DriverObject:
    return DriverObject(name, UID, NVIDIADriverSpec.model_validate({"version": "595.91.07", **spec}))


def test_names_are_nvidias() -> None:
    # NVIDIA's TestGetDriverAppName (internal/state/driver_test.go:794-857, v26.7.0).
    assert app_name(UID, "gpu", "ubuntu20.04") == "nvidia-gpu-driver-ubuntu20.04-67cc6dbb79"
    assert (
        app_name(UID, "gpu", "ubuntu20.04", "5.15.0-70-generic") == "nvidia-gpu-driver-ubuntu20.04-59b779bcc5"
    )
    long = app_name(UID, "gpu", os_tag("redhatCoreOS", "4.14-414.92.202309282257"), "5.15.0-70-generic")
    assert long == "nvidia-gpu-driver-redhatCoreOS4.14-414.92.2023092822-59b779bcc5" and len(long) == 63
    assert [os_tag("rocky", "9.6"), os_tag("ol", "9.7"), os_tag("rhel", "10.1")] == [
        "rocky9",
        "ol9",
        "rhel10",
    ]
    assert driver_name("h100", "gpu", "ubuntu22.04") == "nvidia-gpu-driver-h100-ubuntu22.04"
    assert driver_name("host", "vgpu-host-manager", "ubuntu22.04") == "nvidia-vgpu-manager-host-ubuntu22.04"


def test_one_pool_per_os_with_nvidias_node_selector() -> None:
    nodes = [gpu_node("a", UBUNTU), gpu_node("b", RHEL), gpu_node("c", UBUNTU), gpu_node("no-nfd")]
    found = pools(driver(nodeSelector={"pool": "h100"}), nodes)
    assert [(v.name, v.account, v.os_tag) for v in found] == [
        (app_name(UID, "gpu", "rhel9"), "nvidia-gpu-driver-h100-rhel9", "rhel9"),
        (app_name(UID, "gpu", "ubuntu22.04"), "nvidia-gpu-driver-h100-ubuntu22.04", "ubuntu22.04"),
    ]
    base = {"pool": "h100", GPU_PRESENT: "true", OWNER_LABEL: "h100"}
    assert found[0].node_selector == {**base, OS_ID_LABEL: "rhel", OS_VERSION_MAJOR_LABEL: "9"}
    assert found[1].node_selector == {**base, **UBUNTU}
    assert all(v.app == v.name for v in found)


def test_precompiled_drivers_get_one_pool_per_kernel() -> None:
    nodes = [
        gpu_node("a", {**UBUNTU, KERNEL_LABEL: "5.15.0-105-generic"}),
        gpu_node("b", {**UBUNTU, KERNEL_LABEL: "6.8.0-40-generic"}),
        gpu_node("no-kernel", UBUNTU),
    ]
    found = pools(driver(usePrecompiled=True, version="595"), nodes)
    assert [(v.kernel, v.node_selector[KERNEL_LABEL]) for v in found] == [
        ("5.15.0-105-generic", "5.15.0-105-generic"),
        ("6.8.0-40-generic", "6.8.0-40-generic"),
    ]
    assert found[0].name != found[1].name


def test_render_driver_gives_each_pool_its_daemonset_and_account() -> None:
    nodes = [
        gpu_node("a", UBUNTU),
        NodeInfo("b", {**RHEL, "feature.node.kubernetes.io/pci-10de.present": "true"}),
    ]
    objects = render_driver(driver(), nodes, ClusterFacts(namespace="gpu-operator"))
    daemonsets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}
    assert set(daemonsets) == {app_name(UID, "gpu", "rhel9"), app_name(UID, "gpu", "ubuntu22.04")}
    ubuntu = daemonsets[app_name(UID, "gpu", "ubuntu22.04")]
    assert ubuntu["spec"]["selector"]["matchLabels"] == {"app": app_name(UID, "gpu", "ubuntu22.04")}
    pod = ubuntu["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nvidia-gpu-driver-h100-ubuntu22.04"
    assert pod["nodeSelector"][OWNER_LABEL] == "h100"
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.driver"] == "true"
    driver_ctr = next(c for c in pod["containers"] if c["name"] == "nvidia-driver-ctr")
    assert driver_ctr["image"] == "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
    accounts = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    assert accounts == ["nvidia-gpu-driver-h100-rhel9", "nvidia-gpu-driver-h100-ubuntu22.04"]


def test_nothing_without_a_pool() -> None:
    assert render_driver(driver(), [gpu_node("no-nfd")], ClusterFacts()) == []
    assert render_driver(DriverObject("broken", UID, None), [gpu_node("a", UBUNTU)], ClusterFacts()) == []


def test_tolerations_add_to_the_default_and_args_follow_init() -> None:
    toleration = {"key": "foo", "operator": "Exists", "effect": "NoSchedule"}
    objects = render_driver(
        driver(tolerations=[toleration], args=["--foo"]), [gpu_node("a", UBUNTU)], ClusterFacts()
    )
    pod = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        toleration,
    ]
    ctr = next(c for c in pod["containers"] if c["name"] == "nvidia-driver-ctr")
    assert ctr["args"] == ["init", "--foo"]


def _daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "DaemonSet")


def _driver_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    pod = daemonset["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "nvidia-driver-ctr")


TOKEN = "/drivers/ClientConfigToken/client_configuration_token.tok"


def test_licensing_uses_nls_unless_turned_off() -> None:
    # NVIDIADriver's nlsEnabled defaults to true (the ClusterPolicy's to false): the client token is
    # mounted beside gridd.conf unless nlsEnabled is false.
    def mounts(**licensing: Any) -> list[str]:
        objects = render_driver(
            driver(driverType="vgpu", licensingConfig={"secretName": "licence", **licensing}),
            [gpu_node("a", UBUNTU)],
            ClusterFacts(),
        )
        return [
            m["mountPath"]
            for m in _driver_container(_daemonset(objects))["volumeMounts"]
            if m["name"] == "licensing-config"
        ]

    assert mounts() == ["/drivers/gridd.conf", TOKEN]
    assert mounts(nlsEnabled=True) == ["/drivers/gridd.conf", TOKEN]
    assert mounts(nlsEnabled=False) == ["/drivers/gridd.conf"]


def test_a_vgpu_host_manager_pool_renders_nvidias_vgpu_manager_pod() -> None:
    # NVIDIA's manifests/state-driver/0500_daemonset.yaml for driverType vgpu-host-manager.
    probe = {"initialDelaySeconds": 60}
    host = driver(
        "host",
        driverType="vgpu-host-manager",
        repository="nvcr.io/nvidia",
        image="vgpu-manager",
        livenessProbe=probe,
        readinessProbe=probe,
    )
    daemonset = _daemonset(render_driver(host, [gpu_node("a", UBUNTU)], ClusterFacts()))
    assert daemonset["metadata"]["name"] == app_name(UID, "vgpu-host-manager", "ubuntu22.04")
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    for metadata in (daemonset["metadata"], template["metadata"]):
        assert metadata["labels"][COMPONENT_LABEL] == VGPU_HOST_MANAGER_LABEL
        assert component_of(metadata) == "driver"  # the operator's own bookkeeping still sees a driver
    assert pod["serviceAccountName"] == "nvidia-vgpu-manager-host-ubuntu22.04"
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"] == "true"
    assert "nvidia.com/gpu.deploy.driver" not in pod["nodeSelector"]
    assert pod["terminationGracePeriodSeconds"] == 120
    terms = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["labelSelector"]["matchExpressions"][0]["values"] == [
        "nvidia-driver",
        VGPU_HOST_MANAGER_LABEL,
    ]
    ctr = _driver_container(daemonset)
    assert ctr["image"] == "nvcr.io/nvidia/vgpu-manager:595.91.07-ubuntu22.04"
    # No probe (nothing writes .driver-ctr-ready for it), not even the ones the spec asks for, and no preStop.
    assert not {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle"} & set(ctr)
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path, name in (("/sys/fs/cgroup", "cgroup"), ("/dev/vfio", "vfio")):
        assert mounts[path] == name and volumes[name] == {"name": name, "hostPath": {"path": path}}


def test_gpu_and_vgpu_guest_pools_render_the_same_pod() -> None:
    # Only the names follow driverType gpu or vgpu (NVIDIA's asset renders both alike): the guest
    # driver's image decides what it is.
    node = [gpu_node("a", UBUNTU)]
    gpu, vgpu = (
        _daemonset(render_driver(driver(driverType=t), node, ClusterFacts())) for t in ("gpu", "vgpu")
    )
    assert vgpu["metadata"]["name"] == app_name(UID, "vgpu", "ubuntu22.04")
    assert vgpu["spec"]["template"]["spec"]["serviceAccountName"] == "nvidia-vgpu-driver-h100-ubuntu22.04"
    for daemonset in (gpu, vgpu):
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.deploy.driver"] == "true"
        assert "terminationGracePeriodSeconds" not in pod
        assert daemonset["spec"]["template"]["metadata"]["labels"][COMPONENT_LABEL] == "nvidia-driver"
        assert "startupProbe" in _driver_container(daemonset)

    def pod_of(daemonset: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in daemonset["spec"]["template"]["spec"].items() if k != "serviceAccountName"}

    assert pod_of(gpu) == pod_of(vgpu)
