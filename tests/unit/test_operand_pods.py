"""The chart's admission policies of the operator's workloads (`<release>-writes-daemonsets` and
`-deployments`, templates/admission-policy.yaml): every DaemonSet and Deployment the operator renders,
for any policy, NVIDIADriver or GPUCluster of the tests and of NVIDIA's conformance cases, is admitted;
what a stolen token would write instead is refused.

`refusal` is the policies' CEL in Python, on the same data (files/operand-rbac.yaml, generated from the
operator's templates by hack/operand_pods.py; test_chart.py fails when that file is stale and checks
that the chart carries it). tests/e2e/test_least_privilege.py tries the refusals against the API
server's own evaluation of the CEL, with the operator's token.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_conformance import CASES, DRIVER_CASES, GPUCLUSTER_CASES, render_gpucluster_case
from test_conformance import render as render_case

from gpu_operator.api import parse_spec
from gpu_operator.api.gpucluster import parse_gpucluster_document
from gpu_operator.api.nvidiadriver import parse_driver_document, parse_driver_spec
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.driver_pool_plan import pool_variants
from gpu_operator.core.driver_pool_render import app_name, render_pools
from gpu_operator.core.driver_pools import DriverObject
from gpu_operator.core.gpucluster_render import render_gpucluster
from gpu_operator.core.render import ClusterFacts, render
from hack import operand_pods, operand_rbac
from hack.operand_pods import HOST_NAMESPACES, NODES, WORKLOADS, containers, key_of, privileged

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "charts" / "gpu-operator" / "files" / "operand-rbac.yaml"
NAMESPACE = "gpu-operator"

Obj = dict[str, Any]


@cache
def data() -> Obj:
    found: Obj = yaml.safe_load(GENERATED.read_text())
    return {kind: found[kind] for kind in WORKLOADS}


def refusal(obj: Mapping[str, Any]) -> str | None:
    """Which of the policy's validations refuses this workload, as its CEL does; None: admitted."""
    pods = data()[obj["kind"]]
    key = key_of(pods, obj["metadata"]["name"])
    if key is None:
        return "name"
    shape = pods["shapes"][key]
    pod = obj["spec"]["template"]["spec"]
    if pod.get("serviceAccountName") != shape["account"]:
        return "account"
    if any(pod.get(host) and host not in shape["hostNamespaces"] for host in HOST_NAMESPACES):
        return "host namespaces"
    if any(privileged(c) and c["name"] not in shape["privileged"] for c in containers(pod)):
        return "privileged"
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            paths = shape["hostPaths"].get(volume["name"])
            if paths is None or (paths and volume["hostPath"]["path"] not in paths):
                return "hostPath"
    return None


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def assert_admitted(objects: list[Obj], where: str) -> None:
    found = workloads(objects)
    refused = [(o["kind"], o["metadata"]["name"], refusal(o)) for o in found if refusal(o)]
    assert not refused, f"{where}: the chart's policy would refuse {refused}"


# --- every workload the operator renders is admitted ---------------------------------------------


def facts_for(policy: Any, node: operand_pods.Node) -> ClusterFacts:
    config_maps = {name: ("any",) for c in COMPONENTS for _, name in c.config_maps(policy)}
    return ClusterFacts(
        namespace=NAMESPACE,
        os_tag=node.tag,
        kernels=((node.kernel, node.tag),),
        runtimes=(node.runtime,),
        config_maps=config_maps,
    )


def documents(directory: Path, kind: str) -> Iterator[tuple[str, Obj]]:
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind:
                yield path.name, doc


POLICY_FILES = [
    *documents(ROOT / "tests" / "data" / "policies", "ClusterPolicy"),
    *documents(ROOT / "tests" / "data" / "nvidia", "ClusterPolicy"),
]


@pytest.mark.parametrize(("name", "doc"), POLICY_FILES, ids=[n for n, _ in POLICY_FILES])
def test_the_test_policies_workloads_are_admitted(name: str, doc: Obj) -> None:
    policy = parse_spec(doc.get("spec") or {})
    for node in NODES:
        assert_admitted(render(policy, facts_for(policy, node)), f"{name} on {node.tag}")


def test_a_policy_moving_every_host_path_is_admitted() -> None:
    """Host paths are the user's: a policy that names its own is never refused."""
    spec = operand_rbac.everything_spec()
    spec["hostPaths"] = {"rootFS": "/host", "driverInstallDir": "/opt/nvidia/driver", "kubeletRootDir": "/k"}
    spec["toolkit"] = {**spec["toolkit"], "installDir": "/opt/toolkit"}
    spec["toolkit"]["env"] = [
        {"name": "CONTAINERD_CONFIG", "value": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"},
        {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"},
    ]
    spec["devicePlugin"] = {**spec["devicePlugin"], "mps": {"root": "/var/mps"}}
    spec["dcgmExporter"]["hpcJobMapping"] = {"enabled": True, "directory": "/var/slurm/jobs"}
    policy = parse_spec(spec)
    for node in NODES:
        assert_admitted(render(policy, facts_for(policy, node)), f"moved paths on {node.tag}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nvidias_conformance_policies_workloads_are_admitted(case: Any) -> None:
    assert_admitted(render_case(case), case.name)


def test_nvidiadriver_pools_are_admitted() -> None:
    """NVIDIA's samples on every OS, and its golden driver cases, as the operator applies them (under
    the ClusterPolicy driver's ServiceAccount: pool_variants)."""
    facts = ClusterFacts(namespace=NAMESPACE)
    nodes = [n.info() for n in NODES]
    for name, doc in documents(ROOT / "tests" / "data" / "nvidia", "NVIDIADriver"):
        spec = parse_driver_document(doc)
        found = pool_variants(DriverObject(doc["metadata"]["name"], "uid", spec), nodes)
        assert found, name
        assert_admitted(render_pools(spec, found, facts), name)
    for case in DRIVER_CASES:
        # The case's name and ServiceAccount are NVIDIA's test harness's; the pool's are these.
        spec = parse_driver_spec(case.spec)
        name = app_name("uid", spec.driverType, case.variant.os_tag or "", case.variant.kernel)
        pool = replace(case.variant, name=name, app=name, account=None)
        assert_admitted(render_pools(spec, [pool], facts), case.name)


def test_gpuclusters_are_admitted() -> None:
    facts = ClusterFacts(namespace=NAMESPACE)
    for name, doc in documents(ROOT / "tests" / "data" / "nvidia", "GPUCluster"):
        assert_admitted(render_gpucluster(parse_gpucluster_document(doc), facts), name)
    for case in GPUCLUSTER_CASES:
        assert_admitted(render_gpucluster_case(case), case.name)


def test_generated_names_have_a_prefix_and_a_fixed_account() -> None:
    daemonsets = data()["DaemonSet"]
    assert {"nvidia-driver-daemonset-", "nvidia-gpu-driver-"} <= set(daemonsets["prefixes"])
    assert all(daemonsets["shapes"][p]["account"] == "nvidia-driver" for p in daemonsets["prefixes"])
    assert data()["Deployment"]["prefixes"] == []


# --- what a stolen token would write instead is refused ------------------------------------------


@cache
def everything() -> dict[str, Obj]:
    policy = parse_spec(operand_rbac.everything_spec())
    objects = render(policy, facts_for(policy, NODES[0]))
    return {o["metadata"]["name"]: o for o in workloads(objects)}


def shape_of(name: str) -> Obj:
    daemonsets = data()["DaemonSet"]
    shape: Obj = daemonsets["shapes"][key_of(daemonsets, name)]
    return shape


def unprivileged() -> tuple[str, str]:
    """An operand DaemonSet and one of its containers that its templates never make privileged."""
    for name, obj in everything().items():
        for container in containers(obj["spec"]["template"]["spec"]):
            if obj["kind"] == "DaemonSet" and container["name"] not in shape_of(name)["privileged"]:
                return name, container["name"]
    raise AssertionError("every container of every operand DaemonSet may be privileged")


def without(host: str) -> str:
    return next(
        n
        for n, o in everything().items()
        if o["kind"] == "DaemonSet" and host not in shape_of(n)["hostNamespaces"]
    )


def fixed_path() -> tuple[str, str]:
    """An operand DaemonSet and a hostPath volume of it whose path no policy field names."""
    for name, obj in everything().items():
        for volume in obj["spec"]["template"]["spec"].get("volumes") or []:
            if (
                "hostPath" in volume
                and obj["kind"] == "DaemonSet"
                and shape_of(name)["hostPaths"][volume["name"]]
            ):
                return name, volume["name"]
    raise AssertionError("no hostPath volume at a fixed path")


def changed(name: str, change: Any) -> Obj:
    obj = copy.deepcopy(everything()[name])
    change(obj["spec"]["template"]["spec"])
    return obj


def _set_privileged(pod: Obj, container: str, context: Obj) -> None:
    for each in containers(pod):
        if each["name"] == container:
            each["securityContext"] = {**(each.get("securityContext") or {}), **context}


@cache
def attempts() -> dict[str, tuple[Obj, str]]:
    """What a stolen token would write → the validation that refuses it."""
    plugin = "nvidia-device-plugin-daemonset"
    name, container = unprivileged()
    fixed, volume = fixed_path()
    foreign = copy.deepcopy(everything()["nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04"])
    foreign["metadata"]["name"] = "escalation"
    pool = copy.deepcopy(foreign)
    pool["metadata"]["name"] = "nvidia-gpu-driver-ubuntu22.04-abcde"
    pool["spec"]["template"]["spec"]["serviceAccountName"] = "nvidia-gpu-driver-x-ubuntu22.04"

    def moved(pod: Obj) -> None:
        next(v for v in pod["volumes"] if v["name"] == volume)["hostPath"]["path"] = "/etc"

    return {
        "a DaemonSet of a foreign name": (foreign, "name"),
        "a pool's name under a ServiceAccount of its own": (pool, "account"),
        "another ServiceAccount": (
            changed(plugin, lambda pod: pod.update(serviceAccountName="gpu-operator")),
            "account",
        ),
        "hostPID": (changed(without("hostPID"), lambda pod: pod.update(hostPID=True)), "host namespaces"),
        "hostIPC": (changed(without("hostIPC"), lambda pod: pod.update(hostIPC=True)), "host namespaces"),
        "a privileged container": (
            changed(name, lambda pod: _set_privileged(pod, container, {"privileged": True})),
            "privileged",
        ),
        "an added capability": (
            changed(
                name, lambda pod: _set_privileged(pod, container, {"capabilities": {"add": ["SYS_ADMIN"]}})
            ),
            "privileged",
        ),
        "the host's root as a volume of its own": (
            changed(plugin, lambda pod: pod["volumes"].append({"name": "evil", "hostPath": {"path": "/"}})),
            "hostPath",
        ),
        "a rendered volume moved to /etc": (changed(fixed, moved), "hostPath"),
    }


ATTEMPTS = (
    "a DaemonSet of a foreign name",
    "a pool's name under a ServiceAccount of its own",
    "another ServiceAccount",
    "hostPID",
    "hostIPC",
    "a privileged container",
    "an added capability",
    "the host's root as a volume of its own",
    "a rendered volume moved to /etc",
)


@pytest.mark.parametrize("what", ATTEMPTS)
def test_what_a_stolen_token_would_write_is_refused(what: str) -> None:
    obj, validation = attempts()[what]
    original = everything().get(obj["metadata"]["name"])
    assert original is None or refusal(original) is None
    assert refusal(obj) == validation


def test_every_attempt_is_tried() -> None:
    assert set(attempts()) == set(ATTEMPTS)
