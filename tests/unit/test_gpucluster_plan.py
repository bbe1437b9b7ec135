"""The GPUCluster in the pass (core/gpucluster_plan.py through plan.build): its stack rendered and owned,
the device plugin's stack withheld on DRA nodes and the DRA deploy labels set there, a node moving only
once its GPU pods are gone (the device plugin's label dropped first), its status, and its teardown in
NVIDIA's order; and nothing of it without a GPUCluster."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from builders import PCI, gpu_node
from test_label_protocol import Node
from test_proof import run

from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.core.allocators import Allocator
from gpu_operator.core.answers import Failure
from gpu_operator.core.caches import Caches
from gpu_operator.core.gpucluster_plan import FINALIZER
from gpu_operator.core.memory import Memory
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import GPUClusterRef, ObjectInfo, ObjectKey, object_key
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.plan import Observed, Plan, PolicyRef, build
from gpu_operator.core.proof import Answer, DryRun, LookUp, Question, prove
from gpu_operator.core.psa import NamespaceInfo
from gpu_operator.core.upgrade import Facts
from gpu_operator.core.upgrade.facts import WorkloadPod

NS = "gpu-operator"
NOW = "2026-12-01T00:00:00Z"
GC_UID = "uid-gc"
DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DRA_DRIVER = "nvidia.com/gpu.deploy.dra-driver"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
TOOLKIT = "nvidia.com/gpu.deploy.container-toolkit"


def policy() -> PolicyRef:
    return PolicyRef("cluster-policy", "uid-cp", 1, NOW, {}, {})


def gpucluster(
    deleting: bool = False, finalizers: tuple[str, ...] = (FINALIZER,), **spec: Any
) -> GPUClusterRef:
    return GPUClusterRef(
        "gpu-cluster",
        GC_UID,
        1,
        parse_gpucluster_spec({"nodeSelector": {"pool": "dra"}, **spec}),
        deleting=deleting,
        finalizers=finalizers,
        resource_version="7",
    )


def node(name: str, pool: str, **labels: str) -> NodeInfo:
    return gpu_node(name, {"pool": pool, **labels}, own_labels=frozenset(labels), uid=f"u-{name}")


def observed(
    nodes: list[NodeInfo],
    gpuclusters: tuple[GPUClusterRef, ...] = (),
    pods: tuple[WorkloadPod, ...] = (),
    known: frozenset[str] | None = None,
    objects: dict[Any, ObjectInfo] | None = None,
) -> Observed:
    return Observed(
        policies=(policy(),),
        nodes={n.name: n for n in nodes},
        pods=(),
        daemonsets={},
        objects=objects or {},
        namespace=NS,
        operand_namespace=NamespaceInfo(NS, {}, {}, frozenset(), uid="ns"),
        gpuclusters=gpuclusters,
        upgrade=Facts(nodes=(), pods=pods, pods_known=frozenset() if known is None else known),
    )


def plan_of(world: Observed) -> Plan:
    return build(world, NOW, caches=Caches())


def gpu_pod(node_name: str, claims: bool = False) -> WorkloadPod:
    return WorkloadPod(
        "default", f"job-{node_name}", f"uid-{node_name}", node_name, gpu=not claims, claims=claims
    )


def test_without_a_gpucluster_nothing_changes() -> None:
    nodes = [node("a", "dra"), node("b", "classic")]
    plan = plan_of(observed(nodes))
    assert plan.dra is None
    assert not any(o["kind"] in ("DeviceClass", "Deployment") for o in plan.objects)


def test_the_dra_pool_gets_the_dra_labels_and_no_device_plugin() -> None:
    nodes = [node("a", "dra"), node("b", "classic")]
    plan = plan_of(observed(nodes, (gpucluster(),), known=frozenset({"a"})))
    assert plan.dra is not None
    assert plan.dra.split.nodes["a"].allocator is Allocator.DRA
    assert plan.node_labels["a"][DRA_DRIVER] == "true"
    assert DEVICE_PLUGIN not in plan.node_labels["a"] and GFD not in plan.node_labels["a"]
    # The classic node keeps the ClusterPolicy's stack and gets no DRA label.
    assert DRA_DRIVER not in plan.node_labels.get("b", {})
    # The DRA stack is owned by its GPUCluster.
    kinds = {
        o["kind"] for o in plan.objects if o["metadata"].get("ownerReferences", [{}])[0].get("uid") == GC_UID
    }
    assert {"DaemonSet", "DeviceClass", "ClusterRole"} <= kinds
    # The namespace label of the admin-access claims.
    assert plan.dra.namespace_labels == {"resource.kubernetes.io/admin-access": "true"}


def test_a_node_moving_to_dra_loses_the_device_plugin_first_and_waits_for_its_gpu_pods() -> None:
    moving = node("a", "dra", **{DEVICE_PLUGIN: "true", TOOLKIT: "true"})
    world = observed([moving], (gpucluster(),), pods=(gpu_pod("a"),), known=frozenset({"a"}))
    plan = plan_of(world)
    assert plan.dra is not None
    allocation = plan.dra.split.nodes["a"]
    assert allocation.held and "GPU pod" in allocation.reason
    labels = plan.node_labels["a"]
    assert DEVICE_PLUGIN not in labels and DRA_DRIVER not in labels
    assert "a" in plan.pods_needed
    # Its pods are gone: it moves.
    gone = plan_of(observed([moving], (gpucluster(),), known=frozenset({"a"})))
    assert gone.node_labels["a"][DRA_DRIVER] == "true"


def test_the_device_plugin_label_gone_the_pods_still_hold_the_node() -> None:
    drained = node("a", "dra", **{TOOLKIT: "true"})  # the device plugin's label was dropped
    plan = plan_of(observed([drained], (gpucluster(),), pods=(gpu_pod("a"),), known=frozenset({"a"})))
    assert plan.dra is not None and plan.dra.split.nodes["a"].held
    assert DRA_DRIVER not in plan.node_labels.get("a", {})


def test_a_node_whose_pods_are_not_listed_yet_waits() -> None:
    moving = node("a", "dra", **{DEVICE_PLUGIN: "true"})
    plan = plan_of(observed([moving], (gpucluster(),), known=frozenset()))
    assert plan.dra is not None and plan.dra.split.nodes["a"].held
    assert "a" in plan.pods_needed


def test_a_node_leaving_dra_keeps_the_kubelet_plugin_while_claims_run() -> None:
    leaving = node("a", "classic", **{DRA_DRIVER: "true"})
    plan = plan_of(
        observed([leaving], (gpucluster(),), pods=(gpu_pod("a", claims=True),), known=frozenset({"a"}))
    )
    assert plan.node_labels.get("a", {}).get(DRA_DRIVER, leaving.labels[DRA_DRIVER]) == "true"
    assert DEVICE_PLUGIN not in plan.node_labels.get("a", {})


def test_the_status_is_written_only_when_it_differs() -> None:
    world = observed([node("a", "dra")], (gpucluster(),), known=frozenset({"a"}))
    plan = plan_of(world)
    assert plan.dra is not None
    body = plan.dra.status_writes["gpu-cluster"]
    assert body["state"] == "notReady" and body["namespace"] == NS
    settled = GPUClusterRef(**{**gpucluster().__dict__, "status": body})
    again = plan_of(observed([node("a", "dra")], (settled,), known=frozenset({"a"})))
    assert again.dra is not None and "gpu-cluster" not in again.dra.status_writes


def test_the_finalizer_is_added_and_removed_in_nvidias_order() -> None:
    fresh = plan_of(observed([node("a", "dra")], (gpucluster(finalizers=()),), known=frozenset({"a"})))
    assert fresh.dra is not None and fresh.dra.finalizers == {"gpu-cluster": ("7", (FINALIZER,))}
    validator = ("apps/v1", "DaemonSet", NS, "nvidia-dra-validator")
    plugin = ("apps/v1", "DaemonSet", NS, "nvidia-dra-driver-kubelet-plugin")
    objects = {key: ObjectInfo(key, "", "", 1, "1", GC_UID, (FIELD_MANAGER,)) for key in (validator, plugin)}
    deleting = plan_of(
        observed([node("a", "dra")], (gpucluster(deleting=True),), known=frozenset({"a"}), objects=objects)
    )
    assert deleting.dra is not None
    # The claim holders go first, foreground; the kubelet plugin stays; the finalizer stays.
    assert validator in deleting.deletes and deleting.propagation(validator) == "Foreground"
    assert plugin not in deleting.deletes
    assert not deleting.dra.finalizers
    del objects[validator]
    done = plan_of(
        observed([node("a", "dra")], (gpucluster(deleting=True),), known=frozenset({"a"}), objects=objects)
    )
    assert done.dra is not None and done.dra.finalizers == {"gpu-cluster": ("7", ())}


def test_without_a_clusterpolicy_the_gpucluster_says_why_and_runs_nothing() -> None:
    world = observed([node("a", "dra")], (gpucluster(),), known=frozenset({"a"}))
    plan = plan_of(Observed(**{**world.__dict__, "policies": ()}))
    assert plan.dra is not None and not plan.dra.objects
    body = plan.dra.status_writes["gpu-cluster"]
    error = next(c for c in body["conditions"] if c["type"] == "Error")
    assert (body["state"], error["reason"]) == ("notReady", "PrerequisiteNotMet")
    assert not any(DRA_DRIVER in labels for labels in plan.node_labels.values())


def test_metrics_per_allocator() -> None:
    from gpu_operator.runtime import metrics

    nodes = [node("a", "dra"), node("b", "classic"), node("c", "classic")]
    plan = plan_of(observed(nodes, (gpucluster(),), known=frozenset({"a"})))
    metrics.observe_pass(plan, {}, 3, 0.1)
    sample = metrics.REGISTRY.get_sample_value
    assert sample("gpu_operator_gpu_nodes_by_allocator", {"allocator": "dra"}) == 1
    assert sample("gpu_operator_gpu_nodes_by_allocator", {"allocator": "device-plugin"}) == 2
    assert sample("gpu_operator_gpu_nodes_waiting_for_allocator", {}) == 0
    assert sample("gpu_operator_gpucluster_state", {"state": "notReady"}) == 1
    metrics.observe_pass(plan_of(observed(nodes)), {}, 3, 0.1)
    assert sample("gpu_operator_gpu_nodes_by_allocator", {"allocator": "device-plugin"}) == 3
    assert sample("gpu_operator_gpucluster_state", {"state": "notReady"}) is None


ADMIN_ACCESS = "resource.kubernetes.io/admin-access"
VALIDATOR = ("apps/v1", "DaemonSet", NS, "nvidia-dra-validator")
VALIDATOR_CLAIM = ("resource.k8s.io/v1", "ResourceClaimTemplate", NS, "nvidia-dra-validator-gpu")
KUBELET_PLUGIN = ("apps/v1", "DaemonSet", NS, "nvidia-dra-driver-kubelet-plugin")


def admin_requests(body: dict[str, Any]) -> bool:
    spec = body["spec"]["spec"] if body["kind"] == "ResourceClaimTemplate" else body.get("spec", {})
    return any(r.get("exactly", {}).get("adminAccess") for r in spec.get("devices", {}).get("requests", []))


def api_server(labelled: bool) -> Any:
    """Lookups find nothing (but the default priority class); a dry run is refused, as kube-apiserver
    refuses it, for a claim or claim template with an admin-access request while the namespace lacks
    the label, and accepted otherwise."""
    refusal = Failure(
        422,
        "Invalid",
        "ResourceClaimTemplate is invalid",
        (
            (
                "spec.spec.devices.requests[0].exactly.adminAccess",
                "Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: "
                "true` label on the containing namespace",
            ),
        ),
    )

    def answer(question: Question) -> Answer:
        if isinstance(question, LookUp):
            return {
                key: {"metadata": {"name": key[3]}} if key[1] == "PriorityClass" else None
                for key in question.keys
            }
        assert isinstance(question, DryRun)
        return {
            object_key(body): refusal
            if not labelled
            and body["kind"] in ("ResourceClaimTemplate", "ResourceClaim")
            and admin_requests(body)
            else None
            for body in question.bodies
        }

    return answer


def labelled(world: Observed) -> Observed:
    assert world.operand_namespace is not None
    return replace(world, operand_namespace=replace(world.operand_namespace, admin_access=True))


def test_the_first_pass_withholds_the_admin_access_claims_until_the_namespace_has_its_label() -> None:
    """The API server refuses a claim template with an admin-access request, dry run included, until
    the operand namespace carries resource.kubernetes.io/admin-access=true, which the first pass writes
    after its change is proven: that change leaves them (and the DaemonSets whose pods claim from them)
    out, and the pass after the label is seen writes them."""
    world = observed([node("a", "dra")], (gpucluster(),), known=frozenset({"a"}))
    first, _ = run(prove(world, NOW, 0.0, Memory(), NS), api_server(labelled=False))
    assert first.verdict.proven and first.plan.problems is None
    writes = {object_key(o) for o in first.verdict.writes}
    assert KUBELET_PLUGIN in writes
    assert VALIDATOR not in writes and VALIDATOR_CLAIM not in writes
    assert not any(key[1] == "ResourceClaimTemplate" for key in writes)
    dra = first.plan.dra
    assert dra is not None and dra.namespace_labels == {ADMIN_ACCESS: "true"}
    assert {VALIDATOR, VALIDATOR_CLAIM} <= dra.withheld
    # Not an error: the GPUCluster waits for its workloads, and says why; the ClusterPolicy is fine.
    status = dra.status_writes["gpu-cluster"]
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert error["reason"] == "OperandNotReady" and ADMIN_ACCESS in error["message"], error
    policy_reasons = {c.reason for c in first.plan.statuses["cluster-policy"].conditions}
    assert not policy_reasons & {"InvalidSpec", "ReconcileFailed"}, policy_reasons

    second, _ = run(prove(labelled(world), NOW, 0.0, Memory(), NS), api_server(labelled=True))
    assert second.verdict.proven
    writes = {object_key(o) for o in second.verdict.writes}
    assert {VALIDATOR, VALIDATOR_CLAIM, KUBELET_PLUGIN} <= writes
    dra = second.plan.dra
    assert dra is not None and not dra.namespace_labels and not dra.withheld
    error = next(c for c in dra.status_writes["gpu-cluster"]["conditions"] if c["type"] == "Error")
    assert ADMIN_ACCESS not in error["message"]


def test_withheld_objects_that_exist_are_left_as_they_are() -> None:
    """The label gone (someone removed it): it is written again, and meanwhile the admin-access
    objects already there are neither rewritten nor deleted."""
    existing: dict[ObjectKey, ObjectInfo] = {
        key: ObjectInfo(key, "", "", 1, "1", GC_UID, (FIELD_MANAGER,)) for key in (VALIDATOR, VALIDATOR_CLAIM)
    }
    plan = plan_of(observed([node("a", "dra")], (gpucluster(),), known=frozenset({"a"}), objects=existing))
    assert plan.dra is not None and plan.dra.namespace_labels == {ADMIN_ACCESS: "true"}
    assert VALIDATOR not in plan.deletes and VALIDATOR_CLAIM not in plan.deletes
    assert not {VALIDATOR, VALIDATOR_CLAIM} & {object_key(o) for o in plan.objects}


DRA_ONLY = (
    DRA_DRIVER,
    *(f"nvidia.com/gpu.deploy.{n}" for n in ("dra-validator", "dcgm-dra", "dcgm-exporter-dra")),
)


def one_pass(nodes: list[Node], world: Observed) -> Plan:
    """A pass, its label applies and rewrites played on the nodes' labels and owners."""
    plan = plan_of(world)
    for each in nodes:
        if each.name in plan.node_labels:
            each.apply(plan.node_labels[each.name])
        if each.name in plan.label_rewrites:
            each.rewrite(plan.label_rewrites[each.name])
    return plan


def test_k8s_driver_managers_empty_labels_of_the_other_stack_are_swept() -> None:
    """k8s-driver-manager v0.12.0, when it starts on a node without a loaded driver, writes every deploy
    label it knows back as maybeSetTrue(value): "" for each that was absent, the DRA stack's among them
    (cmd/driver-manager/main.go:1037-1086), on every GPU node. NVIDIA's labeller then deletes the
    labels of the stack the node does not run (state_manager.go removeGPUStateLabels, and
    devicePluginOnlyStateLabelKeys on a DRA node); so does this operator, but never an opt-out."""
    dra = Node("a", {PCI: "true", "pool": "dra"})
    classic = Node("b", {PCI: "true", "pool": "classic"})
    for each in (dra, classic):
        each.driver_manager_reschedules()
        assert each.labels[DRA_DRIVER] == "" and each.labels[DEVICE_PLUGIN] == ""
    classic.labels[GFD] = "false"  # a person's opt-out, which k8s-driver-manager carries over
    classic.owners[GFD] = {"kubectl-label"}

    def world() -> Observed:
        return observed([dra.info(), classic.info()], (gpucluster(),), known=frozenset({"a", "b"}))

    one_pass([dra, classic], world())
    assert not set(DRA_ONLY) & classic.labels.keys(), classic.labels
    assert classic.labels[GFD] == "false"
    assert DEVICE_PLUGIN not in dra.labels and GFD not in dra.labels, dra.labels
    assert dra.labels[DRA_DRIVER] == "true"
    # At rest: nothing more to remove.
    again = plan_of(world())
    assert "b" not in again.label_rewrites and "a" not in again.label_rewrites, again.label_rewrites


def test_a_node_leaving_dra_keeps_the_dra_labels_a_manager_restored_while_claims_run() -> None:
    """The sweep follows the allocator. k8s-driver-manager writes the DRA labels back as `true` after a
    driver restart (then its own, not the operator's): a node held on DRA by its claim pods keeps them,
    so its kubelet plugin stays to unprepare the claims; with no claim left, they go."""

    def restored() -> Node:
        node = Node("a", {PCI: "true", "pool": "classic"})
        node.patch("driver-manager", dict.fromkeys(DRA_ONLY, "true"))
        return node

    held = restored()
    plan = plan_of(
        observed([held.info()], (gpucluster(),), pods=(gpu_pod("a", claims=True),), known=frozenset({"a"}))
    )
    assert plan.dra is not None and plan.dra.split.nodes["a"].allocator is Allocator.DRA
    assert not set(DRA_ONLY) & plan.label_rewrites.get("a", {}).keys(), plan.label_rewrites
    left = restored()
    one_pass([left], observed([left.info()], (gpucluster(),), known=frozenset({"a"})))
    assert not set(DRA_ONLY) & left.labels.keys(), left.labels
