"""A tiny simulated cluster for the upgrade state machine's tests: it carries out the writes a plan asks
for, the way the API server, the DaemonSet controller and the kubelet would, and checks the invariants
the issue names after every pass."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpu_operator.api.upgrade_policy import UpgradePolicySpec
from gpu_operator.core.upgrade import (
    DeletePod,
    DriverDaemonSet,
    DriverPod,
    EvictionResult,
    EvictPod,
    Facts,
    PatchNode,
    State,
    UpgradeNode,
    UpgradePlan,
    ValidatorPod,
    WorkloadPod,
    plan_upgrade,
)
from gpu_operator.core.upgrade.states import AUTO_UPGRADE_ANNOTATION, IDLE, SKIP_LABEL, STATE_LABEL

START = 1_700_000_000.0
PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
_uids = itertools.count()


def uid(prefix: str) -> str:
    return f"{prefix}-{next(_uids)}"


@dataclass
class World:
    nodes: dict[str, UpgradeNode]
    revision: str = "r1"
    drivers: dict[str, DriverPod] = field(default_factory=dict)
    validators: dict[str, ValidatorPod] = field(default_factory=dict)
    pods: dict[str, WorkloadPod] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)
    """Pod keys (ns/name) whose eviction a PodDisruptionBudget refuses."""
    crashing: set[str] = field(default_factory=set)
    """Driver revisions whose pods crash-loop."""
    evictions: dict[str, EvictionResult] = field(default_factory=dict)
    now: float = START
    digest: str = ""
    validator_ok: bool = True
    driver_replaced_by_hand: set[str] = field(default_factory=set)
    """Nodes whose driver pod was deleted by hand while it still installed: its replacement's
    k8s-driver-manager finds no driver loaded and evicts nothing, so the validator pod stays."""
    dying: set[str] = field(default_factory=set)
    selects: set[str] | None = None
    """The nodes the driver DaemonSet selects (None: every node). Only there does it replace a deleted
    driver pod and start one where none is; elsewhere a deleted pod is simply gone (an orphan's)."""
    initially_unschedulable: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.initially_unschedulable = frozenset(n for n, node in self.nodes.items() if node.unschedulable)

    @classmethod
    def make(
        cls,
        count: int,
        *,
        unschedulable: Iterable[str] = (),
        skip: Iterable[str] = (),
        labels: dict[str, dict[str, str]] | None = None,
        gpu_pods: int = 1,
        prefix: str = "node",
    ) -> World:
        """`count` upgraded, validated nodes at revision r1, each with `gpu_pods` GPU pods of a Deployment,
        named `prefix`-0, `prefix`-1, ..."""
        names = [f"{prefix}-{i}" for i in range(count)]
        nodes = {
            n: UpgradeNode(
                n,
                labels={
                    STATE_LABEL: "upgrade-done",
                    **({SKIP_LABEL: "true"} if n in skip else {}),
                    **(labels or {}).get(n, {}),
                },
                annotations={AUTO_UPGRADE_ANNOTATION: "true"},
                unschedulable=n in unschedulable,
            )
            for n in names
        }
        world = cls(nodes)
        for n in names:
            world.drivers[n] = world._driver(n, ready=True, created=START - 100)
            world.validators[n] = world._validator(n, ready=True, created=START - 50)
            for j in range(gpu_pods):
                world.add_pod(n, f"train-{n}-{j}", gpu=True)
        return world

    def add_pod(self, node: str, name: str, **kwargs: object) -> WorkloadPod:
        base = {"controller_kind": "ReplicaSet", "labels": {"app": name}}
        pod = WorkloadPod("default", name, uid("pod"), node, **{**base, **kwargs})  # type: ignore[arg-type]
        self.pods[pod.uid] = pod
        return pod

    def _validator(self, node: str, *, ready: bool, created: float) -> ValidatorPod:
        return ValidatorPod(
            f"validator-{node}-{int(created)}",
            node,
            ready,
            created,
            namespace="gpu-operator",
            uid=uid("validator"),
        )

    def _driver(self, node: str, *, ready: bool, created: float) -> DriverPod:
        return DriverPod(
            f"nvidia-driver-{node}-{self.revision}-{int(created)}",
            "gpu-operator",
            uid("driver"),
            node,
            daemonset_uid="ds",
            revision=self.revision,
            config_digest=self.digest,
            ready=ready,
            created=created,
        )

    def daemonset(self) -> DriverDaemonSet:
        return DriverDaemonSet(
            "nvidia-driver-daemonset", "ds", self.revision, self.digest, f"v-{self.revision}"
        )

    def facts(self, *, forget_evictions: bool = False) -> Facts:
        return Facts(
            nodes=list(self.nodes.values()),
            driver_daemonsets=[self.daemonset()],
            driver_pods=list(self.drivers.values()),
            validator_pods=list(self.validators.values()),
            pods=list(self.pods.values()),
            evictions={} if forget_evictions else dict(self.evictions),
            now=self.now,
        )

    # --- carrying out writes ----------------------------------------------------------------------

    def apply(self, plan: UpgradePlan) -> None:
        for action in plan.actions:
            for write in action.writes:
                if isinstance(write, PatchNode):
                    self._patch(write)
                elif isinstance(write, EvictPod):
                    self._evict(write)
                else:
                    self._delete(write)

    def _patch(self, patch: PatchNode) -> None:
        node = self.nodes[patch.node]
        labels = {**node.labels, **patch.labels}
        annotations = {**node.annotations, **patch.annotations}
        self.nodes[patch.node] = replace(
            node,
            labels={k: v for k, v in labels.items() if v is not None},
            annotations={k: v for k, v in annotations.items() if v is not None},
            unschedulable=node.unschedulable if patch.unschedulable is None else patch.unschedulable,
        )

    def _evict(self, evict: EvictPod) -> None:
        pod = self.pods.get(evict.uid)
        if pod is None:
            self.evictions[evict.uid] = EvictionResult(404, "not found", self.now)
        elif pod.key in self.blocked:
            self.evictions[evict.uid] = EvictionResult(429, PDB_MESSAGE, self.now)
        else:
            self.evictions[evict.uid] = EvictionResult(201, "", self.now)
            self.pods[evict.uid] = replace(pod, terminating=True)

    def _delete(self, delete: DeletePod) -> None:
        if delete.uid in self.pods:
            self.pods[delete.uid] = replace(self.pods[delete.uid], terminating=True)
            return
        for node, driver in self.drivers.items():
            if driver.uid == delete.uid:
                self.drivers[node] = replace(driver, terminating=True, ready=False)
        for node, validator in self.validators.items():
            if validator.uid == delete.uid:
                self.validators[node] = replace(validator, terminating=True)

    # --- time passing: controllers and kubelets ---------------------------------------------------

    def tick(self, seconds: float = 30) -> None:
        """Time passes. A deleted pod is seen terminating for one tick, then it is gone; a new driver pod
        is seen starting for one tick; a new validator pod is seen not Ready for one tick."""
        self.now += seconds
        for pod_uid, pod in list(self.pods.items()):
            if pod.terminating and pod_uid in self.dying:
                del self.pods[pod_uid]
                self.evictions.pop(pod_uid, None)
                target = next((n for n in sorted(self.nodes) if not self.nodes[n].unschedulable), None)
                if pod.controller_kind and target is not None:  # its controller creates a replacement
                    self.add_pod(target, pod.name, **_copy(pod))
            elif pod.terminating:
                self.dying.add(pod_uid)
        for node, validator in list(self.validators.items()):
            if validator.terminating:  # its DaemonSet starts a new one
                self.validators[node] = self._validator(node, ready=False, created=self.now)
            elif not validator.ready and self.validator_ok and self._driver_ready(node):
                self.validators[node] = replace(validator, ready=True)
        for node in self.nodes:
            if node not in self.drivers and self._selected(node):
                self.drivers[node] = self._driver(node, ready=False, created=self.now)
        for node, driver in list(self.drivers.items()):
            if driver.terminating and driver.uid in self.dying:
                if self._selected(node):
                    self.drivers[node] = self._driver(node, ready=False, created=self.now)
                else:
                    del self.drivers[node]
            elif driver.terminating:
                self.dying.add(driver.uid)
            elif not driver.ready and driver.created < self.now:
                if driver.revision in self.crashing:
                    self.drivers[node] = replace(
                        driver, restarts=driver.restarts + 4, reason="CrashLoopBackOff"
                    )
                else:
                    self.drivers[node] = replace(driver, ready=True, reason="")
                    # k8s-driver-manager paused the validator; it comes back after the new driver,
                    # unless the driver pod was replaced by hand while it installed (evicts nothing).
                    if node not in self.driver_replaced_by_hand:
                        self.validators[node] = self._validator(node, ready=False, created=self.now)

    def _selected(self, node: str) -> bool:
        return self.selects is None or node in self.selects

    def _driver_ready(self, node: str) -> bool:
        driver = self.drivers.get(node)
        return driver is not None and driver.ready

    # --- observations -----------------------------------------------------------------------------

    def state(self, node: str) -> State:
        return State.of(self.nodes[node].labels.get(STATE_LABEL))

    def states(self) -> dict[str, str]:
        return {n: str(self.state(n)) for n in sorted(self.nodes)}

    def unavailable(self) -> set[str]:
        return {n for n, node in self.nodes.items() if node.unschedulable or not node.ready}

    def in_progress(self) -> set[str]:
        return {n for n in self.nodes if self.state(n) not in IDLE}

    def step(self, policy: UpgradePolicySpec, *, seconds: float = 30, **kwargs: bool) -> UpgradePlan:
        """One pass: plan, check the invariants, carry out the writes, let time pass."""
        plan = plan_upgrade(policy, self.facts(), target_version=f"v-{self.revision}", **kwargs)
        check(self, plan, policy)
        self.apply(plan)
        self.tick(seconds)
        return plan

    def run(self, policy: UpgradePolicySpec, passes: int = 200, **kwargs: bool) -> UpgradePlan:
        """Pass after pass until nothing is left to do (or `passes` ran out)."""
        plan = self.step(policy, **kwargs)
        for _ in range(passes):
            if (
                not plan.writes
                and plan.wake_at is None
                and all(
                    self.state(n) in (State.DONE, State.FAILED) or self.nodes[n].labels.get(SKIP_LABEL)
                    for n in self.nodes
                )
            ):
                break
            plan = self.step(policy, **kwargs)
        return plan


def _copy(pod: WorkloadPod) -> dict[str, object]:
    fields = {f.name: getattr(pod, f.name) for f in dataclasses.fields(pod)}
    for key in ("namespace", "name", "uid", "node", "terminating"):
        fields.pop(key)
    return fields


def check(world: World, plan: UpgradePlan, policy: UpgradePolicySpec) -> None:
    """The invariants of issue 11, on the cluster as the plan leaves it."""
    after = World(dict(world.nodes), world.revision, dict(world.drivers), pods=dict(world.pods))
    after.apply(plan)
    total = len(after.nodes)
    if not policy.autoUpgrade:
        assert all(isinstance(w, PatchNode) and not w.labels and w.unschedulable is None for w in plan.writes)
    # Never more unavailable than maxUnavailable allows, beyond what already was.
    assert len(after.unavailable()) <= max(len(world.unavailable()), policy.max_unavailable(total))
    # Never more in progress than maxParallelUpgrades, beyond what already was.
    if policy.maxParallelUpgrades:
        assert len(after.in_progress()) <= max(len(world.in_progress()), policy.maxParallelUpgrades)
    # A workload pod is evicted or deleted only on a node that is being emptied; a driver pod only
    # at pod-restart-required, a validator pod only at validation-required.
    for write in plan.writes:
        if isinstance(write, EvictPod | DeletePod):
            pod = world.pods.get(write.uid)
            if pod is not None:
                assert after.state(pod.node) in (State.POD_DELETION_REQUIRED, State.DRAIN_REQUIRED), write
                assert after.nodes[pod.node].unschedulable, write
            elif isinstance(write, DeletePod) and write.why == "validator-restart":
                owner = next(n for n, v in world.validators.items() if v.uid == write.uid)
                assert after.state(owner) == State.VALIDATION_REQUIRED, write
            else:
                owner = next(n for n, d in world.drivers.items() if d.uid == write.uid)
                assert after.state(owner) == State.POD_RESTART_REQUIRED, write
    # A node we cordoned is in progress.
    for name, node in after.nodes.items():
        if node.unschedulable and name not in world.initially_unschedulable:
            assert after.state(name) not in IDLE, name
    # Every node that is not done has a reason in the status.
    status = plan.status
    explained = {e["node"] for e in status["inProgress"] + status["failed"] if e["reason"]}
    explained |= {n for group in status["pending"] if group["reason"] for n in group["nodes"]}
    for name in after.nodes:
        if after.state(name) != State.DONE and (policy.autoUpgrade or name in _not_current(world)):
            assert name in explained, (name, after.state(name), status)
    assert (
        status["nodes"]
        == status["nodesDone"] + status["nodesInProgress"] + status["nodesFailed"] + status["nodesPending"]
    )


def _not_current(world: World) -> set[str]:
    return {n for n, d in world.drivers.items() if d.revision != world.revision} | world.in_progress()
