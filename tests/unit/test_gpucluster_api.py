"""The GPUCluster models: NVIDIA's sample accepted unchanged, NVIDIA's defaults (and what an absent
section means in NVIDIA's controller), each rule refused naming the field, and the CRD's own rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import PolicyError
from gpu_operator.api.crd import GPU_CLUSTER, definition
from gpu_operator.api.gpucluster import (
    COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    GPUS_HEALTHCHECK_PORT,
    SINGLETON_MESSAGE,
    SINGLETON_RULE,
    GPUClusterSpec,
    KubeletPluginSpec,
    parse_gpucluster_document,
    parse_gpucluster_spec,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "nvidia" / "gpucluster-sample.yaml"
ROOT: dict[str, Any] = definition(GPU_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def errors(spec: Any) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_gpucluster_spec(spec)
    return {e.path: e.message for e in info.value.errors}


def sample() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    return doc


def test_nvidias_sample_is_accepted_as_is() -> None:
    assert SAMPLE.read_text(encoding="utf-8").startswith("# NVIDIA gpu-operator v26.7.0")
    spec = parse_gpucluster_document(sample())
    assert spec.draDriver.image == "dra-driver-nvidia-gpu"
    assert spec.draDriver.compute_domains_enabled()
    assert not spec.dcgm_enabled() and spec.exporter_enabled()
    assert spec.daemonsets.rollingUpdate is not None and spec.daemonsets.rollingUpdate.maxUnavailable == "1"
    assert spec.ignored_fields() == []  # rootFS: "/" is what the DRA stack uses anyway


def test_empty_spec_has_nvidias_defaults() -> None:
    spec = parse_gpucluster_spec({})
    assert spec.hostPaths.kubeletRootDir == "/var/lib/kubelet"
    assert spec.hostPaths.driverInstallDir == "/run/nvidia/driver"
    assert not spec.draDriver.compute_domains_enabled()  # absent section: off (IsComputeDomainsEnabled)
    assert not spec.dcgm_enabled() and not spec.exporter_enabled()  # absent sections: off
    assert spec.nodeSelector is None
    assert parse_gpucluster_spec(None) == spec


@pytest.mark.parametrize(
    ("section", "dcgm", "exporter"),
    [
        ({"dcgm": {}}, False, False),
        ({"dcgm": {"enabled": True}}, True, False),
        ({"dcgmExporter": {}}, False, True),
        ({"dcgmExporter": {"enabled": False}}, False, False),
    ],
)
def test_dcgm_and_exporter_follow_nvidias_controller(
    section: dict[str, Any], dcgm: bool, exporter: bool
) -> None:
    spec = parse_gpucluster_spec(section)
    assert (spec.dcgm_enabled(), spec.exporter_enabled()) == (dcgm, exporter)


def test_compute_domains_given_default_to_enabled() -> None:
    assert parse_gpucluster_spec({"draDriver": {"computeDomains": {}}}).draDriver.compute_domains_enabled()
    off = parse_gpucluster_spec({"draDriver": {"computeDomains": {"enabled": False}}})
    assert not off.draDriver.compute_domains_enabled()


@pytest.mark.parametrize(
    ("healthcheck", "default", "port"),
    [
        (None, GPUS_HEALTHCHECK_PORT, 51516),
        ({}, COMPUTE_DOMAINS_HEALTHCHECK_PORT, 51515),
        ({"port": 52000}, GPUS_HEALTHCHECK_PORT, 52000),
        ({"enabled": False, "port": 52000}, GPUS_HEALTHCHECK_PORT, -1),
    ],
)
def test_healthcheck_port(healthcheck: dict[str, Any] | None, default: int, port: int) -> None:
    plugin = KubeletPluginSpec.model_validate({"healthcheck": healthcheck} if healthcheck is not None else {})
    assert plugin.healthcheck_port(default) == port


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"draDriver": {"image": "nvcr.io/nvidia/dra"}}, "spec.draDriver.image", "pattern"),
        ({"draDriver": {"repository": "nvcr.io/nvidia"}}, "spec.draDriver", "image and version"),
        ({"draDriver": {"imagePullPolicy": "Sometimes"}}, "spec.draDriver.imagePullPolicy", "Always"),
        (
            {"draDriver": {"featureGates": {"MPSSupport": "yes"}}},
            "spec.draDriver.featureGates.MPSSupport",
            "bool",
        ),
        (
            {"draDriver": {"gpus": {"kubeletPlugin": {"healthcheck": {"port": 0}}}}},
            "spec.draDriver.gpus.kubeletPlugin.healthcheck.port",
            "greater than or equal to 1",
        ),
        ({"draDriver": {"gpu": {}}}, "spec.draDriver.gpu", "unknown field"),
        ({"hostPaths": {"kubeletRootDir": "relative"}}, "spec.hostPaths.kubeletRootDir", "absolute"),
        ({"nodeSelector": {"pool": 3}}, "spec.nodeSelector.pool", "string"),
        ({"dcgmExporter": {"enabled": "yes"}}, "spec.dcgmExporter.enabled", "bool"),
    ],
)
def test_bad_fields_are_named(spec: dict[str, Any], path: str, words: str) -> None:
    found = errors(spec)
    assert path in found, found
    assert words in found[path]


def test_every_problem_is_reported_at_once() -> None:
    found = errors({"draDriver": {"imagePullPolicy": "x"}, "hostPaths": {"driverInstallDir": "/"}})
    assert set(found) == {"spec.draDriver.imagePullPolicy", "spec.hostPaths.driverInstallDir"}


def test_the_singleton_name_is_nvidias() -> None:
    doc = sample()
    doc["metadata"]["name"] = "my-cluster"
    with pytest.raises(PolicyError) as info:
        parse_gpucluster_document(doc)
    assert [e.path for e in info.value.errors] == ["metadata.name"]
    assert SINGLETON_MESSAGE in str(info.value)
    assert {"rule": SINGLETON_RULE, "message": SINGLETON_MESSAGE} in ROOT["x-kubernetes-validations"]


def test_wrong_kind_is_named() -> None:
    doc = sample()
    doc["kind"] = "ClusterPolicy"
    with pytest.raises(PolicyError) as info:
        parse_gpucluster_document(doc)
    assert [e.path for e in info.value.errors] == ["kind"]


def test_root_fs_other_than_slash_is_reported_ignored() -> None:
    spec = parse_gpucluster_spec({"hostPaths": {"rootFS": "/host"}})
    assert [f.split(":")[0] for f in spec.ignored_fields()] == ["spec.hostPaths.rootFS"]


def test_crd_has_nvidias_shape() -> None:
    crd = definition(GPU_CLUSTER)
    assert crd["metadata"]["name"] == "gpuclusters.nvidia.com"
    assert crd["spec"]["names"]["shortNames"] == ["gc"]
    assert crd["spec"]["scope"] == "Cluster"
    spec = ROOT["properties"]["spec"]["properties"]
    assert set(spec) == {"draDriver", "dcgm", "dcgmExporter", "hostPaths", "daemonsets", "nodeSelector"}
    dra = spec["draDriver"]["properties"]
    assert dra["image"]["pattern"] == r"^[a-zA-Z0-9\-]+$"
    assert dra["computeDomains"]["properties"]["enabled"]["default"] is True
    assert spec["hostPaths"]["properties"]["kubeletRootDir"]["default"] == "/var/lib/kubelet"
    assert ROOT["properties"]["status"]["properties"]["state"]["enum"] == ["ready", "notReady", "disabled"]


def test_the_model_round_trips_through_json() -> None:
    spec = parse_gpucluster_document(sample())
    again = GPUClusterSpec.model_validate_json(spec.model_dump_json(exclude_none=True))
    assert again == spec
