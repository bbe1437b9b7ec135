"""Findings about pods: operand pods that fail, GPU pods that stay Pending (the scheduler's reasons,
node by node), GPU pods that cannot start, pods the kubelet refused and NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

from gpu_operator.core.observed import (
    waiting_reason,
)
from gpu_operator.doctor import checklist
from gpu_operator.doctor.checklist import Command
from gpu_operator.doctor.cluster import (
    Cluster,
    Link,
    age_seconds,
    allocatable_gpus,
    duration,
    first_container,
    link_commands,
    listing,
    log_details,
    name_of,
    ref_of,
)
from gpu_operator.doctor.scheduling import (
    GPU,
    Verdict,
    gpu_request,
    scheduler_reasons,
    show,
    verdict,
)
from gpu_operator.doctor.state import (
    STARTUP_GRACE_SECONDS,
    UPGRADE_STATE,
    VISIBLE_DEVICES,
    Finding,
    Obj,
    rejected_by_kubelet,
)

# --- operand pods ---------------------------------------------------------------------------------------


def operand_findings(cluster: Cluster) -> list[Finding]:
    findings: list[Finding] = []
    for (component, node), operand in sorted(cluster.operands.items()):
        info = operand.info
        if info.ready or info.terminating or node not in cluster.nodes:
            continue
        age = age_seconds(info.created, cluster.state.now)
        if not info.failing and age < STARTUP_GRACE_SECONDS:
            continue
        message = f": {info.message}" if info.message else ""
        still = "" if info.failing else f" for {duration(age)}"
        link = Link(False, "", operand, component)
        why = f"{info.reason}{message}"
        if not info.failing:
            # A pod waiting in Init for a dependency (the toolkit for its driver): point at that one.
            chain = cluster.explain(component, node)
            if chain.component != component:
                link, why = chain, chain.text
        findings.append(
            Finding(
                "error",
                "OperandNotReady",
                f"pod {ref_of(operand.raw)}",
                f"{component} not ready on {node}{still}: {why}",
                node,
                ref_of(operand.raw),
                details=tuple(log_details(cluster, operand)),
                commands=tuple(link_commands(cluster, link, node)),
            )
        )
    return findings


# --- GPU workloads --------------------------------------------------------------------------------------


def _pod_events(cluster: Cluster, pod: Obj) -> list[str]:
    uid = (pod.get("metadata") or {}).get("uid", "")
    events = sorted(
        cluster.events.get(uid, []), key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")
    )
    seen: dict[str, str] = {}
    for event in events:
        if event.get("type") == "Warning":
            seen[str(event.get("reason"))] = str(event.get("message") or "")
    return [f"event {reason}: {message}" for reason, message in seen.items()]


def _scheduled_condition(pod: Obj) -> Obj:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def _unschedulable(cluster: Cluster, pod: Obj) -> Finding:
    ref = ref_of(pod)
    namespace, name = ref.split("/", 1)
    condition = _scheduled_condition(pod)
    message = str(condition.get("message") or "")
    commands: list[Command] = [checklist.describe_pod(namespace, name)]
    if not cluster.gpu_nodes:
        return Finding(
            "error",
            "GPUPodUnschedulable",
            f"pod {ref}",
            "Pending: no node in the cluster has an NVIDIA GPU (no Node Feature Discovery label "
            "feature.node.kubernetes.io/pci-10de.present, no nvidia.com/gpu.present): is NFD installed?",
            pod=ref,
            details=(f"scheduler: {message}",) if message else (),
            commands=(
                *commands,
                checklist.kubectl("get", "nodes", "-L", "feature.node.kubernetes.io/pci-10de.present"),
            ),
        )
    groups: dict[str, list[tuple[str, Verdict]]] = {}
    fits: list[str] = []
    for node in cluster.gpu_nodes:
        found = verdict(pod, cluster.nodes[node], cluster.state.requested.get(node, {}))
        if found is None:
            fits.append(node)
        else:
            groups.setdefault(_group(cluster, pod, node, found), []).append((node, found))
    parts = [f"it fits on {listing(fits)} now; the scheduler will retry"] if fits else []
    # The nodes the pod's own selector excludes come last: the others are where it was meant to go.
    for text, members in sorted(groups.items(), key=lambda item: item[1][0][1].filter == "NodeAffinity"):
        nodes = [node for node, _ in members]
        parts.append(f"on {listing(nodes)}: {text}{_label_values(cluster, members)}")
        commands += _verdict_commands(cluster, members)
    cause = "Pending: " + "; ".join(parts) if parts else "Pending: not scheduled yet"
    details = [f"scheduler: {message}"] if message else []
    # The scheduler's counts are from its last attempt; say so when the cluster has changed since.
    now: dict[str, int] = {}
    for name, other in cluster.nodes.items():
        found = verdict(pod, other, cluster.state.requested.get(name, {}))
        if found is not None:
            now[found.reason] = now.get(found.reason, 0) + 1
    said = scheduler_reasons(message)
    if said and said != now:
        shown = ", ".join(f"{count} {reason}" for reason, count in sorted(now.items())) or "a node fits"
        details.append(f"now: {shown} (the cluster changed since the scheduler's last attempt)")
    return Finding(
        "warning" if fits else "error",
        "GPUPodUnschedulable",
        f"pod {ref}",
        cause,
        pod=ref,
        details=tuple(details),
        commands=tuple(dict.fromkeys(commands)),
    )


def _group(cluster: Cluster, pod: Obj, node: str, found: Verdict) -> str:
    """The cause a GPU node does not take the pod for; nodes with the same cause are named together."""
    if found.filter == "TaintToleration":
        return f"the taint {found.detail} is not tolerated (add a toleration for it)"
    if found.filter == "NodeAffinity":
        return f"its {found.detail} does not match"
    if found.filter == "NodeUnschedulable":
        state = cluster.infos[node].labels.get(UPGRADE_STATE)
        return "cordoned" + (f" (driver upgrade: {state})" if state else "")
    if found.resource.startswith(GPU):
        allocatable = allocatable_gpus(cluster.nodes[node])
        if allocatable == 0:
            return f"no allocatable nvidia.com/gpu ({cluster.explain('device-plugin', node).text})"
        if gpu_request(pod) > allocatable:
            return f"it requests {show(gpu_request(pod))} GPUs, the node has {show(allocatable)}"
        return f"every GPU is in use ({found.detail})"
    return f"{found.reason} ({found.detail})"


def _label_values(cluster: Cluster, members: list[tuple[str, Verdict]]) -> str:
    """For a selector that matches no GPU node: the values those nodes do have for its label."""
    label = members[0][1].label
    if not label:
        return ""
    values = sorted({cluster.infos[node].labels.get(label, "") for node, _ in members} - {""})
    return f" (they have {label}: {', '.join(values)})" if values else f" (they have no {label} label)"


def _verdict_commands(cluster: Cluster, members: list[tuple[str, Verdict]]) -> list[Command]:
    node, found = members[0]
    if found.filter == "NodeAffinity":
        return [checklist.kubectl("get", "nodes", "-L", found.label)] if found.label else []
    if found.resource.startswith(GPU) and allocatable_gpus(cluster.nodes[node]) == 0:
        commands = [checklist.describe_node(node)]
        for name, _ in members:
            commands += link_commands(cluster, cluster.explain("device-plugin", name), name)
        return commands
    if found.filter in ("TaintToleration", "NodeUnschedulable"):
        return [checklist.kubectl("describe", "node", node)]
    return [checklist.describe_node(node)]


_STUCK_REASONS = frozenset({"", "ContainerCreating", "PodInitializing", "Pending"})


def _not_starting(cluster: Cluster, pod: Obj) -> Finding | None:
    """A GPU pod bound to a node whose containers do not run: the GPU stack there, then the pod."""
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    if ready or node not in cluster.nodes or status.get("phase") == "Succeeded":
        return None
    found = waiting_reason(status.get("initContainerStatuses") or []) or waiting_reason(
        status.get("containerStatuses") or []
    )
    reason, message = found or (str(status.get("phase") or "Pending"), "")
    age = age_seconds(str((pod.get("metadata") or {}).get("creationTimestamp") or ""), cluster.state.now)
    if reason in _STUCK_REASONS and age < STARTUP_GRACE_SECONDS:
        return None
    ref = ref_of(pod)
    namespace, name = ref.split("/", 1)
    commands: list[Command] = [checklist.describe_pod(namespace, name)]
    runtime_class = (pod.get("spec") or {}).get("runtimeClassName")
    causes: list[str] = []
    if runtime_class and not any(name_of(rc) == runtime_class for rc in cluster.state.runtime_classes):
        causes.append(f"its RuntimeClass {runtime_class} does not exist")
        commands.append(checklist.kubectl("get", "runtimeclasses"))
    for component in ("driver", "container-toolkit", "device-plugin"):
        if not cluster.expected_on(component, node):
            continue  # disabled, or opted out on purpose (a driver on the host, say)
        link = cluster.explain(component, node)
        if not link.ok:
            causes.append(f"on {node}, {link.text}")
            commands += link_commands(cluster, link, node)
            break
    stuck = f" for {duration(age)}" if reason in _STUCK_REASONS and age else ""
    state = reason + stuck + (f": {message}" if message else "")
    if causes:
        cause = f"{state}; " + "; ".join(causes)
    else:
        cause = f"{state}; the GPU stack on {node} is ready, so look at the container itself"
    commands += checklist.on_node(node, "devices" if reason in _STUCK_REASONS else "general")
    commands += checklist.in_container(namespace, name, first_container(pod))
    return Finding(
        "error",
        "GPUPodNotStarting",
        f"pod {ref}",
        cause,
        node,
        ref,
        details=tuple(_pod_events(cluster, pod)),
        commands=tuple(dict.fromkeys(commands)),
    )


def _visible_devices(cluster: Cluster, pod: Obj) -> Finding | None:
    spec = pod.get("spec") or {}
    values = [
        str(env.get("value", "(from valueFrom)"))
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for env in c.get("env") or []
        if env.get("name") == VISIBLE_DEVICES
    ]
    if not values:
        return None
    ref = ref_of(pod)
    namespace, name = ref.split("/", 1)
    value = values[0]
    if gpu_request(pod) == 0 and value not in ("void", "none", ""):
        cause = (
            f"sets {VISIBLE_DEVICES}={value} without requesting nvidia.com/gpu: it uses GPUs the device "
            "plugin allocated to other pods (two pods on one GPU)"
        )
    elif value in ("void", "none", ""):
        cause = f"sets {VISIBLE_DEVICES}={value or '(empty)'}: nvidia-smi in it sees no GPU"
    else:
        cause = (
            f"requests nvidia.com/gpu but overrides {VISIBLE_DEVICES}={value}: it may see other pods' GPUs "
            "instead of its own"
        )
    node = str(spec.get("nodeName") or "")
    return Finding(
        "warning",
        "VisibleDevicesOverride",
        f"pod {ref}",
        cause,
        node,
        ref,
        commands=tuple(checklist.in_container(namespace, name, first_container(pod))),
    )


def _kubelet_rejected(cluster: Cluster, pod: Obj) -> Finding:
    ref = ref_of(pod)
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    link = cluster.explain("device-plugin", node) if node in cluster.nodes else Link(False, "")
    plugin = f"; device plugin: {link.text}" if link.text else ""
    commands = [checklist.describe_pod(*ref.split("/", 1))]
    if link.operand is not None:
        # §5.3 "多 Pod 抢同一张卡": restart the device plugin on that node; its DaemonSet recreates it.
        commands.append(
            checklist.kubectl("delete", "pod", "-n", cluster.namespace, name_of(link.operand.raw))
        )
    return Finding(
        "error",
        "GPUPodRejectedByNode",
        f"pod {ref}",
        f"rejected by the kubelet on {node}: {status.get('reason')}: {status.get('message', '')}{plugin}",
        node,
        ref,
        commands=tuple(commands + checklist.on_node(node, "device-plugin")),
    )


def workload_findings(cluster: Cluster) -> list[Finding]:
    findings: list[Finding] = []
    for pod in cluster.workloads:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if rejected_by_kubelet(pod):
            findings.append(_kubelet_rejected(cluster, pod))
            continue
        if gpu_request(pod) > 0 or spec.get("runtimeClassName"):
            if not spec.get("nodeName"):
                if status.get("phase") == "Pending" and _scheduled_condition(pod).get("status") == "False":
                    findings.append(_unschedulable(cluster, pod))
            else:
                found = _not_starting(cluster, pod)
                if found is not None:
                    findings.append(found)
        override = _visible_devices(cluster, pod)
        if override is not None:
            findings.append(override)
    return findings
