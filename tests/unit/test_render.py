"""The renderer: golden manifests for the sample policies, and the behaviour users rely on.

`UPDATE_GOLDEN=1 pytest tests/unit/test_render.py` rewrites tests/data/golden/ from the current
templates; review the diff like code.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from gpu_operator.api import ClusterPolicySpec, PolicyError, parse_document, parse_spec
from gpu_operator.core.components import BY_NAME, COMPONENTS, SANDBOX_COMPONENTS
from gpu_operator.core.render import (
    CLUSTER_SCOPED_KINDS,
    PREREQUISITES,
    ClusterFacts,
    RenderError,
    _parse,
    missing_inputs,
    render,
    render_component,
    render_prerequisites,
    template_dir,
    templates_of,
    warm,
)
from gpu_operator.core.render import environment as template_environment
from gpu_operator.core.yaml_text import to_yaml, tojson

DATA = Path(__file__).resolve().parents[1] / "data"
POLICIES = sorted((DATA / "policies").glob("*.yaml"))
GOLDEN = DATA / "golden"
FACTS = ClusterFacts(
    namespace="gpu-operator",
    os_tag="ubuntu22.04",
    kernels=(("5.15.0-105-generic", "ubuntu22.04"),),
    # The user ConfigMaps tests/data/policies/everything.yaml names and the driver mounts file by file.
    config_maps={
        "kernel-module-params": ("nvidia.conf",),
        "apt-mirror": ("mirror.list",),
        "corp-ca": ("ca.crt",),
    },
)
PRECOMPILED = "nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04"
STANDARD_LABELS = {
    "app.kubernetes.io/managed-by": "gpu-operator",
    "app.kubernetes.io/part-of": "gpu-operator",
}

Obj = dict[str, Any]


def load(name: str) -> ClusterPolicySpec:
    return parse_document(yaml.safe_load((DATA / "policies" / f"{name}.yaml").read_text()))


def daemonsets(objects: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def pod_spec(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def container(ds: Obj, name: str, init: bool = False) -> Obj:
    key = "initContainers" if init else "containers"
    found: list[Obj] = [c for c in pod_spec(ds).get(key, []) if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def env_of(ctr: Obj) -> dict[str, Any]:
    names = [e["name"] for e in ctr.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names in {ctr['name']}: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


def render_spec(spec: dict[str, Any], facts: ClusterFacts = FACTS) -> list[Obj]:
    return render(parse_spec(spec), facts)


# --- golden files --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy_file", POLICIES, ids=[p.stem for p in POLICIES])
def test_golden(policy_file: Path) -> None:
    try:
        policy = parse_document(yaml.safe_load(policy_file.read_text()))
    except PolicyError:
        pytest.skip("not a valid policy (used by validation tests)")
    rendered = to_yaml(render(policy, FACTS))
    golden = GOLDEN / f"{policy_file.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.exists(), f"{golden} is missing; run UPDATE_GOLDEN=1 pytest {__file__}"
    assert rendered == golden.read_text(), f"{golden.name} differs; review and run UPDATE_GOLDEN=1"


# --- images --------------------------------------------------------------------------------------


def test_seed_sample_images() -> None:
    ds = daemonsets(render(load("seed-sample"), FACTS))
    toolkit = container(ds["nvidia-container-toolkit-daemonset"], "nvidia-container-toolkit-ctr")
    assert toolkit["image"] == "nvidia/container-toolkit:1.15.0-ubuntu22.04"
    driver = container(ds["nvidia-driver-daemonset"], "nvidia-driver-ctr")
    assert driver["image"] == "nvcr.io/nvidia/driver:535-5.4.0-ubuntu22.04"
    validator = container(ds["nvidia-operator-validator"], "nvidia-operator-validator")
    assert validator["image"] == "nvidia/cloud-native/k8s-logical-edge-validator:v22.10.0"
    # Init containers of other operands run the validator image too.
    plugin = ds["nvidia-device-plugin-daemonset"]
    assert container(plugin, "toolkit-validation", init=True)["image"] == validator["image"]


def test_precompiled_driver_tag_and_kernel_selector() -> None:
    ds = daemonsets(
        render_spec(
            {
                "driver": {
                    "usePrecompiled": True,
                    "version": "550.90.07",
                    "image": "driver",
                    "repository": "nvcr.io/nvidia",
                }
            }
        )
    )
    driver = ds[PRECOMPILED]
    assert "nvidia-driver-daemonset" not in ds
    assert container(driver, "nvidia-driver-ctr")["image"] == (
        "nvcr.io/nvidia/driver:550.90.07-5.15.0-105-generic-ubuntu22.04"
    )
    assert (
        pod_spec(driver)["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"]
        == "5.15.0-105-generic"
    )
    assert driver["metadata"]["labels"]["nvidia.com/precompiled"] == "true"


def test_one_precompiled_driver_daemonset_per_kernel() -> None:
    spec = {"driver": {"usePrecompiled": True, "version": "570", "image": "driver", "repository": "r"}}
    kernels = (("5.15.0-105-generic", "ubuntu22.04"), ("6.8.0-31_x86_64", "ubuntu24.04"))
    ds = daemonsets(render_spec(spec, ClusterFacts(kernels=kernels)))
    assert sorted(n for n in ds if n.startswith("nvidia-driver")) == [
        PRECOMPILED,
        "nvidia-driver-daemonset-6.8.0-31-ubuntu24.04",
    ]
    newer = ds["nvidia-driver-daemonset-6.8.0-31-ubuntu24.04"]
    assert container(newer, "nvidia-driver-ctr")["image"] == "r/driver:570-6.8.0-31_x86_64-ubuntu24.04"
    assert (
        pod_spec(newer)["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"] == "6.8.0-31_x86_64"
    )
    # Without a known kernel there is nothing to pin a driver to; the rest of the driver still renders.
    kinds = {
        o["kind"]
        for o in render_spec(spec, ClusterFacts())
        if o["metadata"]["name"].startswith("nvidia-driver")
    }
    assert "DaemonSet" not in kinds
    assert {"ServiceAccount", "ClusterRole", "ConfigMap"} <= kinds


def test_precompiled_driver_named_after_the_whole_os_version_tagged_with_rhels_major() -> None:
    """NVIDIA's names (kernelVersionMap: ID and VERSION_ID as they are) and tags (getGPUNodeOSInfo:
    RHEL's major version) differ; both are what its operator and NVIDIA's image registry use."""
    spec = {"driver": {"usePrecompiled": True, "version": "570", "image": "driver", "repository": "r"}}
    kernel = "5.14.0-427.13.1.el9_4.x86_64"
    ds = daemonsets(render_spec(spec, ClusterFacts(kernels=((kernel, "rhel9.4"),))))
    driver = ds["nvidia-driver-daemonset-5.14.0-427.13.1.el9.4-rhel9.4"]
    assert container(driver, "nvidia-driver-ctr")["image"] == f"r/driver:570-{kernel}-rhel9"


def subscription_volumes(ds: Obj) -> dict[str, tuple[str, str]]:
    """Mount path → (host path, type) of the driver container's subscription mounts."""
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    found = {}
    for mount in container(ds, "nvidia-driver-ctr")["volumeMounts"]:
        if mount["name"].startswith("subscription-config-") or mount["name"] == "lib-modules":
            assert mount["readOnly"] is True
            host = volumes[mount["name"]]["hostPath"]
            found[mount["mountPath"]] = (host["path"], host["type"])
    return found


RHEL_SUBSCRIPTION = {
    "/run/secrets/etc-pki-entitlement": ("/etc/pki/entitlement", "Directory"),
    "/run/secrets/redhat.repo": ("/etc/yum.repos.d/redhat.repo", "File"),
    "/run/secrets/rhsm": ("/etc/rhsm", "Directory"),
}
SUSE_SUBSCRIPTION = {
    "/etc/SUSEConnect": ("/etc/SUSEConnect", "FileOrCreate"),
    "/etc/zypp/credentials.d": ("/etc/zypp/credentials.d", "Directory"),
}


@pytest.mark.parametrize(
    ("os_tag", "runtime", "spec", "expected"),
    [
        ("rhel9", "containerd", {}, RHEL_SUBSCRIPTION),
        ("rhel9", "crio", {}, {}),  # CRI-O on RHEL injects the subscription itself (mounts.conf)
        ("rhel9", "containerd", {"driver": {"repoConfig": {"configMapName": "apt-mirror"}}}, {}),
        ("sles15.6", "containerd", {}, SUSE_SUBSCRIPTION),
        ("sles15.6", "crio", {"driver": {"repoConfig": {"configMapName": "apt-mirror"}}}, SUSE_SUBSCRIPTION),
        ("sl-micro6.0", "containerd", {}, SUSE_SUBSCRIPTION),
        ("ubuntu22.04", "containerd", {}, {}),
    ],
)
def test_driver_gets_the_distributions_subscription_to_install_kernel_headers(
    os_tag: str, runtime: str, spec: Obj, expected: dict[str, tuple[str, str]]
) -> None:
    """NVIDIA's SubscriptionPathMap and its rule for it (object_controls.go:254-330, 3744-3777)."""
    facts = replace(FACTS, os_tag=os_tag, runtimes=(runtime,))
    assert subscription_volumes(daemonsets(render_spec(spec, facts))["nvidia-driver-daemonset"]) == expected


def test_precompiled_driver_mounts_no_subscription_but_suses_host_modules() -> None:
    spec = {"driver": {"usePrecompiled": True, "version": "570", "image": "driver", "repository": "r"}}
    kernel = "6.4.0-150600.23.25-default"
    for os_name, expected in (
        ("sles15.6", {"/run/host/lib/modules": ("/lib/modules", "Directory")}),
        ("rhel9.4", {}),
    ):
        (driver,) = [
            ds
            for name, ds in daemonsets(render_spec(spec, ClusterFacts(kernels=((kernel, os_name),)))).items()
            if name.startswith("nvidia-driver")
        ]
        assert subscription_volumes(driver) == expected


def test_driver_config_digest_follows_the_driver_configuration() -> None:
    def digest(spec: dict[str, Any]) -> str:
        driver = daemonsets(render_spec(spec))["nvidia-driver-daemonset"]
        manager = env_of(container(driver, "k8s-driver-manager", init=True))["DRIVER_CONFIG_DIGEST"]
        assert env_of(container(driver, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"] == manager
        return str(manager)

    base = digest({})
    assert base.isdigit()
    assert digest({"devicePlugin": {"enabled": False}, "daemonsets": {"labels": {"a": "b"}}}) == base
    for changed in (
        {"driver": {"kernelModuleType": "open"}},
        {"driver": {"env": [{"name": "X", "value": "1"}]}},
        {"driver": {"version": "580.1", "image": "driver"}},
        {"driver": {"manager": {"env": [{"name": "X", "value": "1"}]}}},
        {"driver": {"rdma": {"enabled": True}}},
        {"hostPaths": {"rootFS": "/host-root"}},
    ):
        assert digest(changed) != base, changed


def test_digest_is_never_suffixed() -> None:
    digest = "sha256:" + "ab" * 32
    ds = daemonsets(
        render_spec({"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": digest}})
    )
    assert (
        container(ds["nvidia-driver-daemonset"], "nvidia-driver-ctr")["image"]
        == f"nvcr.io/nvidia/driver@{digest}"
    )


def test_operator_environment_supplies_missing_images() -> None:
    facts = ClusterFacts(
        environ={"DRIVER_IMAGE": "mirror.local/driver:1-ubuntu22.04", "VALIDATOR_IMAGE": "mirror.local/v:1"}
    )
    ds = daemonsets(render_spec({}, facts))
    assert (
        container(ds["nvidia-driver-daemonset"], "nvidia-driver-ctr")["image"]
        == "mirror.local/driver:1-ubuntu22.04"
    )
    assert container(ds["nvidia-dcgm"], "toolkit-validation", init=True)["image"] == "mirror.local/v:1"


# --- which components render ---------------------------------------------------------------------


def test_empty_spec_renders_every_default_component() -> None:
    objects = render_spec({})
    # The node-status exporter is off by NVIDIA's default, the sandbox stacks without sandboxWorkloads.
    off = {"node-status-exporter", *SANDBOX_COMPONENTS}
    expected = {c.daemonset for c in COMPONENTS if c.name not in off}
    assert set(daemonsets(objects)) == expected


def test_disabled_components_render_nothing() -> None:
    objects = render(load("host-driver"), FACTS)
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}
    # The RuntimeClass stays: the remaining operands run with it although the toolkit is on the host.
    assert components == {
        "pre-requisites",
        "operator-validator",
        "device-plugin",
        "mps-control-daemon",
        "dcgm-exporter",
    }
    assert find(objects, "RuntimeClass", "nvidia")["handler"] == "nvidia"


def test_render_component_ignores_enabled() -> None:
    policy = parse_spec({"nodeStatusExporter": {"enabled": False}})
    objects = render_component(BY_NAME["node-status-exporter"], policy, FACTS)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "ServiceMonitor",
        "DaemonSet",
    ]
    without_crd = render_component(
        BY_NAME["node-status-exporter"], policy, replace(FACTS, service_monitor_crd=False)
    )
    assert "ServiceMonitor" not in [o["kind"] for o in without_crd]


def test_every_component_has_templates_and_ends_with_its_daemonset() -> None:
    assert template_dir().is_dir()
    for component in COMPONENTS:
        assert templates_of(component.name), component.name
        # The vGPU manager has no image of NVIDIA's: without one its DaemonSet is withheld.
        vgpu = {"repository": "registry.example.com", "image": "vgpu-manager", "version": "1"}
        objects = render_component(component, parse_spec({"vgpuManager": vgpu}), FACTS)
        assert objects[-1]["kind"] == "DaemonSet"
        assert objects[-1]["metadata"]["name"] == component.daemonset
        assert all(o["kind"] != "DaemonSet" for o in objects[:-1])


# --- common DaemonSet rules ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["empty", "seed-sample", "everything"])
def test_every_object_is_labelled_and_scoped(name: str) -> None:
    objects = render(load(name), FACTS)
    by_label = {c.component_label for c in COMPONENTS}
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "gpu-operator"
        assert labels["app.kubernetes.io/component"] in {*by_label, PREREQUISITES}
        assert "ownerReferences" not in obj["metadata"]
        if obj["kind"] in CLUSTER_SCOPED_KINDS:
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == "gpu-operator"


# nvidia-validator's COMPONENT of each dependency an operand's init container validates.
VALIDATED_AS = {
    "driver": "driver",
    "toolkit": "container-toolkit",
    "vfio-pci": "vfio-manager",
    "vgpu-manager": "vgpu-manager",
    "cc-manager": "cc-manager",
}
# The status files an init container's shell loop waits for, by the dependency they stand for (the
# sandbox validator writes vgpu-manager-ready once the vGPU manager works).
GATE_FILES = {"/run/nvidia/validations/vgpu-manager-ready": "vgpu-manager"}


@pytest.mark.parametrize("name", ["empty", "seed-sample", "everything", "host-driver"])
def test_a_component_is_labelled_with_exactly_the_dependencies_its_pods_wait_for(name: str) -> None:
    """Component.waits_for holds what the pods show: a dependency validated by an init container with
    WITH_WAIT=true (retried until it works; the toolkit's driver-validation), not one validated once
    (WITH_WAIT=false: the validator's toolkit-validation fails, so it stays behind the toolkit)."""
    spec = load(name)
    for component in COMPONENTS:
        for ds in daemonsets(render_component(component, spec, FACTS)).values():
            waits = set()
            for ctr in pod_spec(ds).get("initContainers", []):
                env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
                dependency = VALIDATED_AS.get(env.get("COMPONENT") or "")
                if dependency in component.depends_on and env.get("WITH_WAIT") == "true":
                    waits.add(dependency)
                script = " ".join(ctr.get("args") or [])
                waits.update(d for f, d in GATE_FILES.items() if f in script and d in component.depends_on)
            # The sandbox validator's CC step is rendered only where the CC manager runs (Kata mode).
            expected = {d for d in component.waits_for if d != "cc-manager" or BY_NAME[d].enabled(spec)}
            assert waits == expected, component.name


@pytest.mark.parametrize("name", ["empty", "seed-sample", "everything"])
def test_every_daemonset_selects_its_pods_on_deploy_labelled_nodes(name: str) -> None:
    for component in COMPONENTS:
        objects = render_component(component, load(name), FACTS)
        for ds in (o for o in objects if o["kind"] == "DaemonSet"):
            template_labels = ds["spec"]["template"]["metadata"]["labels"]
            # NVIDIA's VFIO and CC managers select on `name`; their pods carry `app` too.
            assert template_labels["app"] == component.daemonset
            assert ds["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
            assert template_labels["app.kubernetes.io/component"] == component.component_label
            assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == component.component_label
            assert pod_spec(ds)["nodeSelector"][component.deploy_label] == "true"
            volumes = [v["name"] for v in pod_spec(ds).get("volumes", [])]
            assert len(volumes) == len(set(volumes)), f"{component.name}: a volume twice"
            for ctr in pod_spec(ds).get("initContainers", []) + pod_spec(ds)["containers"]:
                mounts = {m["name"] for m in ctr.get("volumeMounts", [])}
                assert mounts <= set(volumes), f"{component.name}/{ctr['name']} mounts undefined volumes"


def test_selectors_are_nvidias() -> None:
    """So that an in-place move from NVIDIA's operator can apply over its DaemonSets."""
    ds = daemonsets(render_spec({}))
    assert ds["gpu-feature-discovery"]["spec"]["selector"]["matchLabels"] == {
        "app": "gpu-feature-discovery",
        "app.kubernetes.io/part-of": "nvidia-gpu",
    }
    assert ds["nvidia-operator-validator"]["spec"]["selector"]["matchLabels"] == {
        "app": "nvidia-operator-validator",
        "app.kubernetes.io/part-of": "gpu-operator",
    }


def test_default_tolerations_priority_and_pull_policy() -> None:
    for ds in daemonsets(render_spec({})).values():
        spec = pod_spec(ds)
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert spec["priorityClassName"] == "system-node-critical"
        assert spec["containers"][0]["imagePullPolicy"] == "IfNotPresent"
        assert "imagePullSecrets" not in spec


def test_tolerations_replace_the_default() -> None:
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    for ds in daemonsets(render_spec({"daemonsets": {"tolerations": tolerations}})).values():
        assert pod_spec(ds)["tolerations"] == tolerations


def test_daemonset_labels_and_annotations_never_override_the_selector() -> None:
    spec = {
        "daemonsets": {
            "labels": {"app": "x", "team": "ml", "app.kubernetes.io/component": "x"},
            "annotations": {"a.example.com/b": "c"},
        }
    }
    for name, ds in daemonsets(render_spec(spec)).items():
        for meta in (ds["metadata"], ds["spec"]["template"]["metadata"]):
            assert meta["labels"]["app"] == name
            assert meta["labels"]["team"] == "ml"
            assert meta["labels"]["app.kubernetes.io/component"] != "x"
            assert meta["annotations"]["a.example.com/b"] == "c"


def test_runtime_class_only_on_operands_that_need_the_nvidia_runtime() -> None:
    ds = daemonsets(
        render_spec({"operator": {"runtimeClass": "nv"}, "nodeStatusExporter": {"enabled": True}})
    )
    with_class = {name for name, d in ds.items() if pod_spec(d).get("runtimeClassName") == "nv"}
    assert with_class == {
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "nvidia-device-plugin-mps-control-daemon",
        "nvidia-dcgm",
        "nvidia-dcgm-exporter",
        "gpu-feature-discovery",
        "nvidia-mig-manager",
    }
    assert all("runtimeClassName" not in pod_spec(d) for n, d in ds.items() if n not in with_class)


def test_runtime_class_object_follows_operator_runtime_class() -> None:
    objects = render_prerequisites(parse_spec({"operator": {"runtimeClass": "nv"}}), FACTS)
    runtime_class = find(objects, "RuntimeClass", "nv")
    assert runtime_class["handler"] == "nv"


def test_pull_secrets_security_context_host_network() -> None:
    spec = {
        "devicePlugin": {"imagePullSecrets": ["a", "b"], "hostNetwork": True},
        "validator": {"imagePullSecrets": ["b", "c"]},
        "daemonsets": {"podSecurityContext": {"runAsUser": 0}},
    }
    ds = daemonsets(render_spec(spec))
    plugin = pod_spec(ds["nvidia-device-plugin-daemonset"])
    assert plugin["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}, {"name": "c"}]
    assert plugin["hostNetwork"] is True
    assert plugin["securityContext"] == {"runAsUser": 0}
    assert "hostNetwork" not in pod_spec(ds["nvidia-dcgm"])


# --- update strategy -----------------------------------------------------------------------------


def strategies(spec: dict[str, Any]) -> dict[str, Any]:
    return {name: ds["spec"]["updateStrategy"] for name, ds in daemonsets(render_spec(spec)).items()}


def test_driver_is_on_delete_by_default_and_others_roll_one_node_at_a_time() -> None:
    result = strategies({})
    assert result.pop("nvidia-driver-daemonset") == {"type": "OnDelete"}
    assert all(
        s == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}} for s in result.values()
    )


def test_the_driver_is_always_on_delete() -> None:
    explicit = {"daemonsets": {"updateStrategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    assert strategies(explicit)["nvidia-driver-daemonset"] == {"type": "OnDelete"}
    assert strategies(explicit)["nvidia-dcgm"] == rolling  # int stays int
    off = {**explicit, "driver": {"upgradePolicy": {"autoUpgrade": False}}}
    assert strategies(off)["nvidia-driver-daemonset"] == {"type": "OnDelete"}


@pytest.mark.parametrize(("given", "expected"), [("3", 3), (1, 1), ("25%", "25%")])
def test_max_unavailable_is_an_int_or_a_percentage(given: int | str, expected: int | str) -> None:
    # Kubernetes rejects a bare number as a string ("1"); NVIDIA's field is a string.
    result = strategies({"daemonsets": {"rollingUpdate": {"maxUnavailable": given}}})
    assert result["nvidia-dcgm"]["rollingUpdate"]["maxUnavailable"] == expected


def test_on_delete_applies_to_every_operand() -> None:
    assert set(map(str, strategies({"daemonsets": {"updateStrategy": "OnDelete"}}).values())) == {
        "{'type': 'OnDelete'}"
    }


# --- env, args, resources ------------------------------------------------------------------------


def test_user_env_overrides_defaults_in_place_and_appends_new_names() -> None:
    env = [
        {"name": "DEVICE_ID_STRATEGY", "value": "index"},
        {"name": "EXTRA", "value": "1"},
        {"name": "EXTRA", "value": "2"},
    ]
    ds = daemonsets(render_spec({"devicePlugin": {"env": env}}))
    ctr = container(ds["nvidia-device-plugin-daemonset"], "nvidia-device-plugin")
    names = [e["name"] for e in ctr["env"]]
    assert names.index("DEVICE_ID_STRATEGY") < names.index("NVIDIA_VISIBLE_DEVICES")
    assert names[-1] == "EXTRA"
    assert env_of(ctr)["DEVICE_ID_STRATEGY"] == "index"
    assert env_of(ctr)["EXTRA"] == "2"


def test_user_env_replaces_a_downward_api_default() -> None:
    ds = daemonsets(render_spec({"migManager": {"env": [{"name": "NODE_NAME", "value": "n1"}]}}))
    ctr = container(ds["nvidia-mig-manager"], "nvidia-mig-manager")
    assert {"name": "NODE_NAME", "value": "n1"} in ctr["env"]


def test_args_and_resources() -> None:
    resources = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": 1}}
    ds = daemonsets(render_spec({"dcgm": {"args": ["-n", "--port", "5555"], "resources": resources}}))
    ctr = container(ds["nvidia-dcgm"], "nvidia-dcgm-ctr")
    assert ctr["args"] == ["-n", "--port", "5555"]
    assert ctr["resources"] == resources


INJECTIONS = [
    'x"\n  hostNetwork: true\n- name: y',
    "a: b\n---\nkind: Secret",
    "{{ 7 * 7 }} {% raw %}",
    "# comment\n\n\t'single' \"double\" \\ back",
    "- foo: bar",
    # DEL and C0 controls but tab and newlines are refused in env and args (tests/unit/test_bad_input.py).
    "\u2028line\u2029sep\x85nel\ufeffbom\U0001f600",
    "nel\x85only",
    "two\nlines\u2028",
    "\ufeffbom ",
    "",
    "yes",
    "0755",
]


@pytest.mark.parametrize("value", INJECTIONS)
def test_values_cannot_inject_yaml(value: str) -> None:
    baseline = render_spec({})
    spec = {
        "devicePlugin": {"env": [{"name": "INJECTED", "value": value}], "args": [value]},
        "daemonsets": {"annotations": {"note": value}},
    }
    objects = render_spec(spec)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] != "ConfigMap"] == [
        (o["kind"], o["metadata"]["name"]) for o in baseline if o["kind"] != "ConfigMap"
    ]
    assert "Secret" not in {o["kind"] for o in objects}
    ds = daemonsets(objects)
    plugin = ds["nvidia-device-plugin-daemonset"]
    ctr = container(plugin, "nvidia-device-plugin")
    assert env_of(ctr)["INJECTED"] == value
    assert ctr["args"] == [value]
    assert plugin["spec"]["template"]["metadata"]["annotations"]["note"] == value
    assert "hostNetwork" not in pod_spec(plugin)
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


# --- component specifics -------------------------------------------------------------------------


def test_driver_probes_manager_and_mounts() -> None:
    objects = render(load("everything"), FACTS)
    driver = daemonsets(objects)[PRECOMPILED]
    ctr = container(driver, "nvidia-driver-ctr")
    assert ctr["startupProbe"]["initialDelaySeconds"] == 30
    assert ctr["startupProbe"]["failureThreshold"] == 60
    assert ctr["startupProbe"]["periodSeconds"] == 10
    assert ctr["livenessProbe"]["periodSeconds"] == 30
    assert "readinessProbe" not in ctr
    assert env_of(ctr)["KERNEL_MODULE_TYPE"] == "open"
    assert env_of(ctr)["OPEN_KERNEL_MODULES_ENABLED"] == "true"
    assert env_of(ctr)["GPU_DIRECT_RDMA_ENABLED"] == "true"
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/drivers/nvidia.conf"] == {
        "name": "kernel-module-config",
        "mountPath": "/drivers/nvidia.conf",
        "subPath": "nvidia.conf",
        "readOnly": True,
    }
    assert mounts["/drivers/gridd.conf"]["subPath"] == "gridd.conf"
    assert "/drivers/ClientConfigToken/client_configuration_token.tok" in mounts  # nlsEnabled
    # Precompiled drivers install no packages: no repository or CA files, no secret env (NVIDIA's rule).
    assert not {"repo-config", "cert-config"} & {m["name"] for m in ctr["volumeMounts"]}
    assert "envFrom" not in ctr
    assert container(driver, "nvidia-peermem-ctr")["image"] == ctr["image"]
    manager = container(driver, "k8s-driver-manager", init=True)
    assert manager["image"] == "registry.example.com/nvidia/k8s-driver-manager:v0.12.0"
    manager_env = env_of(manager)
    # NVIDIA's static settings: the manager evicts GPU pods itself unless an upgrade controller does.
    assert manager_env["ENABLE_GPU_POD_EVICTION"] == "true"
    assert manager_env["ENABLE_AUTO_DRAIN"] == "false"
    assert manager_env["DRAIN_TIMEOUT_SECONDS"] == "0s"
    find(objects, "ConfigMap", "nvidia-driver-startup-probe")


def test_driver_package_files_are_mounted_one_by_one() -> None:
    """Into the directory, next to the image's own files: a CA file must not hide the system bundle."""
    spec = {
        "driver": {
            "repoConfig": {"configMapName": "apt-mirror"},
            "certConfig": {"name": "corp-ca"},
            "secretEnv": "s",
        }
    }
    facts = replace(FACTS, os_tag="rhel9")
    ctr = container(daemonsets(render_spec(spec, facts))["nvidia-driver-daemonset"], "nvidia-driver-ctr")
    mounts = {
        m["mountPath"]: m["subPath"]
        for m in ctr["volumeMounts"]
        if m["name"] in ("repo-config", "cert-config")
    }
    assert mounts == {
        "/etc/yum.repos.d/mirror.list": "mirror.list",
        "/etc/pki/ca-trust/extracted/pem/ca.crt": "ca.crt",
    }
    assert ctr["envFrom"] == [{"secretRef": {"name": "s"}}]


def test_driver_waits_for_the_config_maps_it_mounts() -> None:
    """As NVIDIA: no driver DaemonSet while a ConfigMap it mounts file by file is not there."""
    spec = parse_spec({"driver": {"certConfig": {"name": "missing-ca"}}})
    objects = render(spec, FACTS)
    assert "nvidia-driver-daemonset" not in daemonsets(objects)
    find(objects, "ServiceAccount", "nvidia-driver")
    assert list(map(str, missing_inputs(BY_NAME["driver"], spec, FACTS))) == [
        "spec.driver.certConfig.name: ConfigMap 'missing-ca' not found in namespace 'gpu-operator'"
    ]


def test_driver_manager_image_from_operator_environment() -> None:
    ds = daemonsets(render_spec({}, ClusterFacts(environ={"DRIVER_MANAGER_IMAGE": "m/dm:1"})))
    assert container(ds["nvidia-driver-daemonset"], "k8s-driver-manager", init=True)["image"] == "m/dm:1"


def test_toolkit_runtime_and_cdi_env() -> None:
    spec = {"toolkit": {"installDir": "/opt/nv"}, "cdi": {"enabled": False}}
    ds = daemonsets(render_spec(spec, ClusterFacts(runtimes=("crio",))))
    toolkit = ds["nvidia-container-toolkit-daemonset"]
    env = env_of(container(toolkit, "nvidia-container-toolkit-ctr"))
    assert env["ROOT"] == "/opt/nv"
    assert env["RUNTIME"] == "crio"
    assert "CDI_ENABLED" not in env
    # CRI-O alone without CDI: NVIDIA's OCI hook, and no RuntimeClass on the operands.
    assert env["CRIO_CONFIG_MODE"] == "hook"
    assert "runtimeClassName" not in pod_spec(ds["nvidia-device-plugin-daemonset"])
    assert "CONTAINERD_RUNTIME_CLASS" not in env
    assert env["RUNTIME_CONFIG"] == env["CRIO_CONFIG"] == "/runtime/config-dir/config.toml"
    assert env["RUNTIME_DROP_IN_CONFIG_HOST_PATH"] == "/etc/crio/crio.conf.d/99-nvidia.conf"
    volumes = {v["name"]: v for v in pod_spec(toolkit)["volumes"]}
    assert volumes["toolkit-install-dir"]["hostPath"]["path"] == "/opt/nv"
    assert volumes["crio-config"]["hostPath"]["path"] == "/etc/crio"
    assert volumes["crio-hooks"]["hostPath"]["path"] == "/usr/share/containers/oci/hooks.d"


def test_one_toolkit_daemonset_per_runtime() -> None:
    ds = daemonsets(render_spec({"cdi": {"enabled": False}}, ClusterFacts(runtimes=("containerd", "crio"))))
    first, crio = ds["nvidia-container-toolkit-daemonset"], ds["nvidia-container-toolkit-daemonset-crio"]
    assert pod_spec(first)["nodeSelector"]["nvidia.com/gpu-operator.runtime"] == "containerd"
    assert pod_spec(crio)["nodeSelector"]["nvidia.com/gpu-operator.runtime"] == "crio"
    assert env_of(container(first, "nvidia-container-toolkit-ctr"))["RUNTIME"] == "containerd"
    # The operands keep the RuntimeClass for the containerd nodes, so CRI-O gets the handler too.
    assert env_of(container(crio, "nvidia-container-toolkit-ctr"))["CRIO_CONFIG_MODE"] == "config"
    assert pod_spec(ds["nvidia-device-plugin-daemonset"])["runtimeClassName"] == "nvidia"
    # Both share one ServiceAccount, Role and entrypoint.
    facts = ClusterFacts(runtimes=("containerd", "crio"))
    toolkit = render_component(BY_NAME["container-toolkit"], parse_spec({}), facts)
    keys = [(o["kind"], o["metadata"]["name"]) for o in toolkit]
    assert len(keys) == len(set(keys)) == 6


def test_runtime_overrides_from_toolkit_env_become_mounts() -> None:
    """NVIDIA's documented MicroK8s settings: host paths in toolkit.env become container paths."""
    env = [
        {"name": "CONTAINERD_CONFIG", "value": "/var/snap/microk8s/current/args/containerd-template.toml"},
        {"name": "CONTAINERD_SOCKET", "value": "/var/snap/microk8s/common/run/containerd.sock"},
        {"name": "RUNTIME_CONFIG_SOURCE", "value": "file=/var/snap/microk8s/current/args/containerd.toml"},
    ]
    toolkit = daemonsets(render_spec({"toolkit": {"env": env}}))["nvidia-container-toolkit-daemonset"]
    values = env_of(container(toolkit, "nvidia-container-toolkit-ctr"))
    assert (
        values["CONTAINERD_CONFIG"]
        == values["RUNTIME_CONFIG"]
        == "/runtime/config-dir/containerd-template.toml"
    )
    assert values["CONTAINERD_SOCKET"] == values["RUNTIME_SOCKET"] == "/runtime/sock-dir/containerd.sock"
    assert values["RUNTIME_CONFIG_SOURCE"] == "file=/host/var/snap/microk8s/current/args/containerd.toml"
    assert values["RUNTIME_DROP_IN_CONFIG_HOST_PATH"] == "/etc/containerd/conf.d/99-nvidia.toml"
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec(toolkit)["volumes"] if "hostPath" in v}
    assert volumes["containerd-config"] == "/var/snap/microk8s/current/args"
    assert volumes["containerd-socket"] == "/var/snap/microk8s/common/run"


def test_nri_mode_has_no_runtime_class_and_annotates_gpu_operands() -> None:
    objects = render_spec({"cdi": {"enabled": True, "nriPluginEnabled": True}})
    assert not [o for o in objects if o["kind"] == "RuntimeClass"]
    ds = daemonsets(objects)
    plugin = ds["nvidia-device-plugin-daemonset"]
    assert "runtimeClassName" not in pod_spec(plugin)
    annotations = plugin["spec"]["template"]["metadata"]["annotations"]
    assert annotations["nvidia.cdi.k8s.io/container.nvidia-device-plugin"] == "management.nvidia.com/gpu=all"
    toolkit = container(ds["nvidia-container-toolkit-daemonset"], "nvidia-container-toolkit-ctr")
    assert env_of(toolkit)["NRI_SOCKET"] == "/runtime/nri-sock-dir/nri.sock"
    assert "RUNTIME_CONFIG" not in env_of(toolkit)


def test_device_plugin_and_gfd_share_the_users_config_map() -> None:
    objects = render(load("seed-sample"), FACTS)
    ds = daemonsets(objects)
    for name, main in (
        ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
        ("gpu-feature-discovery", "gpu-feature-discovery"),
    ):
        spec = pod_spec(ds[name])
        assert env_of(container(ds[name], main))["CONFIG_FILE"] == "/config/config.yaml"
        assert env_of(container(ds[name], main))["MIG_STRATEGY"] == "single"
        assert env_of(container(ds[name], "config-manager"))["DEFAULT_CONFIG"] == "default"
        assert container(ds[name], "config-manager-init", init=True)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["available-configs"]["configMap"]["name"] == "device-plugin-config"
    assert not [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "device-plugin-config"
    ]


def test_device_plugin_without_config_has_no_config_manager() -> None:
    ds = daemonsets(render_spec({"devicePlugin": {"mps": {"root": "/var/mps"}}}))[
        "nvidia-device-plugin-daemonset"
    ]
    assert [c["name"] for c in pod_spec(ds)["containers"]] == ["nvidia-device-plugin"]
    assert env_of(container(ds, "nvidia-device-plugin"))["MPS_ROOT"] == "/var/mps"
    assert {v["name"]: v for v in pod_spec(ds)["volumes"]}["mps-shm"]["hostPath"]["path"] == "/var/mps/shm"


def test_dcgm_host_port_and_service() -> None:
    objects = render_spec({"dcgm": {"hostPort": 15555}})
    port = container(daemonsets(objects)["nvidia-dcgm"], "nvidia-dcgm-ctr")["ports"][0]
    assert port["containerPort"] == 5555
    assert port["hostPort"] == 15555
    assert find(objects, "Service", "nvidia-dcgm")["spec"]["ports"][0]["port"] == 5555


def test_dcgm_exporter_uses_standalone_dcgm_only_when_enabled() -> None:
    with_dcgm = daemonsets(render_spec({}))["nvidia-dcgm-exporter"]
    assert (
        env_of(container(with_dcgm, "nvidia-dcgm-exporter"))["DCGM_REMOTE_HOSTENGINE_INFO"]
        == "nvidia-dcgm:5555"
    )
    without = daemonsets(render_spec({"dcgm": {"enabled": False}}))["nvidia-dcgm-exporter"]
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env_of(container(without, "nvidia-dcgm-exporter"))


def test_dcgm_exporter_everything() -> None:
    objects = render(load("everything"), FACTS)
    exporter = daemonsets(objects)["nvidia-dcgm-exporter"]
    env = env_of(container(exporter, "nvidia-dcgm-exporter"))
    assert env["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"] == "true"
    assert pod_spec(exporter)["hostPID"] is True
    assert exporter["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    service = find(objects, "Service", "nvidia-dcgm-exporter")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    monitor = find(objects, "ServiceMonitor", "nvidia-dcgm-exporter")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["interval"] == "30s"
    assert endpoint["relabelings"][0]["targetLabel"] == "node"
    assert find(objects, "ClusterRole", "nvidia-dcgm-exporter-read-pods")
    binding = find(objects, "ClusterRoleBinding", "nvidia-dcgm-exporter-read-pods")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"}
    ]


@pytest.mark.parametrize(
    ("exporter", "expected"),
    [
        ({}, False),
        ({"serviceMonitoring": True}, True),
        ({"serviceMonitoring": True, "serviceMonitor": {"enabled": False}}, False),
        ({"serviceMonitor": {"enabled": True}}, True),
    ],
)
def test_service_monitor_only_on_request(exporter: dict[str, Any], expected: bool) -> None:
    objects = render_component(BY_NAME["dcgm-exporter"], parse_spec({"dcgmExporter": exporter}), FACTS)
    assert ("ServiceMonitor" in {o["kind"] for o in objects}) is expected
    assert "ClusterRole" not in {o["kind"] for o in objects}


def test_mig_manager_config_maps() -> None:
    component = BY_NAME["mig-manager"]
    default = render_component(component, parse_spec({}), FACTS)
    assert {o["metadata"]["name"] for o in default if o["kind"] == "ConfigMap"} == {
        "default-mig-parted-config",
        "default-gpu-clients",
        "nvidia-mig-manager-entrypoint",
    }
    parted = yaml.safe_load(find(default, "ConfigMap", "default-mig-parted-config")["data"]["config.yaml"])
    # NVIDIA's fallback layouts, used when mig-manager cannot generate them from the GPUs it finds.
    assert len(parted["mig-configs"]) == 81
    assert {"all-disabled", "all-1g.18gb", "all-4g.40gb", "all-balanced"} <= set(parted["mig-configs"])
    env = env_of(container(default[-1], "nvidia-mig-manager"))
    assert env["DEFAULT_CONFIG_FILE"] == "/mig-parted-config/config-default.yaml"
    assert "CONFIG_FILE" not in env
    remap = {v["name"]: v for v in pod_spec(default[-1])["volumes"]}["mig-parted-config"]["configMap"]
    assert remap["items"] == [{"key": "config.yaml", "path": "config-default.yaml"}]
    custom = render_component(
        component,
        parse_spec({"migManager": {"config": {"name": "mine"}, "gpuClientsConfig": {"name": "clients"}}}),
        FACTS,
    )
    assert [o["metadata"]["name"] for o in custom if o["kind"] == "ConfigMap"] == [
        "nvidia-mig-manager-entrypoint"
    ]
    volumes = {v["name"]: v for v in pod_spec(custom[-1])["volumes"]}
    assert volumes["mig-parted-config"]["configMap"] == {"name": "mine"}
    assert volumes["gpu-clients"]["configMap"]["name"] == "clients"
    assert (
        env_of(container(custom[-1], "nvidia-mig-manager"))["CONFIG_FILE"] == "/mig-parted-config/config.yaml"
    )


def test_validator_steps_follow_the_device_plugin_and_take_their_env() -> None:
    spec = {
        "validator": {
            "plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]},
            "cuda": {"env": [{"name": "X", "value": "y"}]},
        }
    }
    validator = daemonsets(render_spec(spec))["nvidia-operator-validator"]
    steps = [c["name"] for c in pod_spec(validator)["initContainers"]]
    assert steps == ["driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"]
    assert env_of(container(validator, "plugin-validation", init=True))["WITH_WORKLOAD"] == "true"
    assert env_of(container(validator, "cuda-validation", init=True))["X"] == "y"
    assert env_of(container(validator, "plugin-validation", init=True))["MIG_STRATEGY"] == "single"
    without = daemonsets(render_spec({"devicePlugin": {"enabled": False}}))["nvidia-operator-validator"]
    assert "plugin-validation" not in [c["name"] for c in pod_spec(without)["initContainers"]]


def test_node_status_exporter() -> None:
    objects = render(load("seed-sample"), FACTS)
    exporter = daemonsets(objects)["nvidia-node-status-exporter"]
    ctr = container(exporter, "nvidia-node-status-exporter")
    assert ctr["image"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert env_of(ctr)["COMPONENT"] == "metrics"
    assert ctr["ports"] == [{"name": "node-status", "containerPort": 8000, "protocol": "TCP"}]
    assert find(objects, "Service", "nvidia-node-status-exporter")["spec"]["ports"][0]["port"] == 8000


def test_host_paths() -> None:
    spec = {"hostPaths": {"rootFS": "/rootfs", "driverInstallDir": "/opt/driver", "kubeletRootDir": "/k/"}}
    ds = daemonsets(render_spec(spec))
    plugin = {v["name"]: v for v in pod_spec(ds["nvidia-device-plugin-daemonset"])["volumes"]}
    assert plugin["host-root"]["hostPath"]["path"] == "/rootfs"
    assert plugin["driver-install-dir"]["hostPath"]["path"] == "/opt/driver"
    assert plugin["device-plugin"]["hostPath"]["path"] == "/k/device-plugins"
    # The containerized driver always installs into /run/nvidia/driver.
    driver = {v["name"]: v for v in pod_spec(ds["nvidia-driver-daemonset"])["volumes"]}
    assert driver["nv-firmware"]["hostPath"]["path"] == "/run/nvidia/driver/lib/firmware"
    # A driver installed elsewhere is found there, and every host-root operand learns the host root.
    validation = container(ds["nvidia-operator-validator"], "driver-validation", init=True)
    assert (
        env_of(validation)["DRIVER_INSTALL_DIR"]
        == env_of(validation)["DRIVER_INSTALL_DIR_CTR_PATH"]
        == "/opt/driver"
    )
    assert "/opt/driver" in {m["mountPath"] for m in validation["volumeMounts"]}
    assert env_of(validation)["HOST_ROOT"] == "/rootfs"
    assert (
        env_of(container(ds["nvidia-container-toolkit-daemonset"], "nvidia-container-toolkit-ctr"))[
            "HOST_ROOT"
        ]
        == "/rootfs"
    )
    validator = {v["name"]: v for v in pod_spec(ds["nvidia-operator-validator"])["volumes"]}
    assert validator["host-dev-char"]["hostPath"]["path"] == "/rootfs/dev/char"


# --- output and errors ---------------------------------------------------------------------------


def test_to_yaml_round_trips() -> None:
    objects = render(load("everything"), FACTS)
    text = to_yaml(objects)
    assert text.startswith("---\n")
    assert list(yaml.safe_load_all(text)) == objects
    assert to_yaml([]) == ""


@pytest.mark.parametrize("value", [*INJECTIONS, 1, None, True, ["a", {"b": "c\n"}], {"k: v": "x"}])
def test_tojson_is_yaml_that_reads_back_the_same(value: Any) -> None:
    text = tojson(value)
    assert "\n" not in text
    assert yaml.safe_load(f"key: {text}") == {"key": value}


@pytest.mark.parametrize(
    "text", ["a: [", "- just\n- a list", "apiVersion: v1\nkind: ConfigMap\nmetadata: {}"]
)
def test_broken_template_output_is_reported_with_the_template_name(text: str) -> None:
    with pytest.raises(RenderError, match="some/template"):
        _parse("some/template", text)


def test_facts_default() -> None:
    facts = ClusterFacts()
    assert (facts.namespace, facts.os_tag, facts.kernels, dict(facts.environ), facts.runtimes) == (
        "gpu-operator",
        None,
        (),
        {},
        (),
    )
    ds = daemonsets(render_spec({}, ClusterFacts(namespace="other")))
    assert all(d["metadata"]["namespace"] == "other" for d in ds.values())
    image = container(daemonsets(render_spec({}, facts))["nvidia-driver-daemonset"], "nvidia-driver-ctr")[
        "image"
    ]
    assert image == "nvcr.io/nvidia/driver:595.91.07"


def test_without_the_validator_nothing_waits_for_toolkit_ready() -> None:
    """Nothing writes toolkit-ready then; the per-node deploy labels keep driver, toolkit, the rest."""
    ds = daemonsets(render_spec({"validator": {"enabled": False}}))
    assert "nvidia-operator-validator" not in ds
    for name, daemonset in ds.items():
        init = [c["name"] for c in pod_spec(daemonset).get("initContainers", [])]
        assert "toolkit-validation" not in init, name
    # The toolkit still validates the driver itself and writes driver-ready for the others.
    assert [c["name"] for c in pod_spec(ds["nvidia-container-toolkit-daemonset"])["initContainers"]] == [
        "driver-validation"
    ]
    # Without the toolkit either, the operands that source driver-ready write it themselves.
    alone = daemonsets(render_spec({"validator": {"enabled": False}, "toolkit": {"enabled": False}}))
    for name in ("nvidia-device-plugin-daemonset", "nvidia-mig-manager"):
        assert [c["name"] for c in pod_spec(alone[name])["initContainers"]] == ["driver-validation"], name
    assert "initContainers" not in pod_spec(alone["gpu-feature-discovery"])


def test_validator_image_containers_run_as_root() -> None:
    """They read host files and exec nvidia-smi; a non-root pod security context must not break them."""
    ds = daemonsets(
        render_spec({"daemonsets": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000}}})
    )
    validator_image = container(ds["nvidia-operator-validator"], "nvidia-operator-validator")["image"]
    for daemonset in ds.values():
        pod = pod_spec(daemonset)
        for ctr in pod.get("initContainers", []) + pod["containers"]:
            if ctr["image"] == validator_image:
                assert ctr["securityContext"]["runAsUser"] == 0, ctr["name"]


def test_mig_strategy_wins_over_gfd_env_but_not_over_the_device_plugins() -> None:
    """NVIDIA applies mig.strategy after gfd.env (object_controls.go:969-970), before devicePlugin.env."""
    user = [
        {"name": "MIG_STRATEGY", "value": "none"},
        {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "none"},
    ]
    ds = daemonsets(
        render_spec({"mig": {"strategy": "mixed"}, "gfd": {"env": user}, "devicePlugin": {"env": user}})
    )
    gfd = env_of(container(ds["gpu-feature-discovery"], "gpu-feature-discovery"))
    plugin = env_of(container(ds["nvidia-device-plugin-daemonset"], "nvidia-device-plugin"))
    assert (gfd["MIG_STRATEGY"], gfd["NVIDIA_MIG_MONITOR_DEVICES"]) == ("mixed", "all")
    assert (plugin["MIG_STRATEGY"], plugin["NVIDIA_MIG_MONITOR_DEVICES"]) == ("none", "none")


def test_warm_compiles_every_template_once_and_a_broken_one_is_left_for_the_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = template_environment()
    asked: list[str] = []
    original = env.get_template

    def get_template(name: str) -> Any:
        asked.append(name)
        if name == env.list_templates()[0]:
            raise jinja2.TemplateSyntaxError("unexpected '}'", 1, name)
        return original(name)

    monkeypatch.setattr(env, "get_template", get_template)
    warm()
    assert sorted(asked) == sorted(env.list_templates())
    assert any(name.startswith("driver/") for name in asked)


# --- empty means unset ----------------------------------------------------------------------------


def test_empty_args_and_tolerations_keep_the_defaults() -> None:
    # NVIDIA's Helm values write `args: []`; with a `sh -c` command, rendering it would leave the
    # container a shell with nothing to run (it exits and crash-loops).
    empty: dict[str, Any] = {"args": [], "env": [], "resources": {}, "imagePullSecrets": []}
    sections = ("validator", "devicePlugin", "dcgm", "dcgmExporter", "gfd", "migManager", "toolkit", "driver")
    spec = {name: dict(empty) for name in sections} | {"daemonsets": {"tolerations": []}}
    assert render_spec(spec) == render_spec({})
    ds = daemonsets(render_spec(spec))
    plugin = container(ds["nvidia-device-plugin-daemonset"], "nvidia-device-plugin")
    assert (plugin["command"], plugin["args"]) == (["/bin/sh", "-c"], ["/bin/entrypoint.sh"])
    assert "args" not in container(ds["nvidia-dcgm"], "nvidia-dcgm-ctr")
    assert pod_spec(ds["nvidia-dcgm"])["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
