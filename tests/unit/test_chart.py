"""Static checks of the Helm chart (charts/gpu-operator): lint, rendering, RBAC, values schema.

They run the pinned helm from `make tools` (hack/build-tools.sh bin-dir) and skip, saying so, when
the toolchain is not built. No cluster is needed; `make chart-lint` adds a server-side dry run.

The RBAC tests hold the chart to least privilege: the rules the chart grants must be exactly the
rules derived here from the operator's code (the kinds it renders, the kinds it watches, and the
few calls listed in REQUIRED_EXTRA), so a missing permission and an unneeded one both fail.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import cli
from gpu_operator.agent.discovery import NFD_CRD
from gpu_operator.api import parse_spec
from gpu_operator.api.gpucluster import parse_gpucluster_document
from gpu_operator.api.nvidiadriver import OWNER_LABEL
from gpu_operator.api.spec import ClusterPolicySpec, OperatorSpec
from gpu_operator.core.components import COMPONENTS, MIG_CONFIG_LABEL, RUNTIME_LABEL
from gpu_operator.core.node_labels import DEPLOY_PREFIX, GPU_PRESENT, PCI_LABELS
from gpu_operator.core.render import ClusterFacts, render
from gpu_operator.core.upgrade.states import ANNOTATION_PREFIX, STATE_LABEL
from gpu_operator.runtime.client import RESOURCES
from hack import operand_rbac

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-operator"
POLICIES = ROOT / "tests" / "data" / "policies"
NAMESPACE = "gpu-operator"
RELEASE = "gpu-operator"
AGENT = f"{RELEASE}-node-discovery"
WRITE_POLICIES = (
    "clusterroles",
    "clusterrolebindings",
    "roles",
    "rolebindings",
    "runtimeclasses",
    "customresourcedefinitions",
    "leases",
    "deviceclasses",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "daemonsets",
    "deployments",
)
"""`<release>-writes-<resource>`: the admission policies of the operator's writes, one per kind."""
KUBE_VERSION = "1.36.0"  # the cluster version the chart is rendered for (the pinned toolchain's)

Obj = dict[str, Any]
# (namespace or "" for cluster-wide, apiGroup, resource, resourceName or "" for any) → verbs
Grants = dict[tuple[str, str, str, str], set[str]]


@cache
def helm_path() -> str:
    bin_dir = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "bin-dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    helm = Path(bin_dir) / "helm"
    return str(helm) if bin_dir and helm.is_file() else ""


needs_helm = pytest.mark.skipif(
    not helm_path(), reason="helm not built: run `make tools` (pinned toolchain in .cache/tools)"
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_path(), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def template_args(*extra: str) -> list[str]:
    return ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *extra]


def render_chart(*extra: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(helm(*template_args(*extra)).stdout) if d]


def values_file(tmp_path: Path, values: Obj) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.fixture(scope="module")
def default_objects() -> list[Obj]:
    if not helm_path():
        pytest.skip("helm not built: run `make tools`")
    return render_chart()


def find(objects: Iterable[Obj], kind: str, name: str = "") -> Obj:
    found = [o for o in objects if o["kind"] == kind and (not name or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


# --- the operator's own objects, as rendered for every component ----------------------------------


def everything_spec() -> Obj:
    doc: Obj = yaml.safe_load((POLICIES / "everything.yaml").read_text())
    return dict(doc["spec"])


@cache
def operand_objects(namespace: str = NAMESPACE) -> tuple[Obj, ...]:
    """What the operator applies for a policy with every component on (data/policies/everything.yaml),
    with the chart's default RuntimeClass: the rendering the chart's files/operand-rbac.yaml is
    generated from (hack/operand_rbac.py)."""
    objects = operand_rbac.operand_objects(namespace, runtime_class=OperatorSpec().runtimeClass)
    daemonsets = [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"]
    missing = {c.daemonset for c in COMPONENTS if not any(n.startswith(c.daemonset) for n in daemonsets)}
    assert not missing - never_deployed(), (
        f"everything.yaml no longer enables every component: {sorted(missing)}"
    )
    return tuple(objects)


def never_deployed() -> set[str]:
    """The DaemonSets of the components neither sandbox mode of everything.yaml deploys: none (the
    KubeVirt and the Kata rendering together, hack/operand_rbac.py, cover every component)."""
    spec = everything_spec()
    modes = [
        parse_spec({**spec, "sandboxWorkloads": {**spec["sandboxWorkloads"], "mode": mode}})
        for mode in ("kubevirt", "kata")
    ]
    return {c.daemonset for c in COMPONENTS if not any(c.enabled(p) for p in modes)}


def test_operand_rbac_admits_both_sandbox_modes() -> None:
    """The Kata sandbox device plugin's and the CC manager's roles and bindings (Kata mode only) are in
    the chart's operand RBAC beside the KubeVirt plugin's."""
    names = {(o["kind"], o["metadata"]["name"]) for o in operand_objects()}
    for name in ("nvidia-kata-sandbox-device-plugin", "nvidia-cc-manager", "nvidia-sandbox-device-plugin"):
        assert ("ClusterRole", name) in names and ("RoleBinding", name) in names, name
    assert never_deployed() == set()


def operand_role_names(kind: str) -> list[str]:
    return sorted({o["metadata"]["name"] for o in operand_objects() if o["kind"] == kind})


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


# --- lint and render -------------------------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_helm_lint_is_clean(strict: bool) -> None:
    proc = helm("lint", str(CHART), "--kube-version", KUBE_VERSION, *(["--strict"] if strict else []))
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@needs_helm
def test_the_projects_helm_knows_its_kubernetes_version() -> None:
    """hack/build-tools.sh builds helm with upstream's version settings: without a cluster it assumes
    the Kubernetes of the client-go it links (not 1.20), so `helm template` takes the chart as is."""
    proc = helm("template", RELEASE, str(CHART))
    assert proc.returncode == 0, proc.stderr
    version = helm("version", "--template", "{{.Version}} {{.GitTreeState}}").stdout
    assert version == "v3.21.4 clean"


def test_default_render_has_the_chart_objects(default_objects: list[Obj]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in default_objects)
    assert kinds == sorted(
        [
            ("ServiceAccount", RELEASE),
            ("ClusterRole", RELEASE),
            ("ClusterRoleBinding", RELEASE),
            ("Role", RELEASE),
            ("RoleBinding", RELEASE),
            ("Role", f"{RELEASE}-events"),
            ("RoleBinding", f"{RELEASE}-events"),
            ("Deployment", RELEASE),
            ("PodDisruptionBudget", RELEASE),
            *(
                (kind, f"{RELEASE}-writes-{resource}")
                for resource in (*WRITE_POLICIES, "nodes")
                for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
            ),
            ("Service", f"{RELEASE}-metrics"),
            ("ClusterRole", f"{RELEASE}-doctor"),
            ("ClusterPolicy", "cluster-policy"),
            # The pre-delete cleanup hook.
            ("ServiceAccount", f"{RELEASE}-cleanup"),
            ("ClusterRole", f"{RELEASE}-cleanup"),
            ("ClusterRoleBinding", f"{RELEASE}-cleanup"),
            ("Job", f"{RELEASE}-cleanup"),
            # The node discovery agent (nodeDiscovery: auto).
            ("ServiceAccount", AGENT),
            ("ClusterRole", AGENT),
            ("ClusterRoleBinding", AGENT),
            ("ValidatingAdmissionPolicy", AGENT),
            ("ValidatingAdmissionPolicyBinding", AGENT),
            ("DaemonSet", AGENT),
        ]
    )
    for obj in default_objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpu-operator"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if obj["kind"] in (
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Deployment",
            "ConfigMap",
            "Job",
            "DaemonSet",
            "Service",
        ):
            expected = "default" if obj["metadata"]["name"].endswith("-events") else NAMESPACE
            assert obj["metadata"]["namespace"] == expected


@pytest.mark.parametrize("name", ["clusterpolicy", "nvidiadriver"])
def test_crd_is_the_repository_crd(name: str) -> None:
    assert (CHART / "crds" / f"{name}.yaml").read_bytes() == (ROOT / "crds" / f"{name}.yaml").read_bytes()


def test_the_chart_has_every_crd() -> None:
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == ours


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["version"], chart["appVersion"]) == (
        "v2",
        "gpu-operator",
        "0.1.0",
        "0.1.0",
    )
    assert chart["kubeVersion"] == ">=1.30.0-0"
    # NFD, as NVIDIA's chart has it, vendored: Helm refuses a chart whose (even disabled) dependency is
    # missing from charts/, and fetching it needs the network.
    assert chart["dependencies"] == [
        {
            "name": "node-feature-discovery",
            "version": "0.19.0",
            "repository": "oci://registry.k8s.io/nfd/charts",
            "condition": "nfd.enabled",
        }
    ]
    vendored = yaml.safe_load((CHART / "charts" / "node-feature-discovery" / "Chart.yaml").read_text())
    assert (vendored["name"], vendored["version"]) == ("node-feature-discovery", "0.19.0")
    assert (CHART / "charts" / "node-feature-discovery" / "LICENSE").is_file()


@needs_helm
def test_nfd_only_when_enabled() -> None:
    """Off by default: not one NFD object, not its CRDs (whose presence alone would idle the node agent)."""

    def nfd(*args: str) -> list[tuple[str, str]]:
        return sorted(
            (o["kind"], o["metadata"]["name"])
            for o in render_chart("--include-crds", *args)
            if "nfd" in o["metadata"]["name"] or "node-feature" in o["metadata"]["name"]
        )

    assert nfd() == []
    enabled = nfd("--set", "nfd.enabled=true")
    assert ("DaemonSet", f"{RELEASE}-node-feature-discovery-worker") in enabled
    assert ("CustomResourceDefinition", "nodefeatures.nfd.k8s-sigs.io") in enabled


# --- the ClusterPolicy ----------------------------------------------------------------------------


def validate_document(policy: Obj) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", "validate", "-f", "-"],
        input=yaml.safe_dump(policy),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_default_cluster_policy_has_every_section_and_is_valid(default_objects: list[Obj]) -> None:
    """Every section is written, as NVIDIA's chart writes them (tests/unit/test_nvidia_values.py
    compares the content), so `kubectl patch --type=json` finds /spec/mig/strategy and the like."""
    policy = find(default_objects, "ClusterPolicy")
    assert policy["metadata"]["name"] == "cluster-policy"
    assert "helm.sh/resource-policy" not in (policy["metadata"].get("annotations") or {})
    assert set(policy["spec"]) == set(ClusterPolicySpec.model_fields) - {"psp"}
    assert policy["spec"]["mig"] == {"strategy": "single"}
    assert policy["spec"]["dcgm"]["enabled"] is False
    assert policy["spec"]["nodeStatusExporter"]["enabled"] is False
    assert policy["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] is True
    validate_document(policy)


# --- the default NVIDIADriver ---------------------------------------------------------------------

CRD_ON = ("--set", "driver.nvidiaDriverCRD.enabled=true")


@needs_helm
@pytest.mark.parametrize(
    ("args", "rendered"),
    [
        # NVIDIA's tests/scripts/end-to-end-nvidia-driver.sh (test_nvidiadriver_helm_render_options), flag
        # for flag, and the chart's defaults.
        ([*CRD_ON, "--set", "driver.nvidiaDriverCRD.deployDefaultCR=true"], True),
        ([*CRD_ON, "--set", "driver.nvidiaDriverCRD.deployDefaultCR=false"], False),
        (
            [
                "--set",
                "driver.nvidiaDriverCRD.enabled=false",
                "--set",
                "driver.nvidiaDriverCRD.deployDefaultCR=true",
            ],
            False,
        ),
        ([*CRD_ON], True),
        ([], False),
        ([*CRD_ON, "--set", "driver.enabled=false"], False),
    ],
)
def test_default_nvidiadriver_only_when_asked_for(args: list[str], rendered: bool) -> None:
    drivers = [o for o in render_chart(*args) if o["kind"] == "NVIDIADriver"]
    assert len(drivers) == int(rendered)
    if rendered:
        assert drivers[0]["metadata"]["name"] == "default"
        assert drivers[0]["spec"]["default"] is True
        validate_document(drivers[0])


@needs_helm
def test_default_nvidiadriver_takes_the_driver_values(tmp_path: Path) -> None:
    """What NVIDIA's chart copies into its default NVIDIADriver: the driver section under NVIDIADriver's
    names (repoConfig.configMapName → repoConfig.name, virtualTopology.config →
    virtualTopologyConfig.name, gpuPodDeletion → podDeletion), the daemonsets' labels, annotations and
    tolerations, gds and gdrcopy; and the ClusterPolicy then carries no driver settings but the switch."""
    values = {
        "driver": {
            "nvidiaDriverCRD": {"enabled": True, "driverType": "vgpu"},
            "version": "580.95.05",
            "usePrecompiled": False,
            "kernelModuleType": "open",
            "repoConfig": {"configMapName": "repo"},
            "certConfig": {"name": "certs"},
            "licensingConfig": {"configMapName": "licence", "nlsEnabled": False},
            "virtualTopology": {"config": "topology"},
            "kernelModuleConfig": {"name": "modules"},
            "secretEnv": "driver-env",
            "env": [{"name": "A", "value": "b"}],
            "upgradePolicy": {
                "maxParallelUpgrades": 2,
                "gpuPodDeletion": {"force": True, "timeoutSeconds": 60},
            },
            "rdma": {"enabled": True},
        },
        "daemonsets": {"labels": {"team": "ml"}, "annotations": {"a": "b"}},
        "gds": {"enabled": True},
        "gdrcopy": {"enabled": True},
    }
    objects = render_chart("-f", values_file(tmp_path, values))
    spec = find(objects, "NVIDIADriver", "default")["spec"]
    assert spec["driverType"] == "vgpu"
    assert spec["version"] == "580.95.05"
    assert spec["kernelModuleType"] == "open"
    assert spec["repoConfig"] == {"name": "repo"}
    assert spec["certConfig"] == {"name": "certs"}
    assert spec["licensingConfig"] == {"name": "licence", "nlsEnabled": False}
    assert spec["virtualTopologyConfig"] == {"name": "topology"}
    assert spec["kernelModuleConfig"] == {"name": "modules"}
    assert spec["secretEnv"] == "driver-env"
    assert spec["env"] == [{"name": "A", "value": "b"}]
    assert spec["upgradePolicy"]["maxParallelUpgrades"] == 2
    assert spec["upgradePolicy"]["podDeletion"]["force"] is True
    assert spec["rdma"] == {"enabled": True, "useHostMofed": False}
    assert spec["labels"] == {"team": "ml"}
    assert spec["annotations"] == {"a": "b"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["gds"]["enabled"] is True
    assert spec["gdrcopy"]["enabled"] is True
    validate_document(find(objects, "NVIDIADriver", "default"))
    driver = find(objects, "ClusterPolicy")["spec"]["driver"]
    assert driver["useNvidiaDriverCRD"] is True
    assert "version" not in driver


def leaf_values(value: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaf_values(sub, (*prefix, key))
    else:
        yield prefix, value


def at(dump: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        dump = dump.get(key) if isinstance(dump, dict) else None
    return dump


@needs_helm
def test_every_field_of_the_model_reaches_the_policy(tmp_path: Path) -> None:
    """Every field of a policy that sets them all (data/policies/everything.yaml), given as values, means
    the same in the ClusterPolicy the chart writes: no model field is dropped by the template."""
    spec = everything_spec()
    values = {key: copy.deepcopy(value) for key, value in spec.items() if key != "operator"}
    values["clusterPolicy"] = {"name": "everything", "operator": spec["operator"]}
    for section in values.values():
        # A whole reference in `image` goes with an empty repository and version, as in NVIDIA's
        # values (vgpuManager.repository: ''): the chart's defaults would otherwise be added to it.
        if isinstance(section, dict) and "image" in section and "repository" not in section:
            section["repository"] = ""
            section.setdefault("version", "")
    policy = find(render_chart("-f", values_file(tmp_path, values)), "ClusterPolicy")
    validate_document(policy)
    expected = parse_spec(spec).model_dump(mode="json")
    written = parse_spec(policy["spec"]).model_dump(mode="json")
    # NVIDIA's chart never writes devicePlugin.mps; this one only when it is not the default.
    left_out_at_default: dict[tuple[str, ...], str] = {("devicePlugin", "mps", "root"): "/run/nvidia/mps"}
    lost = {
        ".".join(path): (at(expected, path), at(written, path))
        for path, _ in leaf_values(spec)
        if at(expected, path) != at(written, path)
        and not (at(written, path) is None and left_out_at_default.get(path) == at(expected, path))
    }
    assert not lost, f"(given, written): {lost}"


@needs_helm
def test_values_without_the_operand_defaults_mean_the_operators_defaults(tmp_path: Path) -> None:
    """`helm upgrade --reuse-values` from a release of the 0.1 chart keeps its values, whose operand
    sections were empty (or absent): the policy then leaves every field to the operator's default."""
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    values = yaml.safe_load((copy / "values.yaml").read_text())
    for name in set(ClusterPolicySpec.model_fields) - {"operator"}:
        values.pop(name, None)
    for name in ("platform", "gpuCluster", "draDriver", "extraObjects", "node-feature-discovery"):
        values.pop(name, None)
    values["nfd"] = {"enabled": False}
    values["driver"] = {}
    (copy / "values.yaml").write_text(yaml.safe_dump(values))
    proc = helm("template", RELEASE, str(copy), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION)
    policy = find([d for d in yaml.safe_load_all(proc.stdout) if d], "ClusterPolicy")
    validate_document(policy)
    spec = policy["spec"]
    # Only the switches NVIDIA's chart always writes, at the operator's defaults; no image, no upgrade policy.
    enabled = {name: s["enabled"] for name, s in spec.items() if "enabled" in s}
    assert enabled == {"driver": True, "psa": False, "cdi": True, "sandboxWorkloads": False}
    assert not [name for name, s in spec.items() if {"repository", "image", "version"} & set(s)]
    assert "upgradePolicy" not in spec["driver"]
    assert policy["spec"]["daemonsets"]["labels"]["helm.sh/chart"] == "gpu-operator-0.1.0"


@needs_helm
def test_cluster_policy_can_be_left_out() -> None:
    for flag in ("clusterPolicy.create=false", "clusterPolicy.deployCR=false"):
        objects = render_chart("--set", flag)
        assert not [o for o in objects if o["kind"] in ("ClusterPolicy", "Job")], flag


def test_spec_keys_are_the_models_fields() -> None:
    """Every ClusterPolicySpec field but `operator` is a top-level value, in values.yaml and the schema."""
    expected = set(ClusterPolicySpec.model_fields) - {"operator"}
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert expected <= set(schema["properties"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert expected <= set(values)


@needs_helm
@pytest.mark.parametrize(
    "component", ["driver", "toolkit", "devicePlugin", "dcgm", "dcgmExporter", "gfd", "migManager", "gds"]
)
def test_a_version_alone_keeps_the_image(component: str) -> None:
    """`--set <component>.version=X` alone: repository and image stay NVIDIA's, so the CRD takes it."""
    policy = find(render_chart("--set", f"{component}.version=1.2.3"), "ClusterPolicy")
    section = policy["spec"][component]
    assert section["version"] == "1.2.3"
    assert section["repository"] and section["image"]
    validate_document(policy)


@needs_helm
def test_nvidias_operator_keys() -> None:
    objects = render_chart(
        "--set",
        "operator.defaultRuntime=crio",
        "--set",
        "operator.imagePullSecrets[0]=regcred",
        "--set",
        "operator.imagePullSecrets[1].name=other",
        "--set",
        "operator.runtimeClass=nvidia-gpu",
        "--set",
        "operator.imagePullPolicy=Always",
        "--set",
        "operator.annotations.a=b",
        "--set",
        "operator.logging.level=debug",
        "--set",
        "operator.repository=nvcr.io/nvidia",
        "--set",
        "operator.image=gpu-operator",
        "--set",
        "operator.version=v26.7.0",
    )
    operator = find(objects, "ClusterPolicy")["spec"]["operator"]
    assert operator == {"defaultRuntime": "crio", "runtimeClass": "nvidia-gpu"}
    pod = find(objects, "Deployment")["spec"]["template"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    assert find(objects, "ServiceAccount", RELEASE)["imagePullSecrets"] == [
        {"name": "regcred"},
        {"name": "other"},
    ]
    assert pod["metadata"]["annotations"] == {"a": "b"}
    container = pod["spec"]["containers"][0]
    # NVIDIA's operator image is not this operator: the chart keeps its own.
    assert container["image"] == "ghcr.io/gpu-operator/gpu-operator:0.1.0"
    assert container["imagePullPolicy"] == "Always"
    assert "--verbose" in container["args"]
    runtime_classes = find(objects, "ClusterRole", RELEASE)
    assert "nvidia-gpu" in json.dumps(runtime_classes)


@needs_helm
def test_cluster_policy_operator_wins_over_nvidias_keys() -> None:
    objects = render_chart(
        "--set", "operator.runtimeClass=a", "--set", "clusterPolicy.operator.runtimeClass=b"
    )
    assert find(objects, "ClusterPolicy")["spec"]["operator"]["runtimeClass"] == "b"


@needs_helm
def test_extra_objects_and_node_feature_rules(tmp_path: Path) -> None:
    values = {
        "extraObjects": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra-{{ .Release.Name }}"}},
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}-secret\n",
        ],
        "nfd": {"nodefeaturerules": True},
    }
    objects = render_chart("-f", values_file(tmp_path, values))
    find(objects, "ConfigMap", f"extra-{RELEASE}")
    find(objects, "Secret", f"{RELEASE}-secret")
    rule = find(objects, "NodeFeatureRule")
    assert {r["name"] for r in rule["spec"]["rules"]} == {
        "kernel-module-gdrdrv",
        "kernel-module-nvidia_fs",
        "kernel-module-nvidia_peermem",
    }


DRA_SERVED = ["--api-versions", "resource.k8s.io/v1/DeviceClass"]
"""What `helm install` finds on a cluster that serves DRA (NVIDIA's chart checks it for a GPUCluster)."""

REFUSED = [
    (["--set", "devicePlugin.config.create=true", "--set", "devicePlugin.config.name=x"], "config.data"),
    (["--set", "devicePlugin.config.create=true", "--set", "devicePlugin.config.data.a=b"], "config.name"),
    (["--set", "cdi.enabled=false", "--set", "cdi.nriPluginEnabled=true"], "needs cdi.enabled"),
    (["--set", "toolkit.enabled=false", "--set", "cdi.nriPluginEnabled=true"], "container toolkit"),
    (["--set", "gpuCluster.deployCR=true"], "supports Dynamic Resource Allocation"),
    (
        [*DRA_SERVED, "--set", "gpuCluster.deployCR=true", "--set", "clusterPolicy.deployCR=false"],
        "driver.nvidiaDriverCRD.enabled=true",
    ),
]


@needs_helm
@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_combinations_nvidias_chart_refuses(args: list[str], message: str) -> None:
    proc = helm(*template_args(*args), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


NO_REGISTRY = [
    (["--set", "validator.repository=nvidia/cloud-native"], 'validator.repository: "nvidia/cloud-native"'),
    (
        ["--set", "devicePlugin.repository=", "--set", "devicePlugin.image=nvidia/k8s-device-plugin"],
        "devicePlugin.image",
    ),
    (["--set", "driver.manager.repository=nvidia"], "driver.manager.repository"),
    (["--set", "dcgm.enabled=true", "--set", "dcgm.repository=nvidia"], "dcgm.repository"),
]


@needs_helm
@pytest.mark.parametrize(("args", "field"), NO_REGISTRY, ids=[" ".join(a) for a, _ in NO_REGISTRY])
def test_images_without_a_registry_are_refused(args: list[str], field: str) -> None:
    proc = helm(*template_args(*args), check=False)
    assert proc.returncode != 0, proc.stdout
    assert f"{field}" in proc.stderr and "names no registry host" in proc.stderr, proc.stderr


@needs_helm
@pytest.mark.parametrize(
    "args",
    [
        ["--set", "validator.repository=docker.io/nvidia"],  # Docker Hub, named
        ["--set", "validator.repository=localhost/nvidia"],
        ["--set", "validator.repository=registry.local:5000"],
        ["--set", "dcgm.enabled=false", "--set", "dcgm.repository=nvidia"],  # not deployed
        ["--set", "gds.repository=nvidia"],  # off by default
    ],
    ids=lambda a: " ".join(a),
)
def test_images_with_a_registry_or_not_deployed_pass(args: list[str]) -> None:
    helm(*template_args(*args))


# --- values schema ----------------------------------------------------------------------------------


def test_values_schema_is_generated_from_the_models() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


BAD_VALUES = [
    (["--set", "operator.replicas=two"], "/operator/replicas", "got string, want integer"),
    (["--set", "operator.replicas=-1"], "/operator/replicas", "minimum"),
    (["--set", "operator.foo=1"], "/operator", "'foo' not allowed"),
    (["--set", "operator.image.pullPolicy=Sometimes"], "/operator/image/pullPolicy", ""),
    (["--set", "operator.logFormat=xml"], "/operator/logFormat", ""),
    (["--set", "operator.port=0"], "/operator/port", "minimum"),
    (["--set", "doctor.rbac.subjects[0].kind=Robot"], "/doctor/rbac/subjects/0/kind", ""),
    (
        ["--set", "operator.metrics.serviceMonitor.enabled=yes"],
        "/operator/metrics/serviceMonitor/enabled",
        "",
    ),
    (
        ["--set", "operator.metrics.serviceMonitor.interval=often"],
        "/operator/metrics/serviceMonitor/interval",
        "",
    ),
    (["--set", "driver.foo=1"], "/driver", "'foo' not allowed"),
    (["--set", "devicePlugin.version=true"], "/devicePlugin/version", ""),
    (["--set", "devicePlugin.config.creat=true"], "/devicePlugin/config", "'creat' not allowed"),
    (["--set", "driver.nvidiaDriverCRD.enable=true"], "/driver/nvidiaDriverCRD", "'enable' not allowed"),
    (["--set", "operator.logging.level=loud"], "/operator/logging/level", ""),
    (["--set", "operator.imagePullSecrets[0]=Not A Name"], "/operator/imagePullSecrets/0", ""),
    (["--set", "operator.defaultRuntime=rkt"], "/operator/defaultRuntime", ""),
    (["--set", "driver.repository=Not A Registry"], "/driver/repository", ""),
    (["--set", "platform.openshfit=true"], "/platform", "'openshfit' not allowed"),
    (
        ["--set", "dcgmExporter.serviceMonitor.enabled=yes"],
        "/dcgmExporter/serviceMonitor/enabled",
        "want boolean",
    ),
    (["--set", "daemonsets.updateStrategy=Sometimes"], "/daemonsets/updateStrategy", ""),
    (["--set", "clusterPolicy.operator.foo=1"], "/clusterPolicy/operator", "'foo' not allowed"),
    (["--set", "clusterPolicy.name=Not_A_Name"], "/clusterPolicy/name", ""),
    (["--set", "operator.serviceAccount.name=Not A Name"], "/operator/serviceAccount/name", ""),
    (["--set", "operator.priorityClassName=critical!"], "/operator/priorityClassName", ""),
    (["--set", "nfd.enabled=maybe"], "/nfd/enabled", "want boolean"),
    (["--set", "drivers.enabled=false"], "'drivers' not allowed", ""),
    (["--set", "nodeDiscovery=yes"], "/nodeDiscovery", "'auto', 'builtin', 'nfd', 'none'"),
    (["--set", "nodeDiscoveryAgent.rescanSeconds=0"], "/nodeDiscoveryAgent/rescanSeconds", ""),
    (["--set", "nodeDiscoveryAgent.foo=1"], "/nodeDiscoveryAgent", "'foo' not allowed"),
]


@needs_helm
@pytest.mark.parametrize(("args", "where", "what"), BAD_VALUES, ids=[" ".join(a) for a, _, _ in BAD_VALUES])
def test_bad_values_fail_naming_the_value(args: list[str], where: str, what: str) -> None:
    proc = helm(*template_args(*args), check=False)
    assert proc.returncode != 0, f"{args} rendered:\n{proc.stdout}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert where in proc.stderr, proc.stderr
    assert what in proc.stderr, proc.stderr


def test_operand_sections_are_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for name in ("operator", "clusterPolicy", "nfd", "nodeDiscoveryAgent"):
        assert schema["properties"][name]["additionalProperties"] is False
    for name in ClusterPolicySpec.model_fields:
        if name == "operator":
            continue
        assert schema["properties"][name]["additionalProperties"] is False, name
    for name in ("config", "upgradePolicy", "manager", "rdma"):
        ref = schema["properties"]["driver" if name != "config" else "devicePlugin"]["properties"][name]
        target = next((b for b in ref.get("anyOf", [ref]) if b.get("type") != "null"), ref)
        if "$ref" in target:
            target = schema["$defs"][target["$ref"].removeprefix("#/$defs/")]
        assert target["additionalProperties"] is False, name


# --- the Deployment ---------------------------------------------------------------------------------


def test_deployment(default_objects: list[Obj]) -> None:
    deployment = find(default_objects, "Deployment")
    spec = deployment["spec"]
    # Two replicas, one leading by a Lease; a new one is ready before an old one stops.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"] | {
        "app.kubernetes.io/component": "gpu-operator"
    }
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"].items()
        <= spec["template"]["metadata"]["labels"].items()
    )
    budget = find(default_objects, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": term["podAffinityTerm"]["labelSelector"]}
    assert spec["template"]["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-drain.skip"] == "true"
    assert pod["serviceAccountName"] == RELEASE
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/gpu-operator/gpu-operator:0.1.0"
    assert container["args"] == [
        "run",
        "--namespace=$(OPERATOR_NAMESPACE)",
        "--log-format=json",
        "--listen=0.0.0.0:8080",
        "--create-crd",
        f"--lease-name={RELEASE}",
    ]
    parsed = cli.build_parser({}).parse_args(container["args"])
    assert parsed.create_crd is True and parsed.leader_election is True and parsed.lease_name == RELEASE
    assert {
        "name": "OPERATOR_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]


@needs_helm
def test_deployment_values(tmp_path: Path) -> None:
    values = {
        "operator": {
            "replicas": 0,
            "image": {"repository": "", "name": "gpu-operator", "tag": "dev", "pullPolicy": "Never"},
            "logFormat": "plain",
            "verbose": True,
            "env": [{"name": "DRIVER_IMAGE", "value": "registry.example.com/driver:1"}],
            "priorityClassName": "system-cluster-critical",
            "podLabels": {"team": "gpu"},
            "podAnnotations": {"example.com/a": "b"},
            "imagePullSecrets": [{"name": "creds"}],
            "serviceAccount": {"create": False, "name": "existing"},
        }
    }
    objects = render_chart("-f", values_file(tmp_path, values))
    accounts = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    assert sorted(accounts) == [f"{RELEASE}-cleanup", AGENT]
    deployment = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 0
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "gpu"
    assert template["metadata"]["annotations"] == {"example.com/a": "b"}
    pod = template["spec"]
    assert pod["serviceAccountName"] == "existing"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "creds"}]
    (container,) = pod["containers"]
    assert container["image"] == "gpu-operator:dev"
    assert container["imagePullPolicy"] == "Never"
    assert "--log-format=plain" in container["args"] and "--verbose" in container["args"]
    assert {"name": "DRIVER_IMAGE", "value": "registry.example.com/driver:1"} in container["env"]
    agent = find(objects, "DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert agent["imagePullSecrets"] == [{"name": "creds"}]
    assert [(c["image"], c["imagePullPolicy"]) for c in agent["containers"]] == [
        ("gpu-operator:dev", "Never")
    ]
    for binding in (
        o
        for o in objects
        if o["kind"].endswith("RoleBinding") and o["metadata"]["name"] not in (f"{RELEASE}-cleanup", AGENT)
    ):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "existing", "namespace": NAMESPACE}]


def test_metrics_service_selects_the_operator_pod(default_objects: list[Obj]) -> None:
    service = find(default_objects, "Service", f"{RELEASE}-metrics")
    pod_labels = find(default_objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "gpu-operator-metrics", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert not [o for o in default_objects if o["kind"] == "ServiceMonitor"], "off by default"


@needs_helm
def test_service_monitor_and_port(tmp_path: Path) -> None:
    values = {
        "operator": {
            "port": 9443,
            "metrics": {
                "service": {"annotations": {"prometheus.io/scrape": "true"}},
                "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
            },
        }
    }
    objects = render_chart("-f", values_file(tmp_path, values))
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--listen=0.0.0.0:9443" in container["args"]
    assert container["ports"][0]["containerPort"] == 9443
    service = find(objects, "Service", f"{RELEASE}-metrics")
    assert service["spec"]["ports"][0]["port"] == 9443
    assert service["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "gpu-operator-metrics", "path": "/metrics", "interval": "15s"}
    ]


# --- RBAC -------------------------------------------------------------------------------------------

# Calls the operator makes beyond applying, deleting and watching the kinds it renders (below), each
# with where it happens. Scope "" is cluster-wide, "default" is the Events namespace, NAMESPACE the
# release (operand) namespace.
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
REQUIRED_EXTRA: Grants = {
    # main.py: the informers of clusterpolicies and nvidiadrivers, cluster-wide.
    ("", "nvidia.com", "clusterpolicies", ""): {"list", "watch"},
    ("", "nvidia.com", "nvidiadrivers", ""): {"list", "watch"},
    ("", "nvidia.com", "gpuclusters", ""): {"list", "watch"},
    # runtime/client.py set_finalizers: the GPUCluster's finalizer (core/gpucluster_plan.py).
    ("", "nvidia.com", "gpuclusters", "gpu-cluster"): {"patch"},
    # runtime/client.py patch_status and patch_driver_status.
    ("", "nvidia.com", "clusterpolicies/status", ""): {"patch"},
    ("", "nvidia.com", "nvidiadrivers/status", ""): {"patch"},
    ("", "nvidia.com", "gpuclusters/status", ""): {"patch"},
    # plan.py and driver_pool_plan.py: controller ownerReference with blockOwnerDeletion
    # (OwnerReferencesPermissionEnforcement), to the ClusterPolicy and to a pool's NVIDIADriver.
    ("", "nvidia.com", "clusterpolicies/finalizers", ""): {"update"},
    ("", "nvidia.com", "nvidiadrivers/finalizers", ""): {"update"},
    ("", "nvidia.com", "gpuclusters/finalizers", ""): {"update"},
    # main.py node_event (watch), runtime/client.py apply_node_labels (server-side apply on existing nodes)
    # and patch_node (the driver upgrade's merge patch); reconciler.py _refresh_node (after a 409).
    ("", "", "nodes", ""): {"get", "list", "watch", "patch"},
    # main.py pod_event and prime: operand pods, for readiness and waiting reasons.
    (NAMESPACE, "", "pods", ""): {"list", "watch"},
    # main.py REVISIONS: the driver DaemonSets' ControllerRevisions (the upgrade's target).
    (NAMESPACE, "apps", "controllerrevisions", ""): {"list", "watch"},
    # runtime/drain_watches.py (list_at and watch of spec.nodeName=<node>, all namespaces) and
    # runtime/client.py delete_pod.
    ("", "", "pods", ""): {"list", "watch", "delete"},
    # runtime/client.py evict.
    ("", "", "pods/eviction", ""): {"create"},
    # runtime/client.py post_event: Events about the cluster-scoped ClusterPolicy, NVIDIADrivers and
    # Nodes live in `default`.
    ("default", "", "events", ""): {"create"},
    # reconciler.py ensure_crd: get, server-side apply, create when absent (operator.createCRD).
    ("", *CRDS, "clusterpolicies.nvidia.com"): {"get", "patch"},
    ("", *CRDS, "nvidiadrivers.nvidia.com"): {"get", "patch"},
    ("", *CRDS, "gpuclusters.nvidia.com"): {"get", "patch"},
    ("", *CRDS, ""): {"list", "watch", "create"},
    # leader.py: the release's Lease (read, renewed; created when absent, which needs no name).
    (NAMESPACE, "coordination.k8s.io", "leases", RELEASE): {"get", "update"},
    (NAMESPACE, "coordination.k8s.io", "leases", ""): {"create"},
    # main.py: the operand namespace's watch; reconciler.py _write_namespace (psa.enabled).
    ("", "", "namespaces", NAMESPACE): {"list", "watch", "patch"},
    # reconciler.py _ask: the Secrets and PriorityClasses new pods name must exist (metadata only).
    (NAMESPACE, "", "secrets", ""): {"get"},
    ("", "scheduling.k8s.io", "priorityclasses", ""): {"get"},
}


# Kinds the operator may change and delete only by name (resourceNames), the rest of their kind being
# someone else's: cluster-scoped objects, and the operands' roles and bindings.
BY_NAME_ONLY = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "RuntimeClass",
        "Role",
        "RoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)


def required_grants() -> Grants:
    """Every permission the operator needs, derived from the code."""
    from gpu_operator.main import MANAGED  # imports Kopf; keep it out of module import time

    grants: Grants = {key: set(verbs) for key, verbs in REQUIRED_EXTRA.items()}

    def add(namespace: str, group: str, resource: str, verbs: set[str], name: str = "") -> None:
        grants.setdefault((namespace, group, resource, name), set()).update(verbs)

    for obj in operand_objects():
        plural, namespaced = RESOURCES[(obj["apiVersion"], obj["kind"])]
        scope = NAMESPACE if namespaced else ""
        group, name = group_of(obj["apiVersion"]), obj["metadata"]["name"]
        # runtime/client.py apply (server-side apply creates when missing) and delete (disabled components);
        # reconciler.py _ask: an object missing from the caches may be someone else's (get).
        if obj["kind"] in BY_NAME_ONLY:
            # Looked up, changed and deleted by name only; created under the chart's admission policy.
            add(scope, group, plural, {"create"})
            add(scope, group, plural, {"get", "patch", "delete"}, name)
        else:
            add(scope, group, plural, {"get", "create", "patch", "delete"})
        if obj["kind"] in ("ClusterRole", "Role"):
            # Creating a role with permissions the operator lacks, and binding it.
            add(scope, "rbac.authorization.k8s.io", plural, {"bind", "escalate"}, name)
    for group, _version, plural in MANAGED:
        namespaced = next(ns for (_av, _k), (p, ns) in RESOURCES.items() if p == plural)
        add(NAMESPACE if namespaced else "", group, plural, {"list", "watch"})
    return grants


def roles_of(objects: list[Obj], service_account: str) -> list[Obj]:
    """The (Cluster)Roles bound to the ServiceAccount (in NAMESPACE)."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace", ""))
        for b in objects
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in b["subjects"]
    }
    return [
        o
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
        and (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")) in bound
    ]


def granted(objects: list[Obj], service_account: str = RELEASE) -> Grants:
    """The chart's rules for a ServiceAccount, flattened to one entry per resource and name."""
    grants: Grants = {}
    for role in roles_of(objects, service_account):
        scope = role["metadata"].get("namespace", "") if role["kind"] == "Role" else ""
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [""]:
                        grants.setdefault((scope, group, resource, name), set()).update(rule["verbs"])
    return grants


def rules(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for role in (o for o in objects if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            yield role["metadata"]["name"], rule


def test_rbac_has_no_wildcards(default_objects: list[Obj]) -> None:
    for name, rule in rules(default_objects):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert not any("*" in value for value in rule.get(field) or []), f"{name}: {field} {rule}"


def test_bind_and_escalate_only_by_name(default_objects: list[Obj]) -> None:
    for name, rule in rules(default_objects):
        if {"bind", "escalate", "impersonate"} & set(rule["verbs"]):
            assert rule.get("resourceNames"), f"{name}: {rule} is not restricted by resourceNames"
            assert set(rule["verbs"]) <= {"bind", "escalate"}, f"{name}: {rule}"


def test_rbac_is_exactly_what_the_code_needs(default_objects: list[Obj]) -> None:
    required = required_grants()
    have = granted(default_objects)
    missing = {k: sorted(v - have.get(k, set())) for k, v in required.items() if v - have.get(k, set())}
    extra = {k: sorted(v - required.get(k, set())) for k, v in have.items() if v - required.get(k, set())}
    assert not missing, f"the operator needs, the chart lacks: {missing}"
    assert not extra, f"the chart grants, the operator never uses: {extra}"


def test_cleanup_hook_rbac(default_objects: list[Obj]) -> None:
    """`gpu-operator cleanup` deletes the release's ClusterPolicy and watches nodes; nothing else."""
    assert granted(default_objects, f"{RELEASE}-cleanup") == {
        ("", "nvidia.com", "clusterpolicies", "cluster-policy"): {"delete"},
        ("", "", "nodes", ""): {"list", "watch"},
    }
    job = find(default_objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        container["image"]
        == find(default_objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "command" not in container, "the image's entry point is gpu-operator"
    assert container["args"] == ["cleanup", "--policy", "cluster-policy", "--timeout", "120"]
    # The arguments are the CLI's: they parse.
    assert cli.build_parser({}).parse_args(container["args"]).handler is cli.cmd_cleanup


def doctor_rules(objects: list[Obj]) -> Grants:
    role = find(objects, "ClusterRole", f"{RELEASE}-doctor")
    grants: Grants = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault(("", group, resource, ""), set()).update(rule["verbs"])
    return grants


def test_doctor_role_is_exactly_what_doctor_reads(default_objects: list[Obj]) -> None:
    from gpu_operator.doctor.recording import READS

    assert doctor_rules(default_objects) == {
        ("", group, resource, ""): set(verbs) for group, resource, verbs in READS
    }
    assert not {"create", "update", "patch", "delete"} & {
        v for verbs in doctor_rules(default_objects).values() for v in verbs
    }
    assert not [
        o
        for o in default_objects
        if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith("-doctor")
    ]


@needs_helm
def test_doctor_role_binding_and_opt_out(tmp_path: Path) -> None:
    subjects = [{"kind": "Group", "name": "gpu-team", "apiGroup": "rbac.authorization.k8s.io"}]
    objects = render_chart("-f", values_file(tmp_path, {"doctor": {"rbac": {"subjects": subjects}}}))
    binding = find(objects, "ClusterRoleBinding", f"{RELEASE}-doctor")
    assert binding["subjects"] == subjects
    assert binding["roleRef"]["name"] == f"{RELEASE}-doctor"
    none = render_chart("--set", "doctor.rbac.create=false")
    assert not [o for o in none if o["metadata"]["name"].endswith("-doctor")]


@needs_helm
def test_a_gpucluster_beside_the_cluster_policy(tmp_path: Path) -> None:
    """gpuCluster.deployCR renders NVIDIA's GPUCluster from the values (test_nvidia_values.py compares
    it with NVIDIA's chart), here beside the ClusterPolicy, which NVIDIA's chart refuses and this
    operator runs (the device plugin on the nodes the GPUCluster does not select); valid for the
    operator's models; gpuCluster.nodeSelector is its pool."""
    values = {
        "gpuCluster": {"deployCR": True, "nodeSelector": {"pool": "dra"}},
        "draDriver": {"featureGates": {"MPSSupport": True}, "computeDomains": {"enabled": False}},
        "dcgm": {"enabled": True},
    }
    objects = render_chart(*DRA_SERVED, "-f", values_file(tmp_path, values))
    find(objects, "ClusterPolicy", "cluster-policy")
    gpucluster = find(objects, "GPUCluster", "gpu-cluster")
    assert gpucluster["apiVersion"] == "nvidia.com/v1alpha1"
    assert "helm.sh/resource-policy" not in (gpucluster["metadata"].get("annotations") or {})
    spec = parse_gpucluster_document(gpucluster)
    assert spec.nodeSelector == {"pool": "dra"}
    assert spec.draDriver.featureGates == {"MPSSupport": True}
    assert not spec.draDriver.compute_domains_enabled() and spec.dcgm_enabled()
    assert spec.daemonsets.priorityClassName == "system-node-critical"
    # The default: every GPU node (no nodeSelector), NVIDIA's images.
    default = find(render_chart(*DRA_SERVED, "--set", "gpuCluster.deployCR=true"), "GPUCluster")
    assert "nodeSelector" not in default["spec"]
    assert default["spec"]["draDriver"]["image"] == "dra-driver-nvidia-gpu"
    assert not [o for o in render_chart() if o["kind"] == "GPUCluster"], "none unless asked for"


@needs_helm
def test_the_cleanup_hook_drains_the_gpucluster_first() -> None:
    """With the chart's GPUCluster, the hook deletes it before the ClusterPolicy and waits until the
    operator has drained it: may delete and read it, by name, nothing more."""
    objects = render_chart(*DRA_SERVED, "--set", "gpuCluster.deployCR=true")
    assert granted(objects, f"{RELEASE}-cleanup") == {
        ("", "nvidia.com", "clusterpolicies", "cluster-policy"): {"delete"},
        ("", "nvidia.com", "gpuclusters", "gpu-cluster"): {"delete", "get", "list", "watch"},
        ("", "", "nodes", ""): {"list", "watch"},
    }
    (container,) = find(objects, "Job")["spec"]["template"]["spec"]["containers"]
    args = cli.build_parser({}).parse_args(container["args"])
    assert (args.gpucluster, args.policy) == ("gpu-cluster", "cluster-policy")


@needs_helm
def test_no_cleanup_hook_without_a_cluster_policy() -> None:
    for args in (["--set", "clusterPolicy.create=false"], ["--set", "cleanup.enabled=false"]):
        assert not [o for o in render_chart(*args) if o["kind"] == "Job"]


def test_operand_rbac_file_is_generated_from_the_templates() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "operand_rbac.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_operand_rbac_is_the_same_for_every_policy_and_namespace() -> None:
    """The admission policy pins each operand role and binding to one content, rendered from
    everything.yaml: every other policy must render the same (or leave the object out)."""

    def rbac(objects: Iterable[Obj]) -> dict[tuple[str, str], Any]:
        return {
            (o["kind"], o["metadata"]["name"]): {k: o.get(k) for k in ("rules", "roleRef", "subjects")}
            for o in objects
            if o["kind"] in operand_rbac.RBAC_KINDS
        }

    pinned = rbac(operand_objects())
    facts = [ClusterFacts(namespace=NAMESPACE, runtimes=r) for r in (("containerd",), ("crio",), ("docker",))]
    for path in POLICIES.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ClusterPolicy":
                continue
            spec = parse_spec(doc.get("spec") or {})
            for each in facts:
                found = rbac(render(spec, each))
                assert {k: v for k, v in pinned.items() if k in found} == found, path.name

    # In another namespace only the subjects' namespace differs (the policy checks it separately).
    def without_namespace(found: dict[tuple[str, str], Any]) -> dict[tuple[str, str], Any]:
        return {
            key: {**value, "subjects": [{**s, "namespace": ""} for s in value["subjects"] or []]}
            for key, value in found.items()
        }

    assert without_namespace(rbac(operand_objects("other"))) == without_namespace(pinned)


@needs_helm
def test_operand_names_match_the_operator() -> None:
    """resourceNames = the objects the operator renders, whatever the namespace and the policy."""
    objects = render_chart()
    have = granted(objects)
    for kind, resource in (("ClusterRole", "clusterroles"), ("ClusterRoleBinding", "clusterrolebindings")):
        names = sorted(
            n for (ns, _, r, n), verbs in have.items() if not ns and r == resource and "delete" in verbs
        )
        assert names == operand_role_names(kind)
    for kind, resource in (("Role", "roles"), ("RoleBinding", "rolebindings")):
        names = sorted(n for (ns, _, r, n), verbs in have.items() if ns == NAMESPACE and r == resource and n)
        assert names == operand_role_names(kind)
    other_namespace = {o["metadata"]["name"] for o in operand_objects("other") if o["kind"].endswith("Role")}
    assert other_namespace == {o["metadata"]["name"] for o in operand_objects() if o["kind"].endswith("Role")}


@needs_helm
def test_runtime_class_names_follow_the_policy() -> None:
    objects = render_chart("--set", "clusterPolicy.operator.runtimeClass=nvidia-gpu")
    names = sorted(n for (_, _, r, n), v in granted(objects).items() if r == "runtimeclasses" and n)
    assert names == ["nvidia-cdi", "nvidia-gpu", "nvidia-legacy"]
    policy = find(objects, "ValidatingAdmissionPolicy", f"{RELEASE}-writes-runtimeclasses")
    assert any(
        '["nvidia-gpu","nvidia-cdi","nvidia-legacy"]' in v["expression"]
        for v in policy["spec"]["validations"]
    )


def test_admission_policy_pins_the_operators_writes(default_objects: list[Obj]) -> None:
    """One policy per kind (each its own expressions: the API server type-checks a policy's
    expressions against every kind it matches, templates/admission-policy.yaml), together covering
    every kind the operator may create without a name in RBAC."""
    matched: set[str] = set()
    expressions: dict[str, list[str]] = {}
    for resource in WRITE_POLICIES:
        name = f"{RELEASE}-writes-{resource}"
        binding = find(default_objects, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        spec = find(default_objects, "ValidatingAdmissionPolicy", name)["spec"]
        assert spec["failurePolicy"] == "Fail"
        (condition,) = spec["matchConditions"]
        assert (
            condition["expression"]
            == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{RELEASE}"'
        )
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["resources"] == [resource] and rule["operations"] == ["CREATE", "UPDATE"]
        matched.add(resource)
        expressions[resource] = [v["expression"] for v in spec["validations"]]
        assert all(v.get("reason") == "Forbidden" and v.get("message") for v in spec["validations"])
    # Every kind the operator may create without a name in RBAC is pinned here.
    creatable = {r for (_, _, r, n), verbs in granted(default_objects).items() if "create" in verbs and not n}
    # pods/eviction (the driver upgrade): an Eviction deletes a pod as `delete pods`, which the
    # operator holds anyway (workload pods, names unknown in advance), does, but only where
    # PodDisruptionBudgets allow it: it grants nothing more.
    assert creatable - matched - {"pods/eviction"} == {
        "serviceaccounts",
        "configmaps",
        "services",
        "resourceclaimtemplates",
        "servicemonitors",
        "events",
    }, "namespaced operand kinds, which grant nothing by themselves"
    generated = yaml.safe_load((CHART / "files" / "operand-rbac.yaml").read_text())
    for kind in operand_rbac.RBAC_KINDS:
        resource = kind.lower() + "s"
        assert generated[kind]["content"] in expressions[resource], kind
        # A Role has no aggregationRule: naming it would fail the type check of the Role policy.
        assert ("aggregationRule" in generated[kind]["content"]) == (kind == "ClusterRole"), kind


@pytest.mark.parametrize(("resource", "kind"), [("daemonsets", "DaemonSet"), ("deployments", "Deployment")])
def test_admission_policy_holds_the_workloads_to_their_rendered_pods(
    default_objects: list[Obj], resource: str, kind: str
) -> None:
    """The shapes of files/operand-rbac.yaml, as CEL literals (JSON is CEL's syntax for maps, lists and
    strings), one map per field (CEL types a map literal by its values: one type each);
    tests/unit/test_operand_pods.py evaluates the policy's rule on them."""
    spec = find(default_objects, "ValidatingAdmissionPolicy", f"{RELEASE}-writes-{resource}")["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["apiVersions"]) == (["apps"], ["v1"])
    generated = yaml.safe_load((CHART / "files" / "operand-rbac.yaml").read_text())[kind]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    for field in ("account", "hostNamespaces", "privileged", "hostPaths"):
        by_name = json.loads(variables["accounts" if field == "account" else field])
        assert by_name == {name: shape[field] for name, shape in generated["shapes"].items()}, field
    assert json.loads(variables["prefixes"]) == generated["prefixes"]
    assert variables["pod"] == "object.spec.template.spec"
    known, *rest = (v["expression"] for v in spec["validations"])
    assert known == "variables.known" and len(rest) == 4
    # A workload of an unknown name fails the first rule only: the others hold only for known names.
    assert all(e.startswith("!variables.known || ") for e in rest)
    fields = {"serviceAccountName", "hostPID", "privileged", "capabilities", "hostPath"}
    assert all(any(f in e for e in rest) for f in fields)


def test_admission_policy_limits_the_operators_node_writes_to_what_it_sets(
    default_objects: list[Obj],
) -> None:
    """The labels, annotations and spec field the operator writes on nodes (the e2e test
    test_least_privilege.py tries the rest with its token)."""
    name = f"{RELEASE}-writes-nodes"
    policy = find(default_objects, "ValidatingAdmissionPolicy", name)["spec"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["nodes"], ["UPDATE"])
    (condition,) = policy["matchConditions"]
    assert (
        condition["expression"]
        == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{RELEASE}"'
    )
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    own = {GPU_PRESENT, RUNTIME_LABEL, MIG_CONFIG_LABEL, STATE_LABEL, OWNER_LABEL}
    assert set(re.findall(r"'([^']+)'", variables["ownLabels"])) == own
    labels, annotations, spec = (v["expression"] for v in policy["validations"])
    assert f"startsWith('{DEPLOY_PREFIX}')" in labels
    assert f"startsWith('{ANNOTATION_PREFIX}')" in annotations
    assert "taints" in spec and "unschedulable" not in spec
    assert [v["reason"] for v in policy["validations"]] == ["Forbidden"] * 3
    binding = find(default_objects, "ValidatingAdmissionPolicyBinding", name)["spec"]
    assert binding == {"policyName": name, "validationActions": ["Deny"]}


@needs_helm
def test_admission_policy_can_be_left_out() -> None:
    objects = render_chart("--set", "operator.admissionPolicy=false")
    assert not [o for o in objects if o["metadata"]["name"].startswith(f"{RELEASE}-writes")]


def test_bindings_point_at_the_chart_roles(default_objects: list[Obj]) -> None:
    for binding in (o for o in default_objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if binding["metadata"]["name"].endswith("-doctor"):
            continue  # bound to people (doctor.rbac.subjects), tested above
        role_kind = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
        role = find(default_objects, role_kind, binding["roleRef"]["name"])
        assert role.get("metadata", {}).get("namespace") == binding["metadata"].get("namespace")
        assert binding["roleRef"]["kind"] == role_kind
        name = binding["metadata"]["name"]
        account = name if name in (f"{RELEASE}-cleanup", AGENT) else RELEASE
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


# --- the node discovery agent ---------------------------------------------------------------------


def agent_objects(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["metadata"]["name"] == AGENT]


def test_agent_rbac_is_exactly_what_the_agent_needs(default_objects: list[Obj]) -> None:
    """gpu_operator/agent/node_agent.py: list and watch its own node (field selector), server-side apply of
    labels (patch); in auto mode list and watch NFD's CRD by name."""
    nodes = ("", "", "nodes", "")
    assert granted(default_objects, AGENT) == {
        nodes: {"list", "watch", "patch"},
        ("", *CRDS, NFD_CRD): {"list", "watch"},
    }
    builtin = render_chart("--set", "nodeDiscovery=builtin")
    assert granted(builtin, AGENT) == {nodes: {"list", "watch", "patch"}}


@needs_helm
@pytest.mark.parametrize("mode", ["nfd", "none"])
def test_no_agent_unless_asked_for(mode: str) -> None:
    assert not agent_objects(render_chart("--set", f"nodeDiscovery={mode}"))


def test_agent_daemonset(default_objects: list[Obj]) -> None:
    daemonset = find(default_objects, "DaemonSet", AGENT)
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    template = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["serviceAccountName"] == AGENT
    assert pod["tolerations"] == [{"operator": "Exists"}], "it must run on tainted GPU nodes"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    operator_image = find(default_objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["image"] == operator_image, "no image of its own"
    assert container["args"] == ["discover", "--mode=auto", "--sysfs=/host/sys", "--rescan-seconds=60"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container[
        "env"
    ]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert container["resources"] == {
        "requests": {"cpu": "5m", "memory": "64Mi"},
        "limits": {"memory": "128Mi"},
    }
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"pci-devices": "/sys/bus/pci/devices", "devices": "/sys/devices"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for name, host_path in host_paths.items():
        assert mounts[name]["readOnly"] is True
        # Mounted where --sysfs=/host/sys expects them, so sysfs's relative symlinks resolve.
        assert mounts[name]["mountPath"] == "/host" + host_path


@needs_helm
def test_agent_values(tmp_path: Path) -> None:
    values = {
        "nodeDiscovery": "builtin",
        "nodeDiscoveryAgent": {"rescanSeconds": 5, "priorityClassName": "system-node-critical"},
    }
    pod = find(render_chart("-f", values_file(tmp_path, values)), "DaemonSet", AGENT)["spec"]["template"][
        "spec"
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["containers"][0]["args"][1:] == ["--mode=builtin", "--sysfs=/host/sys", "--rescan-seconds=5"]


def test_admission_policy_limits_the_agent_to_the_pci_labels_of_its_own_node(
    default_objects: list[Obj],
) -> None:
    policy = find(default_objects, "ValidatingAdmissionPolicy", AGENT)["spec"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["nodes"], ["UPDATE"])
    (condition,) = policy["matchConditions"]
    assert (
        condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{AGENT}"'
    )
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert sorted(re.findall(r"'([^']+)'", variables["pciLabels"])) == sorted(PCI_LABELS)
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name']" in variables["tokenNode"]
    assert [v["reason"] for v in policy["validations"]] == ["Forbidden"] * 3
    binding = find(default_objects, "ValidatingAdmissionPolicyBinding", AGENT)["spec"]
    assert binding == {"policyName": AGENT, "validationActions": ["Deny"]}
