"""What is wrong with the GPU stack of a cluster, from a recorded state of it (pure, no I/O).

`gpu-operator doctor` records the objects that matter (`ClusterState`: nodes, GPU pods and operand
pods, their Events, GPU ResourceQuotas, RuntimeClasses, the operand DaemonSets, ClusterPolicies,
NVIDIADrivers and the last log lines of failing operand pods) and `diagnose` walks the seed article's
§5.3 checklist over them: a GPU node the NVIDIADriver pools give no driver, a GPU pod that stays
Pending (the scheduler's reason, node by node, down to the operand that is missing on the node), a
GPU pod that is scheduled but does not start (driver, toolkit, RuntimeClass on its node), GPU counts
that differ from what GFD found, GPUs shared by pods that override NVIDIA_VISIBLE_DEVICES, operand
pods that fail, quotas, workloads the API server rejects, the ClusterPolicy's status and stuck driver
upgrades. Each `Finding` names the object and node,
says the cause in one line and carries the §5.3 commands to run next (checklist.py).
"""

from __future__ import annotations

from gpu_operator.doctor.admission import quota_findings, rejection_findings
from gpu_operator.doctor.cluster import Cluster, ref_of
from gpu_operator.doctor.dra import dra_findings
from gpu_operator.doctor.nodes import node_findings
from gpu_operator.doctor.pods import operand_findings, workload_findings
from gpu_operator.doctor.policy import policy_findings, runtime_class_findings
from gpu_operator.doctor.state import ClusterState, Finding, Scope

PREREQUISITES = frozenset(
    {
        "NoClusterPolicyCRD",
        "NoClusterPolicy",
        "ClusterPolicyInvalid",
        "ClusterPolicyStale",
        "RuntimeClassMissing",
    }
)
"""Cluster-wide findings that matter to every node and pod, shown for --node and --pod too."""


def _in_scope(finding: Finding, scope: Scope, cluster: Cluster) -> bool:
    if not scope.node and not scope.pod:
        return True
    if finding.code in PREREQUISITES:
        return True
    if scope.pod:
        pod = next((p for p in cluster.state.pods if ref_of(p) == scope.pod), {})
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        return finding.pod == scope.pod or (bool(node) and finding.node == node and not finding.pod)
    return finding.node == scope.node


def diagnose(state: ClusterState, scope: Scope | None = None) -> list[Finding]:
    """Every finding in scope (default the whole cluster): errors first, then warnings, each in
    checklist order."""
    scope = scope or Scope()
    cluster = Cluster(state)
    findings = [
        *policy_findings(cluster),
        *runtime_class_findings(cluster),
        *(f for node in cluster.gpu_nodes for f in node_findings(cluster, node)),
        *operand_findings(cluster),
        *workload_findings(cluster),
        *dra_findings(cluster),
        *rejection_findings(cluster),
        *quota_findings(cluster),
    ]
    chosen = [f for f in findings if _in_scope(f, scope, cluster)]
    return sorted(chosen, key=lambda f: f.severity != "error")


def summary(state: ClusterState) -> dict[str, int]:
    """What was looked at, for the report's header."""
    cluster = Cluster(state)
    return {
        "nodes": len(cluster.nodes),
        "gpuNodes": len(cluster.gpu_nodes),
        "gpuPods": len(cluster.workloads),
        "operandPods": len(cluster.operands),
    }
