"""What the upgrade state machine decides on: slim records of nodes, pods, driver DaemonSets and the
results of eviction requests, with their extraction from API bodies (pure functions, no I/O).

Everything the machine must remember between passes lives in these facts (node labels and
annotations), except eviction results, which the caller keeps in memory: an operator that restarts
simply asks for the evictions again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_operator.core.observed import pod_info

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""A pod that requests or limits one of these is a GPU pod (gpu-operator cmd/gpu-operator/main.go
gpuPodSpecFilter)."""
REVISION_LABEL = "controller-revision-hash"
CONFIG_DIGEST_ENV = "DRIVER_CONFIG_DIGEST"
"""Digest of everything that affects the installed driver: equal digests mean a pod-template change
needs only a driver pod restart, not a full upgrade (gpu-operator internal/predicates/restart_only.go)."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def parse_time(text: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp (as the API server writes them), None when absent or bad."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class UpgradeNode:
    """A GPU node as the state machine sees it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    """The NodeReady condition (a NotReady node counts as unavailable and is not started)."""
    validator_expected: bool = True
    """Whether an operator-validator pod runs on this node (not opted out by its deploy label)."""


def node_ready(body: Mapping[str, Any]) -> bool:
    """The node's NodeReady condition (True when it reports none)."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c.get("status") == "True" for c in conditions if c.get("type") == "Ready"), True)


def upgrade_node(body: Mapping[str, Any], validator_expected: bool = True) -> UpgradeNode:
    metadata = body.get("metadata") or {}
    return UpgradeNode(
        name=metadata["name"],
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        unschedulable=bool((body.get("spec") or {}).get("unschedulable")),
        ready=node_ready(body),
        validator_expected=validator_expected,
    )


def config_digest(pod_spec: Mapping[str, Any]) -> str:
    """DRIVER_CONFIG_DIGEST of a pod spec: init containers first, then containers (NVIDIA's order,
    internal/config/driver_config_digest.go DriverConfigDigestFromPodSpec)."""
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            for env in container.get("env") or []:
                if env.get("name") == CONFIG_DIGEST_ENV and env.get("value"):
                    return str(env["value"])
    return ""


def image_tag(image: str) -> str:
    name = image.split("@", 1)[0]
    return name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""


@dataclass(frozen=True)
class Revision:
    """A ControllerRevision of a driver DaemonSet, slim: its owner, number, hash, and what its pod
    template installs. The DaemonSet controller writes it once the DaemonSet's template changed; the
    target of an upgrade is read from the newest one, never from the DaemonSet itself, so the hash and
    the template it stands for always belong together (the DaemonSet's own watch event may arrive
    before or after the revision's)."""

    owner_uid: str
    number: int
    hash: str
    config_digest: str = ""
    version: str = ""


def controller_revision(body: Mapping[str, Any]) -> Revision | None:
    """The slim record of a DaemonSet's ControllerRevision (None when no DaemonSet owns it)."""
    metadata = body.get("metadata") or {}
    owner = _controller(metadata)
    if owner.get("kind", "DaemonSet") != "DaemonSet" or not owner.get("uid"):
        return None
    template = (((body.get("data") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = template.get("containers") or [{}]
    return Revision(
        owner_uid=str(owner["uid"]),
        number=int(body.get("revision") or 0),
        hash=str(
            (metadata.get("labels") or {}).get(REVISION_LABEL)
            or str(metadata.get("name", "")).removeprefix(f"{owner.get('name', '')}-")
        ),
        config_digest=config_digest(template),
        version=image_tag(str(containers[0].get("image") or "")),
    )


def current_revision(daemonset_uid: str, revisions: Iterable[Revision]) -> Revision | None:
    """The DaemonSet's newest ControllerRevision, as NVIDIA's PodManager
    GetDaemonsetControllerRevisionHash finds it (highest `revision` among those it owns)."""
    return max((r for r in revisions if r.owner_uid == daemonset_uid), key=lambda r: r.number, default=None)


@dataclass(frozen=True)
class DriverDaemonSet:
    """One driver DaemonSet (there is one per kernel with precompiled drivers) and its current revision."""

    name: str
    uid: str
    revision: str
    """controller-revision-hash of its newest ControllerRevision: what an up-to-date pod carries."""
    config_digest: str = ""
    version: str = ""
    """Image tag of the driver container (for status and Events)."""


def driver_daemonset(name: str, uid: str, revisions: Iterable[Revision]) -> DriverDaemonSet | None:
    """The DaemonSet at its newest revision; None while no revision of it is known (then nothing can be
    said about its pods being up to date, so none of its nodes is marked for an upgrade)."""
    newest = current_revision(uid, revisions)
    if newest is None or not newest.hash:
        return None
    return DriverDaemonSet(name, uid, newest.hash, newest.config_digest, newest.version)


def _controller(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ownerReference of the managing controller ({} for a bare pod)."""
    owners: list[Mapping[str, Any]] = metadata.get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), {})


@dataclass(frozen=True)
class DriverPod:
    name: str
    namespace: str
    uid: str
    node: str
    daemonset_uid: str
    """Owner DaemonSet ('' for an orphaned pod)."""
    revision: str
    config_digest: str = ""
    ready: bool = False
    terminating: bool = False
    restarts: int = 0
    """Highest restart count of a container that is not ready (NVIDIA's crash-loop test)."""
    reason: str = ""
    message: str = ""
    created: float = 0.0
    app: str = ""
    """Its `app` label: the selector of the DaemonSet that created it, which adopts it again when it is
    orphaned (core/driver_pool_plan.py pod_owners)."""


def driver_pod(body: Mapping[str, Any]) -> DriverPod | None:
    info = pod_info(body)
    if info is None:
        return None
    metadata = body.get("metadata") or {}
    status = body.get("status") or {}
    owner = _controller(metadata)
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return DriverPod(
        name=info.name,
        namespace=metadata.get("namespace", ""),
        uid=metadata.get("uid", ""),
        node=info.node,
        daemonset_uid=owner.get("uid", "") if owner.get("kind") == "DaemonSet" else "",
        revision=(metadata.get("labels") or {}).get(REVISION_LABEL, ""),
        config_digest=config_digest(body.get("spec") or {}),
        ready=info.ready,
        terminating=info.terminating,
        restarts=max((int(s.get("restartCount") or 0) for s in statuses if not s.get("ready")), default=0),
        reason=info.reason,
        message=info.message,
        created=parse_time(info.created) or 0.0,
        app=(metadata.get("labels") or {}).get("app", ""),
    )


@dataclass(frozen=True)
class ValidatorPod:
    """The operator-validator pod on a node: the validation gate's evidence."""

    name: str
    node: str
    ready: bool
    created: float
    reason: str = ""
    terminating: bool = False
    namespace: str = ""
    uid: str = ""
    """Where and which it is: the gate deletes a validator pod that validated the previous driver."""


def validator_pod(body: Mapping[str, Any]) -> ValidatorPod | None:
    info = pod_info(body)
    if info is None:
        return None
    metadata = body.get("metadata") or {}
    created = parse_time(info.created) or 0.0
    return ValidatorPod(
        info.name,
        info.node,
        info.ready,
        created,
        info.reason,
        info.terminating,
        metadata.get("namespace", ""),
        metadata.get("uid", ""),
    )


@dataclass(frozen=True)
class WorkloadPod:
    """Any other pod on a GPU node: candidates for waitForCompletion, GPU pod eviction and drain."""

    namespace: str
    name: str
    uid: str
    node: str
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = "Running"
    gpu: bool = False
    controller_kind: str = ""
    """Kind of the managing controller ('' for a bare pod, which only `force` may delete)."""
    empty_dir: bool = False
    terminating: bool = False
    mirror: bool = False
    claims: bool = False
    """It names ResourceClaims (DRA): core/gpu_pods.py counts it on the DRA driver's side."""

    @property
    def active(self) -> bool:
        return self.phase not in ("Succeeded", "Failed")

    @property
    def evictable(self) -> bool:
        """kubectl drain's rule: DaemonSet pods come back at once and mirror pods cannot be evicted."""
        return self.active and self.controller_kind != "DaemonSet" and not self.mirror

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _uses_gpu(spec: Mapping[str, Any]) -> bool:
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            if any(str(k).startswith(GPU_RESOURCE_PREFIXES) for k in resources.get(section) or {}):
                return True
    return False


def workload_pod(body: Mapping[str, Any]) -> WorkloadPod | None:
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if not spec.get("nodeName"):
        return None
    controller = _controller(metadata)
    return WorkloadPod(
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        node=spec["nodeName"],
        labels=dict(metadata.get("labels") or {}),
        phase=(body.get("status") or {}).get("phase") or "Pending",
        gpu=_uses_gpu(spec),
        controller_kind=controller.get("kind", ""),
        empty_dir=any("emptyDir" in v for v in spec.get("volumes") or []),
        terminating=bool(metadata.get("deletionTimestamp")),
        mirror=MIRROR_ANNOTATION in (metadata.get("annotations") or {}),
        claims=bool(spec.get("resourceClaims")),
    )


@dataclass(frozen=True)
class EvictionResult:
    """What the API server answered to our last Eviction POST for a pod."""

    status: int
    """HTTP status: 201 accepted, 429 refused (a PodDisruptionBudget), 404 gone, 500 several PDBs, ..."""
    message: str
    at: float
    """When it answered (Unix seconds); a refused eviction is asked again EVICTION_RETRY_SECONDS later."""

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class Facts:
    """One consistent snapshot of the cluster for one pass."""

    nodes: Sequence[UpgradeNode]
    """The GPU nodes (those without a driver pod only get NVIDIA's auto-upgrade annotation)."""
    driver_daemonsets: Sequence[DriverDaemonSet] = ()
    driver_pods: Sequence[DriverPod] = ()
    validator_pods: Sequence[ValidatorPod] = ()
    pods: Sequence[WorkloadPod] = ()
    pods_known: frozenset[str] | None = None
    """The nodes whose pods `pods` lists completely (None: every node's). Pods are looked up only for the
    nodes being emptied, so a node that has just started waits for its list rather than taking an
    unknown list for an empty one."""
    evictions: Mapping[str, EvictionResult] = field(default_factory=dict)
    """Results of our eviction requests, by pod UID."""
    now: float = 0.0
    """Unix seconds."""
    orphans: Mapping[str, str] = field(default_factory=dict)
    """The nodes whose orphaned driver pod (its DaemonSet gone) this upgrade replaces → the
    DRIVER_CONFIG_DIGEST of the DaemonSet that replaces it ("" when unknown): an NVIDIADriver pool taking
    over from the ClusterPolicy's driver (NVIDIA's labelNodesWithOrphanedDriverPods,
    core/driver_pool_upgrade.py). Elsewhere an orphaned driver pod needs no upgrade (NVIDIA's
    ProcessDoneOrUnknownNodes)."""
