"""Why a GPU node has no driver pod while NVIDIADriver pools run the driver (pure).

The answer is the operator's own: core/driver_pools.py's assignment (which NVIDIADriver owns the
node, or the conflict or unparsable spec that holds it) and core/driver_pool_render.py's OS pools
(a node without NFD's OS labels gets no DaemonSet of its owner), read over the recorded NVIDIADrivers,
so that doctor and operator cannot disagree about the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_operator.api import PolicyError
from gpu_operator.api.nvidiadriver import OWNER_LABEL, NVIDIADriverSpec, parse_driver_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import REASON_RECONCILE_FAILED
from gpu_operator.core.components import VGPU_MANAGER_DEPLOY_LABEL
from gpu_operator.core.driver_pool_plan import is_on
from gpu_operator.core.driver_pool_render import pools
from gpu_operator.core.driver_pools import Assignment, DriverObject, assign
from gpu_operator.core.images import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.doctor import checklist
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.state import Obj


@dataclass(frozen=True)
class Verdict:
    """Why the pools give a node no driver: a finding's code, its cause and what to run next."""

    code: str
    cause: str
    commands: tuple[Command, ...]


def _describe(names: Iterable[str]) -> tuple[Command, ...]:
    return tuple(checklist.kubectl("describe", "nvidiadriver", name) for name in names)


def _with_selector(driver: DriverObject) -> str:
    selector = (driver.spec.nodeSelector if driver.spec is not None else None) or {}
    shown = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
    return f"{driver.name} ({shown or 'every GPU node'})"


class DriverPools:
    """The recorded NVIDIADrivers as the operator reads them, and what they give each GPU node."""

    def __init__(
        self, spec: ClusterPolicySpec | None, drivers: Sequence[Obj] | None, nodes: Iterable[NodeInfo]
    ) -> None:
        self.on = spec is not None and drivers is not None and is_on(spec, crd=True)
        """The active ClusterPolicy delegates its driver to NVIDIADrivers (and their CRD is installed)."""
        self.drivers: dict[str, DriverObject] = {}
        self.errors: dict[str, str] = {}
        for body in drivers or ():
            metadata = body.get("metadata") or {}
            name = str(metadata.get("name", ""))
            parsed: NVIDIADriverSpec | None = None
            try:
                parsed = parse_driver_spec(body.get("spec") or {})
            except PolicyError as exc:
                self.errors[name] = str(exc)
            uid = str(metadata.get("uid") or "")
            self.drivers[name] = DriverObject(name, uid, parsed, bool(metadata.get("deletionTimestamp")))
        self.assignment: Assignment = assign(self.drivers.values(), nodes) if self.on else Assignment()

    def why_no_driver(self, node: NodeInfo) -> Verdict | None:
        """Why no NVIDIADriver installs a driver on this GPU node; None when one should (its pod is
        then what to look at)."""
        owner = self.assignment.nodes.get(node.name)
        if not self.on or owner is None:
            return None
        get = checklist.kubectl("get", "nvidiadrivers")
        labels = checklist.kubectl("get", "node", node.name, "--show-labels")
        if owner.held and owner.claimants == (owner.current,) and owner.current in self.errors:
            name = owner.current
            return Verdict(
                "NVIDIADriverInvalid",
                f"its NVIDIADriver {name} ({OWNER_LABEL}={name}) has a spec that does not parse, so the "
                f"node is left as it is until the spec is fixed: {self.errors[name]}",
                (*_describe([name]), get),
            )
        if owner.held:
            names = " and ".join(owner.claimants)
            conflicts = self.assignment.drivers[owner.claimants[0]].conflicts
            if any(c.reason == REASON_RECONCILE_FAILED and node.name in c.nodes for c in conflicts):
                cause = (
                    f"no NVIDIADriver selects the node and several are default: {names} "
                    f"({REASON_RECONCILE_FAILED}); no driver is installed until only one is default"
                )
            else:
                cause = (
                    f"NVIDIADrivers {names} both select the node (ConflictingNodeSelector): no driver is "
                    "installed until only one selects it"
                )
            return Verdict("NVIDIADriverConflict", cause, (*_describe(owner.claimants), labels))
        if owner.owner is None:
            return Verdict("NoNVIDIADriverForNode", self._unselected(), (get, labels))
        driver = self.drivers[owner.owner]
        if not pools(driver, [node]):
            needed = [OS_ID_LABEL, OS_VERSION_LABEL]
            if driver.spec is not None and driver.spec.usePrecompiled:
                needed.append(KERNEL_LABEL)
            return Verdict(
                "NoDriverPoolForNode",
                f"NVIDIADriver {driver.name} owns the node, but none of its DaemonSets selects it: the node "
                f"lacks NFD's labels {', '.join(needed)} (is NFD running on it?)",
                (labels, *_describe([driver.name])),
            )
        if owner.current != owner.owner:
            now = f"{OWNER_LABEL}={owner.current}" if owner.current else f"no {OWNER_LABEL} label"
            return Verdict(
                "DriverPoolNotLabelled",
                f"NVIDIADriver {driver.name} owns the node, which carries {now}: the operator labels it "
                "once no other driver pod is left there (is the operator running?)",
                (labels, *_describe([driver.name])),
            )
        host_manager = driver.spec is not None and driver.spec.driverType == "vgpu-host-manager"
        if host_manager and node.labels.get(VGPU_MANAGER_DEPLOY_LABEL) != "true":
            return Verdict(
                "VGPUManagerNotDeployed",
                f"NVIDIADriver {driver.name} is a vGPU host manager (driverType vgpu-host-manager), whose "
                f"DaemonSets select nodes labelled {VGPU_MANAGER_DEPLOY_LABEL}=true, and the node is not: "
                "NVIDIA's operator sets that label on the vm-vgpu nodes of sandboxWorkloads, which this "
                "operator does not deploy, so label the node yourself",
                (labels, *_describe([driver.name])),
            )
        return None

    def _unselected(self) -> str:
        """Why a node no NVIDIADriver selects gets none, and what would give it one."""
        live = [d for d in self.drivers.values() if not d.deleting and d.spec is not None]
        invalid = sorted(self.errors)
        if not live and not invalid:
            return (
                "no NVIDIADriver exists, so no driver is installed: create one (a default one takes every "
                "GPU node)"
            )
        cause = "no NVIDIADriver selects the node and none is default, so no driver is installed"
        if live:
            shown = ", ".join(_with_selector(d) for d in live)
            cause += f": label the node for one of {shown}, or make one default"
        if invalid:
            verb = "selects" if len(invalid) == 1 else "select"
            cause += f" (what {', '.join(invalid)} {verb} is not known: the spec does not parse)"
        return cause
