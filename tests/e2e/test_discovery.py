"""Built-in GPU node discovery end to end: `helm install` alone finds a GPU node that NFD never labelled.

The chart is installed with its defaults (`nodeDiscovery: auto`) but no in-cluster operator; the
operator runs as a local process logged in as the chart's ServiceAccount. A fresh simulated node is
created like hack/gen_nodes.py makes them, minus every Node Feature Discovery label. kwok runs the
agent's DaemonSet pod on it without executing anything, so the agent's code runs here instead, as a
process for that node: logged in with a token bound to that pod (exactly what the kubelet would
mount into it, so the chart's RBAC and ValidatingAdmissionPolicy apply to every call) and reading a
fake sysfs directory. The tests run in file order on one release and one node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.discovery import FIELD_MANAGER, NFD_CRD
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import GPU_PRESENT, NFD_PREFIX, owned_label_keys
from gpu_operator.runtime.client import ApiError
from gpu_operator.runtime.sync_client import SyncKube
from hack import gen_nodes

from .kube_helpers import Cluster, client, list_pods, pod_is_ready, wait_for, wait_timeout
from .operator_process import OPERATOR, ROOT, OperatorProcess, helm, sa_kubeconfig

pytestmark = pytest.mark.e2e

NS = "gpu-operator-disc"
RELEASE = "disc"
FULLNAME = f"{RELEASE}-gpu-operator"
AGENT = f"{FULLNAME}-node-discovery"
POLICY = "discovery-policy"
CHART = ROOT / "charts" / "gpu-operator"
NODE = "gpu-node-disc-1"  # sorts after gpu-node-<n>: the first GPU node's OS picks the driver tag
VENDOR_ONLY = f"{NFD_PREFIX}pci-10de.present"
CLASS_0302 = f"{NFD_PREFIX}pci-0302_10de.present"
CLASS_0300 = f"{NFD_PREFIX}pci-0300_10de.present"
MANAGED = "app.kubernetes.io/managed-by=gpu-operator"
CONVERGE = wait_timeout(120.0)
"""Seconds a policy may take to converge: 120 under the instant profile, plus one operand start."""

# The fake sysfs: two H100s (3D controller), an RTX (VGA) and its HDMI audio function, a host bridge.
H100 = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200"}
GPUS = {
    "0000:3b:00.0": H100,
    "0000:86:00.0": H100,
    "0000:01:00.0": {"vendor": "0x10de", "device": "0x2684", "class": "0x030000"},
}
OTHER = {
    "0000:01:00.1": {"vendor": "0x10de", "device": "0x22ba", "class": "0x040300"},
    "0000:00:00.0": {"vendor": "0x8086", "device": "0x09a2", "class": "0x060000"},
}


def write_sysfs(root: Path, devices: dict[str, dict[str, str]]) -> None:
    """`root/bus/pci/devices/<address>/{vendor,device,class}` for exactly these devices."""
    folder = root / "bus" / "pci" / "devices"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.name not in devices:
            for file in old.iterdir():
                file.unlink()
            old.rmdir()
    for address, attributes in devices.items():
        (folder / address).mkdir(exist_ok=True)
        for name, value in attributes.items():
            (folder / address / name).write_text(value + "\n")


@dataclass
class Setup:
    operator: OperatorProcess
    sysfs: Path
    agent_kubeconfig: Path
    agent_log: Path
    agent: subprocess.Popen[bytes] | None = None


def core(cluster: Cluster) -> Any:
    return client.CoreV1Api(cluster.api)


def fresh_node(cluster: Cluster) -> dict[str, Any]:
    """hack/gen_nodes.py's tainted GPU node, renamed, without a single NFD label."""
    kubelet = core(cluster).list_node(limit=1).items[0].status.node_info.kubelet_version
    body: dict[str, Any] = gen_nodes.make_node("gpu", 1, kubelet)
    labels = {k: v for k, v in body["metadata"]["labels"].items() if not k.startswith(NFD_PREFIX)}
    body["metadata"].update(name=NODE, labels={**labels, "kubernetes.io/hostname": NODE})
    body["status"]["addresses"] = [
        {"type": "InternalIP", "address": "127.1.254.1"},
        {"type": "Hostname", "address": NODE},
    ]
    assert body["spec"]["taints"], "the agent must tolerate the GPU taint"
    return body


def node_labels(cluster: Cluster) -> dict[str, str]:
    return dict(core(cluster).read_node(NODE).metadata.labels or {})


def assert_label(cluster: Cluster, key: str, value: str | None) -> None:
    labels = node_labels(cluster)
    assert labels.get(key) == value, f"{key}={labels.get(key)}"


def gpu_nodes_before(cluster: Cluster) -> list[str]:
    """The cluster's own GPU nodes (NFD-labelled by hack/gen_nodes.py), not the test's."""
    nodes = core(cluster).list_node(label_selector=f"{VENDOR_ONLY}=true").items
    return [n.metadata.name for n in nodes if n.metadata.name != NODE]


def policy_status(cluster: Cluster) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(cluster.api)
    status: dict[str, Any] = custom.get_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", POLICY
    ).get("status", {})
    return status


def wait_policy_ready(cluster: Cluster, gpu_nodes: int) -> None:
    def ready() -> None:
        status = policy_status(cluster)
        assert status.get("state") == "ready" and status.get("gpuNodes") == gpu_nodes, json.dumps(status)[
            :2000
        ]

    wait_for(ready, timeout=CONVERGE, what=f"ClusterPolicy {POLICY} ready on {gpu_nodes} GPU nodes")


def start_agent(setup: Setup, mode: str = "builtin") -> None:
    """`builtin` by default: the local cluster runs NFD's master (the emulated GFD publishes through
    NodeFeature objects, hack/emulators/nfd.py) but no nfd-worker, so nobody else labels PCI devices;
    in `auto` mode the agent would rightly leave that to NFD (test_auto_mode_idles_while_nfd_is_installed)."""
    environ = {**os.environ, "KUBECONFIG": str(setup.agent_kubeconfig), "PYTHONUNBUFFERED": "1"}
    environ.pop("NODE_NAME", None)
    command = [
        str(OPERATOR),
        "discover",
        "--node-name",
        NODE,
        "--sysfs",
        str(setup.sysfs),
        "--rescan-seconds",
        "1",
        "--mode",
        mode,
    ]
    with setup.agent_log.open("ab") as log:
        setup.agent = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=ROOT)


def restart_agent(setup: Setup, mode: str) -> None:
    assert setup.agent is not None
    setup.agent.send_signal(signal.SIGTERM)
    assert setup.agent.wait(timeout=30) == 0
    start_agent(setup, mode)


def agent_log(setup: Setup) -> str:
    return setup.agent_log.read_text(errors="replace")


@pytest.fixture(scope="module")
def setup(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    if not cluster.local:
        pytest.skip("creates a simulated node: needs the local kwok cluster")
    folder = tmp_path_factory.mktemp("discovery")
    installed = node_created = False
    found: Setup | None = None
    try:
        helm(
            cluster,
            *("install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", "--wait"),
            *("--set", "operator.replicas=0", "--set", f"clusterPolicy.name={POLICY}"),
        )
        installed = True
        core(cluster).create_node(fresh_node(cluster))
        node_created = True

        def agent_pod() -> Any:
            pods = list_pods(cluster.api, NS, labels="app.kubernetes.io/component=node-discovery", node=NODE)
            assert pods and pod_is_ready(pods[0]), f"agent pods on {NODE}: {pods}"
            return pods[0]

        pod = wait_for(agent_pod, timeout=60, what=f"the agent's DaemonSet pod on {NODE}")
        operator = OperatorProcess(
            sa_kubeconfig(cluster, NS, FULLNAME, folder / "operator"),
            NS,
            folder / "operator.log",
            args=("--lease-name", FULLNAME),  # the Lease the chart's RBAC names: the release's fullname
        )
        found = Setup(
            operator=operator.start(),
            sysfs=folder / "sys",
            agent_kubeconfig=sa_kubeconfig(cluster, NS, AGENT, folder / "agent", bound_pod=pod),
            agent_log=folder / "agent.log",
        )
        yield found
    finally:
        if found is not None and found.agent is not None and found.agent.poll() is None:
            found.agent.kill()
        if installed:
            # kwok completes the pre-delete hook's Job without running it: run its script here (the
            # operator, still running, removes its node labels).
            environ = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
            command = [str(OPERATOR), "cleanup", "--policy", POLICY, "--timeout", "60"]
            subprocess.run(command, env=environ, check=False)
        if found is not None:
            found.operator.stop()
            print(found.operator.log()[-4000:])
            print(agent_log(found)[-4000:] if found.agent_log.exists() else "no agent log")
        if installed:
            helm(cluster, "uninstall", RELEASE, "--namespace", NS, "--wait")
        if node_created:
            core(cluster).delete_node(NODE)


# --- the tests, in order -------------------------------------------------------------------------


def test_without_nfd_labels_the_node_is_not_a_gpu_node(cluster: Cluster, setup: Setup) -> None:
    wait_policy_ready(cluster, gpu_nodes=len(gpu_nodes_before(cluster)))
    assert GPU_PRESENT not in node_labels(cluster)


def test_the_admission_policy_type_checks(cluster: Cluster, setup: Setup) -> None:
    """The API server type-checks the policy's CEL against the Node schema; a typo would show here."""
    admission: Any = client.AdmissionregistrationV1Api(cluster.api)

    def checked() -> Any:
        policy = admission.read_validating_admission_policy(AGENT)
        assert policy.status and policy.status.observed_generation == policy.metadata.generation, (
            policy.status
        )
        return policy.status.type_checking

    type_checking = wait_for(checked, timeout=30, what=f"ValidatingAdmissionPolicy {AGENT} type-checked")
    assert not (type_checking and type_checking.expression_warnings), type_checking


def test_the_agents_token_is_bound_to_its_node(cluster: Cluster, setup: Setup) -> None:
    """What the admission policy relies on: the pod-bound token names the pod's node."""
    api = SyncKube.connect(setup.agent_kubeconfig)
    try:
        review = api.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    finally:
        api.close()
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NS}:{AGENT}"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [NODE]


def test_the_agent_labels_its_node_and_the_policy_converges(cluster: Cluster, setup: Setup) -> None:
    # A value set by hand or by NFD is never overwritten nor taken over: here "false" on the VGA label.
    core(cluster).patch_node(NODE, {"metadata": {"labels": {CLASS_0300: "false"}}})
    write_sysfs(setup.sysfs, {**GPUS, **OTHER})
    start_agent(setup)

    def labelled() -> dict[str, str]:
        labels = node_labels(cluster)
        assert labels.get(VENDOR_ONLY) == labels.get(CLASS_0302) == "true", labels
        assert labels.get(GPU_PRESENT) == "true", "the operator has not taken the node as a GPU node yet"
        return labels

    labels = wait_for(labelled, timeout=CONVERGE, what=f"{NODE} labelled by the agent and the operator")
    assert labels[CLASS_0300] == "false"
    managed = json.loads(cluster.kubectl("get", "node", NODE, "-o", "json", "--show-managed-fields"))[
        "metadata"
    ]["managedFields"]
    assert owned_label_keys(managed, FIELD_MANAGER) == {VENDOR_ONLY, CLASS_0302}
    wait_policy_ready(cluster, gpu_nodes=len(gpu_nodes_before(cluster)) + 1)

    def operands_ready() -> None:
        pods = list_pods(cluster.api, NS, labels=MANAGED, node=NODE)
        components = {p.metadata.labels["app.kubernetes.io/component"] for p in pods if pod_is_ready(p)}
        assert {
            BY_NAME[c].component_label
            for c in ("driver", "container-toolkit", "device-plugin", "operator-validator")
        } <= components, components

    wait_for(operands_ready, timeout=CONVERGE, what=f"operands ready on {NODE}")
    assert "Traceback" not in agent_log(setup)


DENIED = [
    (
        "another node",
        "gpu-node-0",
        {"metadata": {"labels": {CLASS_0302: "true"}}},
        "may change only the node",
    ),
    (
        "another label",
        NODE,
        {"metadata": {"labels": {"nvidia.com/gpu.deploy.operands": "false"}}},
        "PCI labels",
    ),
    ("a PCI label to false", NODE, {"metadata": {"labels": {VENDOR_ONLY: "false"}}}, "PCI labels"),
    ("an annotation", NODE, {"metadata": {"annotations": {"example.com/a": "b"}}}, "only node labels"),
    (
        "a taint",
        NODE,
        {"spec": {"taints": [{"key": "example.com/a", "effect": "NoExecute"}]}},
        "only node labels",
    ),
    ("cordon", NODE, {"spec": {"unschedulable": True}}, "only node labels"),
]


@pytest.mark.parametrize(("what", "node", "patch", "message"), DENIED, ids=[d[0] for d in DENIED])
def test_the_agents_token_cannot_change_another_node_or_another_label(
    cluster: Cluster, setup: Setup, what: str, node: str, patch: dict[str, Any], message: str
) -> None:
    before = core(cluster).read_node(node)
    api = SyncKube.connect(setup.agent_kubeconfig)
    try:
        with pytest.raises(ApiError) as denied:
            api.request(
                "PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json"
            )
    finally:
        api.close()
    assert denied.value.status == 403, denied.value
    assert f"ValidatingAdmissionPolicy '{AGENT}'" in str(denied.value) and message in str(denied.value)
    # Nothing the patch named changed (the emulated host keeps writing its own annotations meanwhile).
    after = core(cluster).read_node(node)
    for field, keys in patch.get("metadata", {}).items():
        for key in keys:
            was, now = getattr(before.metadata, field) or {}, getattr(after.metadata, field) or {}
            assert now.get(key) == was.get(key), (field, key)
    assert (after.spec.taints, after.spec.unschedulable) == (before.spec.taints, before.spec.unschedulable)


def test_a_label_removed_by_hand_comes_back(cluster: Cluster, setup: Setup) -> None:
    """The agent watches its node: no rescan needed (the sysfs did not change)."""
    core(cluster).patch_node(NODE, {"metadata": {"labels": {CLASS_0302: None}}})
    wait_for(
        lambda: assert_label(cluster, CLASS_0302, "true"), timeout=60, what=f"{CLASS_0302} back on {NODE}"
    )


def nfd_crd() -> dict[str, Any]:
    """A stand-in for NFD's CRD: the agent looks only at whether it exists."""
    group, plural = NFD_CRD.split(".", 1)[1], NFD_CRD.split(".", 1)[0]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NFD_CRD},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": "nodefeature", "kind": "NodeFeature"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def test_auto_mode_idles_while_nfd_is_installed(cluster: Cluster, setup: Setup) -> None:
    extensions: Any = client.ApiextensionsV1Api(cluster.api)
    # NFD's CRD may be there already (the local cluster's emulated nfd-master): then it stays.
    installed = bool(
        extensions.list_custom_resource_definition(field_selector=f"metadata.name={NFD_CRD}").items
    )
    log_size = len(agent_log(setup))
    restart_agent(setup, "auto")
    if not installed:
        extensions.create_custom_resource_definition(nfd_crd())
    try:

        def idle() -> None:
            text = agent_log(setup)[log_size:]
            assert "idle: Node Feature Discovery is installed" in text, text[-1000:]

        wait_for(idle, timeout=60, what="the agent idle while NFD's CRD exists")
    finally:
        if not installed:
            extensions.delete_custom_resource_definition(NFD_CRD)
    if not installed:
        log_size = len(agent_log(setup))

        def resumed() -> None:
            assert "labels in place" in agent_log(setup)[log_size:], agent_log(setup)[-1000:]

        wait_for(resumed, timeout=60, what="the agent back at work once NFD's CRD is gone")
    restart_agent(setup, "builtin")


def test_a_node_whose_gpus_disappear_loses_the_label_and_its_operands(cluster: Cluster, setup: Setup) -> None:
    write_sysfs(setup.sysfs, OTHER)  # the NVIDIA audio function stays: it is not a GPU
    # What the device plugin sees too: the emulated host has no GPU any more, and its device plugin,
    # restarted as after the reboot that removed them, advertises none.
    core(cluster).patch_node(NODE, {"metadata": {"annotations": {"gpu-operator.sim/gpu-count": "0"}}})
    for pod in list_pods(cluster.api, NS, labels="app.kubernetes.io/component=device-plugin", node=NODE):
        core(cluster).delete_namespaced_pod(pod.metadata.name, NS)

    def gone() -> None:
        labels = node_labels(cluster)
        prefixes = ("nvidia.com/gpu.deploy.", GPU_PRESENT, NFD_PREFIX + "pci-")
        # Left alone: the "" marks k8s-driver-manager writes for components it found unset.
        ours = {k: v for k, v in labels.items() if k.startswith(prefixes) and v != ""}
        assert ours == {CLASS_0300: "false"}, ours
        pods = list_pods(cluster.api, NS, labels=MANAGED, node=NODE)
        assert not pods, [p.metadata.name for p in pods]

    wait_for(gone, timeout=CONVERGE, what=f"{NODE} without GPU labels and operands")
    wait_policy_ready(cluster, gpu_nodes=len(gpu_nodes_before(cluster)))


def test_the_agent_stops_on_sigterm_and_leaves_the_labels(cluster: Cluster, setup: Setup) -> None:
    write_sysfs(setup.sysfs, {**GPUS, **OTHER})
    wait_for(lambda: assert_label(cluster, CLASS_0302, "true"), timeout=60, what="the GPUs back")
    assert setup.agent is not None
    setup.agent.send_signal(signal.SIGTERM)
    assert setup.agent.wait(timeout=30) == 0
    log = agent_log(setup)
    assert "SIGTERM received" in log and "Traceback" not in log
    assert node_labels(cluster).get(CLASS_0302) == "true"
    # No RBAC or admission denial ever: the agent wrote only what it may.
    assert "Forbidden" not in log and "could not label" not in log, log[-3000:]
    setup.operator.assert_clean_log()
