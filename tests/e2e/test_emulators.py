"""The operand emulators on their own (hack/emulators), without the operator: pods labelled
``app.kubernetes.io/managed-by=gpu-operator`` run as NVIDIA's images would on a GPU node.

They need the emulators of the local kwok cluster and skip elsewhere.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from .kube_helpers import (
    GPU_RESOURCE,
    GPU_TOLERATION,
    SIMULATED_NODE_LABEL,
    clear_failure,
    client,
    create_object,
    daemonset_manifest,
    describe_pods,
    emulated_host,
    inject_failure,
    list_pods,
    node_gpus,
    pod_is_ready,
    wait_for,
)

MANAGED = {"app.kubernetes.io/managed-by": "gpu-operator"}
TOLERATION = GPU_TOLERATION
VALIDATIONS = {
    "name": "validations",
    "hostPath": {"path": "/run/nvidia/validations", "type": "DirectoryOrCreate"},
}
VALIDATIONS_MOUNT = {"name": "validations", "mountPath": "/run/nvidia/validations"}
TOOLKIT = "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
VALIDATOR = "nvcr.io/nvidia/gpu-operator:v26.7.0"
DRIVER = "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"


@pytest.fixture(scope="module")
def node(api: Any) -> str:
    """The last simulated GPU node (tests here leave its host as they found it)."""
    nodes = client.CoreV1Api(api).list_node(label_selector=f"{SIMULATED_NODE_LABEL}=true").items
    names: list[str] = [n.metadata.name for n in nodes if n.metadata.name.startswith("gpu-node-")]
    if not names:
        pytest.skip("needs the local kwok cluster and its emulators (hack/cluster.sh)")
    return max(names, key=lambda n: int(n.rsplit("-", 1)[1]))


def container(name: str, image: str, command: list[str], *args: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command, "args": list(args), **fields}


def sh(name: str, image: str, script: str, **fields: Any) -> dict[str, Any]:
    return container(name, image, ["sh", "-c"], script, **fields)


def operand(name: str, node: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A DaemonSet the emulators run (the operator's managed-by label), pinned to one node."""
    labels = {"app.kubernetes.io/component": name, **MANAGED}
    return daemonset_manifest(name, labels, {"kubernetes.io/hostname": node}, containers=containers, **spec)


def only_pod(api: Any, namespace: str, app: str) -> Any:
    pods = list_pods(api, namespace, labels=f"app={app}")
    assert len(pods) == 1, describe_pods(pods)
    return pods[0]


def ready_pod(api: Any, namespace: str, app: str) -> Any:
    pod = only_pod(api, namespace, app)
    assert pod_is_ready(pod), describe_pods([pod])
    return pod


def equal(seen: Any, want: Any) -> None:
    assert seen == want, seen


def test_gpu_pod_is_scheduled_once_a_device_plugin_is_ready(api: Any, namespace: str, node: str) -> None:
    """Driver, then device plugin: the kubelet advertises the plugin's GPUs and withdraws them."""
    core = client.CoreV1Api(api)

    def no_gpus() -> None:
        assert node_gpus(api, node)[0] in (None, "0"), node_gpus(api, node)

    # An earlier test's device plugin may still be terminating (its operator cleaned up just now).
    wait_for(no_gpus, timeout=60, what=f"{node} without a device plugin before the test")
    cuda = container("cuda", "example.invalid/cuda:1", [], resources={"limits": {GPU_RESOURCE: "1"}})
    consumer = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-consumer"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [TOLERATION],
            "containers": [cuda],
        },
    }
    create_object(api, consumer, namespace)

    def unschedulable() -> None:
        pod = core.read_namespaced_pod("gpu-consumer", namespace)
        cond = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        assert cond and cond[0].reason == "Unschedulable" and GPU_RESOURCE in (cond[0].message or ""), cond

    wait_for(unschedulable, timeout=30, what="GPU pod Unschedulable")
    run_nvidia = {"name": "run-nvidia", "hostPath": {"path": "/run/nvidia", "type": "DirectoryOrCreate"}}
    mount = [{"name": "run-nvidia", "mountPath": "/run/nvidia"}]
    driver = container("nvidia-driver-ctr", DRIVER, ["nvidia-driver"], "init", volumeMounts=mount)
    create_object(api, operand("e2e-driver", node, [driver], volumes=[run_nvidia]), namespace)
    driver_root = {"name": "driver-root", "hostPath": {"path": "/run/nvidia/driver"}}
    mount = [{"name": "driver-root", "mountPath": "/driver-root"}]
    plugin = container("nvidia-device-plugin", PLUGIN, ["nvidia-device-plugin"], volumeMounts=mount)
    create_object(api, operand("e2e-device-plugin", node, [plugin], volumes=[driver_root]), namespace)

    def scheduled() -> None:
        assert node_gpus(api, node) == ("8", "8"), node_gpus(api, node)
        pod = core.read_namespaced_pod("gpu-consumer", namespace)
        assert pod.spec.node_name == node and pod_is_ready(pod), describe_pods([pod])

    wait_for(scheduled, timeout=60, what=f"8 GPUs advertised on {node} and the GPU pod running")
    assert emulated_host(api, node).get("driver") == "595.91.07"
    client.AppsV1Api(api).delete_namespaced_daemon_set("e2e-device-plugin", namespace)
    wait_for(lambda: equal(node_gpus(api, node), ("0", "0")), timeout=30, what=f"{node} withdraws its GPUs")


def test_init_container_waits_for_its_status_file(api: Any, namespace: str, node: str) -> None:
    """`until [ -f FILE ]; do ...; sleep 5; done` completes once the node has FILE; preStop removes it."""
    name = f"e2e-{uuid.uuid4().hex[:8]}-ready"
    loop = f"until [ -f /run/nvidia/validations/{name} ]; do echo waiting; sleep 5; done"
    wait = sh("wait", VALIDATOR, loop, volumeMounts=[VALIDATIONS_MOUNT])
    main = sh("main", VALIDATOR, "echo ok; sleep infinity")
    create_object(
        api, operand("waiter", node, [main], initContainers=[wait], volumes=[VALIDATIONS]), namespace
    )

    def initialising() -> None:
        pod = only_pod(api, namespace, "waiter")
        init = pod.status.init_container_statuses or []
        assert pod.status.phase == "Pending" and init and init[0].state.running, describe_pods([pod])

    wait_for(initialising, timeout=30, what="pod shown Init:0/1")
    remove = {"exec": {"command": ["/bin/sh", "-c", f"rm -f /run/nvidia/validations/{name}"]}}
    touch = f"touch /run/nvidia/validations/{name}; sleep infinity"
    writer = sh("main", VALIDATOR, touch, volumeMounts=[VALIDATIONS_MOUNT], lifecycle={"preStop": remove})
    create_object(api, operand("writer", node, [writer], volumes=[VALIDATIONS]), namespace)
    wait_for(
        lambda: ready_pod(api, namespace, "waiter"), timeout=60, what="waiter Ready once the file exists"
    )

    def mirrored() -> None:
        assert name in emulated_host(api, node).get("validations", "").split(",")

    wait_for(mirrored, timeout=10, what="the file in the node's gpu-operator.sim/validations annotation")
    client.AppsV1Api(api).delete_namespaced_daemon_set("writer", namespace)

    def removed() -> None:
        assert name not in emulated_host(api, node).get("validations", "").split(",")

    wait_for(removed, timeout=30, what="preStop removed the file")


def terminated(pod: Any, name: str) -> Any:
    statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
    found = [s for s in statuses if s.name == name]
    assert found and found[0].restart_count >= 1 and found[0].last_state.terminated, describe_pods([pod])
    return found[0]


VALIDATOR_ENV = [
    {"name": "COMPONENT", "value": "driver"},
    {"name": "WITH_WAIT", "value": "true"},
    {"name": "OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]
FAILING = {
    # B2: the distroless toolkit image has /bin/sh, not /bin/bash.
    "bash": (
        container("toolkit", TOOLKIT, ["/bin/bash", "-c"], "/bin/entrypoint.sh"),
        128,
        'exec: "/bin/bash": stat /bin/bash: no such file or directory',
    ),
    # B6: GFD v0.20 publishes NodeFeatures and needs the node name.
    "gfd": (
        container("gfd", PLUGIN, ["gpu-feature-discovery"]),
        1,
        "failed to create label outputer: required flag node-name not set",
    ),
    # B3: the validator lists DaemonSets with the pod's ServiceAccount.
    "rbac": (
        sh("driver-validation", VALIDATOR, "nvidia-validator", env=VALIDATOR_ENV),
        1,
        "error checking if driver is managed by GPU Operator: error listing daemonsets: "
        "daemonsets.apps is forbidden",
    ),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_images_fail_as_the_real_images_do(api: Any, namespace: str, node: str, case: str) -> None:
    spec, exit_code, message = FAILING[case]
    create_object(api, operand(case, node, [spec]), namespace)

    def crash_looping() -> Any:
        pod = only_pod(api, namespace, case)
        status = terminated(pod, spec["name"])
        waiting = status.state.waiting
        assert waiting and waiting.reason == "CrashLoopBackOff", describe_pods([pod])
        return status

    status = wait_for(crash_looping, timeout=60, what=f"{case}: CrashLoopBackOff")
    assert status.last_state.terminated.exit_code == exit_code
    assert message in status.last_state.terminated.message, status.last_state.terminated.message
    if case == "rbac":
        assert f'User "system:serviceaccount:{namespace}:default"' in status.last_state.terminated.message


def test_missing_config_maps_block_the_pod_until_they_exist(api: Any, namespace: str, node: str) -> None:
    core = client.CoreV1Api(api)
    volume = {"name": "configs", "configMap": {"name": "e2e-configs"}}
    mount = [{"name": "configs", "mountPath": "/available-configs"}]
    create_object(api, operand("mounts", node, [sh("main", PLUGIN, "sleep infinity", volumeMounts=mount)],
                               volumes=[volume]), namespace)  # fmt: skip
    env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "e2e-env", "key": "x"}}}]
    create_object(api, operand("env", node, [sh("main", PLUGIN, "sleep infinity", env=env)]), namespace)

    def blocked() -> None:
        mounts, uses_env = only_pod(api, namespace, "mounts"), only_pod(api, namespace, "env")
        assert mounts.status.container_statuses and uses_env.status.container_statuses, "no status yet"
        waiting = mounts.status.container_statuses[0].state.waiting
        assert mounts.status.phase == "Pending" and waiting.reason == "ContainerCreating", describe_pods(
            [mounts]
        )
        selector = f"involvedObject.name={mounts.metadata.name}"
        messages = [e.message for e in core.list_namespaced_event(namespace, field_selector=selector).items]
        assert any('configmap "e2e-configs" not found' in m for m in messages), messages
        waiting = uses_env.status.container_statuses[0].state.waiting
        assert waiting.reason == "CreateContainerConfigError", describe_pods([uses_env])
        assert waiting.message == 'configmap "e2e-env" not found'

    wait_for(blocked, timeout=30, what="pods blocked on missing ConfigMaps")
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "e2e-configs"}, "data": {"a": "1"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "e2e-env"}, "data": {"x": "1"}})
    wait_for(
        lambda: ready_pod(api, namespace, "mounts"), timeout=60, what="pod with the ConfigMap volume starts"
    )
    wait_for(lambda: ready_pod(api, namespace, "env"), timeout=60, what="pod with the ConfigMap env starts")


def test_failure_injection_reaches_emulated_pods(api: Any, namespace: str, node: str, failures: None) -> None:
    component = f"e2e-{uuid.uuid4().hex[:6]}"
    inject_failure(api, component, node, "CrashLoopBackOff")
    main = sh("main", VALIDATOR, "sleep infinity")
    body = operand(component, node, [main])
    create_object(api, body, namespace)

    def crash_looping() -> Any:
        pod = only_pod(api, namespace, component)
        status = terminated(pod, "main")
        assert (
            status.state.waiting.reason == "CrashLoopBackOff" and status.last_state.terminated.exit_code == 1
        )
        return pod

    failing = wait_for(crash_looping, timeout=60, what="injected crash loop")
    assert not pod_is_ready(failing)
    clear_failure(api, component, node)

    def recovered() -> None:
        pod = only_pod(api, namespace, component)
        assert pod.metadata.uid != failing.metadata.uid and pod_is_ready(pod), describe_pods([pod])

    wait_for(recovered, timeout=60, what="replacement pod Ready")


def test_deleted_operand_pods_go_away(api: Any, namespace: str, node: str) -> None:
    main = sh("main", VALIDATOR, "sleep infinity")
    create_object(api, operand("doomed", node, [main]), namespace)
    pod = wait_for(lambda: ready_pod(api, namespace, "doomed"), timeout=30, what="pod Ready")
    client.CoreV1Api(api).delete_namespaced_pod(pod.metadata.name, namespace)

    def gone() -> None:
        try:
            found = client.CoreV1Api(api).read_namespaced_pod(pod.metadata.name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        raise AssertionError(describe_pods([found]))

    wait_for(gone, timeout=30, what="deleted pod removed by its (emulated) kubelet")
