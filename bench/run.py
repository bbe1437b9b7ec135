"""`make bench`: how fast the operator converges N simulated GPU nodes, against what the control plane allows.

For each size N, on a fresh local cluster (hack/cluster.sh, kwok) with N GPU nodes and one CPU node:

* operator run: `gpu-operator run` as its own process, logged in as the Helm chart's ServiceAccount;
  time from `kubectl apply` of the ClusterPolicy to `status.state=ready` (watched, see kubeapi.Watcher);
* limit run: the same objects (`gpu-operator render`) applied with `kubectl apply --server-side` at
  once with every node label the operator would end up setting; time until every DaemonSet is rolled
  out (observedGeneration current, desired == updated == available == ready == expected);
* node join, for both: a new GPU node (hack/gen_nodes.py's make_node) until its operand pods are Ready;
* the first operator run then stays at rest for --rest-seconds: its requests from the audit log;
* between runs everything is removed again (the policy or the limit's objects, pods, node labels).

Runs alternate their order (limit first, then operator first, ...) on the same cluster; see bench/README.md.

With --side-by-side there is no limit: NVIDIA's own operator (bench/nvidia.py) runs where ours does, each
run on a fresh cluster (ours, NVIDIA's, ours, NVIDIA's, ... at each size), measured by the same code.

    python -m bench.run --sizes 10 100 1000 --rounds 10=3 100=3 1000=1
    python -m bench.run --sizes 10 --rounds 10=1 --side-by-side
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench import audit, kubeapi, memtrace, nvidia, procstat, profile, report, stats, timeline, versus
from bench.cluster import (
    NAMESPACE,
    OPERATOR,
    ROOT,
    SERVICE_ACCOUNT_USER,
    Cluster,
    OperatorProcess,
    bin_dir,
    install_chart,
    log,
    missing_access,
    run,
    sa_kubeconfig,
    versions,
)
from bench.kubeapi import Objects, Watcher
from bench.timeline import writer_marker
from gpu_operator.api import parse_document
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import BY_LABEL, COMPONENTS, MIG_CAPABLE_LABEL
from gpu_operator.core.node_labels import GPU_PRESENT, MIG_CONFIG, NodeInfo, desired_labels, node_info
from gpu_operator.runtime.client import ApiError
from hack import gen_nodes
from hack.emulators import gpus

POLICY = ROOT / "examples" / "clusterpolicy.yaml"
VALIDATOR_WORKLOADS = ("nvidia-cuda-validator", "nvidia-device-plugin-validator")
SEED_CONFIG_MAPS = (ROOT / "examples" / "device-plugin-config.yaml", ROOT / "examples" / "mig-config.yaml")
POLICIES = "/apis/nvidia.com/v1/clusterpolicies"
NODES = "/api/v1/nodes"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
DAEMONSETS = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
SELECTOR = "app.kubernetes.io/managed-by=gpu-operator"
COMPONENT_LABEL = "app.kubernetes.io/component"
LIMIT_MANAGER = "gpu-operator-bench-limit"
MANAGED_COLLECTIONS = (
    f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    f"/api/v1/namespaces/{NAMESPACE}/services",
    DAEMONSETS,
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/node.k8s.io/v1/runtimeclasses",
)
OPERATOR_LABELS = (GPU_PRESENT, MIG_CONFIG, *(c.deploy_label for c in COMPONENTS))
# Watches the operator must have open before a timed run starts (the rest open at the same moment).
OPERATOR_WATCHES = frozenset({"clusterpolicies", "nodes", "pods", "daemonsets"})
LABEL_WORKERS = 8
OURS, NVIDIA = "ours", "nvidia"
"""Which operator a SizeBench runs (NVIDIA's only with --side-by-side)."""
APP_LABEL = "app"
"""The label NVIDIA's operand pods carry their DaemonSet's name in (ours carry it too)."""


def always_ready(component: str, node: str) -> bool:
    return True


def final_info(node: Mapping[str, Any]) -> NodeInfo:
    """The node as the operator reads it once GFD has run there: GFD's mig.capable label, from the
    simulated GPU model (hack/emulators/gfd.py), decides whether the MIG manager runs on it."""
    info = node_info(node)
    model = gpus.MODELS.get(
        (node.get("metadata", {}).get("annotations") or {}).get(gpus.MODEL_ANNOTATION, "")
    )
    if model is None:
        return info
    mig = "true" if model.mig_capable else "false"
    return dataclasses.replace(info, labels={**info.labels, MIG_CAPABLE_LABEL: mig})


@dataclass
class Settings:
    sizes: list[int]
    rounds: dict[int, int]
    rest_s: float
    settle_s: float
    cluster_name: str
    port_base: int
    out: Path
    work: Path
    keep_cluster: bool = False
    operator_only: bool = False
    admin: bool = False
    profile: bool = False
    timeline: bool = False
    tracemalloc: bool = False
    env: dict[str, str] = field(default_factory=dict)
    sim_profile: str = "instant"
    sim_time_scale: float = 1.0
    side_by_side: bool = False
    """NVIDIA's operator against ours, each run on a fresh cluster, no limit."""
    joins: int = 1
    """Node joins per operator run, one after the other (the one before leaves first): a join takes a
    few seconds and varies by as much, so one sample per 10-minute run says little."""


# --- predicates over watched collections -------------------------------------------------------------


def policy_ready(name: str, gpu_nodes: int) -> Callable[[Objects], bool]:
    def check(objects: Objects) -> bool:
        body = objects.get(f"/{name}")
        if body is None:
            return False
        status = body.get("status") or {}
        return bool(
            status.get("state") == "ready"
            and status.get("observedGeneration") == body["metadata"].get("generation")
            and status.get("gpuNodes") == gpu_nodes
        )

    return check


def policy_counts(name: str, gpu_nodes: int) -> Callable[[Objects], bool]:
    """The operator's status counts `gpu_nodes` GPU nodes (whatever its state)."""

    def check(objects: Objects) -> bool:
        body = objects.get(f"/{name}")
        return body is not None and (body.get("status") or {}).get("gpuNodes") == gpu_nodes

    return check


def daemonsets_rolled_out(expected: Mapping[str, int]) -> Callable[[Objects], bool]:
    """Every expected DaemonSet current and fully available on exactly its expected number of nodes. One
    expected on no node may be absent (an operator may leave out what would run nowhere)."""

    def check(objects: Objects) -> bool:
        by_name = {body["metadata"]["name"]: body for body in objects.values()}
        for name, count in expected.items():
            body = by_name.get(name)
            if body is None:
                if count == 0:
                    continue
                return False
            status = body.get("status") or {}
            if int(status.get("observedGeneration") or 0) < int(body["metadata"].get("generation") or 0):
                return False
            numbers = [
                status.get(key) or 0
                for key in (
                    "desiredNumberScheduled",
                    "updatedNumberScheduled",
                    "numberAvailable",
                    "numberReady",
                )
            ]
            if any(n != count for n in numbers):
                return False
        return True

    return check


def desired_pods(objects: Objects) -> dict[str, int]:
    """DaemonSet name → the pods it wants: what an operator deployed, for the results."""
    return {
        body["metadata"]["name"]: int((body.get("status") or {}).get("desiredNumberScheduled") or 0)
        for body in objects.values()
    }


def all_gpus_advertised(gpu_nodes: int) -> Callable[[Objects], bool]:
    def check(objects: Objects) -> bool:
        advertised = sum(
            1
            for body in objects.values()
            if int(((body.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu") or 0) > 0
        )
        return advertised >= gpu_nodes

    return check


def pod_ready(body: Mapping[str, Any]) -> bool:
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pods_ready(components: frozenset[str], key: str = COMPONENT_LABEL) -> Callable[[Objects], bool]:
    """A Ready pod of every component, named by the pods' label `key` (the watch is limited to one node)."""

    def check(objects: Objects) -> bool:
        ready = {
            (body["metadata"].get("labels") or {}).get(key) for body in objects.values() if pod_ready(body)
        }
        return components <= ready

    return check


def own_driver(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy with its driver its own (`driver.useNvidiaDriverCRD: false`): the seed sample delegates
    its driver to NVIDIADriver objects, which every round before the operator ran them ignored, so the
    rounds measure the same stack, the ClusterPolicy's driver included."""
    driver = policy.setdefault("spec", {}).setdefault("driver", {})
    driver["useNvidiaDriverCRD"] = False
    return policy


# --- one size ----------------------------------------------------------------------------------------


class SizeBench:
    """All runs at one size N, on one fresh cluster."""

    def __init__(
        self, settings: Settings, nodes: int, policy: Path = POLICY, operator: str = OURS, run_name: str = ""
    ) -> None:
        self.s = settings
        self.n = nodes
        self.ours = operator == OURS
        # Before any cluster starts: NVIDIA's runs need its build (`make nvidia-operator`).
        self.nvidia_build = None if self.ours else nvidia.build()
        self.work = settings.work / f"n{nodes}" / run_name if run_name else settings.work / f"n{nodes}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.policy = self.work / "policy.yaml"
        document = own_driver(yaml.safe_load(policy.read_text()))
        self.policy.write_text(
            yaml.safe_dump(document if self.ours else nvidia.with_required_sections(document))
        )
        self.log_file = self.work / "bench.log"
        self.cluster = Cluster(
            settings.cluster_name,
            settings.port_base,
            nodes,
            self.log_file,
            sim_profile=settings.sim_profile,
            sim_time_scale=settings.sim_time_scale,
        )
        self.tools = bin_dir()
        self.kubectl = str(self.tools / "kubectl")
        self.kubelet_version = versions()["K8S_VERSION"]
        self.policy_doc: dict[str, Any] = yaml.safe_load(self.policy.read_text())
        self.policy_name = str(self.policy_doc["metadata"]["name"])
        self.spec: ClusterPolicySpec = parse_document(self.policy_doc)
        self.loads: list[float] = []
        self.timeout = max(300.0, nodes * 2.0)

    # --- set-up and tear-down ---
    def setup(self) -> None:
        log(f"N={self.n}: starting cluster {self.s.cluster_name} (ports from {self.s.port_base})")
        self.cluster.down()
        start = time.time()
        self.cluster.up()
        self.cluster_up_s = time.time() - start
        self.kubeconfig = self.cluster.kubeconfig
        self.api = kubeapi.connect(self.kubeconfig, pool=LABEL_WORKERS * 2)
        self.install_crds()
        if self.s.admin:
            self.user = self.api.request(
                "POST",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )["status"]["userInfo"]["username"]
            self.operator_kubeconfig = self.kubeconfig
            self.kc("create", "namespace", NAMESPACE)
            excluded: tuple[str, ...] = ("kubectl", "helm", "Helm", "gpu-operator-bench")
        else:
            self.user = SERVICE_ACCOUNT_USER
            self.install_rbac()
            self.operator_kubeconfig = sa_kubeconfig(
                self.api, self.kubeconfig, self.work / "operator-kubeconfig"
            )
            excluded = ()
        # The ConfigMaps the seed policy names (devicePlugin.config, migManager.config): without them
        # the emulated kubelet leaves the device plugin and GFD waiting to mount them, as a kubelet does.
        for path in SEED_CONFIG_MAPS:
            self.kc("apply", "--server-side", "-f", str(path))
        self.audit = audit.AuditReader(self.cluster.audit_log, self.user, excluded)
        self.pod_audit = audit.AuditReader(
            self.cluster.audit_log, None, keep=lambda r: r.namespace == NAMESPACE, marker='"resource":"pods"'
        )
        nodes = kubeapi.items(self.api, NODES)
        self.gpu_nodes = sum(1 for n in nodes if node_info(n).is_gpu)
        assert self.gpu_nodes == self.n, f"{self.gpu_nodes} GPU nodes, expected {self.n}"
        nodes_file = self.work / "nodes.yaml"
        nodes_file.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        self.rendered = self.work / "rendered.yaml"
        self.rendered.write_text(
            run(
                [
                    str(OPERATOR),
                    "render",
                    "-f",
                    str(self.policy),
                    "--nodes",
                    str(nodes_file),
                    "--namespace",
                    NAMESPACE,
                    # What the operator renders there: the bench's cluster has no Prometheus operator.
                    "--no-servicemonitor-crd",
                ]
            )
        )
        # What the operator ends up owning on each node, once every dependency is ready. NVIDIA's node
        # watch ignores GFD's mig.capable (controllers/clusterpolicy_controller.go:369-408), but it
        # reconciles again while its states are not ready, and so comes to the same MIG manager.
        self.final_labels = {
            n["metadata"]["name"]: labels
            for n in nodes
            if (labels := desired_labels(final_info(n), self.spec, always_ready))
        }
        labels_now = {
            n["metadata"]["name"]: {
                **(n["metadata"].get("labels") or {}),
                **self.final_labels.get(n["metadata"]["name"], {}),
            }
            for n in nodes
        }
        self.expected_daemonsets: dict[str, int] = {}
        for doc in yaml.safe_load_all(self.rendered.read_text()):
            if doc and doc.get("kind") == "DaemonSet":
                selector = doc["spec"]["template"]["spec"].get("nodeSelector") or {}
                count = sum(
                    1
                    for labels in labels_now.values()
                    if all(labels.get(k) == v for k, v in selector.items())
                )
                self.expected_daemonsets[doc["metadata"]["name"]] = count
        log(f"N={self.n}: cluster up in {self.cluster_up_s:.0f}s; expected pods {self.expected_daemonsets}")
        self.sample_load()

    def install_crds(self) -> None:
        """Ours: its ClusterPolicy CRD. NVIDIA's: every CRD of its chart (what `helm install` applies)."""
        if self.nvidia_build is not None:
            for path in self.nvidia_build.crds:
                self.kc("apply", "--server-side", "--force-conflicts", "-f", str(path))
            for name in nvidia.CRD_NAMES:
                self.wait_established(name)
            return
        crd = ROOT / "crds" / "clusterpolicy.yaml"
        self.kc("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.wait_established("clusterpolicies.nvidia.com")

    def install_rbac(self) -> None:
        """The ServiceAccount `gpu-operator` the operator logs in as, and its roles: our chart's, or NVIDIA's
        chart's (its ServiceAccount, Roles and bindings only; bench/nvidia.py)."""
        helm = self.tools / "helm"
        if self.nvidia_build is not None:
            self.kc("create", "namespace", NAMESPACE)
            rbac = run(nvidia.rbac_command(helm, self.nvidia_build.chart), log_file=self.log_file)
            self.kc("apply", "--server-side", "-f", "-", input=rbac)
            return
        install_chart(helm, self.kubeconfig, self.log_file)
        # Fail before anything is timed rather than time an operator that cannot do its job.
        missing = missing_access(self.api, self.user)
        if missing:
            raise RuntimeError(f"charts/gpu-operator does not give the operator: {', '.join(missing)}")

    def wait_established(self, name: str) -> None:
        deadline = time.time() + 60
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        while not any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (kubeapi.get(self.api, path).get("status") or {}).get("conditions") or []
        ):
            if time.time() > deadline:
                raise TimeoutError(f"CRD {name} not Established after 60s")
            time.sleep(0.2)

    def teardown(self) -> None:
        if getattr(self, "api", None) is not None:
            self.api.close()
        if self.s.keep_cluster:
            log(f"N={self.n}: keeping cluster {self.s.cluster_name} (--keep-cluster)")
            return
        self.cluster.down()

    def kc(self, *args: str, input: str | None = None) -> str:
        return run(
            [self.kubectl, "--kubeconfig", str(self.kubeconfig), *args], input=input, log_file=self.log_file
        )

    def pipeline(self, start: float, end: float) -> dict[str, Any]:
        """What the control plane did with the operand pods between start and end (see audit.Pipeline)."""
        found = audit.pod_pipeline(audit.in_window(self.pod_audit.update(), start, end), start)
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(found).items()}

    def sample_load(self) -> None:
        self.loads.append(procstat.load_average()[0])

    def terminated_watchers(self) -> dict[str, int]:
        return procstat.terminated_watchers(self.kc("get", "--raw", "/metrics"))

    def watchers_closed(self, before: Mapping[str, int]) -> dict[str, int]:
        """The watchers the API server closed as unresponsive since `before`, by resource."""
        now = self.terminated_watchers()
        return {k: n for k, v in now.items() if (n := v - before.get(k, 0))}

    def control_plane_cpu(self, operator: OperatorProcess | None = None) -> dict[str, float]:
        pids = self.cluster.pids()
        if operator is not None and operator.running:
            pids["operator"] = operator.pid
        return procstat.cpu_seconds(pids)

    # --- waiting for a clean cluster between runs ---
    def leftovers(self, join_node: str | None) -> list[str]:
        found = []
        if kubeapi.exists(self.api, POLICIES):
            found.append("ClusterPolicy")
        found += [
            path.rsplit("/", 1)[-1]
            for path in MANAGED_COLLECTIONS
            if kubeapi.exists(self.api, path, SELECTOR)
        ]
        if kubeapi.exists(self.api, PODS):
            found.append("pods")
        found += [f"label {key}" for key in OPERATOR_LABELS if kubeapi.exists(self.api, NODES, key)]
        if join_node and kubeapi.exists(self.api, f"{NODES}/{join_node}"):
            found.append(f"node {join_node}")
        return found

    def strip_labels(self) -> None:
        """The operator labels an emulated operand manager still owns once the limit's apply released its
        own: k8s-driver-manager writes "" for the operand labels it finds absent when a driver pod
        starts, and restores "true" after a pause, under its own field manager."""
        for node in kubeapi.items(self.api, NODES):
            left = {key: None for key in OPERATOR_LABELS if key in (node["metadata"].get("labels") or {})}
            if left:
                self.api.patch_node(node["metadata"]["name"], {"metadata": {"labels": left}}, LIMIT_MANAGER)

    def clean_up(self, join_node: str | None, strip: bool = False) -> float:
        """Remove pods without their grace period once the DaemonSets are gone (bench housekeeping:
        nothing here is timed), delete the joined node, and wait until nothing of a run is left.
        `strip`: remove the operator labels left on the nodes too (after the limit, which has no
        operator to release them)."""
        start = time.time()
        deadline = start + self.timeout
        while kubeapi.exists(self.api, DAEMONSETS, SELECTOR):
            if time.time() > deadline:
                raise TimeoutError(f"N={self.n}: DaemonSets still there after {self.timeout:.0f}s")
            time.sleep(0.5)
        self.delete_pods()
        if join_node:
            kubeapi.delete(self.api, f"{NODES}/{join_node}", body={"gracePeriodSeconds": 0})
        while left := self.leftovers(join_node):
            if time.time() > deadline:
                raise TimeoutError(f"N={self.n}: still there after {self.timeout:.0f}s: {left}")
            if "pods" in left:
                self.delete_pods()
            if strip and any(item.startswith("label ") for item in left):
                self.strip_labels()
            time.sleep(1.0)
        return time.time() - start

    def delete_pods(self) -> None:
        """One component at a time (about N pods each); a failed call is retried by the caller's loop."""
        for component in COMPONENTS:
            try:
                kubeapi.delete_collection(self.api, PODS, f"{COMPONENT_LABEL}={component.component_label}")
            except (ApiError, OSError) as exc:
                log(f"N={self.n}: deleting {component.name} pods: {exc}; will retry")
        try:
            # The validator's workload pods (the emulated validator creates them, as NVIDIA's does).
            kubeapi.delete_collection(self.api, PODS, f"app in ({','.join(VALIDATOR_WORKLOADS)})")
        except (ApiError, OSError) as exc:
            log(f"N={self.n}: deleting validator workload pods: {exc}; will retry")

    # --- node join ---
    def join_node_body(self, with_labels: bool, index: int = 0) -> tuple[dict[str, Any], frozenset[str]]:
        body: dict[str, Any] = gen_nodes.make_node("gpu", self.n + index, self.kubelet_version)
        final = desired_labels(final_info(body), self.spec, always_ready)
        labels = {**body["metadata"]["labels"], **final}
        # A component whose DaemonSet selects more than its deploy label (the MPS control daemon shares
        # the device plugin's and wants nvidia.com/mps.capable) runs only where its filter matches.
        components = frozenset(
            c.component_label
            for c in COMPONENTS
            if final.get(c.deploy_label) == "true" and c.node_filter(labels)
        )
        if with_labels:
            body["metadata"]["labels"].update(final)
        return body, components

    def leave(self, node: str) -> float:
        """Delete a joined node and wait until the policy counts N nodes again: how long that took."""
        gone = time.time()
        kubeapi.delete(self.api, f"{NODES}/{node}", body={"gracePeriodSeconds": 0})
        Watcher(
            self.api,
            POLICIES,
            policy_counts(self.policy_name, self.n),
            {"fieldSelector": f"metadata.name={self.policy_name}"},
            "policy back to N nodes",
        ).start().wait(120.0)
        return time.time() - gone

    def quiet(self) -> float:
        """Wait until the simulated device manager advertises nvidia.com/gpu on every GPU node (its node
        status patches trail the device-plugin pods by seconds at 1000 nodes), then settle_s more: a
        node join is timed on a cluster that is done with the previous convergence, for both sides."""
        start = time.time()
        Watcher(self.api, NODES, all_gpus_advertised(self.n), what="nvidia.com/gpu advertised").start().wait(
            self.timeout
        )
        time.sleep(self.s.settle_s)
        return time.time() - start

    def join(self, with_labels: bool, policy: bool, index: int = 0) -> dict[str, Any]:
        body, components = self.join_node_body(with_labels, index)
        name = body["metadata"]["name"]
        # NVIDIA's pods carry no component label: they are known by their DaemonSet's, as ours are too.
        apps = frozenset(BY_LABEL[c].daemonset for c in components)
        pods = Watcher(
            self.api,
            PODS,
            pods_ready(components) if self.ours else pods_ready(apps, APP_LABEL),
            {"fieldSelector": f"spec.nodeName={name}"},
            f"pods on {name}",
        ).start()
        status = None
        if policy:
            status = Watcher(
                self.api,
                POLICIES,
                policy_ready(self.policy_name, self.n + 1),
                {"fieldSelector": f"metadata.name={self.policy_name}"},
                "policy ready with the new node",
            ).start()
        t0 = time.time()
        self.api.request("POST", NODES, body=body)
        done = pods.wait(self.timeout)
        result: dict[str, Any] = {"node": name, "components": sorted(components), "pods_ready_s": done - t0}
        if status is not None:
            result["policy_ready_s"] = status.wait(self.timeout) - t0
        result["t0"], result["t1"] = t0, max(done, t0 + result.get("policy_ready_s", 0.0))
        return result

    # --- the operator ---
    def new_operator(self, round_no: int) -> OperatorProcess:
        """Ours (`gpu-operator run`, probe on port base +90) or NVIDIA's (probe +91, metrics +92)."""
        log_path = self.work / f"operator-r{round_no}.log"
        base = self.s.port_base
        if self.nvidia_build is not None:
            return nvidia.NvidiaProcess(
                self.nvidia_build, self.operator_kubeconfig, log_path, base + 91, base + 92
            )
        env = dict(self.s.env)
        module = "gpu_operator.cli"
        if self.s.tracemalloc:
            env[memtrace.ENV] = str(self.work / f"memtrace-r{round_no}.txt")
            module = "bench.memtrace"
        return OperatorProcess(self.operator_kubeconfig, log_path, base + 90, env, module)

    def start_operator(self, round_no: int) -> OperatorProcess:
        proc = self.new_operator(round_no).start()
        deadline = time.time() + 120
        while True:
            if not proc.running:
                raise RuntimeError(f"operator exited at start-up:\n{proc.tail()}")
            watching = {
                r.resource
                for r in self.audit.update()
                if r.verb == "watch" and r.received >= proc.started_at - 1
            }
            if watching >= OPERATOR_WATCHES:
                break
            if time.time() > deadline:
                raise TimeoutError(f"operator watches {sorted(watching)} after 120s:\n{proc.tail()}")
            time.sleep(0.2)
        # Ours past its first pass (no policy yet; Kopf caches probe answers for 10 s), NVIDIA's ready.
        while not proc.up():
            if time.time() > deadline:
                raise TimeoutError(f"operator not up after 120s: {proc.probe()}\n{proc.tail()}")
            time.sleep(1.0)
        return proc

    def start_profiler(self, proc: OperatorProcess, round_no: int) -> subprocess.Popen[bytes]:
        """py-spy on every thread of the operator, idle ones too (a wall-clock view), 20 samples a second."""
        py_spy = Path(sys.executable).parent / "py-spy"
        if not py_spy.exists():
            raise RuntimeError(f"--profile needs py-spy: {Path(sys.executable).parent}/pip install py-spy")
        output = self.work / f"profile-r{round_no}.txt"
        command = [str(py_spy), "record", "--pid", str(proc.pid), "--idle", "--threads", "--rate", "20"]
        command += ["--format", "raw", "--output", str(output), "--nonblocking"]
        with self.log_file.open("ab") as out:
            spy = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.profile_output = output
        return spy

    def stop_profiler(self, spy: subprocess.Popen[bytes]) -> dict[str, float]:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        return profile.summarise(self.profile_output.read_text()) if self.profile_output.exists() else {}

    def memtrace(self, proc: OperatorProcess, round_no: int) -> list[str]:
        """Ask the traced operator (bench.memtrace) for what it has allocated now."""
        output = self.work / f"memtrace-r{round_no}.txt"
        output.unlink(missing_ok=True)
        assert proc.process is not None
        proc.process.send_signal(signal.SIGUSR1)
        deadline = time.time() + 120
        while not output.exists() or not output.read_text().endswith("\n"):
            if time.time() > deadline:
                return ["no tracemalloc report after 120 s"]
            time.sleep(0.5)
        return output.read_text().splitlines()

    @staticmethod
    def operator_usage(proc: OperatorProcess, peaks: list[float]) -> procstat.ProcessUsage:
        usage = procstat.usage(proc.pid)
        if usage is None or not proc.running:
            code = proc.process.poll() if proc.process is not None else None
            raise RuntimeError(
                f"the operator exited ({code}; -15: SIGTERM from outside the bench):\n{proc.tail()}"
            )
        if usage.peak_rss_mib is not None:
            peaks.append(usage.peak_rss_mib)
        return usage

    @property
    def apply_policy(self) -> tuple[str, ...]:
        """How the policy is applied. NVIDIA's CRD does not declare the sample's
        `dcgmExporter.serviceMonitoring` (a deprecated alias of serviceMonitor.enabled that ours reads):
        a client-side apply with `--validate=warn` has its API server drop the field with a warning, as
        for any user of the sample; a server-side apply would refuse the whole object."""
        return ("--server-side",) if self.ours else ("--validate=warn",)

    def rolled_out(self, watcher: Watcher) -> float:
        """The rollout's end; on a time-out, what each DaemonSet wanted against what was expected."""
        try:
            return watcher.wait(self.timeout)
        except TimeoutError as exc:
            found = desired_pods(watcher.objects)
            raise TimeoutError(f"{exc}: expected {self.expected_daemonsets}, desired {found}") from exc

    def operator_round(self, round_no: int, rest: bool, cleanup: bool = True) -> dict[str, Any]:
        # Clean-up knows our objects and labels; NVIDIA's runs each have a fresh cluster.
        assert self.ours or not cleanup, "NVIDIA's operator runs are never cleaned up"
        proc = self.start_operator(round_no)
        try:
            return self._operator_round(proc, round_no, rest, cleanup)
        finally:
            proc.stop()

    def _operator_round(
        self, proc: OperatorProcess, round_no: int, rest: bool, cleanup: bool
    ) -> dict[str, Any]:
        watcher = Watcher(
            self.api,
            POLICIES,
            # NVIDIA's reports neither a generation nor a node count: its state alone.
            policy_ready(self.policy_name, self.n) if self.ours else nvidia.policy_ready(self.policy_name),
            {"fieldSelector": f"metadata.name={self.policy_name}"},
            "policy ready",
        ).start()
        assert not watcher.held_before_start, "a ready ClusterPolicy before the run"
        # Side by side, the operators' verdicts differ (NVIDIA's counts a DaemonSet no node wants yet as
        # ready, controllers/object_controls.go:4006-4009): both are also timed to the limit's end, every
        # DaemonSet rolled out on its nodes.
        rollout = (
            Watcher(
                self.api, DAEMONSETS, daemonsets_rolled_out(self.expected_daemonsets), what="rollout"
            ).start()
            if self.s.side_by_side
            else None
        )
        spy = self.start_profiler(proc, round_no) if self.s.profile and self.ours else None
        cpu0, busy0 = self.control_plane_cpu(proc), procstat.machine_busy()
        closed0 = self.terminated_watchers()
        passes0, planning0 = _passes(proc)
        loop0 = procstat.thread_cpu(proc.pid, proc.pid)  # the main thread runs the event loop
        t0 = time.time()
        self.kc("apply", *self.apply_policy, "-f", str(self.policy))
        t_ready = watcher.wait(self.timeout)
        t_rollout = self.rolled_out(rollout) if rollout is not None else None
        t_done = max(t_ready, t_rollout or t_ready)
        if self.s.timeline:
            self.write_timeline(
                f"{'ours' if self.ours else 'nvidia'}-r{round_no}", t0, writer_marker(user=self.user)
            )
        shares = self.stop_profiler(spy) if spy is not None else None
        cpu1, busy1 = self.control_plane_cpu(proc), procstat.machine_busy()
        passes1, planning1 = _passes(proc)
        loop1 = procstat.thread_cpu(proc.pid, proc.pid)
        peaks: list[float] = []
        self.operator_usage(proc, peaks)
        result: dict[str, Any] = {
            "round": round_no,
            "converge_s": t_ready - t0,
            "converge_cpu_s": cpu1.get("operator", 0.0) - cpu0.get("operator", 0.0),
            "passes": int(passes1 - passes0),
            # Ours only: its probe's planning CPU, and its event loop on the main thread.
            "planning_cpu_s": round(planning1 - planning0, 2) if self.ours else None,
            "event_loop_cpu_s": None
            if loop0 is None or loop1 is None or not self.ours
            else round(loop1 - loop0, 2),
            "cpu_by_process": procstat.cpu_delta(cpu0, cpu1),
            "machine_busy": procstat.busy_fraction(busy0, busy1),
            "pods": self.pipeline(t0, t_done),
            "load_average_1m": procstat.load_average()[0],
            "watchers_closed": self.watchers_closed(closed0),
        }
        if rollout is not None and t_rollout is not None:
            result["rollout_s"] = t_rollout - t0
            result["daemonsets"] = desired_pods(rollout.objects)
        if shares is not None:
            result["profile"] = shares
        self.sample_load()
        log(f"N={self.n} r{round_no}: operator ready after {result['converge_s']:.2f}s {result['pods']}")
        settled = t_done + self.s.settle_s
        time.sleep(max(0.0, settled - time.time()))
        rest_end = settled
        if rest:
            log(f"N={self.n} r{round_no}: at rest for {self.s.rest_s:.0f}s")
            cpu_rest0 = self.control_plane_cpu(proc)
            rest_end = settled + self.s.rest_s
            while time.time() < rest_end:
                time.sleep(min(30.0, max(0.0, rest_end - time.time())))
                self.sample_load()
            result["rest_cpu_by_process"] = procstat.cpu_delta(cpu_rest0, self.control_plane_cpu(proc))
            self.operator_usage(proc, peaks)
        result["quiet_s"] = self.quiet()
        joined = self.join(with_labels=False, policy=self.ours)
        result["join_s"] = joined["pods_ready_s"]
        result["join_policy_ready_s"] = joined.get("policy_ready_s")
        log(f"N={self.n} r{round_no}: operator node join {result['join_s']:.2f}s")
        time.sleep(max(0.0, joined["t1"] + self.s.settle_s - time.time()))
        requests = self.audit.update()
        converging = audit.in_window(requests, t0, settled)
        result["requests"] = len(converging)
        result["requests_by_kind"] = audit.by_verb_resource(converging)
        result["timeline"] = audit.timeline(audit.writes(converging), t0)
        result["join_requests_by_kind"] = audit.by_verb_resource(
            audit.in_window(requests, joined["t0"], joined["t1"] + self.s.settle_s)
        )
        if rest:
            resting = audit.in_window(requests, settled, rest_end)
            result["rest_s"] = self.s.rest_s
            result["rest_requests_by_kind"] = audit.by_verb_resource(resting)
            result["rest_writes"] = [audit.describe(r, settled) for r in audit.writes_at_rest(resting)]
            renewals = len(audit.writes(resting)) - len(audit.writes_at_rest(resting))
            result["lease_renewals_per_min"] = audit.per_minute(renewals, self.s.rest_s)
            result["rest_reads"] = [
                f"{r.verb} {r.resource} {r.name} x{r.count}"
                + (f" every {r.mean_interval_s:.0f}s" if r.mean_interval_s else "")
                for r in audit.repeated_reads(resting)
            ]
        for index in range(1, self.s.joins):
            self.leave(joined["node"])
            time.sleep(self.s.settle_s)
            joined = self.join(with_labels=False, policy=self.ours, index=index)
            log(f"N={self.n} r{round_no}: operator node join {index + 1}: {joined['pods_ready_s']:.2f}s")
            time.sleep(max(0.0, joined["t1"] + self.s.settle_s - time.time()))
            result.setdefault("more_joins_s", []).append(joined["pods_ready_s"])
        if self.s.tracemalloc and self.ours:
            result["memtrace"] = self.memtrace(proc, round_no)
        # The process's cost: start-up, convergence, the rest window (first run) and the node join.
        usage = self.operator_usage(proc, peaks)
        result["process_cpu_s"] = usage.cpu_s
        result["process_rss_mib"] = usage.rss_mib
        result["process_lifetime_s"] = time.time() - proc.started_at
        if cleanup:
            # The joined node goes first, and the operator is given time to see it gone: deleting a
            # node while the operator removes its labels makes its server-side apply try to create the
            # node (403, a failed pass; see bench/README.md), which is not what this bench measures.
            result["node_leave_s"] = self.leave(joined["node"])
            kubeapi.delete(self.api, f"{POLICIES}/{self.policy_name}")
            result["cleanup_s"] = self.clean_up(joined["node"])
            self.operator_usage(proc, peaks)
        # VmHWM only grows; several reads, so one unreadable moment cannot lose the peak.
        result["process_peak_rss_mib"] = max(peaks, default=None)
        for line in proc.tail(400).splitlines():
            if "Traceback" in line or " 403" in line or "orbidden" in line:
                result.setdefault("log_problems", []).append(line[:300])
        return result

    def write_timeline(self, run_name: str, t0: float, marker: str) -> None:
        """bench/timeline.py's steps of this run, from its pods as they are now and the audit log."""
        pods = kubeapi.items(self.api, PODS)
        text = timeline.report(self.cluster.audit_log, pods, marker, t0, NAMESPACE)
        path = self.s.out.with_name(f"{self.s.out.name}-timeline-n{self.n}-{run_name}.md")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {run_name}, {self.n} GPU nodes, {self.s.sim_profile} profile\n\n{text}")
        log(f"N={self.n} {run_name}: per-node steps in {path}")

    # --- the limit ---
    def label_nodes(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """One server-side apply per node, LABEL_WORKERS at a time (what `kubectl label` in bulk does
        one by one)."""

        def apply(name: str) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": dict(labels[name])},
            }
            self.api.apply(body, LIMIT_MANAGER)

        with concurrent.futures.ThreadPoolExecutor(LABEL_WORKERS) as pool:
            for future in [pool.submit(apply, name) for name in labels]:
                future.result()

    def limit_round(self, round_no: int, cleanup: bool = True) -> dict[str, Any]:
        watcher = Watcher(
            self.api,
            DAEMONSETS,
            daemonsets_rolled_out(self.expected_daemonsets),
            {"labelSelector": SELECTOR},
            "rollout",
        ).start()
        assert not watcher.held_before_start, "DaemonSets rolled out before the run"
        cpu0, busy0 = self.control_plane_cpu(), procstat.machine_busy()
        closed0 = self.terminated_watchers()
        t0 = time.time()
        command = [self.kubectl, "--kubeconfig", str(self.kubeconfig), "apply", "--server-side"]
        command += ["--force-conflicts", f"--field-manager={LIMIT_MANAGER}", "-f", str(self.rendered)]
        applying = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.label_nodes(self.final_labels)
        labelled = time.time()
        _, errors = applying.communicate()
        if applying.returncode != 0:
            raise RuntimeError(f"kubectl apply of the rendered objects failed: {errors}")
        applied = time.time()
        t_done = watcher.wait(self.timeout)
        cpu1, busy1 = self.control_plane_cpu(), procstat.machine_busy()
        if self.s.timeline:
            self.write_timeline(f"limit-r{round_no}", t0, writer_marker(agent=kubeapi.USER_AGENT))
        result: dict[str, Any] = {
            "round": round_no,
            "converge_s": t_done - t0,
            "labels_done_s": labelled - t0,
            "apply_done_s": applied - t0,
            "cpu_by_process": procstat.cpu_delta(cpu0, cpu1),
            "machine_busy": procstat.busy_fraction(busy0, busy1),
            "pods": self.pipeline(t0, t_done),
            "load_average_1m": procstat.load_average()[0],
            "watchers_closed": self.watchers_closed(closed0),
        }
        self.sample_load()
        log(f"N={self.n} r{round_no}: limit rolled out after {result['converge_s']:.2f}s {result['pods']}")
        result["quiet_s"] = self.quiet()
        joined = self.join(with_labels=True, policy=False)
        result["join_s"] = joined["pods_ready_s"]
        log(f"N={self.n} r{round_no}: limit node join {result['join_s']:.2f}s")
        if cleanup:
            self.kc("delete", "--ignore-not-found", "--wait=false", "-f", str(self.rendered))
            self.label_nodes({name: {} for name in self.final_labels})
            result["cleanup_s"] = self.clean_up(joined["node"], strip=True)
        return result

    # --- everything at this size ---
    def run(self) -> dict[str, Any]:
        started = time.time()
        try:
            self.setup()
            operator_runs, limit_runs = alternate(
                self.s.rounds.get(self.n, 3),
                None if self.s.operator_only else self.limit_round,
                # The first operator run (round 1) rests first: the cluster is fresh from its setup.
                lambda round_no, cleanup: self.operator_round(round_no, rest=round_no == 1, cleanup=cleanup),
            )
        finally:
            self.teardown()
        return summarise(self, operator_runs, limit_runs, time.time() - started)


def side_by_side(settings: Settings, nodes: int) -> dict[str, Any]:
    """Ours and NVIDIA's operator at one size, each run on a fresh cluster, alternating (ours, NVIDIA's,
    ours, ...): the same rounds as an operator run of `make bench` (the first of each side rests), with
    the rollout timed too. No limit runs, and no clean-up: each cluster goes away with its run."""
    started = time.time()
    runs: dict[str, list[dict[str, Any]]] = {OURS: [], NVIDIA: []}
    loads: list[float] = []
    for round_no in range(1, settings.rounds.get(nodes, 3) + 1):
        for operator in (OURS, NVIDIA):
            bench = SizeBench(settings, nodes, operator=operator, run_name=f"{operator}-r{round_no}")
            try:
                bench.setup()
                result = bench.operator_round(round_no, rest=round_no == 1, cleanup=False)
            finally:
                bench.teardown()
            result["cluster_up_s"] = bench.cluster_up_s
            result["operator_user"] = bench.user
            runs[operator].append(result)
            loads += bench.loads
    return versus.summarise(nodes, runs[OURS], runs[NVIDIA], loads, time.time() - started)


Round = Callable[[int, bool], dict[str, Any]]
"""One run: (round number, clean up after it) → its result."""


def alternate(
    rounds: int, limit: Round | None, operator: Round
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The operator's and the limit's runs, `rounds` of each, in alternating order (limit first in odd
    rounds), so neither side always runs on the fresher cluster; no limit runs when `limit` is None.
    The last run leaves its objects: the cluster goes away with them."""
    operator_runs: list[dict[str, Any]] = []
    limit_runs: list[dict[str, Any]] = []
    phases = [
        (kind, round_no)
        for round_no in range(1, rounds + 1)
        for kind in (("limit", "operator") if round_no % 2 else ("operator", "limit"))
        if limit is not None or kind == "operator"
    ]
    for index, (kind, round_no) in enumerate(phases):
        cleanup = index < len(phases) - 1
        if limit is not None and kind == "limit":
            limit_runs.append(limit(round_no, cleanup))
        else:
            operator_runs.append(operator(round_no, cleanup))
    return operator_runs, limit_runs


def summarise(
    bench: SizeBench, operator_runs: list[dict[str, Any]], limit_runs: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """Per-size results: medians of the runs, the paired ratio, the first run's traffic, the costs."""
    n = bench.n
    op = [r["converge_s"] for r in operator_runs]
    lim = [r["converge_s"] for r in limit_runs]
    op_join = [r["join_s"] for r in operator_runs]
    lim_join = [r["join_s"] for r in limit_runs]
    first = operator_runs[0]
    result: dict[str, Any] = {
        "nodes": n,
        "rounds": len(operator_runs),
        "operator_s": stats.median(op),
        "limit_s": stats.median(lim),
        "ratio": stats.median(stats.paired_ratios(op, lim)),
        "node_join_operator_s": stats.median(op_join),
        "node_join_limit_s": stats.median(lim_join),
        "node_join_ratio": stats.median(stats.paired_ratios(op_join, lim_join)),
        "node_join_policy_ready_s": stats.median([r["join_policy_ready_s"] for r in operator_runs]),
        "requests_per_node": stats.median([r["requests"] / n for r in operator_runs]),
        "peak_rss_mib": max(r["process_peak_rss_mib"] or 0.0 for r in operator_runs),
        "rss_after_join_mib": first.get("process_rss_mib"),
        "cpu_s": first["process_cpu_s"],
        "converge_cpu_s": stats.median([r["converge_cpu_s"] for r in operator_runs]),
        "planning_cpu_s": stats.median([r.get("planning_cpu_s", 0.0) for r in operator_runs]),
        "event_loop_cpu_s": stats.median([r.get("event_loop_cpu_s") or 0.0 for r in operator_runs]),
        "operator_profile": first.get("profile", {}),
        "operator_runs_s": op,
        "limit_runs_s": lim,
        "ratios": stats.paired_ratios(op, lim),
        "node_join_operator_runs_s": op_join,
        "node_join_operator_all_s": [
            j for r in operator_runs for j in [r["join_s"], *r.get("more_joins_s", [])]
        ],
        "node_join_limit_runs_s": lim_join,
        "pod_watchers_closed_runs": [r.get("watchers_closed", {}).get("pods", 0) for r in operator_runs],
        "limit_pod_watchers_closed_runs": [r.get("watchers_closed", {}).get("pods", 0) for r in limit_runs],
        **audit.first_run_traffic(first),
        "operator_timeline": first.get("timeline", []),
        "operator_user": bench.user,
        "operator_runs": operator_runs,
        "limit_runs": limit_runs,
        "cluster_up_s": bench.cluster_up_s,
        "wall_s": wall_s,
        "load_average_1m": {"min": min(bench.loads), "max": max(bench.loads)},
    }
    return result


# --- the whole run -------------------------------------------------------------------------------------


def _passes(proc: OperatorProcess) -> tuple[float, float]:
    """The reconcile passes the operator has run, and the CPU seconds they took (its /healthz answer)."""
    reconcile = proc.probe().get("reconcile", {})
    return float(reconcile.get("passes", 0)), float(reconcile.get("planningCpuSeconds", 0.0))


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def write(settings: Settings, results: dict[str, dict[str, Any]], loads: list[float], started: str) -> None:
    document = {
        "date": started,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": procstat.machine(),
        "load_average": {"min": min(loads), "max": max(loads)} if loads else {},
        "settings": {
            "sizes": settings.sizes,
            "rounds": {str(k): v for k, v in settings.rounds.items()},
            "rest_s": settings.rest_s,
            "settle_s": settings.settle_s,
            "policy": f"{POLICY.relative_to(ROOT)}, driver.useNvidiaDriverCRD: false",
            "cluster": f"{settings.cluster_name} (ports from {settings.port_base})",
            "sim_profile": settings.sim_profile,
            "sim_time_scale": settings.sim_time_scale,
            "side_by_side": settings.side_by_side,
            **({"nvidia_operator": str(nvidia.build().dir.name)} if settings.side_by_side else {}),
        },
        "results": results,
    }
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.with_suffix(".json").write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    settings.out.with_suffix(".md").write_text(report.markdown(document))


def parse_rounds(values: list[str]) -> dict[int, int]:
    """`10=3 1000=1` → {10: 3, 1000: 1}."""
    found = {}
    for value in values:
        size, _, count = value.partition("=")
        found[int(size)] = int(count)
    return found


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000], help="GPU node counts")
    parser.add_argument(
        "--rounds", nargs="*", default=["10=3", "100=3", "1000=1"], help="SIZE=RUNS (default 3)"
    )
    parser.add_argument(
        "--joins", type=int, default=1, help="node joins per operator run, one after the other (default 1)"
    )
    parser.add_argument("--rest-seconds", type=float, default=300.0, help="time at rest after the first run")
    parser.add_argument(
        "--settle-seconds", type=float, default=5.0, help="pause after each ready before the next step"
    )
    parser.add_argument("--cluster-name", default="bench")
    parser.add_argument(
        "--port-base", type=int, default=29500, help="CLUSTER_PORT_BASE of the bench's cluster"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "latest", help="writes OUT.json, OUT.md"
    )
    parser.add_argument(
        "--work", type=Path, default=ROOT / ".cache" / "bench", help="logs and rendered files"
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the last cluster up")
    parser.add_argument(
        "--operator-only", action="store_true", help="no limit runs (profiling rounds; no ratio)"
    )
    parser.add_argument(
        "--admin", action="store_true", help="run the operator with the admin kubeconfig (no chart)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy while it converges"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="write each run's per-node steps (label, scheduled, initialized, ready): OUT-timeline-*.md",
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="run the operator under tracemalloc; report what it holds"
    )
    parser.add_argument(
        "--sim-profile",
        choices=["instant", "realistic"],
        default="instant",
        help="timing of the emulated operand images (hack/emulators/profile.py)",
    )
    parser.add_argument(
        "--sim-time-scale", type=float, default=1.0, help="multiplies every emulated duration (realistic)"
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="NVIDIA's operator (make nvidia-operator) against ours, a fresh cluster per run, no limit; "
        "writes OUT-side-by-side.json, .md",
    )
    args = parser.parse_args(argv)
    if args.side_by_side and args.operator_only:
        parser.error("--side-by-side has no limit runs to leave out")
    return Settings(
        sizes=args.sizes,
        rounds=parse_rounds(args.rounds),
        rest_s=args.rest_seconds,
        settle_s=args.settle_seconds,
        cluster_name=args.cluster_name,
        port_base=args.port_base,
        work=args.work,
        keep_cluster=args.keep_cluster,
        operator_only=args.operator_only,
        admin=args.admin,
        profile=args.profile,
        timeline=args.timeline,
        tracemalloc=args.tracemalloc,
        sim_profile=args.sim_profile,
        sim_time_scale=args.sim_time_scale,
        side_by_side=args.side_by_side,
        joins=max(1, args.joins),
        # Its own results: `make bench BENCH_ARGS=--side-by-side` never overwrites the limit's.
        out=args.out.with_name(args.out.name + "-side-by-side") if args.side_by_side else args.out,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results: dict[str, dict[str, Any]] = {}
    loads = [procstat.load_average()[0]]
    for size in settings.sizes:
        if settings.side_by_side:
            results[str(size)] = side_by_side(settings, size)
            loads += results[str(size)]["load_average_1m"].values()
        else:
            bench = SizeBench(settings, size)
            results[str(size)] = bench.run()
            loads += bench.loads
        write(settings, results, loads, started)
        log(f"N={size}: done in {results[str(size)]['wall_s']:.0f}s")
    print(report.versus_table(results) if settings.side_by_side else report.table(results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
