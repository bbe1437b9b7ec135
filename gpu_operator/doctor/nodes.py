"""Findings about GPU nodes: no driver from the NVIDIADriver pools, no allocatable GPUs (for containers,
or for VMs on a sandbox node), fewer than GFD counted, driver upgrades, MIG."""

from __future__ import annotations

from decimal import Decimal

from gpu_operator.core.components import BY_NAME
from gpu_operator.core.node_labels import takes_operands
from gpu_operator.core.workloads import CONTAINER, VM_PASSTHROUGH, workload_type
from gpu_operator.doctor import checklist
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.cluster import (
    Cluster,
    allocatable_gpus,
    duration,
    link_commands,
    log_details,
    name_of,
    parse_time,
)
from gpu_operator.doctor.scheduling import (
    quantity,
    show,
)
from gpu_operator.doctor.state import (
    GFD_COUNT,
    GFD_REPLICAS,
    MIG_CONFIG_STATE,
    MIG_STRATEGY,
    UPGRADE_STARTED,
    UPGRADE_STATE,
    UPGRADE_STUCK_SECONDS,
    Finding,
    Obj,
)


def _node_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_findings(cluster: Cluster, name: str) -> list[Finding]:
    node, info = cluster.nodes[name], cluster.infos[name]
    what = f"node {name}"
    findings: list[Finding] = []
    if not _node_ready(node):
        findings.append(
            Finding(
                "error",
                "NodeNotReady",
                what,
                "the node is not Ready (kubelet down or unreachable)",
                name,
                commands=(checklist.kubectl("describe", "node", name),),
            )
        )
        return findings
    if cluster.operands.get(("driver", name)) is None and takes_operands(info):
        verdict = cluster.pools.why_no_driver(info)
        if verdict is not None:
            # The cause, not its symptoms (no GPUs advertised, operands waiting for the driver).
            return [Finding("error", verdict.code, what, verdict.cause, name, commands=verdict.commands)]
    allocatable = allocatable_gpus(node)
    plugin = cluster.explain("device-plugin", name)
    # Without a ClusterPolicy every node lacks GPUs for the same reason, already its own finding. A VM
    # node's sandbox device plugin advertises its GPUs under their models' names, not nvidia.com/gpu.
    containers = workload_type(info.labels, cluster.rules()) == CONTAINER
    if allocatable == 0 and takes_operands(info) and cluster.policy is not None and containers:
        if plugin.ok:
            cause = (
                f"advertises no nvidia.com/gpu although {plugin.text}: the plugin found no healthy GPU "
                "or could not register with the kubelet"
            )
        else:
            cause = f"advertises no nvidia.com/gpu: {plugin.text}"
        findings.append(
            Finding(
                "error",
                "NoAllocatableGPU",
                what,
                cause,
                name,
                details=tuple(log_details(cluster, plugin.operand)),
                commands=(checklist.describe_node(name), *link_commands(cluster, plugin, name)),
            )
        )
    if not containers and takes_operands(info) and cluster.policy is not None:
        findings += _vm_gpu_findings(cluster, name)
    count = info.labels.get(GFD_COUNT)
    if count and count.isdigit() and allocatable > 0 and info.labels.get(MIG_STRATEGY) != "mixed":
        replicas = info.labels.get(GFD_REPLICAS, "1")
        expected = int(count) * (int(replicas) if replicas.isdigit() and int(replicas) > 0 else 1)
        if allocatable != expected:
            shared = f" x {replicas} replicas" if expected != int(count) else ""
            findings.append(
                Finding(
                    "error",
                    "GPUCountMismatch",
                    what,
                    f"advertises {show(allocatable)} nvidia.com/gpu, but GFD counted {count} GPUs{shared}: "
                    "the device plugin does not see (or marked unhealthy) some of them",
                    name,
                    commands=(
                        checklist.describe_node(name),
                        *(
                            [checklist.logs(cluster.namespace, name_of(plugin.operand.raw))]
                            if plugin.operand is not None
                            else []
                        ),
                        *checklist.on_node(name, "count"),
                    ),
                )
            )
    findings += _upgrade_findings(cluster, name)
    return findings


SANDBOX_PLUGINS = ("sandbox-device-plugin", "kata-sandbox-device-plugin")
"""The operands that advertise a VM node's GPUs to the kubelet: KubeVirt's (a resource per GPU model or
vGPU type, e.g. nvidia.com/GH100_H100_SXM5_80GB) and, in Kata mode on vm-passthrough nodes, Kata's."""
CONTAINER_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


def vm_gpus(node: Obj) -> dict[str, Decimal]:
    """The GPUs the node offers to VMs: allocatable nvidia.com/ resources other than the container
    device plugin's (nvidia.com/gpu, .shared, nvidia.com/mig-*)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    found = {k: quantity(v) for k, v in allocatable.items() if k.startswith("nvidia.com/")}
    return {k: v for k, v in found.items() if not k.startswith(CONTAINER_RESOURCES) and v > 0}


def _vm_gpu_findings(cluster: Cluster, name: str) -> list[Finding]:
    """A VM node (vm-passthrough, vm-vgpu) whose GPUs no sandbox device plugin advertises: which plugin
    should, and what it waits for (the chain of the sandbox stack: the sandbox validator, the VFIO or
    vGPU manager, the vGPU device manager's devices)."""
    node, info = cluster.nodes[name], cluster.infos[name]
    if vm_gpus(node):
        return []
    workload = workload_type(info.labels, cluster.rules())
    kind = "GPUs for VM passthrough" if workload == VM_PASSTHROUGH else "vGPUs"
    plugins = [p for p in SANDBOX_PLUGINS if cluster.expected_on(p, name)]
    what = f"node {name}"
    commands = [checklist.describe_node(name)]
    if not plugins:
        mode = cluster.rules().sandboxWorkloads.mode
        sections = " or ".join(f"spec.{BY_NAME[p].section}" for p in SANDBOX_PLUGINS)
        cause = (
            f"advertises no {kind} ({workload} node): no sandbox device plugin runs on it (sandboxWorkloads"
            f".mode {mode}; {sections} disabled, or the node opted out), so nothing offers them to VMs"
        )
        return [Finding("error", "NoVMGPUs", what, cause, name, commands=tuple(commands))]
    plugin = cluster.explain(plugins[0], name)
    if plugin.ok:
        cause = (
            f"advertises no {kind} ({workload} node) although {plugin.text}: it found none when it started "
            "(it discovers GPUs bound to vfio-pci and vGPU devices only then); once they are there, delete "
            "its pod to start it again"
        )
    else:
        cause = f"advertises no {kind} ({workload} node): {plugin.text}"
    commands += link_commands(cluster, plugin, name)
    commands += [Command("node", name, "lspci -nnk -d 10de:"), Command("node", name, "ls -l /dev/vfio")]
    return [
        Finding(
            "error",
            "NoVMGPUs",
            what,
            cause,
            name,
            details=tuple(log_details(cluster, plugin.operand)),
            commands=tuple(commands),
        )
    ]


def _upgrade_findings(cluster: Cluster, name: str) -> list[Finding]:
    node, info = cluster.nodes[name], cluster.infos[name]
    what = f"node {name}"
    findings: list[Finding] = []
    state = info.labels.get(UPGRADE_STATE, "")
    driver = cluster.explain("driver", name)
    commands = (
        checklist.kubectl("describe", "node", name),
        *link_commands(cluster, driver, name)[:2],
    )
    # The operator's status says why (gpu_operator/core/upgrade/): the step that failed, or what it waits for.
    says = cluster.upgrade_reason(name)
    if state == "upgrade-failed":
        why = f" ({says})" if says else ""
        findings.append(
            Finding(
                "error",
                "DriverUpgradeFailed",
                what,
                f"the driver upgrade failed on the node{why}; driver: {driver.text}",
                name,
                commands=commands,
            )
        )
    elif state and state != "upgrade-done":
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        # The upgrade state machine stamps some of its waits with a unix time (k8s-operator-libs
        # pkg/upgrade/consts.go: ...-validation-start-time, ...-wait-for-pod-completion-start-time).
        started = [
            int(annotations[key]) for key in UPGRADE_STARTED if str(annotations.get(key, "")).isdigit()
        ]
        now = parse_time(cluster.state.now)
        elapsed = now.timestamp() - max(started) if started and now else 0.0
        stuck = elapsed > UPGRADE_STUCK_SECONDS
        since = f" for {duration(elapsed)}" if elapsed else ""
        cordoned = " (the node is cordoned)" if (node.get("spec") or {}).get("unschedulable") else ""
        waits = f"; the operator says: {says}" if says else ""
        findings.append(
            Finding(
                "error" if stuck else "warning",
                "DriverUpgradeStuck" if stuck else "DriverUpgradeInProgress",
                what,
                f"driver upgrade in state {state}{since}{cordoned}{waits}; driver: {driver.text}",
                name,
                commands=commands,
            )
        )
    paused = sorted(
        k
        for k, v in info.labels.items()
        if k.startswith("nvidia.com/gpu.deploy.") and v.startswith("paused-for-")
    )
    if paused:
        findings.append(
            Finding(
                "warning",
                "OperandsPaused",
                what,
                f"operands paused by labels {', '.join(f'{k}={info.labels[k]}' for k in paused)}: not "
                "scheduled until the upgrade or MIG change that set them finishes",
                name,
                commands=(checklist.kubectl("get", "node", name, "--show-labels"),),
            )
        )
    if info.labels.get(MIG_CONFIG_STATE) == "failed":
        manager = cluster.explain("mig-manager", name)
        findings.append(
            Finding(
                "error",
                "MigConfigFailed",
                what,
                f"MIG reconfiguration to {info.labels.get('nvidia.com/mig.config', '?')} failed; "
                f"mig-manager: {manager.text}",
                name,
                commands=(
                    *link_commands(cluster, manager, name)[:2],
                    Command("node", name, "nvidia-smi mig -lgi"),
                ),
            )
        )
    return findings
