"""Least privilege, proven with the operator's own token (the chart's ServiceAccount): it creates every
operand object it needs, and nothing it could try gains it anything beyond the operand rules. RBAC
limits changes and deletions by name; the chart's ValidatingAdmissionPolicies pin creates, the
content of roles and bindings (`escalate`/`bind` cannot be turned into anything else) and the pods of
the workloads (no new DaemonSet or Deployment, no operand pod with more of the host than rendered)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.runtime.client import ApiError, path
from gpu_operator.runtime.sync_client import SyncKube
from hack.operand_rbac import OUTPUT, policy_objects

from .kube_helpers import Cluster, wait_for
from .operator_process import OperatorProcess, chart_operator
from .test_operator import NS, RELEASE, apply_policy, assert_cleaned_up, get_policy, policy_from

RBAC = "rbac.authorization.k8s.io/v1"
ME = {"kind": "ServiceAccount", "name": RELEASE, "namespace": NS}
EVERYTHING = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}


@pytest.fixture(scope="module")
def converged(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SyncKube, SyncKube]]:
    """The operator, converged on a policy with every component (every operand role and binding
    exists); (the operator's token, the admin)."""
    folder = tmp_path_factory.mktemp("least-privilege")
    # everything.yaml names its own RuntimeClass: the chart must be told (its RBAC names it).
    runtime_class = "clusterPolicy.operator.runtimeClass=nvidia-gpu"
    with chart_operator(cluster, folder, NS, "--set", runtime_class) as operator:
        admin = cluster.api
        token = SyncKube.connect(folder / "kubeconfig")
        for body in REFERENCES:
            admin.apply(body, manager="e2e-user")
        apply_policy(cluster, policy_from("everything", "cluster-policy"))
        try:
            wait_for(
                lambda: all_rbac_applied(admin, operator), timeout=180, what="every operand role applied"
            )
            yield token, admin
        finally:
            admin.request("DELETE", path("nvidia.com/v1", "ClusterPolicy", name="cluster-policy"))
            wait_for(lambda: assert_cleaned_up(cluster), timeout=180, what="cleanup")
            for body in REFERENCES:
                metadata = body["metadata"]
                admin.request(
                    "DELETE",
                    path(body["apiVersion"], body["kind"], metadata.get("namespace", ""), metadata["name"]),
                )
            token.close()
            operator.assert_clean_log()


def _user_object(api_version: str, kind: str, name: str, **content: Any) -> dict[str, Any]:
    namespace = {} if kind == "PriorityClass" else {"namespace": NS}
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **namespace}, **content}


REFERENCES = [
    *(
        _user_object("v1", "ConfigMap", name, data={key: "x"})
        for name, key in (
            ("apt-mirror", "mirror.list"),
            ("corp-ca", "ca.crt"),
            ("kernel-module-params", "nvidia.conf"),
            ("time-slicing", "any"),
            ("custom-metrics", "dcgm-metrics.csv"),
            ("custom-mig-parted-config", "config.yaml"),
            ("gpu-clients", "clients.yaml"),
            ("vgpu-devices-config", "config.yaml"),
        )
    ),
    *(
        _user_object("v1", "Secret", name, stringData={"token": "x"})
        for name in ("registry-creds", "validator-creds", "nls-token", "driver-secrets")
    ),
    _user_object("scheduling.k8s.io/v1", "PriorityClass", "gpu-critical", value=1000),
]
"""What everything.yaml names and the operator does not create (it proves a change before writing it,
so the policy is not applied before these are there): the user's ConfigMaps, Secrets, PriorityClass."""


def all_rbac_applied(admin: SyncKube, operator: OperatorProcess) -> None:
    """Every operand role and binding everything.yaml renders (the chart admits the Kata mode's
    too, files/operand-rbac.yaml) is there."""
    rendered = policy_objects(NS, runtime_class="nvidia-gpu")
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        namespace = NS if kind in ("Role", "RoleBinding") else ""
        found = {
            o["metadata"]["name"]
            for o in admin.list(RBAC, kind, namespace, f"app.kubernetes.io/managed-by={FIELD_MANAGER}")
        }
        wanted = {o["metadata"]["name"] for o in rendered if o["kind"] == kind}
        assert wanted and wanted <= found, f"{kind}: {sorted(wanted - found)} missing"
    assert "Forbidden" not in operator.log() and "denied" not in operator.log(), operator.log()[-3000:]


def refused(write: Any, *args: Any, **kwargs: Any) -> ApiError:
    """`write(*args, **kwargs)` fails with 403 (RBAC) or 422 (the admission policy)."""
    with pytest.raises(ApiError) as caught:
        write(*args, **kwargs)
    assert caught.value.status in (403, 422), caught.value
    return caught.value


def apply(kube: SyncKube, body: dict[str, Any]) -> dict[str, Any]:
    return kube.apply(body, manager=FIELD_MANAGER, force=True)


def role(admin: SyncKube, kind: str, name: str) -> dict[str, Any]:
    return admin.get(RBAC, kind, name, NS if kind in ("Role", "RoleBinding") else "")


def test_the_operator_created_everything_it_needs(
    converged: tuple[SyncKube, SyncKube], cluster: Cluster
) -> None:
    def no_write_refused() -> None:
        status = get_policy(cluster, "cluster-policy").get("status", {})
        error = next((c for c in status.get("conditions", []) if c["type"] == "Error"), None)
        assert error is not None and error["reason"] in ("OperandNotReady", "Ready"), error

    wait_for(no_write_refused, timeout=60, what="a status without refused writes")


def test_the_charts_admission_policies_type_check(converged: tuple[SyncKube, SyncKube]) -> None:
    """kube-controller-manager type-checks each policy's expressions against the kinds it matches and
    writes the result into its status. A policy whose warnings do not fit in a status (3 MiB; one
    policy over all seven kinds had more) is type-checked again and again, seconds of the controller
    manager's CPU each time: every policy must be checked once and clean."""
    _, admin = converged

    def checked() -> None:
        found = admin.request("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")
        ours = [p for p in found["items"] if p["metadata"]["name"].startswith(f"{RELEASE}-writes-")]
        # One per kind the operator writes (charts/gpu-operator/templates/admission-policy.yaml), the
        # GPUCluster's DeviceClasses and admission policies and bindings, DaemonSets and Deployments
        # among them.
        assert len(ours) == 13, [p["metadata"]["name"] for p in ours]
        for policy in ours:
            name, status = policy["metadata"]["name"], policy.get("status") or {}
            assert status.get("observedGeneration") == policy["metadata"]["generation"], (name, status)
            assert not (status.get("typeChecking") or {}).get("expressionWarnings"), (name, status)

    wait_for(checked, timeout=60, what="every admission policy type-checked without warnings")


def test_rewriting_an_operand_role_to_everything_is_refused(converged: tuple[SyncKube, SyncKube]) -> None:
    token, admin = converged
    for kind in ("ClusterRole", "Role"):
        before = role(admin, kind, "nvidia-driver")
        metadata = {"name": "nvidia-driver", **({"namespace": NS} if kind == "Role" else {})}
        body: dict[str, Any] = {"apiVersion": RBAC, "kind": kind, "metadata": metadata, "rules": [EVERYTHING]}
        error = refused(apply, token, body)
        assert "exactly the operator's rules" in str(error)
        # Nor by aggregating other roles into it.
        aggregated = {**body, "rules": before["rules"], "aggregationRule": {"clusterRoleSelectors": [{}]}}
        if kind == "ClusterRole":
            refused(apply, token, aggregated)
        assert role(admin, kind, "nvidia-driver")["rules"] == before["rules"]


def test_binding_an_operand_role_to_itself_is_refused(converged: tuple[SyncKube, SyncKube]) -> None:
    token, admin = converged
    driver_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nvidia-driver"}
    attempts: list[dict[str, Any]] = [
        # a new binding of an operand role
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "escalation"},
            "roleRef": driver_ref,
            "subjects": [ME],
        },
        # the operand's own binding, with the operator added
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "nvidia-driver"},
            "roleRef": driver_ref,
            "subjects": [{**ME, "name": "nvidia-driver"}, ME],
        },
        # a namespaced binding of the ClusterRole, under an operand binding's name
        {
            "kind": "RoleBinding",
            "metadata": {"name": "nvidia-driver", "namespace": NS},
            "roleRef": driver_ref,
            "subjects": [ME],
        },
    ]
    for attempt in attempts:
        before = (
            role(admin, attempt["kind"], attempt["metadata"]["name"])
            if attempt["metadata"]["name"] != "escalation"
            else None
        )
        refused(apply, token, {"apiVersion": RBAC, **attempt})
        if before is not None:
            after = role(admin, attempt["kind"], attempt["metadata"]["name"])
            assert (after["roleRef"], after["subjects"]) == (before["roleRef"], before["subjects"])
    with pytest.raises(ApiError) as gone:
        admin.get(RBAC, "ClusterRoleBinding", "escalation")
    assert gone.value.status == 404


def test_foreign_objects_are_out_of_reach(converged: tuple[SyncKube, SyncKube]) -> None:
    token, admin = converged
    new_role = {
        "apiVersion": RBAC,
        "kind": "ClusterRole",
        "metadata": {"name": "escalation"},
        "rules": [EVERYTHING],
    }
    refused(apply, token, new_role)
    cluster_admin = admin.get(RBAC, "ClusterRole", "cluster-admin")
    merge = {"metadata": {"labels": {"escalation": "true"}}}
    url = path(RBAC, "ClusterRole", name="cluster-admin")
    refused(token.request, "PATCH", url, body=merge, content_type="application/merge-patch+json")
    refused(token.delete, (RBAC, "ClusterRoleBinding", "", "cluster-admin"))
    assert (
        admin.get(RBAC, "ClusterRole", "cluster-admin")["metadata"]["resourceVersion"]
        == (cluster_admin["metadata"]["resourceVersion"])
    )
    foreign = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "kata-user"},
        "handler": "kata",
    }
    apply(admin, foreign)
    try:
        refused(token.delete, ("node.k8s.io/v1", "RuntimeClass", "", "kata-user"))
        refused(apply, token, {**foreign, "handler": "runc"})
        assert admin.get("node.k8s.io/v1", "RuntimeClass", "kata-user")["handler"] == "kata"
        # Not even a RuntimeClass of its own name with another handler.
        refused(apply, token, {**foreign, "metadata": {"name": "nvidia"}, "handler": "runc"})
    finally:
        admin.delete(("node.k8s.io/v1", "RuntimeClass", "", "kata-user"))


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("a taint", {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}),
        ("a label of someone else's", {"metadata": {"labels": {"team": "evil"}}}),
        ("an NVIDIA label it does not set", {"metadata": {"labels": {"nvidia.com/gpu.product": "evil"}}}),
        ("an annotation of someone else's", {"metadata": {"annotations": {"team": "evil"}}}),
        ("its provider ID", {"spec": {"providerID": "evil://x"}}),
        ("a finalizer", {"metadata": {"finalizers": ["evil.example.com/hold"]}}),
    ],
)
def test_a_node_is_changed_only_where_the_operator_writes(
    converged: tuple[SyncKube, SyncKube], what: str, change: dict[str, Any]
) -> None:
    """RBAC's `patch nodes` covers every field; the chart's policy leaves the token its own labels,
    the upgrade's annotations and the cordon (which the upgrade tests write with this token)."""
    token, admin = converged
    name = admin.list("v1", "Node", "", "nvidia.com/gpu.present=true")[0]["metadata"]["name"]
    error = refused(token.patch_node, name, change)
    assert "the gpu-operator may change only" in str(error), (what, error)
    # Nothing of the change landed (other fields move on their own: the operator's labels, the node
    # lifecycle controller's taints).
    after = admin.get("v1", "Node", name)
    assert "evil" not in json.dumps({"metadata": after["metadata"], "spec": after["spec"]}), what


APPS = "apps/v1"
Pod = dict[str, Any]
Shapes = dict[str, Any]


def pod_of(workload: dict[str, Any]) -> Pod:
    spec: Pod = workload["spec"]["template"]["spec"]
    return spec


def hostile_pod(name: str) -> dict[str, Any]:
    """A pod template that owns its nodes: the operator's ServiceAccount, the host's namespaces and root,
    privileged."""
    return {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "serviceAccountName": RELEASE,
            "hostPID": True,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "shell",
                    "image": "busybox",
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_a_workload_of_a_foreign_name_is_refused(converged: tuple[SyncKube, SyncKube], kind: str) -> None:
    """RBAC lets the token create any DaemonSet and Deployment in its namespace; the chart's policy
    admits only the operands' names."""
    token, admin = converged
    name = "escalation"
    body = {
        "apiVersion": APPS,
        "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": hostile_pod(name)},
    }
    error = refused(token.apply, body, manager="escalation", force=True)
    assert f"the gpu-operator may create or change only its operands' {kind}s" in str(error), error
    with pytest.raises(ApiError) as gone:
        admin.get(APPS, kind, name, NS)
    assert gone.value.status == 404


def _another_account(daemonsets: dict[str, Any], shapes: Shapes) -> tuple[str, Pod]:
    # The operator's own: its pods would hold the token itself, and so would any pod anyone can exec into.
    return "nvidia-device-plugin-daemonset", {"serviceAccountName": RELEASE}


def _host_pid(daemonsets: dict[str, Any], shapes: Shapes) -> tuple[str, Pod]:
    # Not one that shares its process namespace: the API server refuses that with hostPID anyway.
    name = next(
        n
        for n, ds in sorted(daemonsets.items())
        if "hostPID" not in shapes[n]["hostNamespaces"] and not pod_of(ds).get("shareProcessNamespace")
    )
    return name, {"hostPID": True}


def _privileged(daemonsets: dict[str, Any], shapes: Shapes) -> tuple[str, Pod]:
    for name, ds in sorted(daemonsets.items()):
        for part in ("initContainers", "containers"):
            for container in pod_of(ds).get(part) or []:
                if container["name"] not in shapes[name]["privileged"]:
                    change = {"name": container["name"], "securityContext": {"privileged": True}}
                    return name, {part: [change]}
    raise AssertionError("every container of every operand DaemonSet may be privileged")


def _host_root(daemonsets: dict[str, Any], shapes: Shapes) -> tuple[str, Pod]:
    return "nvidia-device-plugin-daemonset", {"volumes": [{"name": "escalation", "hostPath": {"path": "/"}}]}


def _etc(daemonsets: dict[str, Any], shapes: Shapes) -> tuple[str, Pod]:
    """A rendered hostPath volume whose path no policy field names, pointed at /etc."""
    for name, ds in sorted(daemonsets.items()):
        for volume in pod_of(ds).get("volumes") or []:
            if "hostPath" in volume and shapes[name]["hostPaths"].get(volume["name"]):
                return name, {"volumes": [{"name": volume["name"], "hostPath": {"path": "/etc"}}]}
    raise AssertionError("no operand DaemonSet has a hostPath volume at a fixed path")


@pytest.mark.parametrize(
    ("what", "attempt", "message"),
    [
        ("another ServiceAccount", _another_account, "run under the ServiceAccount"),
        ("hostPID", _host_pid, "share only the host namespaces"),
        (
            "a privileged container",
            _privileged,
            "only the containers the operator's templates make privileged",
        ),
        ("the host's root mounted", _host_root, "mounts only the hostPath volumes"),
        ("a rendered volume moved to /etc", _etc, "mounts only the hostPath volumes"),
    ],
)
def test_an_operand_daemonset_keeps_its_rendered_pod(
    converged: tuple[SyncKube, SyncKube],
    what: str,
    attempt: Callable[[dict[str, Any], Shapes], tuple[str, Pod]],
    message: str,
) -> None:
    """RBAC lets the token patch every DaemonSet of its namespace; the chart's policy holds each operand
    DaemonSet to the pod its templates render (files/operand-rbac.yaml). Tried as the operator writes,
    by server-side apply, here under a field manager of its own so that only the change is sent."""
    token, admin = converged
    shapes: Shapes = yaml.safe_load(OUTPUT.read_text())["DaemonSet"]["shapes"]
    daemonsets = {
        ds["metadata"]["name"]: ds
        for ds in admin.list(APPS, "DaemonSet", NS, f"app.kubernetes.io/managed-by={FIELD_MANAGER}")
        if ds["metadata"]["name"] in shapes
    }
    name, change = attempt(daemonsets, shapes)
    body = {
        "apiVersion": APPS,
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": change}},
    }
    error = refused(token.apply, body, manager="escalation", force=True)
    assert message in str(error), (what, name, error)
    after = admin.get(APPS, "DaemonSet", name, NS)
    before = daemonsets[name]
    assert after["metadata"]["generation"] == before["metadata"]["generation"], (what, name)
    assert pod_of(after) == pod_of(before), (what, name)


@pytest.mark.parametrize("name", ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"])
def test_its_crds_cannot_get_a_conversion_webhook(converged: tuple[SyncKube, SyncKube], name: str) -> None:
    token, admin = converged
    crd = admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    webhook = {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:1/convert"},
        },
    }
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {**crd["spec"], "conversion": webhook},
    }
    refused(token.apply, body, manager="escalation", force=True)
    other = {**body, "metadata": {"name": "escalations.example.com"}}
    refused(token.apply, other, manager="escalation", force=True)


def test_what_the_token_can_do_is_no_more_than_before(converged: tuple[SyncKube, SyncKube]) -> None:
    token, _admin = converged
    checks = [
        ("*", "*", "*", ""),
        ("get", "", "secrets", ""),
        ("patch", "rbac.authorization.k8s.io", "clusterrolebindings", "cluster-admin"),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", "cluster-admin"),
        ("impersonate", "", "users", ""),
        ("create", "", "pods/exec", NS),
    ]
    for verb, group, resource, name_or_ns in checks:
        attributes: dict[str, str] = {"verb": verb, "group": group, "resource": resource}
        if resource == "pods/exec":
            attributes = {
                "verb": verb,
                "group": group,
                "resource": "pods",
                "subresource": "exec",
                "namespace": name_or_ns,
            }
        elif name_or_ns:
            attributes["name"] = name_or_ns
        review = token.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            },
        )
        assert not review["status"].get("allowed"), json.dumps(attributes)
