"""The operator's view of a recorded cluster: indexes, the active ClusterPolicy, and `Cluster.explain`,
which says why a component does not run or is not ready on a node, in the operator's own rules
(components.py, nodes.py, observed.py), so that doctor and operator agree."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import (
    DEPLOY_OPERANDS,
    NodeInfo,
    awaited,
    node_info,
    runs_on,
    takes_operands,
    unmet_dependencies,
)
from gpu_operator.core.observed import PodInfo, component_of, pod_info
from gpu_operator.core.plan import pods_by_node
from gpu_operator.core.workloads import WORKLOAD_LABEL, workload_type
from gpu_operator.doctor import checklist
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.driver_pools import DriverPools
from gpu_operator.doctor.scheduling import GPU, quantity
from gpu_operator.doctor.state import LOG_LINES, ClusterState, Obj, is_operand

# --- reading the state -----------------------------------------------------------------------------


def parse_time(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def age_seconds(stamp: str, now: str) -> float:
    """Seconds from `stamp` to `now`; 0 when either is unreadable."""
    then, current = parse_time(stamp), parse_time(now)
    return (current - then).total_seconds() if then and current else 0.0


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def ref_of(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def listing(names: Iterable[str], most: int = 4) -> str:
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def first_container(pod: Obj) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0].get("name", "")) if containers else ""


@dataclass(frozen=True)
class Operand:
    info: PodInfo
    raw: Obj


@dataclass(frozen=True)
class Link:
    """How far a component got on a node: ready, or why not (following what it waits for)."""

    ok: bool
    text: str
    operand: Operand | None = None
    """The pod at the end of the chain (the one to look at), if there is one."""
    component: str = ""
    """The component at the end of the chain."""


class Cluster:
    """Indexes over a ClusterState, and the operator's view of it (active policy, enabled components)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.namespace = state.namespace
        self.nodes: dict[str, Obj] = {name_of(n): n for n in state.nodes}
        self.infos: dict[str, NodeInfo] = {name: node_info(n) for name, n in self.nodes.items()}
        self.gpu_nodes = sorted(name for name, info in self.infos.items() if info.is_gpu)
        self.workloads = [p for p in state.pods if not is_operand(p, state.namespace)]
        raw: dict[str, Obj] = {}
        infos: list[PodInfo] = []
        for pod in state.pods:
            info = pod_info(pod) if is_operand(pod, state.namespace) else None
            if info is not None:
                raw[info.name] = pod
                infos.append(info)
        # The planner's rule for which pod speaks for a component on a node.
        self.operands = {key: Operand(info, raw[info.name]) for key, info in pods_by_node(infos).items()}
        self.events: dict[str, list[Obj]] = {}
        for event in state.events:
            uid = (event.get("involvedObject") or {}).get("uid", "")
            self.events.setdefault(uid, []).append(event)
        policies = sorted(
            state.policies or [],
            key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "", name_of(p)),
        )
        self.policy: Obj | None = policies[0] if policies else None
        self.ignored = policies[1:]
        self.spec: ClusterPolicySpec | None = None
        if self.policy is not None:
            try:
                self.spec = parse_spec(self.policy.get("spec") or {})
            except PolicyError:
                self.spec = None
        self.daemonsets = {component_of(d.get("metadata") or {}): d for d in state.daemonsets}
        self.pools = DriverPools(self.spec, state.nvidia_drivers, self.infos.values())

    def driver_upgrade(self) -> Obj:
        """The active policy's `status.driverUpgrade` ({} when the operator wrote none)."""
        status = (self.policy or {}).get("status") or {}
        return status.get("driverUpgrade") or {}

    def upgrade_reason(self, node: str) -> str:
        """What the operator's status says the node's driver upgrade waits for, or why it failed."""
        upgrade = self.driver_upgrade()
        entries = [*(upgrade.get("inProgress") or []), *(upgrade.get("failed") or [])]
        return next((str(e.get("reason") or "") for e in entries if e.get("node") == node), "")

    # --- the operator's rules ---

    def enabled(self, component: str) -> bool:
        return self.spec is None or BY_NAME[component].enabled(self.spec)

    def expected_on(self, component: str, node: str) -> bool:
        """Whether the component should run on the node at all (enabled, the node not opted out)."""
        return self.enabled(component) and runs_on(BY_NAME[component], self.infos[node], self.rules())

    def rules(self) -> ClusterPolicySpec:
        """The policy the operator's rules read: the active one, else NVIDIA's defaults."""
        return self.spec if self.spec is not None else ClusterPolicySpec()

    def is_ready(self, component: str, node: str) -> bool:
        operand = self.operands.get((component, node))
        return operand is not None and operand.info.ready

    def runtime_class(self) -> str:
        return self.spec.operator.runtimeClass if self.spec is not None else "nvidia"

    def explain(self, component: str, node: str) -> Link:
        """Whether `component` runs and is ready on `node`, and if not, why (recursing into the
        dependency it waits for), in the operator's own terms."""
        if self.policy is None:
            return Link(False, "no ClusterPolicy, so the operator deploys nothing", component=component)
        if not self.enabled(component):
            return Link(
                False, f"{component} is disabled in ClusterPolicy {name_of(self.policy)}", component=component
            )
        info = self.infos[node]
        spec = BY_NAME[component]
        if not runs_on(spec, info, self.rules()):
            workload = workload_type(info.labels, self.rules())
            if info.labels.get(DEPLOY_OPERANDS) == "false":
                text = f"the node opted out of every operand ({DEPLOY_OPERANDS}=false)"
            elif not takes_operands(info):
                text = "the operator does not see a GPU on the node"
            elif not spec.node_filter(info.labels):
                text = f"{component} does not run on this kind of node"
            elif workload not in spec.workloads:
                text = (
                    f"the node's GPU workload type is {workload} ({WORKLOAD_LABEL}, else "
                    f"sandboxWorkloads.defaultWorkload), and {component} runs on "
                    f"{' and '.join(sorted(spec.workloads))} nodes"
                )
            else:
                value = info.labels.get(spec.deploy_label)
                text = f"{component} opted out by the label {spec.deploy_label}={value}"
            return Link(False, text, component=component)
        operand = self.operands.get((component, node))
        if operand is not None and operand.info.ready:
            return Link(True, f"{operand.info.name} is ready", operand, component)
        if operand is None or not operand.info.failing:
            # Deployed with a dependency its pod waits for in Init (the toolkit with the driver).
            waited = (
                awaited(spec, self.spec, info, self.is_ready)
                if self.spec is not None
                else [d for d in spec.waits_for if not self.is_ready(d, node)]
            )
            found = self._waits_for(component, waited, node)
            if found is not None:
                return found
        if operand is None and component == "driver" and (verdict := self.pools.why_no_driver(info)):
            return Link(False, verdict.cause, component=component)
        if operand is not None:
            message = f": {operand.info.message}" if operand.info.message else ""
            return Link(
                False,
                f"{component} pod {operand.info.name} is {operand.info.reason}{message}",
                operand,
                component,
            )
        if info.labels.get(spec.deploy_label) == "true":
            daemonset = self.daemonsets.get(component)
            where = f"DaemonSet {spec.daemonset} is missing" if daemonset is None else "no pod created yet"
            return Link(
                False,
                f"{component} is deployed to the node but has no pod there ({where})",
                component=component,
            )
        unmet = (
            unmet_dependencies(spec, self.spec, info, self.is_ready)
            if self.spec is not None
            else [d for d in spec.depends_on if not self.is_ready(d, node)]
        )
        found = self._waits_for(component, unmet, node)
        return found or Link(False, f"{component} is not deployed to the node yet", component=component)

    def _waits_for(self, component: str, dependencies: Iterable[str], node: str) -> Link | None:
        """The first of `dependencies` not ready on the node, as what `component` waits for."""
        for dependency in dependencies:
            link = self.explain(dependency, node)
            if not link.ok:
                return Link(False, f"{component} waits for {link.text}", link.operand, link.component)
        return None


# --- commands for links ------------------------------------------------------------------------------


def link_commands(cluster: Cluster, link: Link, node: str) -> list[Command]:
    """§5.3's commands for the component at the end of a chain: its pod's log, then the node."""
    commands: list[Command] = []
    if link.operand is not None:
        pod = link.operand.raw
        crashed = link.operand.info.reason == "CrashLoopBackOff"
        commands += [
            checklist.describe_pod(cluster.namespace, name_of(pod)),
            checklist.logs(cluster.namespace, name_of(pod), first_container(pod), previous=crashed),
        ]
    else:
        commands.append(checklist.operand_daemonsets(cluster.namespace))
    driver = cluster.operands.get(("driver", node))
    if driver is not None and driver.info.ready:
        commands.append(
            checklist.driver_smi(cluster.namespace, name_of(driver.raw), first_container(driver.raw))
        )
    focus = (
        link.component if link.component in ("driver", "container-toolkit", "device-plugin") else "general"
    )
    return commands + checklist.on_node(node, focus)


def log_details(cluster: Cluster, operand: Operand | None) -> list[str]:
    if operand is None:
        return []
    prefix = f"{ref_of(operand.raw)}/"
    lines: list[str] = []
    for key, text in cluster.state.logs.items():
        if key.startswith(prefix):
            tail = text.rstrip("\n").splitlines()[-LOG_LINES:]
            lines.append(f"log of {key.removeprefix(prefix)} (last {len(tail)} lines):")
            lines += [f"  | {line}" for line in tail]
    return lines


def allocatable_gpus(node: Obj) -> Decimal:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return quantity(allocatable.get(GPU, 0)) + quantity(allocatable.get(f"{GPU}.shared", 0))
