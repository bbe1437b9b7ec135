"""GPU-node detection and the deploy-label rules (who owns which label, dependency order per node)."""

from __future__ import annotations

import pytest
from builders import PCI, gpu_node, label_owner, node_body

from gpu_operator.api import parse_spec
from gpu_operator.core.components import BY_NAME, COMPONENTS, RUNTIME_LABEL
from gpu_operator.core.images import tag_of
from gpu_operator.core.node_labels import (
    DEPLOY_OPERANDS,
    GPU_PRESENT,
    MIG_CONFIG,
    IsReady,
    NodeInfo,
    cluster_facts,
    desired_labels,
    node_info,
    unmet_dependencies,
)


def ready_all(component: str, node: str) -> bool:
    return True


def ready_none(component: str, node: str) -> bool:
    return False


def deploy(name: str) -> str:
    return f"nvidia.com/gpu.deploy.{name}"


def test_gpu_detection_sources() -> None:
    assert gpu_node().is_gpu
    assert NodeInfo("n", {"feature.node.kubernetes.io/pci-0302_10de.present": "true"}).is_gpu
    assert NodeInfo("n", {}, gpu_allocatable=8).is_gpu
    assert NodeInfo("n", {GPU_PRESENT: "true"}).is_gpu  # someone else said so
    # Our own gpu.present label does not keep a node a GPU node once the evidence is gone.
    assert not NodeInfo("n", {GPU_PRESENT: "true"}, own_labels=frozenset({GPU_PRESENT})).is_gpu
    assert not NodeInfo("cpu", {"feature.node.kubernetes.io/system-os_release.ID": "ubuntu"}).is_gpu


def test_node_info_reads_our_labels_from_managed_fields() -> None:
    body = node_body(
        "gpu-0",
        {GPU_PRESENT: "true", deploy("driver"): "false"},
        managed_fields=[
            label_owner([GPU_PRESENT]),
            label_owner([deploy("driver")], "kubectl-label", "Update"),
        ],
        status={"allocatable": {"nvidia.com/gpu": "4"}},
    )
    info = node_info(body)
    assert info.own_labels == {GPU_PRESENT}
    assert info.gpu_allocatable == 4


def only(*names: str) -> IsReady:
    return lambda component, node: component in names


def test_fresh_gpu_node_gets_only_the_driver_first_then_the_toolkit_once_the_driver_pod_started() -> None:
    spec = parse_spec({})
    first = {GPU_PRESENT: "true", RUNTIME_LABEL: "containerd", deploy("driver"): "true"}
    assert desired_labels(gpu_node(), spec, ready_none, only()) == first
    # The driver pod in its init containers (k8s-driver-manager): the toolkit label would be paused
    # by it, its pod evicted and re-created, where a driver is still loaded.
    node = gpu_node(labels={deploy("driver"): "true"})
    assert deploy("container-toolkit") not in desired_labels(node, spec, ready_none, only())
    # Past them, the driver container installing: the toolkit's pod waits in Init for it by itself.
    labels = desired_labels(node, spec, ready_none, only("driver"))
    assert labels == {**first, deploy("container-toolkit"): "true"}


def test_the_validator_comes_only_once_the_toolkit_is_ready() -> None:
    spec = parse_spec({})
    node = gpu_node(labels={deploy("driver"): "true", deploy("container-toolkit"): "true"})
    for waiting in (only(), only("driver")):
        labels = desired_labels(node, spec, waiting, ready_all)
        assert deploy("operator-validator") not in labels and deploy("device-plugin") not in labels
    labels = desired_labels(node, spec, only("driver", "container-toolkit"))
    assert labels[deploy("operator-validator")] == labels[deploy("device-plugin")] == "true"
    # dcgm-exporter does not wait for DCGM (it crash-loops without it): DCGM must be ready first.
    assert deploy("dcgm") in labels and deploy("dcgm-exporter") not in labels


def test_a_started_dependency_counts_only_for_what_waits_for_it_and_while_it_is_deployed() -> None:
    spec = parse_spec({})
    for value in ("paused-for-driver-upgrade", "custom"):
        node = gpu_node(labels={deploy("driver"): value})
        assert deploy("container-toolkit") not in desired_labels(node, spec, ready_none, ready_all), value
    toolkit, plugin = BY_NAME["container-toolkit"], BY_NAME["device-plugin"]
    node = gpu_node(labels={deploy("driver"): "true"})
    assert unmet_dependencies(toolkit, spec, node, ready_none) == ["driver"]  # not told: only when ready
    assert unmet_dependencies(toolkit, spec, node, ready_none, only("driver")) == []
    # The device plugin's pods do not wait for the toolkit: it must be ready.
    node = gpu_node(labels={deploy("driver"): "true", deploy("container-toolkit"): "true"})
    assert unmet_dependencies(plugin, spec, node, only("driver"), ready_all) == ["container-toolkit"]


def test_registry_order_and_waits() -> None:
    seen: set[str] = set()
    for component in COMPONENTS:
        assert set(component.depends_on) <= seen, f"{component.name} comes before a dependency"
        assert set(component.waits_for) <= set(component.depends_on), component.name
        seen.add(component.name)


def test_runtime_label_from_the_kubelet_else_default_runtime() -> None:
    body = node_body("n", {PCI: "true"}, status={"nodeInfo": {"containerRuntimeVersion": "cri-o://1.30.4"}})
    assert desired_labels(node_info(body), parse_spec({}), ready_none)[RUNTIME_LABEL] == "crio"
    kwok = node_body("n", status={"nodeInfo": {"containerRuntimeVersion": "kwok-v0.8"}})
    unknown = NodeInfo("n", {PCI: "true"}, runtime=node_info(kwok).runtime)
    assert unknown.runtime is None
    spec = parse_spec({"operator": {"defaultRuntime": "docker"}})
    assert desired_labels(unknown, spec, ready_none)[RUNTIME_LABEL] == "docker"
    # Someone else's value is left alone; without the toolkit nothing selects on it.
    foreign = NodeInfo("n", {PCI: "true", RUNTIME_LABEL: "crio"})
    assert RUNTIME_LABEL not in desired_labels(foreign, parse_spec({}), ready_none)
    assert RUNTIME_LABEL not in desired_labels(
        gpu_node(), parse_spec({"toolkit": {"enabled": False}}), ready_none
    )


def test_chain_follows_readiness_per_node() -> None:
    spec = parse_spec({})

    def driver_ready(component: str, node: str) -> bool:
        return component == "driver"

    labels = desired_labels(gpu_node(), spec, driver_ready)
    assert labels[deploy("container-toolkit")] == "true"
    assert deploy("node-status-exporter") not in labels  # off by default
    with_exporter = desired_labels(
        gpu_node(), parse_spec({"nodeStatusExporter": {"enabled": True}}), driver_ready
    )
    assert with_exporter[deploy("node-status-exporter")] == "true"  # needs only the driver
    assert deploy("device-plugin") not in labels  # toolkit not ready yet
    everything = desired_labels(gpu_node(), spec, ready_all)
    assert {deploy(c) for c in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery")} <= set(
        everything
    )
    assert deploy("mig-manager") not in everything  # not MIG-capable


def test_labels_once_set_by_us_are_kept_while_a_dependency_restarts() -> None:
    key = deploy("container-toolkit")
    node = gpu_node(labels={key: "true"}, own_labels=frozenset({key, deploy("driver"), GPU_PRESENT}))
    assert desired_labels(node, parse_spec({}), ready_none)[key] == "true"


def test_disabled_dependency_counts_as_satisfied_but_its_own_dependencies_apply() -> None:
    spec = parse_spec({"driver": {"enabled": False}})
    labels = desired_labels(gpu_node(), spec, ready_none)
    assert labels[deploy("container-toolkit")] == "true"
    assert deploy("driver") not in labels
    spec = parse_spec({"toolkit": {"enabled": False}})
    labels = desired_labels(gpu_node(), spec, ready_none)
    # Still waits for the driver, to be ready: its pods would not wait for it (only the toolkit's do).
    assert deploy("device-plugin") not in labels


def test_foreign_values_are_never_touched_and_opt_out_a_dependency() -> None:
    node = gpu_node(labels={deploy("driver"): "false"})
    labels = desired_labels(node, parse_spec({}), ready_none)
    assert deploy("driver") not in labels  # not ours: left as the user set it
    # A driver opted out on this node (pre-installed) no longer holds the toolkit back.
    assert labels[deploy("container-toolkit")] == "true"
    paused = gpu_node(labels={deploy("device-plugin"): "paused-for-driver-upgrade"})
    assert deploy("device-plugin") not in desired_labels(paused, parse_spec({}), ready_all)


def test_operands_false_takes_the_node_out() -> None:
    node = gpu_node(labels={DEPLOY_OPERANDS: "false"})
    assert desired_labels(node, parse_spec({}), ready_all) == {GPU_PRESENT: "true"}


def test_mig_manager_only_on_mig_capable_nodes_with_default_layout() -> None:
    node = gpu_node(labels={"nvidia.com/mig.capable": "true"})
    labels = desired_labels(node, parse_spec({}), ready_all)
    assert labels[deploy("mig-manager")] == "true"
    assert labels[MIG_CONFIG] == "all-disabled"
    user_layout = gpu_node(labels={"nvidia.com/mig.capable": "true", "nvidia.com/mig.config": "all-1g.10gb"})
    assert MIG_CONFIG not in desired_labels(user_layout, parse_spec({}), ready_all)


def test_no_policy_or_non_gpu_node_owns_nothing() -> None:
    assert desired_labels(gpu_node(), None, ready_all) == {}
    assert desired_labels(NodeInfo("cpu", {}), parse_spec({}), ready_all) == {}


def test_cluster_facts_from_first_gpu_node() -> None:
    nodes = [
        node_body("cpu-0", {"feature.node.kubernetes.io/system-os_release.ID": "rhel"}),
        node_body(
            "gpu-1",
            {
                PCI: "true",
                "feature.node.kubernetes.io/system-os_release.ID": "rhel",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "9.4",
                "feature.node.kubernetes.io/kernel-version.full": "5.14.0-427.el9.x86_64",
            },
        ),
    ]
    facts = cluster_facts(nodes, "ns", {})
    assert facts.os_tag == "rhel9"  # the driver image's tag: RHEL's major version only
    assert facts.kernels == (("5.14.0-427.el9.x86_64", "rhel9.4"),)  # a precompiled DaemonSet's name
    assert facts.runtimes == ("containerd",)  # not reported: NVIDIA's default
    assert facts.namespace == "ns"


def test_cluster_facts_list_every_kernel_and_runtime_in_nvidias_order() -> None:
    def node(name: str, kernel: str, runtime: str) -> dict[str, object]:
        """A GPU node with this kernel and container runtime (builders.node_body in short)."""
        labels = {PCI: "true", "feature.node.kubernetes.io/kernel-version.full": kernel}
        return node_body(name, labels, status={"nodeInfo": {"containerRuntimeVersion": runtime}})

    nodes = [
        node("a", "6.8", "docker://27"),
        node("b", "5.15", "cri-o://1.30"),
        node("c", "6.8", "containerd://2.0"),
    ]
    facts = cluster_facts(nodes, "ns", {})
    assert facts.kernels == (("5.15", None), ("6.8", None))
    assert facts.runtimes == ("containerd", "crio", "docker")


@pytest.mark.parametrize(
    ("os_image", "tag"),
    [
        ("Ubuntu 22.04.4 LTS", "ubuntu22.04"),
        ("Ubuntu 24.04 LTS", "ubuntu24.04"),
        ("Debian GNU/Linux 12 (bookworm)", "debian12"),
        ("Red Hat Enterprise Linux 9.4 (Plow)", "rhel9"),
        ("Rocky Linux 8.9 (Green Obsidian)", "rocky8"),
        ("SUSE Linux Enterprise Server 15 SP5", "sles15.5"),
        ("Amazon Linux 2023.4.20240319", "amzn2023"),
        ("Talos (v1.7.0)", None),
        ("", None),
    ],
)
def test_without_nfd_the_os_comes_from_the_kubelet(os_image: str, tag: str | None) -> None:
    """The chart's node agent sets only PCI labels: the driver tag still gets the node's OS."""
    node = node_body("gpu-0", {PCI: "true"}, status={"nodeInfo": {"osImage": os_image}})
    assert cluster_facts([node], "ns", {}).os_tag == tag


def test_nfd_labels_win_over_the_kubelets_os_image() -> None:
    labels = {
        PCI: "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
    }
    node = node_body("gpu-0", labels, status={"nodeInfo": {"osImage": "Ubuntu 22.04.4 LTS"}})
    assert cluster_facts([node], "ns", {}).os_tag == "ubuntu24.04"


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("rhel9.4", "rhel9"),
        ("rocky8.10", "rocky8"),
        ("ol9.3", "ol9"),
        ("ubuntu22.04", "ubuntu22.04"),
        ("sles15.6", "sles15.6"),
        ("sl-micro6.0", "sl-micro6.0"),
    ],
)
def test_driver_image_tag_of_an_os_name(name: str, tag: str) -> None:
    """A precompiled driver's DaemonSet carries the OS name, its image NVIDIA's tag."""
    assert tag_of(name) == tag


def test_which_components_are_enabled_follows_each_policy_object_asked_about() -> None:
    # Component.enabled keeps the answer for the last policy object asked: asking of another one (a new
    # ClusterPolicy generation is a new object) answers for that one, and back again.
    everything, without_dcgm = parse_spec({}), parse_spec({"dcgm": {"enabled": False}})
    dcgm = BY_NAME["dcgm"]
    assert [dcgm.enabled(p) for p in (everything, without_dcgm, everything, without_dcgm)] == [
        True,
        False,
        True,
        False,
    ]
