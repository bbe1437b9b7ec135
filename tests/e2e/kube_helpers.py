"""Helpers for end-to-end tests: the cluster's client, waiting on conditions, reading pod state, failure
injection.

The client: the project's own (gpu_operator/runtime/client.py, blocking through
gpu_operator/runtime/sync_client.py's SyncKube), ``Cluster.api``. Where a test reads typed objects
(``pod.metadata.name``), :data:`client` is kubernetes_asyncio's ``client`` whose API classes take
that SyncKube and block until their answer (``client.CoreV1Api(cluster.api).list_node()``), on
the same connections: one client library, one transport.

Waiting: :func:`wait_for` calls a check until it passes. A check is a function that either
returns a value (done) or raises ``AssertionError`` whose message describes what it saw; on
timeout :class:`WaitTimeout` carries that last message, so a failing test shows the last
observed state instead of "timed out". No fixed sleeps: the interval is only the polling period.

Failure injection (local kwok cluster, or any cluster running kwok with ``--enable-crds=Stage``
and the stages of ``hack/kwok/stages.yaml``): :func:`inject_failure` creates a kwok ``Stage``
that matches pods by their ``app.kubernetes.io/component`` label and ``spec.nodeName``; kwok
then gives every such pod that starts *afterwards* the failure state instead of Running/Ready:

* ``CrashLoopBackOff``: phase Running, Ready=False, each container ``waiting.reason``
  CrashLoopBackOff, ``lastState.terminated`` exit code 1, ``restartCount`` 3 (or ``restarts``: a
  pod that has been crash-looping for a while), a Warning event ``BackOff``;
* ``ImagePullBackOff``: phase Pending, Ready=False, each container ``waiting.reason``
  ImagePullBackOff (message ``Back-off pulling image "<image>"``), ``restartCount`` 0.

Operand pods are run by the emulators (hack/emulators), whose containers then fail for real: a
crash-looping one starts at ``restartCount`` ``restarts`` and goes on restarting with the kubelet's
back-off for that count.

Pods that are already running are not changed (pass ``recreate=True`` to delete them so their
DaemonSet recreates them with the failure). :func:`clear_failure` deletes the Stage and, by
default, the failing pods, so the DaemonSet's replacement pods become Ready (a simulated pod does
not heal in place).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
from kubernetes_asyncio import client as async_client
from kubernetes_asyncio import utils
from kubernetes_asyncio import watch as async_watch
from kubernetes_asyncio.client import ApiException

from gpu_operator.runtime.client import Kube
from gpu_operator.runtime.sync_client import SyncKube
from hack.emulators.emulator import (  # the failure protocol: the emulators read what these write
    FAILURE_COMPONENT_LABEL,
    FAILURE_CONTAINER_ANNOTATION,
    FAILURE_LABEL,
    FAILURE_NODE_LABEL,
    FAILURE_REASON_LABEL,
    FAILURE_RESTARTS_ANNOTATION,
)
from hack.emulators.node import HOSTS_NAMESPACE
from hack.emulators.profile import STARTUP_DEFAULT, Profile, profile

T = TypeVar("T")

COMPONENT_LABEL = "app.kubernetes.io/component"
GPU_NODE_LABEL = "feature.node.kubernetes.io/pci-10de.present"
GPU_COUNT_ANNOTATION = "gpu-operator.sim/gpu-count"
GPU_MODEL_ANNOTATION = "gpu-operator.sim/gpu-model"
SIMULATED_NODE_LABEL = "gpu-operator.sim/simulated"
GPU_RESOURCE = "nvidia.com/gpu"

STAGE_GROUP = "kwok.x-k8s.io"
STAGE_VERSION = "v1alpha1"
STAGE_PLURAL = "stages"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Any weight > 0 beats pod-ready (weight 0): kwok never picks a weight-0 stage over a weighted one.
FAILURE_WEIGHT = 1000
CRASH_RESTART_COUNT = 3

FailureReason = Literal["CrashLoopBackOff", "ImagePullBackOff"]
FAILURE_REASONS: tuple[FailureReason, ...] = ("CrashLoopBackOff", "ImagePullBackOff")


class BlockingCall:
    """A method of one of kubernetes_asyncio's API classes that blocks until its answer, run on a
    SyncKube's event loop; `method` is the library's own (what :class:`Watch` streams)."""

    def __init__(self, kube: SyncKube, method: Callable[..., Any]) -> None:
        self.kube = kube
        self.method = method
        self.__doc__ = method.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        answer = self.method(*args, **kwargs)
        return self.kube.run(answer) if inspect.iscoroutine(answer) else answer


class Blocking:
    """One of kubernetes_asyncio's API classes (CoreV1Api, ...) over a SyncKube's client: each call
    blocks until its answer (typed models, ApiException)."""

    def __init__(self, kube: SyncKube, api: Any) -> None:
        self._kube = kube
        self._api = api

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._api, name)
        return BlockingCall(self._kube, found) if callable(found) else found


class Watch:
    """kubernetes_asyncio's ``watch.Watch``, blocking: ``stream(core.list_node, **kwargs)`` (a method
    of a :class:`Blocking` API) yields its events (``type``, typed ``object``, ``raw_object``) one at
    a time; after ``stop()`` it ends at the next. An ERROR event is an ApiException."""

    def __init__(self) -> None:
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    def stream(self, lister: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert isinstance(lister, BlockingCall), f"not a method of client.<Kind>Api(cluster.api): {lister}"
        kube = lister.kube

        async def start() -> Any:
            return async_watch.Watch().stream(lister.method, *args, **kwargs)

        events = kube.run(start())
        try:
            for event in kube.iterate(events):
                yield event
                if self._stop:
                    return
        finally:
            kube.run(events.close())


class _BlockingClient:
    """kubernetes_asyncio's ``client`` module, its API classes :class:`Blocking` over a SyncKube;
    models (``client.V1Namespace``) and ``client.ApiException`` are the module's own."""

    def __getattr__(self, name: str) -> Any:
        found = getattr(async_client, name)
        if isinstance(found, type) and name.endswith("Api"):
            return lambda kube: Blocking(kube, found(kube.kube.api))
        return found


client: Any = _BlockingClient()
"""``client.CoreV1Api(cluster.api)``: typed calls through the cluster's SyncKube (module docstring)."""


def follow_pods(
    api: Any,
    namespace: str,
    selector: str,
    record: Callable[[str, Any], None],
    ready: threading.Event,
    stop: threading.Event,
) -> None:
    """List the pods `selector` picks in `namespace` (each recorded as ADDED), set `ready`, then record
    every watch event (type, pod) until `stop` is set. Run on a thread of its own."""
    core = client.CoreV1Api(api)
    listed = core.list_namespaced_pod(namespace, label_selector=selector)
    for pod in listed.items:
        record("ADDED", pod)
    version = listed.metadata.resource_version
    ready.set()
    while not stop.is_set():
        watch = Watch()
        for event in watch.stream(
            core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version=version,
            timeout_seconds=5,
        ):
            version = event["object"].metadata.resource_version
            record(event["type"], event["object"])
            if stop.is_set():
                watch.stop()


def token_client(kube: SyncKube, token: str) -> SyncKube:
    """A client for `kube`'s API server (its address and CA) that logs in with a bearer token."""
    base = kube.kube.api.configuration

    async def make() -> Kube:
        configuration = async_client.Configuration()
        configuration.host = base.host
        configuration.ssl_ca_cert = base.ssl_ca_cert
        configuration.verify_ssl = base.verify_ssl
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return Kube(async_client.ApiClient(configuration))

    return SyncKube(make)


@dataclass(frozen=True)
class Cluster:
    """The cluster under test, as the ``cluster`` session fixture gives it."""

    kubeconfig: Path
    api: SyncKube
    kubectl_path: str
    # True when the tests started the local kwok cluster (or found it running) via make.
    local: bool
    # API server audit log of the local cluster; None for a cluster given by $KUBECONFIG.
    audit_log: Path | None

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """Run kubectl against this cluster; return stdout, raise with stderr on failure."""
        proc = subprocess.run(
            [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout


class WaitTimeout(AssertionError):
    """A condition was not met in time; the message ends with the last observed state."""


class FailureInjectionUnsupported(RuntimeError):
    """The cluster has no kwok Stage API (not the local kwok cluster)."""


# --- waiting ---------------------------------------------------------------------------------


def assert_true(value: Any) -> None:
    """For wait_for: a check that holds once `value` is truthy (a bare value never makes it wait)."""
    assert value, value


def wait_for(
    check: Callable[[], T],
    *,
    timeout: float = 60.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Call ``check`` until it returns; retry while it raises AssertionError or what the API server
    answers while it catches up: a 404 (a CRD established a moment ago, an object not created yet),
    a 429 or a 5xx (a new resource's storage still starting), or a dropped connection.

    Returns what ``check`` returned. Raises :class:`WaitTimeout` after ``timeout`` seconds with
    the last assertion message (the last observed state).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError as exc:
            last = str(exc) or repr(exc)
        except ApiException as exc:
            if not (exc.status in (404, 429) or (exc.status or 0) >= 500):
                raise
            last = f"{exc.status} {exc.reason}: {str(exc.body)[:200]}"
        except aiohttp.ClientConnectionError as exc:
            last = f"connection: {exc!r}"
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{what}: not met after {timeout:.0f}s; last observed: {last}")
        time.sleep(interval)


# --- how long the emulated images take -----------------------------------------------------

# What the rendered operand pods make a real node wait for (manifests/templates): the driver's
# startupProbe (initialDelaySeconds 60, periodSeconds 10), the longest readiness probe
# (dcgm-exporter's initialDelaySeconds 45), the init containers' `sleep 5` wait loops.
DRIVER_STARTUP_PROBE_S = 60.0
DRIVER_PROBE_PERIOD_S = 10.0
LONGEST_READINESS_DELAY_S = 45.0
INIT_POLL_S = 5.0
# Operands that wait on the one before (driver, toolkit, validator, device plugin, GFD/DCGM, exporter).
STACK_STAGES = 6


def emulator_profile() -> Profile:
    """The timing profile of the local cluster's emulators.

    ``SIM_PROFILE`` and ``SIM_TIME_SCALE`` are what ``make cluster-up`` passes to hack/cluster.sh,
    which restarts the emulators when they run with other ones (the conftest checks they match).
    """
    return profile(os.environ.get("SIM_PROFILE", "instant"), float(os.environ.get("SIM_TIME_SCALE", "1")))


def node_start_s(timing: Profile) -> float:
    """The longest the operand stack takes to come up on one node under ``timing`` (0 s-ish: instant).

    Each stage's worst start-up (mean + spread) and init-container poll, the driver's build and
    startup probe, the toolkit, a MIG change, the slowest readiness probe and one crash-loop back-off.
    """

    def worst(operand: str) -> float:
        mean, spread = timing.startup.get(operand, timing.startup[STARTUP_DEFAULT])
        return (mean + spread) * timing.scale

    return (
        worst("driver")
        + timing.probe_delay(DRIVER_STARTUP_PROBE_S + DRIVER_PROBE_PERIOD_S)
        + worst("toolkit")
        + worst("mig")
        + timing.probe_delay(LONGEST_READINESS_DELAY_S)
        + STACK_STAGES * (worst(STARTUP_DEFAULT) + timing.sleep_time(INIT_POLL_S))
        + timing.backoff(1)
        + sum(timing.termination) * timing.scale
    )


def wait_timeout(seconds: float, *, node_starts: int = 1) -> float:
    """A wait timeout: ``seconds`` (enough under the instant profile) plus ``node_starts`` times the
    emulators' worst operand-stack start on a node (:func:`node_start_s`; nodes start in parallel,
    so a rollout over every node is one, a rolling upgrade one per node it restarts in turn)."""
    return seconds + node_starts * node_start_s(emulator_profile())


# --- reading state ---------------------------------------------------------------------------


def pod_is_ready(pod: Any) -> bool:
    """Running, not being deleted, and condition Ready=True."""
    if pod.metadata.deletion_timestamp is not None or pod.status is None or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def waiting_reasons(pod: Any) -> list[str]:
    """The ``state.waiting.reason`` of every container that is waiting."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return [s.state.waiting.reason for s in statuses if s.state and s.state.waiting]


def describe_pod(pod: Any) -> str:
    """One line: name, node, phase, ready, waiting reasons and restart counts."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    restarts = [s.restart_count for s in statuses]
    return (
        f"{pod.metadata.namespace}/{pod.metadata.name} node={pod.spec.node_name} "
        f"phase={pod.status.phase if pod.status else None} ready={pod_is_ready(pod)} "
        f"waiting={waiting_reasons(pod)} restarts={restarts}"
        + (" deleting" if pod.metadata.deletion_timestamp else "")
    )


def describe_pods(pods: Iterable[Any]) -> str:
    return "; ".join(describe_pod(p) for p in pods) or "no pods"


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def daemonset_manifest(
    name: str, labels: dict[str, str], node_selector: dict[str, str], **pod_spec: Any
) -> dict[str, Any]:
    """A DaemonSet selecting `app=<name>`, its pods labelled `labels`, tolerating the GPU taint."""
    labels = {"app": name, **labels}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": node_selector, "tolerations": [GPU_TOLERATION], **pod_spec},
            },
        },
    }


def create_object(api: SyncKube, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create any object from its manifest (a dict), in ``namespace`` when it is namespaced."""
    try:
        api.run(utils.create_from_dict(api.kube.api, body, namespace=namespace or "default"))
    except utils.FailToCreateError as exc:  # an ApiException without the status of the one it wraps
        raise exc.api_exceptions[0] from None


def list_pods(api: SyncKube, namespace: str | None = None, *, labels: str = "", node: str = "") -> list[Any]:
    """Pods by label selector and node, in one namespace or all; deleted pods excluded."""
    core = client.CoreV1Api(api)
    fields = f"spec.nodeName={node}" if node else ""
    result: Any = (
        core.list_namespaced_pod(namespace, label_selector=labels, field_selector=fields)
        if namespace
        else core.list_pod_for_all_namespaces(label_selector=labels, field_selector=fields)
    )
    return [p for p in result.items if p.metadata.deletion_timestamp is None]


def node_gpus(api: SyncKube, node: str) -> tuple[str | None, str | None]:
    """(capacity, allocatable) of nvidia.com/gpu on the node; None where not advertised."""
    found: Any = client.CoreV1Api(api).read_node(node)
    status = found.status
    return (status.capacity or {}).get(GPU_RESOURCE), (status.allocatable or {}).get(GPU_RESOURCE)


def gpu_nodes(api: SyncKube) -> list[str]:
    """Names of the nodes labelled as having an NVIDIA PCI device, sorted."""
    nodes: list[Any] = client.CoreV1Api(api).list_node(label_selector=f"{GPU_NODE_LABEL}=true").items
    return sorted(str(n.metadata.name) for n in nodes)


def wait_for_daemonset(
    api: SyncKube,
    namespace: str,
    name: str,
    *,
    ready: int,
    desired: int | None = None,
    timeout: float = 60.0,
) -> Any:
    """Wait until the DaemonSet's controller observed its spec and counts ``ready`` ready pods.

    ``desired`` (default: ``ready``) is the expected desiredNumberScheduled; available and
    up-to-date pods must equal ``ready`` too.
    """
    apps = client.AppsV1Api(api)
    want_desired = ready if desired is None else desired

    def check() -> Any:
        ds: Any = apps.read_namespaced_daemon_set(name, namespace)
        st = ds.status
        seen = (
            f"observedGeneration={st.observed_generation}/{ds.metadata.generation} "
            f"desired={st.desired_number_scheduled} current={st.current_number_scheduled} "
            f"ready={st.number_ready} available={st.number_available or 0} "
            f"updated={st.updated_number_scheduled or 0} misscheduled={st.number_misscheduled}"
        )
        assert (st.observed_generation or 0) >= ds.metadata.generation, seen
        assert st.desired_number_scheduled == want_desired, seen
        assert st.number_ready == ready, seen
        assert (st.number_available or 0) == ready, seen
        assert (st.updated_number_scheduled or 0) == want_desired, seen
        return ds

    return wait_for(check, timeout=timeout, what=f"DaemonSet {namespace}/{name} ready={ready}")


# --- failure injection -----------------------------------------------------------------------

_CONTAINER_FILTER = """{{ $pod := .metadata.name }}
{{ $target := %s }}"""

_CRASH_LOOP_TEMPLATE = """{{ $now := Now }}
%s
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  reason: ContainersNotReady
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  reason: ContainersNotReady
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
{{ if or (eq $target "") (eq .name $target) }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: %d
  lastState:
    terminated:
      exitCode: 1
      reason: Error
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
  state:
    waiting:
      reason: CrashLoopBackOff
      message: {{ printf "back-off 40s restarting failed container=%%s pod=%%s" .name $pod | Quote }}
{{ else }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
%s
phase: Running
startTime: {{ $now | Quote }}
"""

_IMAGE_PULL_TEMPLATE = """{{ $now := Now }}
%s
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  reason: ContainersNotReady
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  reason: ContainersNotReady
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
{{ if or (eq $target "") (eq .name $target) }}
- image: {{ .image | Quote }}
  imageID: ""
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    waiting:
      reason: ImagePullBackOff
      message: {{ printf "Back-off pulling image %%q" .image | Quote }}
{{ else }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    waiting:
      reason: ContainerCreating
{{ end }}
{{ end }}
%s
phase: Pending
startTime: {{ $now | Quote }}
"""

# Addresses as kwok's pod-ready stage assigns them (node IP, pod IP from the kwok pod CIDR).
_POD_IPS = (
    "{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) "
    '( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}'
)
_ADDRESSES = (
    """{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
"""
    + _POD_IPS
    + """
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}"""
)


def _go_string(value: str) -> str:
    """A Go template string literal (JSON string syntax is valid Go syntax)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def failure_stage_name(component: str, node: str | None, reason: FailureReason) -> str:
    raw = f"gpu-operator-sim-{reason}-{component}-{node or 'all-nodes'}".lower()
    return re.sub(r"[^a-z0-9.-]", "-", raw)[:253]


def _failure_labels(component: str, node: str | None) -> dict[str, str]:
    return {
        FAILURE_LABEL: "true",
        FAILURE_COMPONENT_LABEL: component,
        FAILURE_NODE_LABEL: node or "all-nodes",
    }


def failure_stage(
    component: str,
    node: str | None,
    reason: FailureReason,
    container: str | None = None,
    restarts: int = CRASH_RESTART_COUNT,
) -> dict[str, Any]:
    """The kwok Stage that gives new pods of ``component`` on ``node`` (None: any node) ``reason``."""
    if reason not in FAILURE_REASONS:
        raise ValueError(f"reason must be one of {FAILURE_REASONS}, not {reason!r}")
    header = _CONTAINER_FILTER % _go_string(container or "")
    if reason == "CrashLoopBackOff":
        template = _CRASH_LOOP_TEMPLATE % (header, restarts, _ADDRESSES)
        event = {"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container"}
    else:
        template = _IMAGE_PULL_TEMPLATE % (header, _ADDRESSES)
        event = {"type": "Warning", "reason": "Failed", "message": "Error: ImagePullBackOff"}
    expressions: list[dict[str, Any]] = [
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
        # Operand pods are run by the emulators (hack/emulators), which read this Stage themselves
        # and make the pod's containers fail for real (restarts with back-off, a pull that never
        # succeeds); kwok gives the failure state to every other pod.
        {"key": f'.metadata.labels["{MANAGED_BY_LABEL}"]', "operator": "NotIn", "values": ["gpu-operator"]},
        # Only pods that kwok has not started yet, and never twice (the result stays Pending for
        # ImagePullBackOff, so also skip pods that already carry a waiting reason).
        {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
        {"key": ".status.containerStatuses.[].state.waiting.reason", "operator": "DoesNotExist"},
    ]
    if node:
        expressions.append({"key": ".spec.nodeName", "operator": "In", "values": [node]})
    else:
        expressions.append({"key": ".spec.nodeName", "operator": "Exists"})
    return {
        "apiVersion": f"{STAGE_GROUP}/{STAGE_VERSION}",
        "kind": "Stage",
        "metadata": {
            "name": failure_stage_name(component, node, reason),
            "labels": {**_failure_labels(component, node), FAILURE_REASON_LABEL: reason},
            # The emulators read these; kwok, the status template.
            "annotations": {
                FAILURE_CONTAINER_ANNOTATION: container or "",
                **({FAILURE_RESTARTS_ANNOTATION: str(restarts)} if reason == "CrashLoopBackOff" else {}),
            },
        },
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchLabels": {COMPONENT_LABEL: component}, "matchExpressions": expressions},
            "weight": FAILURE_WEIGHT,
            "next": {"event": event, "statusTemplate": template},
        },
    }


def _stages(api: SyncKube) -> Any:
    return client.CustomObjectsApi(api)


def failure_injection_supported(api: SyncKube) -> bool:
    """True when the cluster serves kwok's Stage API."""
    try:
        _stages(api).list_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, limit=1)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _delete_pods(api: SyncKube, component: str, node: str | None) -> list[str]:
    core = client.CoreV1Api(api)
    deleted = []
    for pod in list_pods(api, labels=f"{COMPONENT_LABEL}={component}", node=node or ""):
        try:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
            deleted.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
        except ApiException as exc:
            if exc.status != 404:
                raise
    return deleted


def inject_failure(
    api: SyncKube,
    component: str,
    node: str | None,
    reason: FailureReason = "CrashLoopBackOff",
    *,
    container: str | None = None,
    recreate: bool = False,
    restarts: int = CRASH_RESTART_COUNT,
) -> str:
    """Make pods of ``component`` on ``node`` fail with ``reason`` from now on.

    ``component`` is matched against the pod label ``app.kubernetes.io/component``; ``node``
    against ``spec.nodeName`` (None: every node). ``container`` limits the failure to one
    container (default: all); ``restarts`` is the crash-looping containers' ``restartCount``.
    Only pods that start after this call fail; ``recreate=True``
    deletes the matching pods now so their controller replaces them with failing ones.
    Replaces an earlier injection for the same component and node. Returns the Stage name.
    Raises :class:`FailureInjectionUnsupported` without the kwok Stage API.
    """
    if not failure_injection_supported(api):
        raise FailureInjectionUnsupported("this cluster has no kwok Stage API (kwok --enable-crds=Stage)")
    _delete_stages(api, component, node)
    body = failure_stage(component, node, reason, container, restarts)
    _stages(api).create_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, body)
    if recreate:
        _delete_pods(api, component, node)
    return str(body["metadata"]["name"])


def _delete_stages(api: SyncKube, component: str | None, node: str | None) -> set[tuple[str, str | None]]:
    """Deletes the matching failure Stages; the (component, node or None) they failed."""
    selector = f"{FAILURE_LABEL}=true"
    if component is not None:
        selector += f",{FAILURE_COMPONENT_LABEL}={component},{FAILURE_NODE_LABEL}={node or 'all-nodes'}"
    stages = _stages(api)
    found: Any = stages.list_cluster_custom_object(
        STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, label_selector=selector
    )
    failed: set[tuple[str, str | None]] = set()
    for item in found["items"]:
        try:
            stages.delete_cluster_custom_object(
                STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, item["metadata"]["name"]
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        labels = item["metadata"].get("labels") or {}
        where = labels.get(FAILURE_NODE_LABEL, "all-nodes")
        failed.add((labels.get(FAILURE_COMPONENT_LABEL, ""), None if where == "all-nodes" else where))
    return failed


def clear_failure(api: SyncKube, component: str, node: str | None, *, delete_pods: bool = True) -> list[str]:
    """Undo :func:`inject_failure` for ``component`` on ``node`` (None: the all-nodes injection).

    Pods that start from now on become Ready. A failing pod does not heal in place, so by
    default its pods of ``component`` on ``node`` are deleted for their DaemonSet to recreate;
    returns the deleted pods (namespace/name).
    """
    _delete_stages(api, component, node)
    return _delete_pods(api, component, node) if delete_pods else []


def clear_all_failures(api: SyncKube) -> None:
    """Delete every injected failure Stage and the pods it made fail (a failing pod does not heal in
    place; its controller recreates it healthy), so that a test that failed half-way leaves nothing
    failing behind for the next one. Safe without the Stage API."""
    if failure_injection_supported(api):
        for component, node in _delete_stages(api, None, None):
            if component:
                _delete_pods(api, component, node)


# --- the emulated nodes (hack/emulators) -----------------------------------------------------


SIM_PREFIX = "gpu-operator.sim/"
UNSCHEDULABLE = "spec.unschedulable"


def emulated_host(api: SyncKube, node: str) -> dict[str, str]:
    """The emulated host of a node: its hardware (the node's `gpu-operator.sim/...` annotations, prefix
    removed: `gpu-model`, `gpu-count`) and the emulators' mirror of its state (its ConfigMap in
    HOSTS_NAMESPACE, hack/emulators/node.py): `validations` (files in /run/nvidia/validations),
    `driver` (the loaded module), `mig`, `runtime-handlers`, `toolkit`, `host-files` (JSON)."""
    core = client.CoreV1Api(api)
    found: Any = core.read_node(node)
    annotations = found.metadata.annotations or {}
    host = {k.removeprefix(SIM_PREFIX): v for k, v in annotations.items() if k.startswith(SIM_PREFIX)}
    try:
        mirror: Any = core.read_namespaced_config_map(node, HOSTS_NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:  # none yet: nothing on the host has changed
            raise
    else:
        if any(o.uid == found.metadata.uid for o in mirror.metadata.owner_references or []):
            host.update(mirror.data or {})
    return host


class LabelHistory:
    """Every value a node's labels (and `spec.unschedulable`) took while recording (a watch in a
    thread), to check transitions a poll could miss, e.g. a deploy label paused and restored within a
    second."""

    def __init__(self, api: SyncKube, node: str, prefixes: tuple[str, ...] = ("nvidia.com/",)) -> None:
        import threading

        self.node = node
        self.values: dict[str, list[str | None]] = {}
        self._prefixes = prefixes
        self._stop = threading.Event()
        self._watch = Watch()
        self._api = client.CoreV1Api(api)
        listed: Any = self._api.list_node(field_selector=f"metadata.name={node}")
        self._record(listed.items[0])
        self._version = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _record(self, node: Any) -> None:
        labels = dict(node.metadata.labels or {})
        labels[UNSCHEDULABLE] = str(bool(node.spec.unschedulable)).lower()
        keys = {k for k in labels if k.startswith(self._prefixes)} | set(self.values) | {UNSCHEDULABLE}
        for key in keys:
            seen = self.values.setdefault(key, [])
            value = labels.get(key)
            if not seen or seen[-1] != value:
                seen.append(value)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                    self._api.list_node,
                    field_selector=f"metadata.name={self.node}",
                    resource_version=self._version,
                    timeout_seconds=30,
                ):
                    obj = event["object"]
                    self._version = obj.metadata.resource_version
                    self._record(obj)
                    if self._stop.is_set():
                        return
            except ApiException as exc:
                if exc.status != 410:
                    raise
                listed: Any = self._api.list_node(field_selector=f"metadata.name={self.node}")
                self._version = listed.metadata.resource_version
            except aiohttp.ClientError:
                # The API server ended the stream early ("Response payload is not completed", seen on
                # a loaded machine): watch again from the last version seen, so no change goes
                # unrecorded.
                continue

    def stop(self) -> dict[str, list[str | None]]:
        """Stop recording (again: a no-op) and return what was seen."""
        if self._stop.is_set():
            return self.values
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=35)
        return self.values
