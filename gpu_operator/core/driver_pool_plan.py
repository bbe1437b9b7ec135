"""NVIDIADriver pools in a pass (pure): which driver runs on each GPU node when the active ClusterPolicy
delegates its driver (`driver.useNvidiaDriverCRD: true`, the NVIDIADriver CRD installed), the pool
DaemonSets to apply, the owner label each node must carry, and what becomes of the ClusterPolicy's
own driver DaemonSets.

Who owns a node is core/driver_pools.py's (NVIDIA's AssignOwners rules); each pool's objects are
core/driver_pool_render.py's. This module decides the order of a switch, because a node's driver is
changed by two writes that do not happen together: a DaemonSet's node selector (and its deletion)
and the node's owner label. The rule, per node: **the owner label names a driver only once no driver
pod of another DaemonSet is on the node** (a terminating one included). Until then the label is
absent, so no pool pod starts beside the pod that is still going. Then:

- Switching on (useNvidiaDriverCRD false → true), as NVIDIA's operator does: the pool DaemonSets are
  written, and the ClusterPolicy's driver DaemonSets deleted after them (the existing "deletes after
  their replacements" rule: no delete in a pass with a failed write) with propagationPolicy Orphan
  (`Pools.orphaning`), so every node keeps its running driver pod, orphaned. Once its DaemonSet is
  going (pod_owners: ORPHAN, or POLICY_ORPHAN once the garbage collector removed its owner), a node
  that a pool takes, not held, is in that pool's upgrade (`Pools.orphaned`, core/driver_pool_upgrade.py),
  where its orphaned pod needs an upgrade (NVIDIA's labelNodesWithOrphanedDriverPods): within the
  pool's limits (maxParallelUpgrades, maxUnavailable) the node is cordoned, its GPU pods evicted, it is
  drained as the pool's upgradePolicy says (none of this when the pool installs the driver the orphan
  runs, the same DRIVER_CONFIG_DIGEST: then the pod is only restarted and the loaded driver kept), and
  the orphan is deleted at pod-restart-required. The
  owner label follows once the orphan is gone, the pool's pod starts, is validated, and the node is
  uncordoned: upgrade-done. A node goes from one driver pod to none to the new one, never two;
  "none" only for that exchange, on a node emptied of its GPU pods. With the pool's autoUpgrade off,
  the orphan stays until someone deletes it; the label and the pool's pod follow then.
- Switching off (true → false): the owner labels go (the pool pods with them: their DaemonSets no
  longer select the node) and the pool DaemonSets are deleted. The ClusterPolicy's driver DaemonSets
  select every GPU node at once (nvidia.com/gpu.deploy.driver), so they are written only once no pool
  driver pod is left on any node; an existing one is kept as it is meanwhile. The orphaned pods of a
  switch on that did not finish hold nothing back (POLICY_ORPHAN): the ClusterPolicy's DaemonSet,
  written again, adopts them, as its selector matches them (not a terminating one: it would start a
  pod beside it, so that one is waited for).
- Moving a node between pools (relabelling, a changed nodeSelector, an NVIDIADriver deleted): the old
  owner's label goes first, the new one once the old pod is gone. While that pod's DaemonSet is there
  the node is in no pool's upgrade; once the DaemonSet is gone (its NVIDIADriver deleted), the pod,
  which the garbage collector deletes, is an orphan to the new pool's upgrade, as above.
- A conflict (two NVIDIADrivers select a node, two defaults) or an NVIDIADriver whose spec does not
  parse holds its nodes as they are (core/driver_pools.py), and so does this module: a held node's
  label stays, and so do its driver's DaemonSets. A conflict present when switching on holds back
  nothing but its own nodes: they keep their orphaned ClusterPolicy driver pod, untouched and in no
  upgrade, until the conflict is resolved and their pool's upgrade replaces it; the other nodes switch.

Nodes whose driver stays the same are not touched: their label and their pool's DaemonSet stay as
they are when another pool, another node or a third, conflicting, NVIDIADriver changes.

Where this differs from NVIDIA's operator: NVIDIA flips the owner label at once, so the old and the
new driver pod may run side by side for a while (on a switch, the orphan and the pool's pod until
the upgrade deletes the orphan); here the label, and with it the pool's pod, waits until the old pod
is gone. The pool DaemonSets run under the ClusterPolicy driver's ServiceAccount and RBAC
(`nvidia-driver`), not under a ServiceAccount per NVIDIADriver and OS (NVIDIA's getDriverName): the
chart grants the operator its operands' Roles and bindings by name only, and names that depend on
what users call their NVIDIADrivers cannot be granted in advance. The driver's RBAC is the same for
every pool, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from gpu_operator.api.nvidiadriver import API_VERSION, KIND, OWNER_LABEL
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.caches import Caches
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.driver_pool_render import policy_view, pools, render_pools
from gpu_operator.core.driver_pools import Assignment, DriverObject, assign
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import DriverRef, ObjectInfo, ObjectKey
from gpu_operator.core.ownership import owned
from gpu_operator.core.render import ClusterFacts, Variant
from gpu_operator.core.upgrade import DriverPod

DRIVER = BY_NAME["driver"]
POLICY = ""
"""The owner of a driver pod of the ClusterPolicy's driver DaemonSets."""
ORPHAN = "?"
"""The owner of a driver pod whose DaemonSet is gone, being deleted, not watched, or owned by no live
object."""
POLICY_ORPHAN = "-"
"""The owner of an orphaned driver pod (no owner at all, not terminating) that one of the ClusterPolicy's
driver DaemonSets selects: deleted with its pods orphaned when the pools took over, that DaemonSet,
written again, adopts it (the DaemonSet controller claims the orphans its selector matches)."""
ORPHANS = frozenset({ORPHAN, POLICY_ORPHAN})


class PolicyDriver(Enum):
    """What becomes of the ClusterPolicy's own driver DaemonSets."""

    DEPLOY = "deploy"
    """Rendered and applied, as without NVIDIADrivers."""
    KEEP = "keep"
    """Left as they are: existing ones kept, missing ones not created (switching off waits for the
    pools' driver pods to go)."""
    DELETE = "delete"
    """Not rendered; existing ones deleted after the pass's writes, their pods orphaned (`orphaning`):
    the pools run the driver, and each pool's upgrade replaces the orphaned pods on its nodes."""


@dataclass(frozen=True)
class Pools:
    """The pools' share of a pass."""

    on: bool
    """The ClusterPolicy delegates its driver to the NVIDIADrivers."""
    policy_driver: PolicyDriver = PolicyDriver.DEPLOY
    owner_labels: Mapping[str, str | None] = field(default_factory=dict)
    """Node → the owner label it must carry (None: none), for the GPU nodes and the nodes that carry
    one."""
    objects: tuple[dict[str, Any], ...] = ()
    """The pools' driver DaemonSets, owned by their NVIDIADriver and hashed."""
    kept: frozenset[ObjectKey] = frozenset()
    """DaemonSets left as they are: those of an NVIDIADriver whose spec does not parse, and the
    ClusterPolicy's driver DaemonSets while `policy_driver` is KEEP."""
    assignment: Assignment = field(default_factory=Assignment)
    waiting: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Node → the owners of the driver pods its owner label waits for (POLICY, ORPHAN, POLICY_ORPHAN or
    a name)."""
    orphaned: Mapping[str, str] = field(default_factory=dict)
    """Node → the NVIDIADriver whose upgrade replaces its orphaned driver pod: the node is assigned to
    it, not held, and its owner label waits for orphaned pods only (core/driver_pool_upgrade.py)."""
    orphaning: frozenset[ObjectKey] = frozenset()
    """The ClusterPolicy's driver DaemonSets to delete with their pods orphaned (propagationPolicy
    Orphan), while `policy_driver` is DELETE."""


def is_on(spec: ClusterPolicySpec, crd: bool) -> bool:
    """Whether the ClusterPolicy delegates its driver: useNvidiaDriverCRD, the CRD established, and the
    driver enabled (without it no node gets the driver's deploy label, which the pools select too)."""
    return bool(spec.driver.useNvidiaDriverCRD) and crd and spec.driver.is_enabled()


def pod_owners(
    pods: Iterable[DriverPod],
    daemonsets: Mapping[str, str],
    objects: Mapping[ObjectKey, ObjectInfo],
    drivers: Iterable[DriverRef],
    policy_uids: Iterable[str],
    policy_apps: Collection[str] = (),
) -> dict[str, set[str]]:
    """Node → the owners of its driver pods: POLICY, an NVIDIADriver's name, ORPHAN, or POLICY_ORPHAN
    for an orphan whose `app` label is in `policy_apps` (the selectors of the ClusterPolicy's driver
    DaemonSets as rendered)."""
    names = {d.uid: d.name for d in drivers}
    policies = set(policy_uids)
    found: dict[str, set[str]] = {}
    for pod in pods:
        name = daemonsets.get(pod.daemonset_uid)
        info = objects.get(("apps/v1", "DaemonSet", pod.namespace, name)) if name is not None else None
        uid = info.owner_uid if info is not None and not info.deleting else ""
        owner = names.get(uid) or (POLICY if uid and uid in policies else ORPHAN)
        if not pod.daemonset_uid and not pod.terminating and pod.app in policy_apps:
            owner = POLICY_ORPHAN
        found.setdefault(pod.node, set()).add(owner)
    return found


def plan_pools(
    on: bool,
    drivers: tuple[DriverRef, ...],
    nodes: Mapping[str, NodeInfo],
    owners: Mapping[str, set[str]],
    objects: Mapping[ObjectKey, ObjectInfo],
    policy_uids: frozenset[str],
    facts: ClusterFacts,
    host_root: str,
    caches: Caches,
) -> Pools:
    """The pools' share of the pass (see the module docstring for the order of a switch). `owners`:
    pod_owners."""
    policy_daemonsets = frozenset(
        key
        for key, info in objects.items()
        if key[1] == "DaemonSet" and info.component == DRIVER.name and info.owner_uid in policy_uids
    )
    if not on:
        labelled = {name: None for name, node in nodes.items() if OWNER_LABEL in node.labels}
        pooled = {node: sorted(o) for node, o in owners.items() if o - {POLICY, POLICY_ORPHAN}}
        if pooled:
            return Pools(False, PolicyDriver.KEEP, labelled, kept=policy_daemonsets, waiting=_tuples(pooled))
        return Pools(False, PolicyDriver.DEPLOY, labelled)
    assignment = assign((_object(d) for d in drivers), nodes.values())
    labels: dict[str, str | None] = {name: None for name, node in nodes.items() if OWNER_LABEL in node.labels}
    waiting: dict[str, tuple[str, ...]] = {}
    orphaned: dict[str, str] = {}
    for name, owner in assignment.nodes.items():
        target = owner.label
        others = owners.get(name, set()) - {target}
        if target is not None and others:
            waiting[name] = tuple(sorted(others))
            if not owner.held and others <= ORPHANS:
                orphaned[name] = target
            target = None
        labels[name] = target
    kept: set[ObjectKey] = set()
    rendered: list[dict[str, Any]] = []
    caches.pools.keep({d.name for d in drivers})
    for driver in drivers:
        if driver.deleting:
            continue
        if driver.spec is None:
            kept.update(k for k, i in objects.items() if k[1] == "DaemonSet" and i.owner_uid == driver.uid)
            continue
        mine = [nodes[n] for n, owner in assignment.nodes.items() if owner.label == driver.name]
        rendered.extend(_daemonsets(caches, driver, mine, facts, host_root))
    return Pools(
        True,
        PolicyDriver.DELETE,
        labels,
        tuple(rendered),
        frozenset(kept),
        assignment,
        waiting,
        orphaned,
        policy_daemonsets,
    )


def _tuples(found: Mapping[str, list[str]]) -> dict[str, tuple[str, ...]]:
    return {key: tuple(value) for key, value in found.items()}


def _object(driver: DriverRef) -> DriverObject:
    return DriverObject(driver.name, driver.uid, driver.spec, driver.deleting)


def pool_variants(driver: DriverObject, nodes: Iterable[NodeInfo]) -> list[Variant]:
    """The driver's pools as the operator applies them: under the ClusterPolicy driver's ServiceAccount
    (module docstring)."""
    return [replace(variant, account=None) for variant in pools(driver, nodes)]


def _daemonsets(
    caches: Caches, driver: DriverRef, nodes: list[NodeInfo], facts: ClusterFacts, host_root: str
) -> list[dict[str, Any]]:
    """The driver's pool DaemonSets, owned and hashed; rendered again only when the driver, its pools or
    the facts change."""
    spec = driver.spec
    assert spec is not None
    found = pool_variants(_object(driver), nodes)
    view = policy_view(spec, host_root)
    named = {name for _, name in DRIVER.config_maps(view)}
    facts = replace(facts, config_maps={n: k for n, k in facts.config_maps.items() if n in named})

    def render() -> list[dict[str, Any]]:
        objects = render_pools(spec, found, facts, host_root)
        return [
            owned(obj, API_VERSION, KIND, driver.name, driver.uid)
            for obj in objects
            if obj["kind"] == "DaemonSet"
        ]

    inputs = (driver.uid, spec, tuple(found), facts, host_root)
    return caches.pools.get(driver.name, inputs, render)
