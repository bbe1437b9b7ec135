"""The pure planner: which policy is active, what is applied, deleted and labelled, and the status."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import PCI, gpu_node, operand_daemonset, operand_pod

from gpu_operator.api.quoting import MESSAGE_MAX, bounded
from gpu_operator.core.components import RUNTIME_LABEL
from gpu_operator.core.driver_pool_counts import PoolCounts
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo
from gpu_operator.core.observed import (
    DaemonSetInfo,
    ObjectInfo,
    PodInfo,
    component_of,
    pod_info,
)
from gpu_operator.core.ownership import HASH_ANNOTATION
from gpu_operator.core.plan import (
    Applied,
    Observed,
    Plan,
    PolicyRef,
    active_policy,
    build,
    in_sync,
    pods_by_node,
    status_differs,
    unlisted_pods,
)
from gpu_operator.core.psa import (
    PREVIOUS_ANNOTATION,
    PSA_LABELS,
    NamespaceInfo,
    NamespaceWrite,
    namespace_info,
)
from gpu_operator.core.status import status_body
from gpu_operator.core.upgrade import Facts, UpgradePlan

NOW = "2026-11-29T12:00:00Z"
OURS = ("gpu-operator", "kube-controller-manager")
"""The field managers of an object the operator created (and a controller updated the status of)."""


def policy(name: str = "cluster-policy", created: str = "2026-01-01T00:00:00Z", **spec: Any) -> PolicyRef:
    return PolicyRef(name, f"uid-{name}", 1, created, spec, {})


def observed(*policies: PolicyRef, nodes: list[NodeInfo] | None = None, **kw: Any) -> Observed:
    nodes = nodes if nodes is not None else [gpu_node(), NodeInfo("cpu-0", {})]
    return Observed(
        policies=policies,
        nodes={n.name: n for n in nodes},
        pods=kw.get("pods", ()),
        daemonsets=kw.get("daemonsets", {}),
        objects=kw.get("objects", {}),
        namespace="gpu-operator",
        config_maps=kw.get("config_maps", {}),
        service_monitor_crd=kw.get("service_monitor_crd", False),
    )


def status_of(plan: Plan, name: str) -> dict[str, Any]:
    """The status the plan has for a policy, as the operator writes it."""
    return status_body(plan.statuses[name])


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_oldest_policy_is_active_and_others_are_ignored_with_a_condition() -> None:
    old, new = policy("b-old", "2026-01-01T00:00:00Z"), policy("a-new", "2026-02-01T00:00:00Z")
    assert active_policy([new, old]) == old
    plan = build(observed(new, old), NOW)
    assert plan.active == old
    ignored = status_of(plan, "a-new")
    assert ignored["state"] == "ignored"
    assert "'b-old' is active" in condition(ignored, "Ready")["message"]
    assert condition(ignored, "Error")["status"] == "False"


def test_objects_are_owned_hashed_and_in_dependency_order() -> None:
    plan = build(observed(policy()), NOW)
    assert plan.objects, "spec: {} renders objects"
    for obj in plan.objects:
        owner = obj["metadata"]["ownerReferences"][0]
        assert (
            owner["kind"] == "ClusterPolicy" and owner["uid"] == "uid-cluster-policy" and owner["controller"]
        )
        assert obj["metadata"]["annotations"][HASH_ANNOTATION]
    components = [o["metadata"]["labels"]["app.kubernetes.io/component"] for o in plan.objects]
    assert (
        components.index("nvidia-driver")
        < components.index("container-toolkit")
        < components.index("device-plugin")
    )


def test_disabled_component_objects_are_deleted() -> None:
    stale = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-dcgm")
    info = ObjectInfo(stale, "dcgm", "h", 1, "1", "uid-cluster-policy", OURS)
    plan = build(observed(policy(dcgm={"enabled": False}), objects={stale: info}), NOW)
    assert plan.deletes == [stale]
    assert not any(o["metadata"]["name"] == "nvidia-dcgm" and o["kind"] == "DaemonSet" for o in plan.objects)


def test_invalid_spec_changes_nothing_and_names_the_field() -> None:
    stale = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-driver-daemonset")
    info = ObjectInfo(stale, "driver", "h", 1, "1", "uid-cluster-policy", OURS)
    node = gpu_node(labels={GPU_PRESENT: "true"}, own_labels=frozenset({GPU_PRESENT}))
    bad = policy(driver={"upgradePolicy": {"maxUnavailable": "lots"}})
    plan = build(observed(bad, nodes=[node], objects={stale: info}), NOW)
    assert plan.objects == [] and plan.deletes == [] and plan.node_labels == {}
    error = condition(status_of(plan, "cluster-policy"), "Error")
    assert error["status"] == "True" and error["reason"] == "InvalidSpec"
    assert "spec.driver.upgradePolicy.maxUnavailable" in error["message"]


def test_a_huge_value_is_quoted_by_its_start_and_length_and_the_status_stays_writable() -> None:
    """A 1 MiB label value once made a 3 MB Error message the API server refused to store, leaving the
    policy Ready for a generation never applied."""
    huge = "b" * 2**20
    many = [{"name": f"V{i}", "value": "x\x00"} for i in range(300)]  # refused: too many, each with a NUL
    bad = policy(daemonsets={"labels": {"team": huge}}, driver={"env": many, "args": ["a" * 2**20] * 300})
    plan = build(observed(bad), NOW)
    status = status_of(plan, "cluster-policy")
    assert len(json.dumps(status)) < 3 * MESSAGE_MAX
    for kind in ("Ready", "Error"):
        message = condition(status, kind)["message"]
        assert len(message) <= MESSAGE_MAX
        assert "spec.daemonsets.labels" in message and "(1048576 characters)" in message
        assert huge[:100] not in message


def test_a_message_past_the_condition_limit_is_cut_saying_so() -> None:
    text = "; ".join(f"spec.driver.env[{i}].value: something is wrong here" for i in range(2000))
    cut = bounded(text)
    assert len(cut) == MESSAGE_MAX and cut.startswith(text[:1000])
    assert cut.endswith(f"({len(text)} characters in all; the rest left out)")
    assert bounded("short") == "short"


def test_no_policy_removes_operator_labels_and_objects() -> None:
    node = gpu_node(labels={GPU_PRESENT: "true", "team": "a"}, own_labels=frozenset({GPU_PRESENT}))
    key = ("v1", "ConfigMap", "gpu-operator", "x")
    # Left by a ClusterPolicy that is gone; a user's object with our labels is not ours to delete.
    left = ObjectInfo(key, "driver", "h", 0, "1", "uid-deleted-policy", OURS)
    users = ("v1", "ConfigMap", "gpu-operator", "users")
    theirs = ObjectInfo(users, "driver", "", 0, "1", "", ("kubectl-create",))
    plan = build(observed(nodes=[node], objects={key: left, users: theirs}), NOW)
    assert plan.node_labels == {"gpu-0": {}}
    assert plan.deletes == [key]


def test_status_names_the_failing_node_and_reason() -> None:
    nodes = [
        gpu_node(
            f"gpu-{i}",
            {
                GPU_PRESENT: "true",
                "nvidia.com/gpu.deploy.driver": "true",
                RUNTIME_LABEL: "containerd",
            },
            own_labels=frozenset({GPU_PRESENT, "nvidia.com/gpu.deploy.driver", RUNTIME_LABEL}),
        )
        for i in range(2)
    ]
    pods = [
        operand_pod("d0", "driver", "gpu-0"),
        # Its main container crash-loops: past its init containers (k8s-driver-manager).
        operand_pod("d1", "driver", "gpu-1", False, "CrashLoopBackOff", "back-off", initialized=True),
    ]
    ds = {
        "nvidia-driver-daemonset": DaemonSetInfo(
            "nvidia-driver-daemonset", "driver", 1, 1, 2, 1, 2, 1, 1, True
        )
    }
    plan = build(observed(policy(), nodes=nodes, pods=pods, daemonsets=ds), NOW)
    status = status_of(plan, "cluster-policy")
    assert status["state"] == "notReady"
    driver = next(c for c in status["components"] if c["name"] == "driver")
    assert driver["nodesReady"] == 1 and driver["nodesFailing"] == 1
    assert {"node": "gpu-1", "reason": "CrashLoopBackOff", "message": "back-off"} in driver["problems"]
    assert plan.nodes_rolling_out == 2, "the toolkit, on neither node yet, is furthest behind"
    toolkit = next(c for c in status["components"] if c["name"] == "container-toolkit")
    assert "waiting for driver on gpu-1" in toolkit["reason"]
    error = condition(status, "Error")
    assert error["reason"] == "OperandNotReady" and "CrashLoopBackOff on gpu-1" in error["message"]
    # Both get the toolkit, whose pods wait for the driver themselves; nothing after it yet.
    for node in ("gpu-0", "gpu-1"):
        assert set(plan.node_labels[node]) - set(nodes[0].labels) == {
            "nvidia.com/gpu.deploy.container-toolkit"
        }


def test_a_toolkit_pod_waiting_in_init_for_its_driver_is_reported_as_waiting() -> None:
    deployed = ("nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.deploy.container-toolkit")
    node = gpu_node(
        "gpu-0",
        {GPU_PRESENT: "true", RUNTIME_LABEL: "containerd", **dict.fromkeys(deployed, "true")},
        own_labels=frozenset({GPU_PRESENT, RUNTIME_LABEL, *deployed}),
    )

    def toolkit_status(driver: PodInfo, toolkit: PodInfo | None) -> dict[str, Any]:
        pods = [driver, toolkit] if toolkit is not None else [driver]
        status = status_of(build(observed(policy(), nodes=[node], pods=pods), NOW), "cluster-policy")
        component: dict[str, Any] = next(c for c in status["components"] if c["name"] == "container-toolkit")
        return component

    building = operand_pod("d", "driver", "gpu-0", False, "Running", initialized=True)
    initializing = operand_pod("t", "container-toolkit", "gpu-0", False, "Pending")
    waiting = {"node": "gpu-0", "reason": "WaitingForDependency", "message": "waiting for driver"}
    for toolkit in (None, initializing):
        found = toolkit_status(building, toolkit)
        assert found["problems"] == [waiting] and found["nodesWaiting"] == 1 and found["nodesFailing"] == 0
        assert found["state"] == "notReady" and "waiting for driver on gpu-0" in found["reason"]
    # Its own failure is its own news, whatever the driver does.
    crashing = replace(initializing, reason="CrashLoopBackOff", message="back-off")
    found = toolkit_status(building, crashing)
    assert found["problems"][0]["reason"] == "CrashLoopBackOff" and found["nodesWaiting"] == 0
    # Once the driver is ready, the toolkit's pod is what it waits for.
    ready = replace(building, ready=True, reason="")
    found = toolkit_status(ready, initializing)
    assert found["problems"][0]["reason"] == "Pending" and found["nodesWaiting"] == 0


def test_no_gpu_nodes_is_ready_with_nvidia_reason() -> None:
    plan = build(observed(policy(), nodes=[NodeInfo("cpu-0", {})]), NOW)
    status = status_of(plan, "cluster-policy")
    assert status["state"] == "ready"
    assert condition(status, "Ready")["reason"] == "NoGPUNodes"
    assert plan.nodes_rolling_out == 0


def test_an_nvidiadrivers_pool_counts_its_nodes_still_rolling_out() -> None:
    plan = Plan(None, None, [], [], [], {}, {}, [], driver_pools={"a100": PoolCounts("notReady", 5, 2)})
    assert plan.nodes_rolling_out == 3
    assert replace(plan, driver_pools={}).nodes_rolling_out == 0, "no policy, no pool: nothing rolls out"


def test_unsupported_sections_are_reported_not_fatal() -> None:
    sandbox = policy(kataManager={"enabled": True}, sandboxWorkloads={"enabled": True})
    plan = build(observed(sandbox, nodes=[]), NOW)
    assert any("spec.kataManager" in note for note in plan.notes)
    assert status_of(plan, "cluster-policy")["state"] == "ready"
    assert any(c["state"] == "unsupported" for c in status_of(plan, "cluster-policy")["components"])


def test_transition_time_is_stable_when_nothing_changes() -> None:
    first = status_of(build(observed(policy(), nodes=[]), NOW), "cluster-policy")
    again = PolicyRef("cluster-policy", "uid-cluster-policy", 1, "2026-01-01T00:00:00Z", {}, first)
    second = build(observed(again, nodes=[]), "2026-11-29T13:00:00Z").statuses["cluster-policy"]
    assert not status_differs(first, second)


def test_pod_reasons() -> None:
    crash = {
        "metadata": {"name": "p", "labels": {"app.kubernetes.io/component": "driver"}},
        "spec": {"nodeName": "gpu-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "boom"}}}],
        },
    }
    info = pod_info(crash)
    assert info is not None and info.failing and info.reason == "CrashLoopBackOff"
    unscheduled = {
        "metadata": {"name": "q", "labels": {"app.kubernetes.io/component": "driver"}},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "values": ["gpu-1"]}]}
                        ]
                    }
                }
            }
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no cpu"}
            ],
        },
    }
    info = pod_info(unscheduled)
    assert info is not None and info.node == "gpu-1" and info.reason == "Unschedulable"


def test_live_pod_speaks_over_terminating_one() -> None:
    old = operand_pod("a", "driver", "n", True, "Terminating", terminating=True, created="2026-01-02")
    new = operand_pod("b", "driver", "n", False, "ContainerCreating", created="2026-01-01")
    assert pods_by_node([old, new])[("driver", "n")] == new


def test_in_sync_detects_edits_and_deletes() -> None:
    key = ("apps/v1", "DaemonSet", "ns", "ds")
    applied = Applied("h1", generation=3, resource_version="10")
    current = ObjectInfo(key, "driver", "h1", 3, "12", "")
    assert in_sync("h1", current, applied)  # status updates moved only the resourceVersion
    assert not in_sync("h1", None, applied)  # deleted
    assert not in_sync("h1", ObjectInfo(key, "driver", "h1", 4, "13", ""), applied)  # spec edited
    assert not in_sync("h2", current, applied)  # we want something new
    assert not in_sync("h1", current, None)  # unknown since start: apply once
    cm = ("v1", "ConfigMap", "ns", "cm")
    assert in_sync("h", ObjectInfo(cm, "x", "h", 0, "5", ""), Applied("h", 0, "5"))
    assert not in_sync("h", ObjectInfo(cm, "x", "h", 0, "6", ""), Applied("h", 0, "5"))


def test_a_missing_config_map_keeps_the_running_driver_and_says_why() -> None:
    """As NVIDIA: the driver DaemonSet is neither applied nor deleted until its ConfigMap is there."""
    driver = ("apps/v1", "DaemonSet", "gpu-operator", "nvidia-driver-daemonset")
    objects = {driver: ObjectInfo(driver, "driver", "h", 1, "1", "uid-cluster-policy", OURS)}
    wanting = policy(driver={"certConfig": {"name": "corp-ca"}})
    plan = build(observed(wanting, objects=objects), NOW)
    assert driver not in plan.deletes
    assert not [o for o in plan.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == driver[3]]
    status = status_of(plan, "cluster-policy")
    entry = next(c for c in status["components"] if c["name"] == "driver")
    assert entry["state"] == "notReady"
    assert "spec.driver.certConfig.name: ConfigMap 'corp-ca' not found" in entry["reason"]
    assert "corp-ca" in condition(status, "Error")["message"]

    plan = build(
        observed(wanting, objects=objects, config_maps={"corp-ca": ("ca.crt",), "other": ("x",)}), NOW
    )
    ds = next(o for o in plan.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == driver[3])
    mounts = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": "cert-config",
        "mountPath": "/usr/local/share/ca-certificates/ca.crt",
        "subPath": "ca.crt",
        "readOnly": True,
    } in mounts


def test_status_counts_every_daemonset_of_a_component() -> None:
    """One toolkit DaemonSet per runtime: ready only when each is rolled out and all pods are."""
    runtimes = {"gpu-0": "containerd", "gpu-1": "crio"}
    labels = {
        PCI: "true",
        GPU_PRESENT: "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.container-toolkit": "true",
    }
    nodes = [
        NodeInfo(
            n, {**labels, RUNTIME_LABEL: r}, own_labels=frozenset({*labels, RUNTIME_LABEL} - {PCI}), runtime=r
        )
        for n, r in runtimes.items()
    ]
    pods = [operand_pod(f"t{n}", "container-toolkit", n) for n in runtimes]
    first = operand_daemonset("nvidia-container-toolkit-daemonset", "container-toolkit")
    crio = operand_daemonset("nvidia-container-toolkit-daemonset-crio", "container-toolkit")

    def toolkit(daemonsets: dict[str, DaemonSetInfo]) -> dict[str, Any]:
        plan = build(observed(policy(), nodes=nodes, pods=pods, daemonsets=daemonsets), NOW)
        return next(
            c for c in status_of(plan, "cluster-policy")["components"] if c["name"] == "container-toolkit"
        )

    assert toolkit({first.name: first})["state"] == "notReady"  # the CRI-O one is not there yet
    assert toolkit({first.name: first, crio.name: crio})["state"] == "ready"


def test_images_without_a_registry_are_said_on_the_policy_and_still_deployed() -> None:
    # NVIDIA's operator deploys them, and so does this one (refusing would stop a Docker Hub mirror
    # that works); the Ready condition and an Event say which field and what a runtime pulls.
    plan = build(observed(policy(validator={"image": "nvidia/cloud-native/k8s-logical-edge-validator"})), NOW)
    [note] = [n for n in plan.notes if n.reason == "ImageWithoutRegistry"]
    assert note.startswith("spec.validator.image: 'nvidia/cloud-native/k8s-logical-edge-validator' names no")
    assert "docker.io/nvidia/cloud-native/k8s-logical-edge-validator" in note
    assert note in condition(status_of(plan, "cluster-policy"), "Ready")["message"]
    assert any(o["kind"] == "DaemonSet" for o in plan.objects)  # the operands are still written
    named = build(observed(policy(validator={"image": "docker.io/nvidia/validator"})), NOW)
    assert not [n for n in named.notes if n.reason == "ImageWithoutRegistry"]


def test_fields_not_acted_on_are_in_the_status() -> None:
    plan = build(observed(policy(driver={"useOpenKernelModules": True})), NOW)
    assert any(
        n.startswith("accepted but not acted on: spec.driver.useOpenKernelModules") for n in plan.notes
    )
    assert (
        "spec.driver.useOpenKernelModules" in condition(status_of(plan, "cluster-policy"), "Ready")["message"]
    )
    # The driver upgrade is acted on now: no note about it.
    upgrading = build(observed(policy(driver={"upgradePolicy": {"autoUpgrade": True}})), NOW)
    assert not any("upgradePolicy" in n for n in upgrading.notes)


def test_service_monitors_only_where_the_prometheus_crd_is() -> None:
    spec: dict[str, Any] = {
        "nodeStatusExporter": {"enabled": True},
        "dcgmExporter": {"serviceMonitor": {"enabled": True}},
    }

    def monitors(crd: bool) -> list[str]:
        plan = build(observed(policy(**spec), service_monitor_crd=crd), NOW)
        return sorted(o["metadata"]["name"] for o in plan.objects if o["kind"] == "ServiceMonitor")

    assert monitors(True) == ["nvidia-dcgm-exporter", "nvidia-node-status-exporter"]
    assert monitors(False) == []


# --- NVIDIA's chart default: ServiceMonitor without the Prometheus operator, sandbox sections -------

NVIDIA_CHART_DEFAULT = Path(__file__).resolve().parents[1] / "data" / "nvidia" / "chart-default.yaml"


def chart_default() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(NVIDIA_CHART_DEFAULT.read_text())["spec"]
    return spec


def ready_everywhere(plan_objects: list[dict[str, Any]], node: str) -> dict[str, Any]:
    """Pods and DaemonSets as if every component were up on `node`."""
    found = {
        o["metadata"]["name"]: component_of(o["metadata"]) for o in plan_objects if o["kind"] == "DaemonSet"
    }
    pods = [operand_pod(f"{c}-x", c, node, created=NOW) for c in set(found.values())]
    daemonsets = {ds: operand_daemonset(ds, c) for ds, c in found.items()}
    return {"pods": pods, "daemonsets": daemonsets}


def test_chart_default_without_the_prometheus_operator_is_ready_with_a_note() -> None:
    labels = {
        PCI: "true",
        GPU_PRESENT: "true",
        **{
            f"nvidia.com/gpu.deploy.{c}": "true"
            for c in ("driver", "container-toolkit", "operator-validator")
        },
        **{
            f"nvidia.com/gpu.deploy.{c}": "true"
            for c in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery")
        },
    }
    node = NodeInfo("gpu-0", labels, own_labels=frozenset(labels) - {PCI})
    first = build(observed(policy(**chart_default()), nodes=[node]), NOW)
    assert not [o for o in first.objects if o["kind"] == "ServiceMonitor"]
    plan = build(
        observed(policy(**chart_default()), nodes=[node], **ready_everywhere(first.objects, "gpu-0")), NOW
    )
    status = status_of(plan, "cluster-policy")
    assert status["state"] == "ready", status
    ready = condition(status, "Ready")
    assert "ServiceMonitor CRD (servicemonitors.monitoring.coreos.com) is not installed" in ready["message"]
    reasons = [n.reason for n in plan.notes]
    assert "ServiceMonitorSkipped" in reasons and "Unsupported" not in reasons  # no sandbox warnings
    assert not [c for c in status["components"] if c["state"] == "unsupported"]
    with_crd = build(
        Observed(**{**vars(observed(policy(**chart_default()), nodes=[node])), "service_monitor_crd": True}),
        NOW,
    )
    assert [o["metadata"]["name"] for o in with_crd.objects if o["kind"] == "ServiceMonitor"] == [
        "nvidia-dcgm-exporter"
    ]
    assert "ServiceMonitorSkipped" not in [n.reason for n in with_crd.notes]


def test_service_monitor_turned_off_is_deleted() -> None:
    key = ("monitoring.coreos.com/v1", "ServiceMonitor", "gpu-operator", "nvidia-dcgm-exporter")
    info = ObjectInfo(key, "dcgm-exporter", "h", 1, "1", "uid-cluster-policy", OURS)
    spec: dict[str, Any] = {"dcgmExporter": {"serviceMonitor": {"enabled": False}}}
    plan = build(
        Observed(**{**vars(observed(policy(**spec), objects={key: info})), "service_monitor_crd": True}), NOW
    )
    assert plan.deletes == [key]


def test_the_kata_manager_is_unsupported_only_with_sandbox_workloads() -> None:
    spec: dict[str, Any] = {
        "vfioManager": {"enabled": True},
        "kataManager": {"enabled": True},
        "gds": {"enabled": True},
    }
    assert build(observed(policy(**spec), nodes=[]), NOW).notes == []
    sandbox: dict[str, Any] = {**spec, "sandboxWorkloads": {"enabled": True}}
    notes = build(observed(policy(**sandbox), nodes=[]), NOW).notes
    assert [n.split(" ")[0] for n in notes] == ["spec.kataManager"]
    assert {n.reason for n in notes} == {"Unsupported"}


# --- psa.enabled -------------------------------------------------------------------------------------

ENFORCE, AUDIT, WARN = PSA_LABELS


def namespace(
    labels: dict[str, str] | None = None, own: set[str] | None = None, previous: dict[str, str] | None = None
) -> NamespaceInfo:
    return NamespaceInfo("gpu-operator", labels or {}, previous or {}, frozenset(own or ()))


def psa_plan(enabled: bool | None, ns: NamespaceInfo) -> NamespaceWrite | None:
    """The planned namespace write for psa.enabled=`enabled` (None: the policy is deleted)."""
    policies = () if enabled is None else (policy(psa={"enabled": enabled}),)
    base = observed(*policies, nodes=[])
    return build(Observed(**{**vars(base), "operand_namespace": ns}), NOW).namespace_write


def test_psa_labels_the_namespace_privileged_and_remembers_what_it_replaced() -> None:
    write = psa_plan(True, namespace({ENFORCE: "baseline", WARN: "privileged", "team": "x"}))
    assert write is not None
    assert write.labels == {ENFORCE: "privileged", AUDIT: "privileged", WARN: "privileged"}
    assert write.annotations == {PREVIOUS_ANNOTATION: json.dumps({ENFORCE: "baseline"})}
    assert write.restore == {}


def test_psa_already_applied_writes_nothing() -> None:
    labels = dict.fromkeys(PSA_LABELS, "privileged")
    ns = namespace(labels, own={*PSA_LABELS, PREVIOUS_ANNOTATION}, previous={ENFORCE: "baseline"})
    assert psa_plan(True, ns) is None
    assert psa_plan(True, namespace(labels, own=set(PSA_LABELS))) is None
    assert psa_plan(False, namespace()) is None  # nothing of ours there
    assert psa_plan(None, namespace(labels)) is None  # privileged, but set by someone else


@pytest.mark.parametrize("enabled", [False, None], ids=["turned off", "policy deleted"])
def test_psa_off_restores_what_it_replaced_and_removes_what_it_added(enabled: bool | None) -> None:
    labels = dict.fromkeys(PSA_LABELS, "privileged")
    ns = namespace(labels, own={*PSA_LABELS, PREVIOUS_ANNOTATION}, previous={ENFORCE: "baseline"})
    assert psa_plan(enabled, ns) == NamespaceWrite({ENFORCE: "baseline"}, {}, {})


def test_psa_restores_only_a_level_still_its_own() -> None:
    labels = {**dict.fromkeys(PSA_LABELS, "privileged"), ENFORCE: "restricted"}  # changed by someone since
    ns = namespace(labels, own={AUDIT, WARN, PREVIOUS_ANNOTATION}, previous={ENFORCE: "baseline"})
    assert psa_plan(False, ns) == NamespaceWrite({}, {}, {})


def test_invalid_policy_leaves_the_namespace_alone() -> None:
    ns = namespace(dict.fromkeys(PSA_LABELS, "privileged"), own=set(PSA_LABELS))
    bad = PolicyRef("cluster-policy", "uid", 1, NOW, {"psa": {"enabled": "yes"}}, {})
    assert (
        build(Observed(**{**vars(observed(bad, nodes=[])), "operand_namespace": ns}), NOW).namespace_write
        is None
    )


def test_namespace_info_reads_ownership_and_previous_levels() -> None:
    body = {
        "metadata": {
            "name": "gpu-operator",
            "resourceVersion": "7",
            "labels": {ENFORCE: "privileged", "kubernetes.io/metadata.name": "gpu-operator"},
            "annotations": {
                PREVIOUS_ANNOTATION: '{"pod-security.kubernetes.io/enforce": "baseline", "x": "y"}'
            },
            "managedFields": [
                {
                    "manager": "gpu-operator",
                    "operation": "Apply",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:labels": {f"f:{ENFORCE}": {}},
                            "f:annotations": {f"f:{PREVIOUS_ANNOTATION}": {}},
                        }
                    },
                },
                {
                    "manager": "kubectl",
                    "operation": "Update",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}},
                },
            ],
        }
    }
    info = namespace_info(body)
    assert info.labels == {ENFORCE: "privileged"}
    assert info.previous == {ENFORCE: "baseline"}
    assert info.own == {ENFORCE, PREVIOUS_ANNOTATION}
    assert info.resource_version == "7"
    broken = {"metadata": {"name": "n", "annotations": {PREVIOUS_ANNOTATION: "not json"}}}
    assert namespace_info(broken).previous == {}


def test_a_pass_waits_for_the_pods_of_the_nodes_its_upgrade_empties_that_no_watch_has_listed() -> None:
    emptying = Plan(None, None, [], [], [], {}, {}, [], upgrade=UpgradePlan((), {}, None, frozenset("ab")))
    listed = replace(observed(), upgrade=Facts(nodes=(), pods_known=frozenset({"a"})))
    assert unlisted_pods(listed, emptying) == {"b"}
    everyone = replace(observed(), upgrade=Facts(nodes=()))
    assert unlisted_pods(everyone, emptying) == frozenset(), "every node's pods are known"
    assert unlisted_pods(listed, replace(emptying, upgrade=None)) == frozenset(), "no upgrade planned"


def test_use_nvidia_driver_crd_without_its_crd_is_reported() -> None:
    """Without the NVIDIADriver CRD the driver stays managed from the ClusterPolicy: the Ready condition
    says so, and why. With it, the NVIDIADrivers run the driver (tests/unit/test_driver_pool_plan.py)."""
    seed = policy(driver={"useNvidiaDriverCRD": True})
    plan = build(replace(observed(seed), nvidia_driver_crd=False), NOW)
    message = condition(status_of(plan, seed.name), "Ready")["message"]
    assert (
        "spec.driver.useNvidiaDriverCRD is set" in message and "no NVIDIADriver CRD is installed" in message
    )
    assert "the driver is managed from this ClusterPolicy" in message
    delegated = build(replace(observed(seed), nvidia_driver_crd=True), NOW)
    # No NVIDIADriver: the GPU nodes get no driver, and the Ready condition says which and why.
    message = condition(status_of(delegated, seed.name), "Ready")["message"]
    assert "no NVIDIADriver selects GPU nodes" in message and "no CRD" not in message, message
    assert not [o for o in delegated.objects if o["metadata"]["name"] == "nvidia-driver-daemonset"]
    assert "useNvidiaDriverCRD" not in str(status_of(build(observed(policy()), NOW), "cluster-policy"))
