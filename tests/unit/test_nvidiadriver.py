"""The NVIDIADriver models: NVIDIA's own objects accepted unchanged, NVIDIA's defaults, and each rule
(the CRD's and the per-object refusals of NVIDIA's controller) refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import NVIDIA_DRIVER, definition
from gpu_operator.api.nvidiadriver import (
    DEFAULT_WITHOUT_SELECTOR_MESSAGE,
    DEFAULT_WITHOUT_SELECTOR_RULE,
    OWNER_LABEL,
    NVIDIADriverSpec,
    NVIDIADriverStatus,
    _semver_at_least,
    parse_driver_document,
    parse_driver_spec,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia"
SAMPLES = sorted(DATA.glob("nvidiadriver-*.yaml"))
SPEC: dict[str, Any] = definition(NVIDIA_DRIVER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]
VERSION = {"version": "595.91.07"}


def errors(spec: Any) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_driver_spec(spec)
    return {e.path: e.message for e in info.value.errors}


def accepts(spec: dict[str, Any]) -> bool:
    try:
        parse_driver_spec(spec)
    except PolicyError:
        return False
    return True


# --- NVIDIA's objects ------------------------------------------------------------------------------


def test_nvidias_samples_are_all_here() -> None:
    assert [p.name for p in SAMPLES] == [
        "nvidiadriver-chart-default.yaml",
        "nvidiadriver-olm-example.yaml",
        "nvidiadriver-sample.yaml",
    ]
    for path in SAMPLES:
        assert path.read_text(encoding="utf-8").startswith("# NVIDIA gpu-operator v26.7.0"), path


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_nvidias_samples_validate_unchanged(path: Path) -> None:
    spec = parse_driver_document(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert spec.driverType == "gpu"
    assert spec.upgrade_policy().autoUpgrade is True
    assert spec.images_without_registry() == []


def test_the_chart_default_is_the_default_driver() -> None:
    spec = parse_driver_document(yaml.safe_load((DATA / "nvidiadriver-chart-default.yaml").read_text()))
    assert spec.default is True and spec.nodeSelector is None
    assert spec.manager is not None and spec.manager.image == "k8s-driver-manager"
    assert spec.upgradePolicy is not None and spec.upgradePolicy.drain is not None
    assert spec.tolerations is not None and spec.tolerations[0].key == "nvidia.com/gpu"
    assert spec.gdrcopy is not None and not spec.gdrcopy.is_enabled()


# --- defaults --------------------------------------------------------------------------------------


def test_nvidias_defaults() -> None:
    spec = parse_driver_spec(VERSION)
    assert (spec.default, spec.driverType, spec.kernelModuleType) == (False, "gpu", "auto")
    assert (spec.image, spec.usePrecompiled) == ("nvcr.io/nvidia/driver", None)
    policy = spec.upgrade_policy()
    assert (policy.autoUpgrade, policy.maxParallelUpgrades, policy.maxUnavailable) == (True, 1, "25%")
    assert policy.pod_deletion().timeoutSeconds == 300
    # Given in part, the rest defaults as NVIDIA's CRD defaults it (autoUpgrade true).
    given = parse_driver_spec({**VERSION, "upgradePolicy": {"maxParallelUpgrades": 3}}).upgrade_policy()
    assert (given.autoUpgrade, given.maxParallelUpgrades) == (True, 3)
    # The ClusterPolicy's upgrade policy keeps its own default (k8s-operator-libs: false).
    assert parse_spec({"driver": {"upgradePolicy": {}}}).driver.upgradePolicy.autoUpgrade is False  # type: ignore[union-attr]


def test_crd_defaults_are_the_models() -> None:
    defaults = {name: node["default"] for name, node in SPEC["properties"].items() if "default" in node}
    assert defaults == {
        "default": False,
        "driverType": "gpu",
        "image": "nvcr.io/nvidia/driver",
        "kernelModuleType": "auto",
    }
    for name, value in defaults.items():
        assert NVIDIADriverSpec.model_fields[name].default == value
    assert SPEC["properties"]["upgradePolicy"]["properties"]["autoUpgrade"]["default"] is True


def test_an_absent_spec_is_empty() -> None:
    assert errors(None) == errors({})


# --- the CRD's rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("driverType", "cuda"), ("driverType", "GPU"), ("kernelModuleType", "closed"), ("default", "yes")],
)
def test_enums_and_types_name_the_field(field: str, value: str) -> None:
    assert f"spec.{field}" in errors({**VERSION, field: value})


@pytest.mark.parametrize("driver_type", ["gpu", "vgpu", "vgpu-host-manager"])
def test_every_driver_type(driver_type: str) -> None:
    assert parse_driver_spec({**VERSION, "driverType": driver_type}).driverType == driver_type
    assert SPEC["properties"]["driverType"]["enum"] == ["gpu", "vgpu", "vgpu-host-manager"]


@pytest.mark.parametrize("field", ["driverType", "usePrecompiled"])
def test_immutable_fields_are_immutable_in_the_crd(field: str) -> None:
    # nvidiadriver_types.go:57 and :64, NVIDIA's rule and message verbatim.
    assert SPEC["properties"][field]["x-kubernetes-validations"] == [
        {
            "rule": "self == oldSelf",
            "message": f"{field} is an immutable field. Please create a new NvidiaDriver resource instead "
            "when you want to change this setting.",
        }
    ]


def test_the_default_driver_has_no_node_selector() -> None:
    found = errors({**VERSION, "default": True, "nodeSelector": {"pool": "a100"}})
    assert list(found) == ["spec.nodeSelector"]
    assert found["spec.nodeSelector"].startswith("default NVIDIADriver must not use nodeSelector")
    assert accepts({**VERSION, "default": True, "nodeSelector": {}})
    assert accepts({**VERSION, "default": False, "nodeSelector": {"pool": "a100"}})


@pytest.mark.parametrize("default", [None, False, True])
@pytest.mark.parametrize("selector", [None, {}, {"pool": "a100"}])
def test_default_rule_agrees_with_cel(default: bool | None, selector: dict[str, str] | None) -> None:
    rules = SPEC["x-kubernetes-validations"]
    # nvidiadriver_types.go:45, verbatim.
    assert rules[0] == {
        "rule": "has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 "
        ": true",
        "message": "default NVIDIADriver must not use nodeSelector",
        "fieldPath": ".nodeSelector",
    }
    assert (rules[0]["rule"], rules[0]["message"]) == (
        DEFAULT_WITHOUT_SELECTOR_RULE,
        DEFAULT_WITHOUT_SELECTOR_MESSAGE,
    )
    spec = {
        **VERSION,
        **{k: v for k, v in {"default": default, "nodeSelector": selector}.items() if v is not None},
    }
    # The server defaults `default` to false before CEL runs.
    by_cel = not spec.get("default", False) or not spec.get("nodeSelector")
    assert accepts(spec) == by_cel


def test_image_rules_are_the_clusterpolicys() -> None:
    rules = [r["rule"] for r in SPEC["x-kubernetes-validations"][1:]]
    assert rules[:2] == [
        "!has(self.repository) || (has(self.image) && has(self.version))",
        "!has(self.version) || has(self.image)",
    ]
    assert errors({"repository": "nvcr.io/nvidia", "image": "driver:1", "version": "1"}) == {
        "spec": "image 'driver:1' cannot follow repository 'nvcr.io/nvidia': with a repository, image is a "
        "lowercase path without registry, tag or digest (the reference is <repository>/<image>:<version>)"
    }


# --- what NVIDIA's controller refuses about one object ---------------------------------------------


def test_the_owner_label_is_reserved() -> None:
    found = errors({**VERSION, "nodeSelector": {OWNER_LABEL: "other"}})
    assert list(found) == ["spec.nodeSelector"]
    assert OWNER_LABEL in found["spec.nodeSelector"]


@pytest.mark.parametrize("sidecar", ["gds", "gdrcopy"])
def test_sidecars_need_a_driver_built_on_the_node(sidecar: str) -> None:
    on = {"enabled": True, "repository": "nvcr.io/nvidia/cloud-native", "image": "x", "version": "2.16.1"}
    found = errors({**VERSION, "usePrecompiled": True, sidecar: on})
    assert list(found) == [f"spec.{sidecar}"]
    assert "usePrecompiled" in found[f"spec.{sidecar}"]
    assert accepts({**VERSION, "usePrecompiled": True, sidecar: {**on, "enabled": False}})
    assert accepts({**VERSION, "usePrecompiled": False, sidecar: on})


@pytest.mark.parametrize(
    ("version", "needs_open"),
    [
        ("2.17.5", True),
        ("v2.17.5", True),
        ("2.29.4", True),
        ("3", True),
        ("2.18", True),
        ("sha256:" + "a" * 64, True),
        ("2.17.4", False),
        ("2.17.5-rc1", False),
        ("2.16", False),
        ("latest", False),
        (None, False),
    ],
)
def test_new_gds_needs_the_open_kernel_modules(version: str | None, needs_open: bool) -> None:
    gds: dict[str, Any] = {"enabled": True}
    if version is not None:
        gds |= {"repository": "nvcr.io/nvidia/cloud-native", "image": "nvidia-fs", "version": version}
    spec = {**VERSION, "gds": gds}
    if needs_open:
        assert "kernelModuleType: open" in errors(spec)["spec.gds"]
    else:
        assert accepts(spec)
    assert accepts({**spec, "kernelModuleType": "open"})
    assert accepts({**spec, "gds": {**gds, "enabled": False}})


def test_semver_as_golang_compares_it() -> None:
    assert _semver_at_least("2.17.5+build", (2, 17, 5))
    assert not _semver_at_least("02.17.5x", (2, 17, 5))
    assert not _semver_at_least("", (2, 17, 5))


def test_a_version_is_needed_for_a_tag() -> None:
    found = errors({})
    assert list(found) == ["spec.version"]
    assert "image 'nvcr.io/nvidia/driver' has no tag" in found["spec.version"]
    assert "spec.version" in errors({"repository": "nvcr.io/nvidia", "image": "driver"})
    assert accepts({"image": "nvcr.io/nvidia/driver:595.91.07"})
    assert accepts({"image": "nvcr.io/nvidia/driver@sha256:" + "a" * 64})


@pytest.mark.parametrize(
    "image",
    [{"version": "sha256:" + "a" * 64}, {"image": "nvcr.io/nvidia/driver@sha256:" + "a" * 64}],
)
def test_precompiled_drivers_need_a_tag_not_a_digest(image: dict[str, str]) -> None:
    assert accepts(image)
    found = errors({**image, "usePrecompiled": True})
    assert list(found) == ["spec.version"]
    assert "digest" in found["spec.version"]


# --- shapes shared with the ClusterPolicy, and the new ones ------------------------------------------


def test_every_field_of_nvidias_type() -> None:
    # api/nvidia/v1alpha1/nvidiadriver_types.go (v26.7.0), NVIDIADriverSpec's JSON names.
    assert set(NVIDIADriverSpec.model_fields) == {
        "default", "driverType", "usePrecompiled", "useOpenKernelModules", "kernelModuleType",
        "startupProbe", "livenessProbe", "readinessProbe", "rdma", "gds", "gdrcopy", "repository",
        "image", "version", "imagePullPolicy", "imagePullSecrets", "manager", "resources", "args", "env",
        "repoConfig", "certConfig", "licensingConfig", "virtualTopologyConfig", "kernelModuleConfig",
        "secretEnv", "upgradePolicy", "nodeSelector", "nodeAffinity", "labels", "annotations",
        "tolerations", "priorityClassName", "podSecurityContext", "hostNetwork",
    }  # fmt: skip


def test_a_full_spec() -> None:
    spec = parse_driver_spec(
        {
            **VERSION,
            "driverType": "vgpu",
            "repository": "nvcr.io/nvidia",
            "image": "vgpu-guest-driver",
            "imagePullPolicy": "Always",
            "imagePullSecrets": ["ngc"],
            "manager": {
                "imagePullSecrets": ["ngc-manager"],
                "env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}],
            },
            "startupProbe": {"initialDelaySeconds": 60, "failureThreshold": 120},
            "resources": {"limits": {"memory": "2Gi"}},
            "args": ["--foo"],
            "env": [{"name": "FOO", "value": "bar"}],
            "repoConfig": {"name": "repo"},
            "certConfig": {"name": "certs"},
            "licensingConfig": {"secretName": "licensing", "nlsEnabled": True},
            "virtualTopologyConfig": {"name": "topology"},
            "kernelModuleConfig": {"name": "modules"},
            "secretEnv": "driver-secrets",
            "nodeSelector": {"nvidia.com/gpu.product": "A100-SXM4-40GB"},
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kernel", "operator": "Gt", "values": ["5"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]},
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                    }
                ],
            },
            "labels": {"team": "ml"},
            "annotations": {"note": "anything goes"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "priorityClassName": "system-node-critical",
            "podSecurityContext": {"runAsUser": 0},
            "hostNetwork": True,
        }
    )
    assert spec.manager is not None and spec.manager.imagePullSecrets == ["ngc-manager"]
    assert spec.nodeAffinity is not None


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"foo": 1}, "spec.foo"),
        ({"startupProbe": {"periodSeconds": 0}}, "spec.startupProbe.periodSeconds"),
        ({"resources": {"limits": {"cpu": "lots"}}}, "spec.resources.limits.cpu"),
        ({"tolerations": [{"operator": "Equal"}]}, "spec.tolerations[0]"),
        ({"env": [{"name": "1 X"}]}, "spec.env[0].name"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"manager": {"imagePullSecrets": ["Not A Name"]}}, "spec.manager.imagePullSecrets[0]"),
        ({"repoConfig": {"configMapName": "x"}}, "spec.repoConfig.configMapName"),  # v1's name, not here
        ({"licensingConfig": {"name": "Bad_Name"}}, "spec.licensingConfig.name"),
        ({"upgradePolicy": {"maxUnavailable": "200%"}}, "spec.upgradePolicy.maxUnavailable"),
        ({"nodeSelector": {"pool": "not a value"}}, "spec.nodeSelector"),
        ({"labels": {"bad key!": "x"}}, "spec.labels"),
        ({"priorityClassName": "Upper"}, "spec.priorityClassName"),
        ({"podSecurityContext": {"runAsUser": -1}}, "spec.podSecurityContext.runAsUser"),
    ],
)
def test_invalid_fields_are_named(spec: dict[str, Any], path: str) -> None:
    assert path in errors({**VERSION, **spec})


_TERM = "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


@pytest.mark.parametrize(
    ("requirement", "path", "fragment"),
    [
        ({"key": "a", "operator": "In"}, f"{_TERM}[0].matchExpressions[0]", "values must be given"),
        ({"key": "a", "operator": "NotIn", "values": []}, f"{_TERM}[0].matchExpressions[0]", "values must"),
        ({"key": "a", "operator": "Exists", "values": ["x"]}, f"{_TERM}[0].matchExpressions[0]", "empty"),
        ({"key": "a", "operator": "Gt", "values": ["1", "2"]}, f"{_TERM}[0].matchExpressions[0]", "exactly"),
        ({"key": "a", "operator": "Lt", "values": ["x"]}, f"{_TERM}[0].matchExpressions[0]", "integer"),
        ({"key": "a", "operator": "Near", "values": ["x"]}, f"{_TERM}[0].matchExpressions[0].operator", ""),
        ({"key": "bad key", "operator": "Exists"}, f"{_TERM}[0].matchExpressions[0].key", ""),
    ],
)
def test_node_affinity_as_the_api_server_checks_it(
    requirement: dict[str, Any], path: str, fragment: str
) -> None:
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [requirement]}]
        }
    }
    found = errors({**VERSION, "nodeAffinity": affinity})
    assert path in found, found
    assert fragment in found[path]


@pytest.mark.parametrize(
    ("affinity", "path"),
    [
        (
            {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
            "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        ),
        (
            {"requiredDuringSchedulingIgnoredDuringExecution": {}},
            "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        ),
        (
            {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]},
            "spec.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
        (
            {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}
                    ]
                }
            },
            f"{_TERM}[0].matchFields[0].key",
        ),
        (
            {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}
                    ]
                }
            },
            f"{_TERM}[0].matchFields[0].values",
        ),
    ],
)
def test_node_affinity_shapes(affinity: dict[str, Any], path: str) -> None:
    assert path in errors({**VERSION, "nodeAffinity": affinity})


def test_deprecated_fields_say_so() -> None:
    properties = SPEC["properties"]
    assert properties["useOpenKernelModules"]["description"].startswith("Deprecated")
    assert properties["licensingConfig"]["properties"]["name"]["description"].startswith("Deprecated")
    assert parse_driver_spec({**VERSION, "useOpenKernelModules": True}).ignored_fields() == [
        "spec.useOpenKernelModules: deprecated and ignored, as by NVIDIA's operator; use "
        "kernelModuleType: open"
    ]


def test_images_without_a_registry_host_are_named() -> None:
    spec = parse_driver_spec(
        {
            "image": "driver:595.91.07",
            "manager": {"image": "k8s-driver-manager:v0.12.0"},
            "gds": {"enabled": True, "repository": "nvidia", "image": "nvidia-fs", "version": "2.16.1"},
            "gdrcopy": {"enabled": False, "image": "gdrdrv:v2.6"},
        }
    )
    assert [line.split(":")[0] for line in spec.images_without_registry()] == [
        "spec.image",
        "spec.manager.image",
        "spec.gds.repository",
    ]


# --- documents and status ----------------------------------------------------------------------------


def test_document_checks() -> None:
    with pytest.raises(PolicyError) as info:
        parse_driver_document({"apiVersion": "nvidia.com/v1", "kind": "NVIDIADriver", "spec": VERSION})
    assert [str(e) for e in info.value.errors] == [
        "apiVersion: must be nvidia.com/v1alpha1, not 'nvidia.com/v1'",
        "metadata.name: required field is missing",
    ]
    with pytest.raises(PolicyError) as info:
        parse_driver_document(None)
    assert str(info.value) == "(document): must be an NVIDIADriver mapping, not empty"


def test_nvidias_status_parses() -> None:
    status = NVIDIADriverStatus.model_validate(
        {
            "state": "notReady",
            "namespace": "gpu-operator",
            "conditions": [
                {
                    "type": "Error",
                    "status": "True",
                    "reason": "ConflictingNodeSelector",
                    "message": "multiple NVIDIADrivers match the same node gpu-1: [a b]",
                    "lastTransitionTime": "2026-08-21T00:00:00Z",
                }
            ],
        }
    )
    assert status.state == "notReady"
    for state in ("ignored", "ready", "notReady", "disabled"):
        assert NVIDIADriverStatus.model_validate({"state": state}).state == state
