"""Findings about the ClusterPolicy itself and its RuntimeClass."""

from __future__ import annotations

from gpu_operator.doctor import checklist
from gpu_operator.doctor.cluster import Cluster, name_of, ref_of
from gpu_operator.doctor.state import Finding


def policy_findings(cluster: Cluster) -> list[Finding]:
    if cluster.state.policies is None:
        return [
            Finding(
                "error",
                "NoClusterPolicyCRD",
                "crd clusterpolicies.nvidia.com",
                "the ClusterPolicy CRD is not installed: the operator has nothing to act on",
                commands=(checklist.kubectl("get", "crd", "clusterpolicies.nvidia.com"),),
            )
        ]
    if cluster.policy is None:
        if not cluster.gpu_nodes:
            return []
        return [
            Finding(
                "error",
                "NoClusterPolicy",
                "clusterpolicy",
                f"no ClusterPolicy: nothing is deployed to the {len(cluster.gpu_nodes)} GPU nodes",
                commands=(checklist.kubectl("get", "clusterpolicies"),),
            )
        ]
    policy, name = cluster.policy, name_of(cluster.policy)
    status = policy.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    error = conditions.get("Error") or {}
    what = f"clusterpolicy {name}"
    describe = checklist.kubectl("describe", "clusterpolicy", name)
    findings: list[Finding] = []
    generation = (policy.get("metadata") or {}).get("generation")
    if status.get("observedGeneration") != generation:
        findings.append(
            Finding(
                "warning",
                "ClusterPolicyStale",
                what,
                f"the operator has not acted on generation {generation} of the spec yet "
                f"(status is of {status.get('observedGeneration') or 'none'}); is the operator running?",
                commands=(
                    checklist.kubectl("get", "pods", "-A", "-l", "app.kubernetes.io/name=gpu-operator"),
                    describe,
                ),
            )
        )
    if status.get("state") == "notReady":
        invalid = error.get("reason") == "InvalidSpec"
        problems = [
            f"{c['name']} on {p.get('node')}: {p.get('reason')}"
            + (f" ({p['message']})" if p.get("message") else "")
            for c in status.get("components") or []
            for p in c.get("problems") or []
        ]
        findings.append(
            Finding(
                "error",
                "ClusterPolicyInvalid" if invalid else "ClusterPolicyNotReady",
                what,
                str(error.get("message") or "notReady"),
                details=tuple(problems),
                commands=(describe, checklist.operand_daemonsets(cluster.namespace)),
            )
        )
    upgrade = cluster.driver_upgrade()
    if upgrade.get("paused"):
        findings.append(
            Finding(
                "error",
                "DriverUpgradePaused",
                what,
                f"the driver upgrade is paused: {upgrade.get('pausedReason') or 'a node failed'}",
                details=tuple(f"{f.get('node')}: {f.get('reason')}" for f in upgrade.get("failed") or []),
                commands=(
                    describe,
                    checklist.kubectl("get", "nodes", "-L", "nvidia.com/gpu-driver-upgrade-state"),
                ),
            )
        )
    for other in cluster.ignored:
        findings.append(
            Finding(
                "warning",
                "ClusterPolicyIgnored",
                f"clusterpolicy {name_of(other)}",
                f"ignored: only the oldest ClusterPolicy ({name}) is acted on",
                commands=(checklist.kubectl("get", "clusterpolicies"),),
            )
        )
    return findings


def runtime_class_findings(cluster: Cluster) -> list[Finding]:
    if cluster.spec is None:
        return []
    name = cluster.runtime_class()
    if any(name_of(rc) == name for rc in cluster.state.runtime_classes):
        return []
    users = [ref_of(p) for p in cluster.workloads if (p.get("spec") or {}).get("runtimeClassName") == name]
    return [
        Finding(
            "error",
            "RuntimeClassMissing",
            f"runtimeclass {name}",
            f"the RuntimeClass {name} (spec.operator.runtimeClass) does not exist: pods that ask for it are "
            "rejected; the operator recreates it at once, so if it stays missing the operator is not running",
            details=tuple(f"used by pod {ref}" for ref in users),
            commands=(
                checklist.kubectl("get", "runtimeclasses"),
                checklist.kubectl("get", "pods", "-A", "-l", "app.kubernetes.io/name=gpu-operator"),
            ),
        )
    ]
