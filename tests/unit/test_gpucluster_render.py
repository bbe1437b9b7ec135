"""The GPUCluster's objects (core/gpucluster_render.py): what NVIDIA's Go tests beside its golden files
assert (internal/state/dra_driver_test.go, dcgm_test.go, dcgm_exporter_test.go, dra_validation_test.go),
and what ours adds. The golden files themselves are compared in test_conformance.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpu_operator.api import parse_spec
from gpu_operator.api.common import ResourceRequirements
from gpu_operator.api.gpucluster import GPUClusterSpec, parse_gpucluster_spec
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.gpucluster_render import (
    FOLDERS,
    enabled_folders,
    feature_gates,
    largest_resources,
    render_gpucluster,
)
from gpu_operator.core.ownership import MANAGED_BY_LABEL
from gpu_operator.core.render import CLUSTER_SCOPED_KINDS, ClusterFacts, render_component

ENVIRON = {"VALIDATOR_IMAGE": "nvcr.io/nvidia/gpu-operator-validator:test"}
FACTS = ClusterFacts(namespace="test-operator", environ=ENVIRON)
SAMPLE: dict[str, Any] = {
    "draDriver": {
        "repository": "nvcr.io/nvidia",
        "image": "k8s-dra-driver-gpu",
        "version": "v0.1.0",
        "imagePullPolicy": "IfNotPresent",
        "featureGates": {"MPSSupport": True, "AdminAccess": False},
    },
    "daemonsets": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}
IMAGE = "nvcr.io/nvidia/k8s-dra-driver-gpu:v0.1.0"


def spec_of(**changes: Any) -> GPUClusterSpec:
    body = {**SAMPLE, **changes}
    return parse_gpucluster_spec(body)


def with_dra(**changes: Any) -> GPUClusterSpec:
    return spec_of(draDriver={**SAMPLE["draDriver"], **changes})


def render(spec: GPUClusterSpec, **kwargs: Any) -> list[dict[str, Any]]:
    return render_gpucluster(spec, FACTS, **kwargs)


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, [o["metadata"]["name"] for o in found]
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    pod = workload["spec"]["template"]["spec"]
    found: dict[str, Any] = next(
        c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name
    )
    return found


def env(ctr: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


def kinds(objects: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for obj in objects:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    return counts


# --- the DRA driver ---------------------------------------------------------------------------------


def test_gpus_only_renders_nvidias_cut() -> None:
    objects = render(spec_of(), folders=["dra-driver"])
    counts = kinds(objects)
    assert (counts["ServiceAccount"], counts["ClusterRole"], counts["ClusterRoleBinding"]) == (1, 1, 1)
    assert counts["DaemonSet"] == 1 and "Deployment" not in counts
    classes = [o for o in objects if o["kind"] == "DeviceClass"]
    assert {o["metadata"]["name"] for o in classes} == {
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "vfio.gpu.nvidia.com",
    }
    assert {o["apiVersion"] for o in classes} == {"resource.k8s.io/v1"}
    ds = one(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["driver-validation"]
    assert [c["name"] for c in pod["containers"]] == ["gpus"]
    gpus = container(ds, "gpus")
    assert gpus["image"] == IMAGE and env(gpus)["IMAGE_NAME"] == IMAGE
    assert env(gpus)["FEATURE_GATES"] == "AdminAccess=false,MPSSupport=true"
    # The driver root comes from driver-ready, written by the init container: never in the pod spec.
    assert "NVIDIA_DRIVER_ROOT" not in env(gpus) and "DRIVER_ROOT_CTR_PATH" not in env(gpus)
    assert "source /run/nvidia/validations/driver-ready" in gpus["args"][0]
    assert "exec gpu-kubelet-plugin" in gpus["args"][0]


def test_the_kubelet_plugin_waits_for_the_driver_on_its_node() -> None:
    ds = one(render(spec_of(), folders=["dra-driver"]), "DaemonSet")
    init = container(ds, "driver-validation")
    assert init["image"] == ENVIRON["VALIDATOR_IMAGE"]
    assert init["command"] == ["nvidia-validator"]
    assert env(init)["COMPONENT"] == "driver" and env(init)["WITH_WAIT"] == "true"
    assert init["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert {m["name"] for m in init["volumeMounts"]} == {"host-root", "driver-install-dir", "validations"}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["validations"]["hostPath"]["path"] == "/run/nvidia/validations"
    assert volumes["driver-install-dir"]["hostPath"]["path"] == "/run/nvidia/driver"


def test_nodes_are_selected_by_deploy_labels_only() -> None:
    # spec.nodeSelector picks the nodes through the deploy labels (core/allocators.py), never in the
    # DaemonSets: a node leaving the pool keeps the kubelet plugin while its claims' pods remain.
    spec = spec_of(nodeSelector={"pool": "dra"}, dcgm={"enabled": True}, dcgmExporter={})
    for folder in FOLDERS:
        workload = one(render(spec, folders=[folder]), "DaemonSet")
        selector = workload["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == {f"nvidia.com/gpu.deploy.{folder}": "true"}


def test_healthcheck_port_override_and_disabled() -> None:
    spec = with_dra(gpus={"kubeletPlugin": {"healthcheck": {"port": 52000}}})
    gpus = container(one(render(spec, folders=["dra-driver"]), "DaemonSet"), "gpus")
    assert env(gpus)["HEALTHCHECK_PORT"] == "52000"
    assert gpus["startupProbe"]["grpc"]["port"] == gpus["livenessProbe"]["grpc"]["port"] == 52000
    spec = with_dra(gpus={"kubeletPlugin": {"healthcheck": {"enabled": False}}})
    gpus = container(one(render(spec, folders=["dra-driver"]), "DaemonSet"), "gpus")
    # The plugin reads -1 as "no health service"; without one, a probe would restart it forever.
    assert env(gpus)["HEALTHCHECK_PORT"] == "-1"
    assert "startupProbe" not in gpus and "livenessProbe" not in gpus


def test_validation_resources_are_the_largest_of_the_running_plugins() -> None:
    spec = with_dra(
        gpus={
            "kubeletPlugin": {
                "resources": {
                    "limits": {"cpu": "500m", "memory": "256Mi"},
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                }
            }
        },
        computeDomains={
            "kubeletPlugin": {
                "resources": {
                    "limits": {"cpu": "300m", "memory": "512Mi"},
                    "requests": {"cpu": "200m", "memory": "64Mi"},
                }
            }
        },
    )
    init = container(one(render(spec, folders=["dra-driver"]), "DaemonSet"), "driver-validation")
    assert init["resources"] == {
        "limits": {"cpu": "500m", "memory": "512Mi"},
        "requests": {"cpu": "200m", "memory": "128Mi"},
    }
    # A disabled computeDomains container does not run, so its resources count for nothing.
    off = with_dra(
        gpus={"kubeletPlugin": {"resources": {"limits": {"cpu": "500m"}, "requests": {"cpu": "100m"}}}},
        computeDomains={
            "enabled": False,
            "kubeletPlugin": {"resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}}},
        },
    )
    init = container(one(render(off, folders=["dra-driver"]), "DaemonSet"), "driver-validation")
    assert init["resources"] == {"limits": {"cpu": "500m"}, "requests": {"cpu": "100m"}}


def requirements(**body: Any) -> ResourceRequirements:
    return ResourceRequirements.model_validate(body)


def test_largest_resources_keeps_the_result_valid() -> None:
    raised = largest_resources(
        [requirements(requests={"cpu": "1"}), requirements(limits={"cpu": "500m"}, requests={"cpu": "100m"})]
    )
    assert raised == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    # A resource none of them limited stays unlimited.
    assert largest_resources([requirements(requests={"memory": "1Gi"})]) == {"requests": {"memory": "1Gi"}}
    assert largest_resources([None, None]) is None


def test_feature_gates_are_sorted() -> None:
    assert feature_gates({"b": True, "a": False}) == "a=false,b=true"
    assert feature_gates({}) is None and feature_gates(None) is None


def test_mps_role_only_with_mps_support() -> None:
    names = {o["metadata"]["name"] for o in render(spec_of(), folders=["dra-driver"])}
    assert "nvidia-dra-driver-kubeletplugin-mps" in names
    names = {
        o["metadata"]["name"]
        for o in render(with_dra(featureGates={"MPSSupport": False}), folders=["dra-driver"])
    }
    assert "nvidia-dra-driver-kubeletplugin-mps" not in names


def test_compute_domains_add_their_container_controller_and_classes() -> None:
    objects = render(with_dra(computeDomains={}), folders=["dra-driver"])
    names = {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
    assert kinds(objects)["DeviceClass"] == 5
    assert {
        "DeviceClass/compute-domain-daemon.nvidia.com",
        "DeviceClass/compute-domain-default-channel.nvidia.com",
        "Deployment/nvidia-dra-driver-controller",
        "ServiceAccount/nvidia-dra-driver-controller",
        "ServiceAccount/compute-domain-daemon-service-account",
        "Role/nvidia-dra-driver-kubeletplugin",
    } <= names
    ds = one(objects, "DaemonSet")
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]] == ["gpus", "compute-domains"]
    cd = container(ds, "compute-domains")
    assert "exec compute-domain-kubelet-plugin" in cd["args"][0]
    assert env(cd)["HEALTHCHECK_PORT"] == "51515"
    controller = one(objects, "Deployment")
    ctr = controller["spec"]["template"]["spec"]["containers"][0]
    assert ctr["image"] == IMAGE
    assert env(ctr)["LEADER_ELECTION_ENABLED"] == "false"
    assert env(ctr)["LEADER_ELECTION_LEASE_LOCK_NAMESPACE"] == "test-operator"


def test_controller_inherits_the_shared_settings() -> None:
    spec = spec_of(
        draDriver={**SAMPLE["draDriver"], "computeDomains": {}},
        daemonsets={
            "labels": {"team": "platform"},
            "annotations": {"monitoring": "enabled"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "global-priority",
        },
    )
    controller = one(render(spec, folders=["dra-driver"]), "Deployment")
    template = controller["spec"]["template"]
    assert controller["metadata"]["labels"]["team"] == template["metadata"]["labels"]["team"] == "platform"
    assert (
        controller["metadata"]["annotations"]
        == template["metadata"]["annotations"]
        == {"monitoring": "enabled"}
    )
    keys = [t["key"] for t in template["spec"]["tolerations"]]
    assert "node-role.kubernetes.io/control-plane" in keys and "nvidia.com/gpu" in keys
    assert template["spec"]["priorityClassName"] == "global-priority"


def test_user_labels_never_reach_the_selectors() -> None:
    spec = spec_of(daemonsets={"labels": {"app": "mine", "app.kubernetes.io/part-of": "mine", "env": "test"}})
    ds = one(render(spec, folders=["dra-driver"]), "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app"] == "nvidia-dra-driver-kubelet-plugin" and pod_labels["env"] == "test"
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_passthrough_support_mounts_the_hosts_modules_sys_and_proc() -> None:
    ds = one(render(with_dra(featureGates={"PassthroughSupport": True}), folders=["dra-driver"]), "DaemonSet")
    mounts = {m["name"] for m in container(ds, "gpus")["volumeMounts"]}
    assert {"lib-modules", "sysfs", "procfs"} <= mounts


def test_resource_api_version_shapes_the_claim_templates() -> None:
    spec = spec_of(dcgm={"enabled": True})
    v1 = one(render(spec, folders=["dcgm-dra"]), "ResourceClaimTemplate")
    assert v1["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True
    beta = one(
        render(spec, resource_api="resource.k8s.io/v1beta1", folders=["dcgm-dra"]), "ResourceClaimTemplate"
    )
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert beta["spec"]["spec"]["devices"]["requests"][0] == {
        "name": "admin-gpus",
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "All",
        "adminAccess": True,
    }


def test_a_value_cannot_inject_yaml() -> None:
    hostile = "x\n---\napiVersion: v1\nkind: Secret"
    spec = with_dra(gpus={"kubeletPlugin": {"env": [{"name": "EVIL", "value": hostile}]}})
    objects = render(spec, folders=["dra-driver"])
    assert "Secret" not in kinds(objects)
    assert env(container(one(objects, "DaemonSet"), "gpus"))["EVIL"] == hostile


# --- DCGM, the exporter, the validator --------------------------------------------------------------


def test_enabled_states_follow_nvidias_controller() -> None:
    assert enabled_folders(spec_of()) == ["dra-driver", "dra-validator"]
    assert enabled_folders(spec_of(dcgm={"enabled": True}, dcgmExporter={})) == list(FOLDERS)
    assert [o["metadata"]["name"] for o in render(spec_of()) if o["kind"] == "DaemonSet"] == [
        "nvidia-dra-driver-kubelet-plugin",
        "nvidia-dra-validator",
    ]


def test_the_exporter_uses_the_standalone_hostengine_when_dcgm_runs() -> None:
    embedded = one(render(spec_of(dcgmExporter={}), folders=["dcgm-exporter-dra"]), "DaemonSet")
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env(container(embedded, "nvidia-dcgm-exporter-dra"))
    remote = one(
        render(spec_of(dcgmExporter={}, dcgm={"enabled": True}), folders=["dcgm-exporter-dra"]), "DaemonSet"
    )
    assert (
        env(container(remote, "nvidia-dcgm-exporter-dra"))["DCGM_REMOTE_HOSTENGINE_INFO"]
        == "nvidia-dcgm-dra:5555"
    )


def test_exporter_options() -> None:
    spec = spec_of(
        dcgmExporter={
            "config": {"name": "metrics"},
            "hpcJobMapping": {"enabled": True},
            "enablePodUID": True,
            "podLabelAllowlistRegex": ["^team$", "^app$"],
            "serviceMonitor": {"enabled": True, "interval": "30s"},
        },
        hostPaths={"kubeletRootDir": "/data/kubelet"},
    )
    objects = render(spec, folders=["dcgm-exporter-dra"])
    ds = one(objects, "DaemonSet")
    ctr = container(ds, "nvidia-dcgm-exporter-dra")
    values = env(ctr)
    assert values["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"
    assert values["DCGM_HPC_JOB_MAPPING_DIR"] == "/var/lib/dcgm-exporter/job-mapping"
    assert values["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"] == "true"
    assert values["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"] == "^team$,^app$"
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["pod-gpu-resources"]["hostPath"]["path"] == "/data/kubelet/pod-resources"
    assert volumes["metrics-config"]["configMap"]["name"] == "metrics"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
    without_crd = render_gpucluster(
        spec, replace(FACTS, service_monitor_crd=False), folders=["dcgm-exporter-dra"]
    )
    assert "ServiceMonitor" not in kinds(without_crd)


def test_workloads_claim_gpus_with_admin_access() -> None:
    spec = spec_of(dcgm={"enabled": True}, dcgmExporter={})
    for folder, claim, template in (
        ("dcgm-dra", "admin-gpus", "nvidia-dcgm-admin"),
        ("dcgm-exporter-dra", "admin-gpus", "nvidia-dcgm-exporter-admin"),
        ("dra-validator", "validation-gpu", "nvidia-dra-validator-gpu"),
    ):
        objects = render(spec, folders=[folder])
        pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": claim, "resourceClaimTemplateName": template}]
        request = one(objects, "ResourceClaimTemplate", template)["spec"]["spec"]["devices"]["requests"][0]
        assert request["name"] == claim and request["exactly"]["adminAccess"] is True
        claimed = [
            c
            for c in pod.get("initContainers", []) + pod["containers"]
            if c.get("resources", {}).get("claims")
        ]
        assert claimed, folder


@pytest.mark.parametrize("folders", [None, list(FOLDERS)])
def test_every_object_is_labelled_and_scoped(folders: list[str] | None) -> None:
    spec = spec_of(
        draDriver={**SAMPLE["draDriver"], "computeDomains": {}}, dcgm={"enabled": True}, dcgmExporter={}
    )
    for obj in render(spec, folders=folders):
        assert obj["metadata"]["labels"][MANAGED_BY_LABEL] == "gpu-operator", obj["metadata"]["name"]
        scoped = obj["kind"] in CLUSTER_SCOPED_KINDS
        assert ("namespace" in obj["metadata"]) is not scoped, (obj["kind"], obj["metadata"]["name"])


def test_empty_spec_renders_with_built_in_images() -> None:
    objects = render_gpucluster(parse_gpucluster_spec({}), ClusterFacts())
    gpus = container(one(objects, "DaemonSet", "nvidia-dra-driver-kubelet-plugin"), "gpus")
    assert gpus["image"] == "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0"
    ds = one(objects, "DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    # Without daemonsets.tolerations the pods tolerate the GPU taint, as the ClusterPolicy's do.
    assert ds["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def _host_paths(pod: dict[str, Any], ctr: dict[str, Any]) -> dict[str, str]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
        for m in ctr["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


def test_the_kubelet_plugin_waits_for_the_driver_as_the_clusterpolicys_operands_do() -> None:
    # Whoever installs the driver (the ClusterPolicy, an NVIDIADriver pool, the host), the DRA plugin
    # waits for it on its node with the same validation the toolkit (and so the device plugin) waits on.
    toolkit = render_component(BY_NAME["container-toolkit"], parse_spec({}), FACTS)[-1]
    dra = one(render(spec_of(), folders=["dra-driver"]), "DaemonSet")
    theirs, ours = container(toolkit, "driver-validation"), container(dra, "driver-validation")
    assert ours["image"] == theirs["image"] == ENVIRON["VALIDATOR_IMAGE"]
    for key in ("COMPONENT", "WITH_WAIT"):
        assert env(ours)[key] == env(theirs)[key]
    toolkit_paths = _host_paths(toolkit["spec"]["template"]["spec"], theirs)
    dra_paths = _host_paths(dra["spec"]["template"]["spec"], ours)
    # The same host directories: the validations (driver-ready, .driver-ctr-ready), the driver's root,
    # the host's root.
    assert set(dra_paths.values()) == {"/run/nvidia/validations", "/run/nvidia/driver", "/"}
    assert set(dra_paths.values()) <= set(toolkit_paths.values())
