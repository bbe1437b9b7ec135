"""Which NVIDIADriver owns each GPU node: the pool rules, pure (no I/O).

NVIDIA's operator routes each GPU node to one NVIDIADriver with the node label
`nvidia.com/gpu-operator.driver.owner` (`AssignOwners`, internal/nvidiadriver/nvidiadriver.go:39-100 at
v26.7.0) and each NVIDIADriver's DaemonSets select that label (internal/state/nodepool.go:65-68). The
rules kept here:

- A node belongs to the NVIDIADriver whose nodeSelector its labels match (nvidiadriver.go:131-150); a
  driver without nodeSelector, or with `{}`, selects every GPU node (`GetNodeSelector`,
  api/nvidia/v1alpha1/nvidiadriver_types.go:578-587), as `labels.SelectorFromSet` of an empty set
  matches everything.
- A `default: true` driver takes the GPU nodes no other driver selects (nvidiadriver.go:146-149);
  non-default drivers take precedence over it, so a node selected by one driver and the default is
  that driver's, not a conflict.
- Only GPU nodes take part (NVIDIA lists `nvidia.com/gpu.present=true`, nvidiadriver.go:58): the
  ClusterPolicy's own rule for GPU nodes (`NodeInfo.is_gpu`) decides here.
- A driver being deleted takes no node (`classifyDrivers`, nvidiadriver.go:107), so its nodes go to
  whichever driver selects them next, the default included.
- A node selected by two drivers, or left to two defaults, is a conflict (nvidiadriver.go:143-145,
  :49-51; internal/validator/validator.go:75-98), reported with NVIDIA's reasons:
  `ConflictingNodeSelector` for selectors, `ReconcileFailed` for several defaults
  (controllers/nvidiadriver_controller.go:150-160).

Where this differs from NVIDIA's operator, on purpose: NVIDIA fails the whole assignment on the first
conflict (no node's owner label changes anywhere, nvidiadriver.go:63-67) and its validator fails every
NVIDIADriver, involved or not, with a message naming one node (validator.go:94-97). Here a conflict
holds only the nodes in conflict, as they are, and is reported on the drivers involved only, with
every other driver they collide with and their nodes, so that a third object applied by mistake
stops neither the pools it does not touch nor a node joining one of them. NVIDIA's validator also
counts nodes that are not GPU nodes when it looks for overlaps (validator.go:105-116 lists every node
the selector matches); here a node without a GPU cannot be a conflict, as it gets no driver anyway.

"Held" nodes (a conflict, or a driver whose spec does not parse) keep the owner they have now: the
owner label stays as it is, so the driver pod that runs there keeps running, and nothing is
installed on or removed from the node until the conflict is resolved. Moving a node to a new owner,
and what that means for the driver pod already there, is the caller's business; this module only
says who owns what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpu_operator.api.nvidiadriver import OWNER_LABEL, REASON_CONFLICTING_NODE_SELECTOR, NVIDIADriverSpec
from gpu_operator.api.status import REASON_RECONCILE_FAILED
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo

STATE_NOT_READY = "notReady"
NODES_NAMED = 5
"""At most this many node names per conflict in a condition message (the rest are counted)."""


@dataclass(frozen=True)
class DriverObject:
    """One NVIDIADriver as the assignment needs it."""

    name: str
    uid: str
    spec: NVIDIADriverSpec | None
    """The parsed spec; None when it does not parse (its nodes are held, see `NodeOwner.held`)."""
    deleting: bool = False
    """metadata.deletionTimestamp is set: it takes no node."""

    @property
    def is_default(self) -> bool:
        return self.spec is not None and self.spec.default

    def selects(self, labels: Mapping[str, str]) -> bool:
        """NVIDIA's `labels.SelectorFromSet(GetNodeSelector())`: every pair present with its value."""
        selector = (self.spec.nodeSelector if self.spec is not None else None) or {}
        return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True)
class Conflict:
    """Nodes that several drivers claim, and which drivers."""

    drivers: tuple[str, ...]
    """Sorted names of every driver that claims these nodes."""
    nodes: tuple[str, ...]
    """Sorted node names."""
    reason: str
    """ConflictingNodeSelector (selectors overlap) or ReconcileFailed (several default drivers)."""

    def message(self) -> str:
        """The conflict as the Error condition of each driver involved says it."""
        names = " ".join(self.drivers)
        if self.reason == REASON_RECONCILE_FAILED:
            return self._held(f"multiple default NVIDIADrivers found: [{names}]", "; ")
        return self._held(f"multiple NVIDIADrivers match the same nodes: [{names}]", "; ")

    def told_to(self, name: str) -> str:
        """The conflict as the Event on NVIDIADriver `name` tells it: the others, and the nodes."""
        others = [d for d in self.drivers if d != name]
        them = f"NVIDIADriver{'' if len(others) == 1 else 's'} {', '.join(others)}"
        if self.reason == REASON_RECONCILE_FAILED:
            are = "is a default driver" if len(others) == 1 else "are default drivers"
            return self._held(f"{them} {are} too", ": ")
        return self._held(f"its nodeSelector selects the same GPU nodes as {them}", ": ")

    def _held(self, what: str, separator: str) -> str:
        if not self.nodes:
            return f"{what}; no GPU node is concerned yet"
        where = _nodes(self.nodes)
        if self.reason == REASON_RECONCILE_FAILED:
            where = f"the GPU nodes no other NVIDIADriver selects ({where})"
        return f"{what}{separator}the driver on {where} is left as it is until only one selects them"


def _nodes(nodes: tuple[str, ...]) -> str:
    shown = ", ".join(nodes[:NODES_NAMED])
    more = len(nodes) - NODES_NAMED
    count = f"{len(nodes)} node" + ("" if len(nodes) == 1 else "s")
    return f"{count}: {shown}" + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class NodeOwner:
    """Who owns one GPU node's driver."""

    node: str
    owner: str | None
    """The NVIDIADriver that owns the node; None when none does (held, or no driver selects it)."""
    current: str | None
    """The owner label the node carries now (the driver last assigned to it), None if absent."""
    claimants: tuple[str, ...] = ()
    """For a held node: the drivers in conflict over it, or the one whose spec does not parse."""

    @property
    def held(self) -> bool:
        """Keep what runs: the owner label and the driver pod on the node stay as they are."""
        return bool(self.claimants)

    @property
    def label(self) -> str | None:
        """The owner label the node should carry (None: absent)."""
        return self.current if self.held else self.owner

    @property
    def moves(self) -> bool:
        """The node changes owner (joins, leaves or changes pool)."""
        return self.label != self.current


@dataclass(frozen=True)
class DriverPool:
    """One NVIDIADriver's share: its nodes, its conflicts, and what its status says about them."""

    name: str
    uid: str
    nodes: tuple[str, ...]
    """The GPU nodes it owns, sorted (held nodes are nobody's)."""
    conflicts: tuple[Conflict, ...] = ()
    """The conflicts it is part of."""

    @property
    def state(self) -> str | None:
        """notReady while in conflict; otherwise its pods decide (None here)."""
        return STATE_NOT_READY if self.conflicts else None

    @property
    def reason(self) -> str | None:
        return self.conflicts[0].reason if self.conflicts else None

    @property
    def message(self) -> str:
        return "; ".join(conflict.message() for conflict in self.conflicts)

    def conditions(self) -> tuple[tuple[str, str, str, str], ...]:
        """NVIDIA's SetConditionsError pair (internal/conditions/nvidiadriver.go:87-99): Ready=False
        with reason Error and no message, Error=True with the reason and message. Empty when the pool
        is not in conflict."""
        if self.reason is None:
            return ()
        return (("Ready", "False", "Error", ""), ("Error", "True", self.reason, self.message))


@dataclass(frozen=True)
class Assignment:
    """The pools: per GPU node its owner, per NVIDIADriver its nodes and conflicts."""

    nodes: Mapping[str, NodeOwner] = field(default_factory=lambda: MappingProxyType({}))
    """GPU node name → its owner (every GPU node, in name order)."""
    drivers: Mapping[str, DriverPool] = field(default_factory=lambda: MappingProxyType({}))
    """NVIDIADriver name → its pool (every object given, deleting ones with no nodes)."""

    def owner(self, node: str) -> str | None:
        found = self.nodes.get(node)
        return found.owner if found is not None else None

    def held(self) -> tuple[str, ...]:
        return tuple(name for name, owner in self.nodes.items() if owner.held)

    def unowned(self) -> tuple[str, ...]:
        """GPU nodes no driver selects (nor holds): no driver from any NVIDIADriver."""
        return tuple(name for name, owner in self.nodes.items() if owner.label is None)


def selection_labels(node: NodeInfo) -> Mapping[str, str]:
    """The labels a selector is matched against: the node's, with `nvidia.com/gpu.present=true`
    that the operator writes on every GPU node in the same pass (`desired_labels`), so that a
    selector on it (NVIDIA's default `GetNodeSelector`) matches a node from its first pass on."""
    if GPU_PRESENT in node.labels:
        return node.labels
    return {**node.labels, GPU_PRESENT: "true"}


def assign(drivers: Iterable[DriverObject], nodes: Iterable[NodeInfo]) -> Assignment:
    """Decide each GPU node's NVIDIADriver (see the module docstring for the rules and their sources)."""
    objects = sorted(drivers, key=lambda d: d.name)
    live = [d for d in objects if not d.deleting and d.spec is not None]
    selectors = [d for d in live if not d.is_default]
    defaults = tuple(d.name for d in live if d.is_default)
    invalid = {d.name for d in objects if d.spec is None and not d.deleting}

    owners: dict[str, NodeOwner] = {}
    claims: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for node in sorted((n for n in nodes if n.is_gpu), key=lambda n: n.name):
        current = node.labels.get(OWNER_LABEL) or None
        labels = selection_labels(node)
        matching = tuple(d.name for d in selectors if d.selects(labels))
        if current is not None and current in invalid:
            # Its driver's spec does not parse: what it selects is unknown, so the node stays as it is
            # (as a ClusterPolicy that does not parse changes nothing) until the spec is fixed.
            owners[node.name] = NodeOwner(node.name, None, current, (current,))
            continue
        if len(matching) > 1:
            claims.setdefault((REASON_CONFLICTING_NODE_SELECTOR, matching), []).append(node.name)
            owners[node.name] = NodeOwner(node.name, None, current, matching)
        elif matching:
            owners[node.name] = NodeOwner(node.name, matching[0], current)
        elif len(defaults) > 1:
            claims.setdefault((REASON_RECONCILE_FAILED, defaults), []).append(node.name)
            owners[node.name] = NodeOwner(node.name, None, current, defaults)
        else:
            owners[node.name] = NodeOwner(node.name, defaults[0] if defaults else None, current)
    if len(defaults) > 1:
        # Several defaults are a conflict even before a node is left to them (validator.go:75-78).
        claims.setdefault((REASON_RECONCILE_FAILED, defaults), [])

    conflicts = [Conflict(names, tuple(held), reason) for (reason, names), held in sorted(claims.items())]
    owned: dict[str, list[str]] = {}
    for owner in owners.values():
        if owner.owner is not None:
            owned.setdefault(owner.owner, []).append(owner.node)
    pools = {
        d.name: DriverPool(
            d.name,
            d.uid,
            tuple(owned.get(d.name, ())),
            tuple(c for c in conflicts if d.name in c.drivers),
        )
        for d in objects
    }
    return Assignment(MappingProxyType(owners), MappingProxyType(pools))
