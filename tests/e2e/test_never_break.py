"""Never break what runs, end to end: a change the API server would refuse, or whose references are
missing, is not written at all; a GPU node joining meanwhile still gets the running stack; the
operator deletes and rewrites only what it created, never an object because of its labels, and
reports an object of its names that someone else made instead of adopting it; a label write never
creates a Node. After each: the operands that ran still run with the same generation, nothing that
should not be was created, changed or deleted, the status names the policy field, and the next valid
edit converges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from gpu_operator.core.answers import changed_since_read
from gpu_operator.core.observed import ADOPT_ANNOTATION
from gpu_operator.runtime.client import ApiError
from hack import gen_nodes

from .kube_helpers import Cluster, client, wait_for
from .operator_process import OperatorProcess
from .test_bad_input import running_operands
from .test_operator import (
    CONVERGE,
    NS,
    apply_policy,
    condition,
    daemonsets,
    get_policy,
    node_labels,
    policy_from,
    wait_state,
)

OURS = {"app.kubernetes.io/managed-by": "gpu-operator"}
PRESENT = "nvidia.com/gpu.present"


def not_ready_with(cluster: Cluster, reason: str, *words: str) -> dict[str, Any]:
    """Wait for the current generation to be reported notReady, Error=reason, with every word."""

    def check() -> dict[str, Any]:
        policy = wait_state(cluster, "cluster-policy", "notReady", timeout=0)
        error = condition(policy, "Error")
        assert error.get("reason") == reason, error
        for word in words:
            assert word in error["message"], error
        return policy

    return wait_for(check, timeout=CONVERGE, what=f"Error={reason} naming {words}")


@pytest.fixture
def new_gpu_node(cluster: Cluster) -> Iterator[str]:
    """A simulated GPU node, deleted afterwards (the caller creates it when the test wants it)."""
    name = "gpu-node-7"
    yield name
    try:
        client.CoreV1Api(cluster.api).delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def create_gpu_node(cluster: Cluster, name: str) -> None:
    kubelet = client.CoreV1Api(cluster.api).list_node(limit=1).items[0].status.node_info.kubelet_version
    body: dict[str, Any] = gen_nodes.make_node("gpu", 7, kubelet)
    body["metadata"]["name"] = name
    body["metadata"]["labels"]["kubernetes.io/hostname"] = name
    client.CoreV1Api(cluster.api).create_node(body)


def without(state: dict[str, Any], node: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != f"Node/{node}"}


NO_DEBUG = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: e2e-no-debug}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [apps]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [daemonsets]
  validations:
    - expression: >-
        object.spec.template.spec.containers.all(c, !has(c.env) || c.env.all(e, e.name != 'DEBUG'))
      message: DEBUG must not be set on the DaemonSets of this namespace
      reason: Invalid
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: e2e-no-debug}
spec:
  policyName: e2e-no-debug
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: gpu-operator}
"""


@pytest.fixture
def admission_policy(cluster: Cluster) -> Iterator[None]:
    """A cluster rule the models cannot know: an admission policy refusing DaemonSets with DEBUG set."""
    cluster.kubectl("apply", "-f", "-", input=NO_DEBUG)
    probe = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "e2e-probe", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {
                    "containers": [{"name": "c", "image": "x", "env": [{"name": "DEBUG", "value": "1"}]}]
                },
            },
        },
    }

    def in_force() -> None:
        try:
            cluster.api.apply(probe, dry_run=True)
        except ApiError as exc:
            assert "DEBUG must not be set" in exc.message, exc
            return
        raise AssertionError("the admission policy does not refuse yet")

    try:
        wait_for(in_force, timeout=60, what="the admission policy in force")
        yield
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=NO_DEBUG)


def test_a_change_the_api_server_refuses_is_not_written_and_new_nodes_join_the_running_stack(
    cluster: Cluster, clean: OperatorProcess, new_gpu_node: str, admission_policy: None
) -> None:
    body = policy_from("empty")
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    before = running_operands(cluster)
    # Valid for the models; the cluster's admission policy refuses it, which only the dry run of the
    # whole change finds before anything is written.
    body["spec"] = {"devicePlugin": {"env": [{"name": "DEBUG", "value": "1"}]}, "dcgm": {"enabled": False}}
    apply_policy(cluster, body)
    # An admission policy names no field: the component's section, and the server's words.
    policy = not_ready_with(cluster, "InvalidSpec", "spec.devicePlugin: ", "DEBUG must not be set")
    assert "operands keep running generation 1" in condition(policy, "Error")["message"]
    assert running_operands(cluster) == before  # dcgm not deleted either: nothing of generation 2
    # A GPU node joining now gets the stack that runs (generation 1's components).
    create_gpu_node(cluster, new_gpu_node)

    def joined() -> None:
        labels = node_labels(cluster, new_gpu_node)
        assert labels.get(PRESENT) == "true" and labels.get("nvidia.com/gpu.deploy.driver") == "true", labels

    wait_for(joined, timeout=CONVERGE, what="the new node labelled for the running generation")
    assert without(running_operands(cluster), new_gpu_node) == before
    body["spec"] = {"dcgm": {"enabled": False}}
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    assert "dcgm" not in daemonsets(cluster)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            {"daemonsets": {"priorityClassName": "no-such-priority-class"}},
            "spec.daemonsets.priorityClassName",
            "PriorityClass 'no-such-priority-class' not found",
        ),
        (
            {"devicePlugin": {"config": {"name": "plugin-config", "default": "default"}}},
            "spec.devicePlugin.config.name",
            "ConfigMap 'plugin-config' not found",
        ),
        (
            {"devicePlugin": {"imagePullSecrets": ["registry-key"]}},
            "spec.devicePlugin.imagePullSecrets[0]",
            "Secret 'registry-key' not found",
        ),
    ],
    ids=["priority-class", "device-plugin-config-map", "pull-secret"],
)
def test_missing_references_leave_running_operands_alone(
    cluster: Cluster, clean: OperatorProcess, spec: dict[str, Any], field: str, words: str
) -> None:
    body = policy_from("empty")
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    before = running_operands(cluster)
    body["spec"] = spec
    apply_policy(cluster, body)
    not_ready_with(cluster, "PrerequisiteNotMet", f"{field}: {words}")
    assert running_operands(cluster) == before, "every DaemonSet would have rolled to pods that cannot start"
    body["spec"] = {}
    apply_policy(cluster, body)
    wait_state(cluster, "cluster-policy", "ready")
    assert running_operands(cluster) == before


def test_the_device_plugin_config_map_arriving_lets_the_change_through(
    cluster: Cluster, clean: OperatorProcess
) -> None:
    body = policy_from("empty")
    body["spec"] = {"devicePlugin": {"config": {"name": "plugin-config", "default": "shared"}}}
    apply_policy(cluster, body)
    not_ready_with(cluster, "PrerequisiteNotMet", "spec.devicePlugin.config.name")
    assert not daemonsets(cluster), "nothing of a refused generation is written"
    core = client.CoreV1Api(cluster.api)
    config_map = {"metadata": {"name": "plugin-config"}, "data": {"other": "version: v1"}}
    core.create_namespaced_config_map(NS, config_map)
    try:
        not_ready_with(
            cluster,
            "PrerequisiteNotMet",
            "spec.devicePlugin.config.default: ConfigMap 'plugin-config' has no key",
        )
        core.patch_namespaced_config_map("plugin-config", NS, {"data": {"shared": "version: v1"}})
        wait_state(cluster, "cluster-policy", "ready")
        volumes = daemonsets(cluster)["device-plugin"].spec.template.spec.volumes
        assert any(v.config_map and v.config_map.name == "plugin-config" for v in volumes)
    finally:
        core.delete_namespaced_config_map("plugin-config", NS)


def user_objects_with_our_labels(cluster: Cluster) -> dict[str, Any]:
    """A user's objects that carry the operator's labels and none of its names."""
    labels = {**OURS, "app.kubernetes.io/component": "users-tool"}
    meta = {"name": "users-own", "labels": labels}
    return {
        "ConfigMap": client.CoreV1Api(cluster.api).create_namespaced_config_map(
            NS, {"metadata": meta, "data": {"a": "b"}}
        ),
        "ClusterRole": client.RbacAuthorizationV1Api(cluster.api).create_cluster_role(
            {"metadata": meta, "rules": []}
        ),
        "ClusterRoleBinding": client.RbacAuthorizationV1Api(cluster.api).create_cluster_role_binding(
            {
                "metadata": meta,
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "users-own",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}],
            }
        ),
        "RuntimeClass": client.NodeV1Api(cluster.api).create_runtime_class(
            {"metadata": {"name": "kata-user", "labels": labels}, "handler": "kata"}
        ),
        "DaemonSet": client.AppsV1Api(cluster.api).create_namespaced_daemon_set(
            NS,
            {
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": {"app": "users-own"}},
                    "template": {
                        "metadata": {"labels": {"app": "users-own"}},
                        # No node matches: the test needs the object, not pods.
                        "spec": {
                            "nodeSelector": {"example.com/nowhere": "true"},
                            "containers": [{"name": "c", "image": "example.com/tool:1"}],
                        },
                    },
                },
            },
        ),
    }


OBJECT_CALLS = {
    "ConfigMap": (client.CoreV1Api, "namespaced_config_map"),
    "ClusterRole": (client.RbacAuthorizationV1Api, "cluster_role"),
    "ClusterRoleBinding": (client.RbacAuthorizationV1Api, "cluster_role_binding"),
    "RuntimeClass": (client.NodeV1Api, "runtime_class"),
    "DaemonSet": (client.AppsV1Api, "namespaced_daemon_set"),
}
"""Kind → the client API and the method suffix that reads or deletes one (namespaced: in NS)."""


def _call(cluster: Cluster, verb: str, kind: str, name: str) -> Any:
    api_class, suffix = OBJECT_CALLS[kind]
    method = getattr(api_class(cluster.api), f"{verb}_{suffix}")
    return method(name, NS) if suffix.startswith("namespaced_") else method(name)


def current(cluster: Cluster, kind: str, name: str) -> Any:
    return _call(cluster, "read", kind, name)


def delete(cluster: Cluster, kind: str, name: str) -> None:
    try:
        _call(cluster, "delete", kind, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_user_objects_with_our_labels_are_never_deleted_or_changed(
    cluster: Cluster, clean: OperatorProcess
) -> None:
    created = user_objects_with_our_labels(cluster)
    try:
        body = policy_from("empty")
        apply_policy(cluster, body)
        wait_state(cluster, "cluster-policy", "ready")
        body["spec"] = {"dcgmExporter": {"enabled": False}}  # a pass that deletes what is no longer wanted
        apply_policy(cluster, body)
        wait_state(cluster, "cluster-policy", "ready")
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
        )
        wait_for(
            lambda: assert_empty(daemonsets(cluster)), timeout=CONVERGE, what="the operator's objects gone"
        )
        for kind, obj in created.items():
            now = current(cluster, kind, obj.metadata.name)
            assert identity(now) == identity(obj), f"{kind} {obj.metadata.name} was changed"
    finally:
        for kind, obj in created.items():
            delete(cluster, kind, obj.metadata.name)


def identity(obj: Any) -> tuple[Any, ...]:
    """What no one but the object's owner changes: the DaemonSet controller moves a DaemonSet's
    resourceVersion (its status), not its generation."""
    meta = obj.metadata
    version = meta.generation if meta.generation else meta.resource_version
    return meta.uid, version, meta.labels, meta.annotations, meta.owner_references


def assert_empty(found: dict[str, Any]) -> None:
    assert not found, sorted(found)


def test_user_objects_with_our_names_are_reported_not_adopted(
    cluster: Cluster, clean: OperatorProcess
) -> None:
    core, rbac = client.CoreV1Api(cluster.api), client.RbacAuthorizationV1Api(cluster.api)
    config_map = core.create_namespaced_config_map(
        NS, {"metadata": {"name": "default-gpu-clients"}, "data": {"clients.yaml": "mine"}}
    )
    role = rbac.create_cluster_role({"metadata": {"name": "nvidia-driver"}, "rules": []})
    try:
        apply_policy(cluster, policy_from("empty"))

        def reported() -> dict[str, Any]:
            policy = get_policy(cluster, "cluster-policy")
            error = condition(policy, "Error")
            assert error.get("reason") == "ObjectConflict", error
            components = {c["name"]: c for c in policy["status"]["components"]}
            assert "ClusterRole nvidia-driver exists" in components["driver"]["reason"], components["driver"]
            assert "ConfigMap gpu-operator/default-gpu-clients exists" in components["mig-manager"]["reason"]
            assert ADOPT_ANNOTATION in components["driver"]["reason"]
            return policy

        wait_for(reported, timeout=CONVERGE, what="the conflicts reported")
        # The rest converges: every other component's DaemonSet is there.
        wait_for(
            lambda: assert_components(daemonsets(cluster), {"device-plugin", "container-toolkit", "dcgm"}),
            timeout=CONVERGE,
            what="the other components written",
        )
        assert not {"driver", "mig-manager"} & set(daemonsets(cluster))
        for kind, obj in (("ConfigMap", config_map), ("ClusterRole", role)):
            now = current(cluster, kind, obj.metadata.name)
            assert now.metadata.resource_version == obj.metadata.resource_version, f"{kind} was changed"
            assert not now.metadata.owner_references
        # Handed over: taken over, and the policy converges.
        handed = {"metadata": {"annotations": {ADOPT_ANNOTATION: "true"}}}
        core.patch_namespaced_config_map("default-gpu-clients", NS, handed)
        rbac.patch_cluster_role("nvidia-driver", handed)
        wait_state(cluster, "cluster-policy", "ready")
        owners = current(cluster, "ClusterRole", "nvidia-driver").metadata.owner_references
        assert owners and owners[0].kind == "ClusterPolicy" and owners[0].controller
    finally:
        # Taken over, they go with the policy (the clean fixture checks); otherwise remove them here.
        for kind, name in (("ConfigMap", "default-gpu-clients"), ("ClusterRole", "nvidia-driver")):
            if not taken_over(cluster, kind, name):
                delete(cluster, kind, name)


def taken_over(cluster: Cluster, kind: str, name: str) -> bool:
    try:
        return bool(current(cluster, kind, name).metadata.owner_references)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise


def assert_components(found: dict[str, Any], expected: set[str]) -> None:
    assert expected <= set(found), sorted(found)


def test_a_label_write_never_creates_a_node_whatever_the_credentials(cluster: Cluster) -> None:
    """Server-side apply creates what does not exist, even with a resourceVersion; the node's uid in
    the write is what stops it. Under the admin's credentials, which may create Nodes."""
    kube = cluster.api
    core = client.CoreV1Api(cluster.api)
    name = "ghost-node"
    node = core.create_node({"metadata": {"name": name, "labels": {"example.com/ghost": "true"}}})
    core.delete_node(name)
    wait_for(lambda: assert_gone(core, name), timeout=30, what="node deleted")
    with pytest.raises(ApiError) as refused:
        kube.apply_node_labels(name, {PRESENT: "true"}, node.metadata.uid, node.metadata.resource_version)
    assert changed_since_read(refused.value.failure), refused.value
    assert_gone(core, name)
    # A node re-created under the same name is not the one the write was meant for either.
    again = core.create_node({"metadata": {"name": name}})
    try:
        with pytest.raises(ApiError) as replaced:
            kube.apply_node_labels(name, {PRESENT: "true"}, node.metadata.uid)
        assert changed_since_read(replaced.value.failure), replaced.value
        assert PRESENT not in (core.read_node(name).metadata.labels or {})
        assert core.read_node(name).metadata.uid == again.metadata.uid
    finally:
        core.delete_node(name)


def assert_gone(core: Any, name: str) -> None:
    try:
        core.read_node(name)
    except ApiException as exc:
        assert exc.status == 404
        return
    raise AssertionError(f"node {name} exists")


def test_a_deleted_gpu_node_stays_deleted(
    cluster: Cluster, clean: OperatorProcess, new_gpu_node: str
) -> None:
    apply_policy(cluster, policy_from("empty"))
    wait_state(cluster, "cluster-policy", "ready")
    create_gpu_node(cluster, new_gpu_node)
    wait_for(
        lambda: assert_labelled(cluster, new_gpu_node), timeout=CONVERGE, what="the new node gets its labels"
    )
    core = client.CoreV1Api(cluster.api)
    core.delete_node(new_gpu_node)

    def back_to_four() -> None:
        policy = wait_state(cluster, "cluster-policy", "ready", timeout=0)
        assert policy["status"]["gpuNodes"] == 4, policy["status"]["gpuNodes"]

    wait_for(back_to_four, timeout=CONVERGE, what="the policy ready on the 4 nodes left")
    assert_gone(core, new_gpu_node)


def assert_labelled(cluster: Cluster, node: str) -> None:
    labels = node_labels(cluster, node)
    assert labels.get("nvidia.com/gpu.deploy.device-plugin") == "true", labels
