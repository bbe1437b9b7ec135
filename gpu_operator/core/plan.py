"""The pure core: (ClusterPolicies, observed cluster) → what to apply, delete and label, and the status.

Nothing here does I/O, so every decision is unit-tested without a cluster. The reconciler feeds it
the watch caches and carries out the result.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from gpu_operator.api import GROUP, KIND, VERSION, FieldError, PolicyError, parse_spec
from gpu_operator.api.nvidiadriver import OWNER_LABEL
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import (
    REASON_CONFLICT,
    REASON_RECONCILE_FAILED,
    ClusterPolicyStatus,
    DriverUpgradeStatus,
)
from gpu_operator.core.allocators import AllocatorSplit
from gpu_operator.core.caches import Caches
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.driver_pool_counts import PoolCounts, pool_counts
from gpu_operator.core.driver_pool_plan import PolicyDriver, Pools, is_on, plan_pools, pod_owners
from gpu_operator.core.driver_pool_status import (
    DriverEvent,
    conflict_events,
    driver_status_body,
    driver_status_differs,
    driver_statuses,
)
from gpu_operator.core.driver_pool_upgrade import combined, merged, plan_pool_upgrades
from gpu_operator.core.driver_upgrade import driver_rolling, plan_driver_upgrade, with_upgrade_status
from gpu_operator.core.gpucluster_plan import DRAPlan, plan_gpuclusters, without_policy
from gpu_operator.core.node_labels import (
    DRIVER_PAUSE,
    NodeInfo,
    cluster_facts,
    desired_labels,
    driver_manager_repauses,
    gpu_nodes,
    other_stack_removals,
    released_labels,
    uninstall_removals,
)
from gpu_operator.core.observed import (
    DaemonSetInfo,
    DriverRef,
    GPUClusterRef,
    ObjectInfo,
    ObjectKey,
    PodInfo,
    PolicyRef,
    component_of,
    config_map_keys,
    created_by_us,
    object_key,
)
from gpu_operator.core.ownership import HASH_ANNOTATION, content_hash, owned
from gpu_operator.core.psa import NamespaceInfo, NamespaceWrite, namespace_write
from gpu_operator.core.render import ClusterFacts, missing_inputs, render
from gpu_operator.core.status import (
    NO_OPERANDS,
    Event,
    Note,
    Operands,
    Signature,
    events_for,
    ignored_status,
    invalid_status,
    operands_by_node,
    pods_by_node,
    policy_status,
    present,
    progress_only,
    readiness,
    started,
    status_body,
    status_differs,
    with_errors,
    with_problems,
)
from gpu_operator.core.upgrade import Facts, UpgradePlan
from gpu_operator.core.upgrade.facts import parse_time
from gpu_operator.core.vetting import Context, Problems
from gpu_operator.core.workloads import WORKLOAD_LABEL, invalid_label

__all__ = [
    "Observed",
    "Plan",
    "PolicyRef",
    "build",
    "conclude",
    "content_hash",
    "pods_by_node",
    "status_differs",
]

POLICY_CRD = f"clusterpolicies.{GROUP}"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
NVIDIA_DRIVER_CRD = f"nvidiadrivers.{GROUP}"
GPUCLUSTER_CRD = f"gpuclusters.{GROUP}"
"""The Prometheus operator's CRD: ServiceMonitors are rendered only while it is established."""


def active_policy(policies: Iterable[PolicyRef]) -> PolicyRef | None:
    """NVIDIA's singleton rule: the oldest ClusterPolicy is active; ties go to the lowest name."""
    return min(policies, key=lambda p: (p.created, p.name), default=None)


@dataclass(frozen=True)
class Observed:
    policies: tuple[PolicyRef, ...]
    nodes: Mapping[str, NodeInfo]
    pods: Iterable[PodInfo]
    daemonsets: Mapping[str, DaemonSetInfo]
    """By DaemonSet name (a component may have several: one per runtime, one per kernel)."""
    objects: Mapping[ObjectKey, ObjectInfo]
    namespace: str
    environ: Mapping[str, str] = field(default_factory=dict)
    nvidia_driver_crd: bool = False
    config_maps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """ConfigMap name → keys, in the operand namespace."""
    service_monitor_crd: bool = False
    """Whether the Prometheus operator's ServiceMonitor CRD is installed and established."""
    operand_namespace: NamespaceInfo | None = None
    """The operand namespace as watched (None: not seen, e.g. not created yet)."""
    speaking: Mapping[tuple[str, str], PodInfo] | None = None
    """pods_by_node(pods), when the Store kept it (None: computed from `pods`)."""
    operands: Mapping[str, Operands] | None = None
    """operands_by_node(speaking), when the Store kept it (None: computed)."""
    drivers: tuple[DriverRef, ...] = ()
    """The NVIDIADriver objects (none while their CRD is absent)."""
    driver_daemonsets: Mapping[str, str] = field(default_factory=dict)
    """Driver DaemonSet UID → name (whose pod is a driver pod: core/driver_pool_plan.py)."""
    upgrade: Facts = field(default_factory=lambda: Facts(nodes=()))
    """The driver upgrade's facts but nodes and time: driver and validator pods, driver DaemonSets at
    their revision, the pods of the nodes being emptied, and the answers to our evictions."""
    gpuclusters: tuple[GPUClusterRef, ...] = ()
    """The GPUCluster objects (none while their CRD is absent): the DRA stack (core/gpucluster_plan.py)."""


LabelRewrites = dict[str, tuple[str, str | None]]
"""Label → (the value it must still have, its new value or None to remove it)."""
Rewrites = dict[str, LabelRewrites]


@dataclass
class Plan:
    active: PolicyRef | None
    spec: ClusterPolicySpec | None
    errors: list[FieldError]
    objects: list[dict[str, Any]]
    """Desired objects, in dependency order, owner-referenced and hash-annotated."""
    deletes: list[ObjectKey]
    node_labels: dict[str, dict[str, str]]
    """Nodes whose operator-owned labels must change → the complete set to own."""
    statuses: dict[str, ClusterPolicyStatus]
    """Policy name → the status it should have before the writes (`conclude` gives the final one)."""
    notes: list[Note]
    """Remarks about the active policy (unsupported sections, NVIDIADriver CRD, skipped objects)."""
    label_rewrites: Rewrites = field(default_factory=dict)
    """Nodes → labels to change explicitly, each → (the value it must still have, its new value or None
    to remove it), after the node's apply if it is in `node_labels` too: shared deploy labels to
    remove, and with no active policy the operand managers' (node_labels.uninstall_removals); pauses
    written again for k8s-driver-manager (node_labels.driver_manager_repauses)."""
    namespace_write: NamespaceWrite | None = None
    """The operand namespace's pod-security labels to change (psa.enabled)."""
    gpu_nodes: int = 0
    """Nodes detected as GPU nodes (the metrics' gpu_operator_gpu_nodes_total)."""
    upgrade: UpgradePlan | None = None
    """The driver upgrade's writes, Events, status and wake-up (None: no valid active policy)."""
    problems: Problems | None = None
    """Why the active policy's current generation is not written (None: nothing stops it)."""
    running: int | None = None
    """The generation whose objects and labels this plan keeps: the current one, the last one written
    when the current cannot be, None when neither is known (then the plan writes nothing)."""
    missing_inputs: tuple[FieldError, ...] = ()
    """Inputs a component lacks (its DaemonSet is withheld): they refuse any change."""
    driver_status_writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """NVIDIADriver name → the status body to write, for those that differ from the cluster's
    (core/driver_pool_status.py)."""
    driver_events: dict[str, tuple[DriverEvent, ...]] = field(default_factory=dict)
    """NVIDIADriver name → the Events to post once its status write went through (a conflict it
    entered: driver_pool_status.conflict_events)."""
    driver_pools: dict[str, PoolCounts] = field(default_factory=dict)
    """NVIDIADriver name → its state and nodes, for the metrics (core/driver_pool_counts.py)."""
    orphans: frozenset[ObjectKey] = frozenset()
    """The `deletes` that leave their pods running: the ClusterPolicy's driver DaemonSets when the
    NVIDIADriver pools take over, whose orphaned pods each pool's upgrade replaces
    (core/driver_pool_plan.py)."""
    dra: DRAPlan | None = None
    """The GPUClusters' part (core/gpucluster_plan.py); None without a GPUCluster."""

    def propagation(self, key: ObjectKey) -> str:
        """The propagationPolicy of a delete: Orphan for `orphans`, Foreground for the claim-holding
        DaemonSets of a GPUCluster being deleted (each stays until its pods are gone), Background for
        every other (the garbage collector deletes its dependents)."""
        if key in self.orphans:
            return "Orphan"
        if self.dra is not None and key in self.dra.foreground:
            return "Foreground"
        return "Background"

    @property
    def nodes_rolling_out(self) -> int:
        """The GPU nodes an enabled component (or an NVIDIADriver's pool) is not ready on yet, counted
        for the one with the most: the nodes whose changes the next passes still plan. A settled
        cluster has none, so a node that joins it is the one thing its passes plan again."""
        status = self.statuses.get(self.active.name) if self.active is not None else None
        behind = [c.nodesDesired - c.nodesReady for c in status.components if c.enabled] if status else []
        behind += [p.nodes_desired - p.nodes_ready for p in self.driver_pools.values()]
        return max(behind, default=0)

    @property
    def pods_needed(self) -> frozenset[str]:
        """The nodes whose pods the next pass needs: the driver upgrade's and the allocator moves'."""
        upgrade = self.upgrade.pods_needed if self.upgrade is not None else frozenset()
        return upgrade | (self.dra.pods_needed if self.dra is not None else frozenset())


@dataclass(frozen=True)
class Applied:
    """What our own last apply of an object returned: later differences are someone else's edits."""

    hash: str
    generation: int
    resource_version: str


def to_write(
    plan: Plan, objects: Mapping[ObjectKey, ObjectInfo], applied: Mapping[ObjectKey, Applied]
) -> list[dict[str, Any]]:
    """The plan's objects that need an apply (see in_sync): the change of this pass."""
    return [
        o
        for o in plan.objects
        if not in_sync(
            o["metadata"]["annotations"][HASH_ANNOTATION], objects.get(key := object_key(o)), applied.get(key)
        )
    ]


def vetting_context(plan: Plan, observed: Observed) -> Context | None:
    """What judging this plan's change needs of it (None: the plan writes nothing)."""
    if plan.active is None or plan.spec is None:
        return None
    return Context(
        policy=plan.active.name,
        policy_uid=plan.active.uid,
        policy_uids=frozenset(p.uid for p in observed.policies),
        spec=plan.spec,
        namespace=observed.namespace,
        cached=observed.objects,
        # The plan's own ConfigMaps (the operands' scripts) are written with the change or there already.
        config_maps={
            **observed.config_maps,
            **{o["metadata"]["name"]: config_map_keys(o) for o in plan.objects if o["kind"] == "ConfigMap"},
        },
        missing_inputs=plan.missing_inputs,
    )


def unlisted_pods(observed: Observed, plan: Plan) -> frozenset[str]:
    """The nodes whose pods the plan's driver upgrade needs (nodes to empty) and the watches have not
    listed yet: with them listed, a pass planned again takes those nodes as far as they go in one
    pass instead of stopping at the cordon."""
    known = observed.upgrade.pods_known
    if known is None:
        return frozenset()
    return plan.pods_needed - known


def in_sync(desired_hash: str, observed: ObjectInfo | None, applied: Applied | None) -> bool:
    """Whether an object needs no apply: present, at our desired content, and untouched since our apply.

    Objects with a spec generation (DaemonSets) count as edited when the generation moves; others
    (ConfigMaps, RBAC, ...) when the resourceVersion moves. Status updates by controllers move neither.
    """
    if observed is None or observed.applied_hash != desired_hash or applied is None:
        return False
    if applied.hash != desired_hash:
        return False
    if applied.generation:
        return observed.generation == applied.generation
    return observed.resource_version == applied.resource_version


@dataclass(frozen=True)
class Good:
    """The last generation of the active policy whose change was proven and fully written: what the
    operands run. A generation that cannot be written leaves the cluster on it (objects and node
    labels, so that a GPU node joining meanwhile still gets the running stack)."""

    uid: str
    generation: int
    spec: Mapping[str, Any]


def build(
    observed: Observed,
    now: str,
    good: Good | None = None,
    problems: Problems | None = None,
    clock: float | None = None,
    *,
    caches: Caches | None = None,
) -> Plan:
    """The plan of a pass. `problems`: why the active policy's current generation cannot be written
    (found by proving its change, gpu_operator/core/vetting.py); then, as for a spec the models refuse,
    the plan runs `good` (the last generation written) if there is one, else changes nothing.
    `clock`: `now` in Unix seconds (the driver upgrade's timeouts), by default `now`'s. `caches`: what
    earlier passes kept (gpu_operator/core/caches.py), so that this one plans again only what changed;
    None: a new one, for a single pass (the CLI, most tests)."""
    if caches is None:
        caches = Caches()
    policies = observed.policies
    active = active_policy(policies)
    statuses: dict[str, ClusterPolicyStatus] = {}
    for other in policies:
        if active is not None and other.name != active.name:
            statuses[other.name] = ignored_status(other, active, observed.namespace, now)
    pods = observed.speaking if observed.speaking is not None else pods_by_node(observed.pods)
    operands = observed.operands if observed.operands is not None else operands_by_node(pods)
    nodes = list(observed.nodes.values())
    count = len(gpu_nodes(nodes))
    if active is None:
        # Uninstalled (or not installed yet): every label of ours goes, and the operand managers' too.
        labels = _label_changes(caches, nodes, None, pods, operands)
        releases = _uninstall_releases(observed.nodes, labels)
        psa = namespace_write(observed.operand_namespace, enabled=False)
        uids = {p.uid for p in policies}
        deletes = sorted(k for k, info in observed.objects.items() if created_by_us(info, None, uids))
        writes, told, driver_pools = _driver_status_writes(observed, None, None, now, {})
        dra = without_policy(observed.gpuclusters, observed.namespace, now) if observed.gpuclusters else None
        return Plan(
            None,
            None,
            [],
            [],
            deletes,
            labels,
            statuses,
            [],
            releases,
            psa,
            count,
            driver_status_writes=writes,
            driver_events=told,
            driver_pools=driver_pools,
            dra=dra,
        )
    try:
        current: ClusterPolicySpec | None = _parsed(caches, active.spec)
    except PolicyError as exc:
        current, problems = None, Problems(invalid=tuple(exc.errors))
    # The spec that runs (None: leave everything as it is), its source and generation.
    running: int | None = active.generation
    source, spec = active.spec, current
    if problems:
        if good is not None and good.uid == active.uid and good.spec != active.spec:
            running, source, spec = good.generation, good.spec, _parsed(caches, good.spec)
        else:
            running, spec = None, None
    shown = spec or current
    if shown is None:
        statuses[active.name] = invalid_status(active, problems or Problems(), observed.namespace, now)
        return Plan(
            active,
            None,
            list(problems.invalid if problems else ()),
            [],
            [],
            {},
            statuses,
            [],
            gpu_nodes=count,
            problems=problems,
        )

    facts = cluster_facts(nodes, observed.namespace, observed.environ, shown.operator.defaultRuntime)
    # Only the ConfigMaps the policy names, so that other ConfigMap changes do not re-render.
    named = {name for c in COMPONENTS for _, name in c.config_maps(shown)}
    facts = replace(
        facts,
        config_maps={n: k for n, k in observed.config_maps.items() if n in named},
        service_monitor_crd=observed.service_monitor_crd,
    )
    objects = _rendered(caches, replace(active, spec=source), shown, facts)
    policy_uids = frozenset(p.uid for p in policies)
    owners = pod_owners(
        observed.upgrade.driver_pods,
        observed.driver_daemonsets,
        observed.objects,
        observed.drivers,
        policy_uids,
        {o["spec"]["selector"]["matchLabels"]["app"] for o in objects if _policy_driver(o)},
    )
    on = is_on(shown, observed.nvidia_driver_crd)
    pools = plan_pools(
        on,
        observed.drivers,
        observed.nodes,
        owners,
        observed.objects,
        policy_uids,
        facts,
        shown.hostPaths.rootFS,
        caches,
    )
    if pools.policy_driver is not PolicyDriver.DEPLOY:
        objects = [o for o in objects if not _policy_driver(o)]
    if pools.objects:
        objects = [*objects, *pools.objects]
    dra = None
    if observed.gpuclusters:
        namespace = observed.operand_namespace
        dra = plan_gpuclusters(
            observed.gpuclusters,
            nodes,
            shown,
            facts,
            observed.daemonsets,
            observed.objects,
            observed.upgrade.pods,
            observed.upgrade.pods_known,
            namespace is not None and namespace.admin_access,
            now,
            caches,
        )
        objects = [*objects, *dra.objects]
    missing = {
        c.name: found for c in COMPONENTS if c.enabled(shown) and (found := missing_inputs(c, shown, facts))
    }
    notes = _notes(shown, observed.nvidia_driver_crd, pools) + _workload_notes(shown, nodes)
    if (
        not observed.service_monitor_crd
        and shown.dcgmExporter.is_enabled()
        and shown.dcgmExporter.service_monitor_enabled()
    ):
        # NVIDIA's rule (object_controls.go:5060): no Prometheus operator, no ServiceMonitor (the
        # renderer leaves it out), and the exporter is still ready. Created at the next pass once the
        # CRD is established.
        notes.append(Note(SERVICE_MONITOR_SKIPPED, "ServiceMonitorSkipped"))
    wanted = {object_key(o) for o in objects}
    # A DaemonSet withheld for a missing input stays as it is (NVIDIA's behaviour): deleting the
    # driver's would unload the driver under running GPU workloads.
    kept = {
        key for key, info in observed.objects.items() if key[1] == "DaemonSet" and info.component in missing
    } | pools.kept
    if dra is not None:
        # Left out until the namespace has its admin-access label again: not deleted meanwhile.
        kept |= dra.withheld
    # Only what the operator created goes, never an object because it carries our labels; one already
    # going is not deleted again (another propagationPolicy would change what becomes of its pods).
    deletes = sorted(
        key
        for key, info in observed.objects.items()
        if key not in wanted
        and key not in kept
        and not info.deleting
        and created_by_us(info, active.uid, policy_uids)
    )
    labels = _label_changes(
        caches, nodes, shown, pods, operands, pools.owner_labels, dra.split if dra is not None else None
    )
    # Status reflects the labels as they will be once this plan is carried out.
    planned = {n.name: _with_labels(n, labels[n.name]) if n.name in labels else n for n in nodes}
    daemonsets: dict[str, list[DaemonSetInfo | None]] = {}
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            daemonset = observed.daemonsets.get(obj["metadata"]["name"])
            daemonsets.setdefault(component_of(obj["metadata"]), []).append(daemonset)
    status = policy_status(
        active, shown, planned, pods, operands, observed.namespace, daemonsets, missing, notes, now, caches
    )
    upgrade = None
    upgrades: dict[str, DriverUpgradeStatus] | None = None
    if spec is not None:
        # The upgrade follows the generation that runs (the last one written when the current cannot be).
        seconds = clock if clock is not None else parse_time(now) or 0.0
        if pools.on:
            # Each NVIDIADriver's upgradePolicy upgrades its own pool (core/driver_pool_upgrade.py).
            pooled = plan_pool_upgrades(
                spec, pools, observed.drivers, nodes, observed.upgrade, seconds, caches
            )
            upgrade, upgrades = merged(pooled), {name: pool.status for name, pool in pooled.items()}
            status = status.model_copy(update={"driverUpgrade": combined(upgrades)})
        else:
            upgrades = {}
            upgrade = plan_driver_upgrade(spec, nodes, observed.upgrade, objects, seconds, caches)
            status = with_upgrade_status(status, spec, upgrade, driver_rolling(objects, observed.upgrade))
    if problems:
        status = with_problems(active, status, problems, running, now)
    statuses[active.name] = status
    inputs = tuple(e for found in missing.values() for e in found)
    writes, told, driver_pools = _driver_status_writes(observed, pools, active.name, now, upgrades)
    if spec is None:
        # Nothing known to run but the cluster as it is: leave objects, labels and namespace alone.
        return Plan(
            active,
            shown,
            [],
            [],
            [],
            {},
            statuses,
            notes,
            gpu_nodes=count,
            problems=problems,
            missing_inputs=inputs,
            driver_status_writes=writes,
            driver_events=told,
            driver_pools=driver_pools,
            dra=dra,
        )
    return Plan(
        active,
        spec,
        [],
        objects,
        deletes,
        labels,
        statuses,
        notes,
        _rewrites(observed.nodes, labels, pods, pools, dra.split if dra is not None else None),
        namespace_write(observed.operand_namespace, spec.psa.enabled),
        count,
        upgrade=upgrade,
        problems=problems,
        running=running,
        missing_inputs=inputs,
        driver_status_writes=writes,
        driver_events=told,
        driver_pools=driver_pools,
        orphans=pools.orphaning & set(deletes),
        dra=dra,
    )


def _driver_status_writes(
    observed: Observed,
    pools: Pools | None,
    policy: str | None,
    now: str,
    upgrades: Mapping[str, DriverUpgradeStatus] | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[DriverEvent, ...]], dict[str, PoolCounts]]:
    """The NVIDIADriver statuses that differ from the cluster's (none while the CRD is absent), and
    the Events to post with them, and each NVIDIADriver's numbers for the metrics."""
    current = {d.name: d.status for d in observed.drivers}
    found = driver_statuses(
        observed.drivers, pools, policy, observed.daemonsets, observed.namespace, now, upgrades
    )
    writes = {
        name: driver_status_body(status)
        for name, status in found.items()
        if driver_status_differs(current[name], status)
    }
    return (
        writes,
        conflict_events(observed.drivers, pools, found),
        pool_counts(found),
    )


def _policy_driver(obj: Mapping[str, Any]) -> bool:
    """One of the ClusterPolicy's rendered driver DaemonSets."""
    return obj["kind"] == "DaemonSet" and component_of(obj["metadata"]) == "driver"


def _parsed(caches: Caches, spec: Mapping[str, Any]) -> ClusterPolicySpec:
    """parse_spec, once per spec content: the same parsed spec (one object) for every pass of a
    generation, so the per-node memos see it unchanged. Parsed specs are never mutated."""

    def parse() -> ClusterPolicySpec | list[FieldError]:
        try:
            return parse_spec(spec)
        except PolicyError as exc:
            return list(exc.errors)

    found = caches.parsed.get("spec", (spec,), parse)
    if isinstance(found, list):
        raise PolicyError(found)  # a new one each time: a raised exception keeps its traceback
    return found


def _rendered(
    caches: Caches, policy: PolicyRef, spec: ClusterPolicySpec, facts: ClusterFacts
) -> list[dict[str, Any]]:
    """The owned, hashed objects; rendered again only when the policy or the facts change (most passes
    are caused by pod and node events and change neither). Callers must not mutate the result."""
    key = json.dumps([policy.name, policy.uid, policy.spec, asdict(facts)], sort_keys=True)
    return caches.rendered.get(
        "objects",
        (key,),
        lambda: [
            owned(obj, f"{GROUP}/{VERSION}", KIND, policy.name, policy.uid) for obj in render(spec, facts)
        ],
    )


def _with_labels(node: NodeInfo, owned: Mapping[str, str]) -> NodeInfo:
    labels = {k: v for k, v in node.labels.items() if k not in node.own_labels}
    labels.update(owned)
    return replace(node, labels=labels, own_labels=frozenset(owned))


def _driver_initializing(pods: Mapping[tuple[str, str], PodInfo], node: str) -> bool:
    """The node's driver pod is in its init containers (k8s-driver-manager among them) and staying."""
    pod = pods.get(("driver", node))
    return pod is not None and not pod.terminating and not (pod.initialized or pod.ready)


def _label_changes(
    caches: Caches,
    nodes: Collection[NodeInfo],
    spec: ClusterPolicySpec | None,
    pods: Mapping[tuple[str, str], PodInfo],
    operands: Mapping[str, Operands],
    owners: Mapping[str, str | None] | None = None,
    split: AllocatorSplit | None = None,
) -> dict[str, dict[str, str]]:
    """Node → its desired labels, for the nodes where they differ from the labels the operator owns.
    `owners`: the NVIDIADriver owner label each node must carry (driver_pool_plan.Pools.owner_labels;
    a node left out keeps the one it has); `split`: each GPU node's allocator when a GPUCluster exists
    (core/allocators.py: what a DRA node does not run, and its DRA deploy labels). Memoized on the node,
    the spec, the node's operand pods, its owner label and its allocation: all that they depend on."""
    is_ready, is_started, is_present = readiness(pods), started(pods), present(pods)
    owners = owners or {}

    def change(node: NodeInfo) -> dict[str, str] | None:
        want = desired_labels(
            node,
            spec,
            is_ready,
            is_started,
            _driver_initializing(pods, node.name),
            is_present,
            split.withheld(node.name) if split is not None else frozenset(),
            split.deploy_labels(node.name) if split is not None else None,
        )
        owner = owners.get(
            node.name, node.labels.get(OWNER_LABEL) if OWNER_LABEL in node.own_labels else None
        )
        if owner is not None and spec is not None:
            want[OWNER_LABEL] = owner
        have = {key: node.labels[key] for key in node.own_labels if key in node.labels}
        return want if want != have else None

    changes: dict[str, dict[str, str]] = {}
    for node in nodes:
        mine = operands.get(node.name, NO_OPERANDS)
        allocation = split.nodes.get(node.name) if split is not None else None
        inputs = (node, spec, mine, owners.get(node.name, ""), allocation)
        found = caches.labels.get(node.name, inputs, partial(change, node))
        if found is not None:
            changes[node.name] = found
    caches.labels.keep({node.name for node in nodes})
    return changes


def _rewrites(
    nodes: Mapping[str, NodeInfo],
    labels: Mapping[str, Mapping[str, str]],
    pods: Mapping[tuple[str, str], PodInfo],
    pools: Pools,
    split: AllocatorSplit | None = None,
) -> Rewrites:
    """The shared labels the nodes' applies leave behind, to remove; on every node, the pauses to write
    again for k8s-driver-manager (never removed: the pause wins). While the pools run the driver, an
    owner label someone else wrote (NVIDIA's operator) that must go: the apply cannot remove it. With a
    GPUCluster (`split`), the other allocator's deploy labels someone else wrote (k8s-driver-manager's
    `""` for both stacks' labels): removed, as NVIDIA's labeller sweeps them, even over a pause."""
    found: Rewrites = {}
    for name, node in nodes.items():
        rewrite: LabelRewrites = {}
        if name in labels:
            rewrite.update((key, (value, None)) for key, value in released_labels(node, labels[name]).items())
        current = node.labels.get(OWNER_LABEL)
        if (
            pools.on
            and current is not None
            and OWNER_LABEL not in node.own_labels
            and pools.owner_labels.get(name) is None
            and name in pools.owner_labels
        ):
            rewrite[OWNER_LABEL] = (current, None)
        repaused = driver_manager_repauses(node, _driver_initializing(pods, name))
        rewrite.update((key, (value, DRIVER_PAUSE)) for key, value in repaused.items())
        if split is not None:
            leftovers = other_stack_removals(node, split.other_stack_labels(name))
            rewrite.update((key, (value, None)) for key, value in leftovers.items())
        if rewrite:
            found[name] = rewrite
    return found


def _uninstall_releases(nodes: Mapping[str, NodeInfo], labels: Mapping[str, Mapping[str, str]]) -> Rewrites:
    """With no active policy: on every node (not only those whose own labels change), the labels to
    remove besides the empty apply's (`uninstall_removals`, and the shared ones `released_labels`
    gives). Kept nowhere but on the nodes, so an operator restarted half-way through finds the rest."""
    found: Rewrites = {}
    for name, node in nodes.items():
        remove = released_labels(node, labels[name]) if name in labels else {}
        remove.update(uninstall_removals(node))
        if remove:
            found[name] = {key: (value, None) for key, value in remove.items()}
    return found


SERVICE_MONITOR_SKIPPED = (
    "spec.dcgmExporter.serviceMonitor is enabled, but the Prometheus operator's ServiceMonitor CRD "
    "(servicemonitors.monitoring.coreos.com) is not installed: no ServiceMonitor was created; it will be "
    "once the CRD is"
)


def _notes(spec: ClusterPolicySpec, nvidia_driver_crd: bool, pools: Pools) -> list[Note]:
    notes = [
        Note(f"spec.{name} is enabled but {spec.UNSUPPORTED[name]}; it is ignored")
        for name in spec.unsupported_enabled()
    ]
    notes += [Note(f"accepted but not acted on: {field}", "Ignored") for field in spec.ignored_fields()]
    notes += [Note(found, "ImageWithoutRegistry") for found in spec.images_without_registry()]
    if spec.driver.useNvidiaDriverCRD and not nvidia_driver_crd:
        notes.append(
            Note(
                "spec.driver.useNvidiaDriverCRD is set, but no NVIDIADriver CRD is installed; "
                "the driver is managed from this ClusterPolicy"
            )
        )
    if pools.on and (unowned := pools.assignment.unowned()):
        shown = ", ".join(unowned[:5]) + (" and more" if len(unowned) > 5 else "")
        notes.append(
            Note(
                f"spec.driver.useNvidiaDriverCRD: no NVIDIADriver selects GPU nodes {shown} and none is "
                "the default: they get no driver (docs/nvidiadriver.md)",
                "NoNVIDIADriver",
            )
        )
    if pools.policy_driver is PolicyDriver.KEEP:
        nodes = sorted(pools.waiting)
        shown = ", ".join(nodes[:5]) + (" and more" if len(nodes) > 5 else "")
        notes.append(
            Note(
                "the driver DaemonSets of this ClusterPolicy are left as they are until no NVIDIADriver's "
                f"driver pod is left ({shown})",
                "DriverSwitchWaiting",
            )
        )
    return notes


def _workload_notes(spec: ClusterPolicySpec, nodes: Iterable[NodeInfo]) -> list[Note]:
    """GPU nodes whose workload label names no workload type: they run the default one, as NVIDIA's."""
    if not spec.sandboxWorkloads.enabled:
        return []  # the label means nothing then, and a large cluster's nodes are not looked at
    invalid = [
        f"{n.name} ({WORKLOAD_LABEL}={value!r})"
        for n in gpu_nodes(nodes)
        if (value := invalid_label(n.labels, spec)) is not None
    ]
    if not invalid:
        return []
    shown = ", ".join(invalid[:5]) + (" and more" if len(invalid) > 5 else "")
    return [
        Note(
            f"GPU nodes {shown} name no workload type (container, vm-passthrough, vm-vgpu): they run "
            f"sandboxWorkloads.defaultWorkload ({spec.sandboxWorkloads.defaultWorkload})",
            "InvalidWorkloadConfig",
        )
    ]


@dataclass(frozen=True)
class Conclusion:
    """What a pass ends with, once its writes are done."""

    plan: Plan
    """The plan with every policy's final status."""
    status_writes: dict[str, dict[str, Any]]
    """Policy name → the status body to write, for the statuses that differ from the cluster's."""
    events: dict[str, list[Event]]
    """Policy name → the Events to post once its status is written."""
    reported: dict[str, Signature]
    """Policy name → what its Events have now said (the `reported` of the next pass)."""
    progress: frozenset[str] = frozenset()
    """The policies of `status_writes` whose write only tells a rollout's progress (status.progress_only)."""


def conclude(
    plan: Plan,
    policies: Iterable[PolicyRef],
    errors: Mapping[str, str],
    reported: Mapping[str, Signature],
    now: str,
    conflicts: Mapping[str, str] | None = None,
) -> Conclusion:
    """The statuses, status writes and Events of a pass, from its plan and the facts its writes
    returned: `errors` (component or object → the API server's message) are what could not be
    written, `conflicts` (component → message) the objects of our names that are someone else's;
    `reported` what the Events of earlier passes said, by policy."""
    statuses = dict(plan.statuses)
    if plan.active is not None and plan.active.name in statuses:
        final = statuses[plan.active.name]
        if conflicts:
            final = with_errors(plan.active, final, conflicts, REASON_CONFLICT, "conflict", now)
        if errors:
            final = with_errors(plan.active, final, errors, REASON_RECONCILE_FAILED, "apply failed", now)
        statuses[plan.active.name] = final
    writes: dict[str, dict[str, Any]] = {}
    events: dict[str, list[Event]] = {}
    signatures: dict[str, Signature] = {}
    progress: set[str] = set()
    for policy in policies:
        status = statuses.get(policy.name)
        if status is None:
            continue
        if status_differs(policy.status, status):
            writes[policy.name] = status_body(status)
            if progress_only(policy.status, status):
                progress.add(policy.name)
        active = plan.active is not None and plan.active.name == policy.name
        events[policy.name], signatures[policy.name] = events_for(
            policy, status, plan.notes if active else [], reported.get(policy.name)
        )
    return Conclusion(replace(plan, statuses=statuses), writes, events, signatures, frozenset(progress))
