"""`make bench-upgrade`: a driver upgrade of N simulated GPU nodes by the operator, `maxParallelUpgrades`
P (and `maxUnavailable` P), against the limit of the same cluster: the same driver DaemonSet rolled
by the DaemonSet controller with `RollingUpdate` `maxUnavailable` P and nothing else.

On the bench's cluster (bench/run.py SizeBench: N kwok GPU nodes, the chart's RBAC, the operator as its
own process logged in as the chart's ServiceAccount, the seed article's sample policy):

* operator run: the policy at driver version A with `autoUpgrade`, converged (ready, GPUs advertised);
  then the version set to B. Time until `status.driverUpgrade` says every node upgraded at B (every
  driver pod Ready at B, validated, every node uncordoned). A node watch records the most nodes in
  progress and cordoned at once; the operator's requests come from the audit log.
* limit run: the operator stopped and its objects gone; the rendered objects applied with the driver
  DaemonSet `RollingUpdate` (`maxUnavailable` P) at A and every node label set, rolled out; then the
  DaemonSet's image set to B. Time until the DaemonSet is rolled out at B.

kwok has no k8s-driver-manager, which on a real node pauses the operands while the new driver loads,
so that the node's operator-validator pod is a new one (what the validation gate waits for). The bench
plays that part in the operator run (`ValidatorRestarts`: a new driver pod on a node → its validator
pod deleted, as the e2e tests do); the limit validates nothing.

    python -m bench.upgrade --nodes 100 --parallel 10 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench import audit, kubeapi, procstat, stats
from bench.cluster import NAMESPACE, ROOT, OperatorProcess, log
from bench.kubeapi import Objects, Watcher
from bench.run import (
    DAEMONSETS,
    NODES,
    PODS,
    POLICIES,
    POLICY,
    SELECTOR,
    Settings,
    SizeBench,
    alternate,
    daemonsets_rolled_out,
    git,
    policy_ready,
)
from gpu_operator.core.components import BY_NAME
from gpu_operator.core.upgrade.states import STATE_LABEL
from gpu_operator.runtime.sync_client import SyncKube

VERSION_A, VERSION_B = "570.195.03", "580.95.05"
DRIVER = BY_NAME["driver"]
VALIDATOR = BY_NAME["operator-validator"]
IDLE = ("", "upgrade-done", "upgrade-required")
ROLLED = ("desiredNumberScheduled", "updatedNumberScheduled", "numberAvailable", "numberReady")


def policy_at(version: str, parallel: int) -> dict[str, Any]:
    """The bench's sample policy with the driver at `version` and an automatic upgrade policy."""
    body: dict[str, Any] = yaml.safe_load(POLICY.read_text())
    driver = body["spec"]["driver"]
    driver.update(repository="nvcr.io/nvidia", image="driver", version=version)
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": parallel,
        "maxUnavailable": parallel,
    }
    return body


def upgraded(name: str, nodes: int, version: str) -> Callable[[Objects], bool]:
    """The operator's status: every node upgraded at `version`, for the current generation."""

    def check(objects: Objects) -> bool:
        body = objects.get(f"/{name}")
        if body is None:
            return False
        status = body.get("status") or {}
        upgrade = status.get("driverUpgrade") or {}
        return bool(
            status.get("observedGeneration") == body["metadata"].get("generation")
            and str(upgrade.get("targetVersion") or "").startswith(version)
            and upgrade.get("nodesDone") == nodes
            and upgrade.get("summary") == "up to date"
        )

    return check


def rolled_to(daemonset: str, image: str) -> Callable[[Objects], bool]:
    """The DaemonSet's template at `image`, and every pod updated, ready and available."""

    def check(objects: Objects) -> bool:
        body = objects.get(f"{NAMESPACE}/{daemonset}")
        if body is None:
            return False
        containers = body["spec"]["template"]["spec"]["containers"]
        status = body.get("status") or {}
        desired = status.get("desiredNumberScheduled") or 0
        return bool(
            containers[0]["image"] == image
            and int(status.get("observedGeneration") or 0) >= int(body["metadata"].get("generation") or 0)
            and desired > 0
            and all(status.get(key) == desired for key in ROLLED)
        )

    return check


class Concurrency:
    """The most GPU nodes in progress (upgrade state neither none, done nor required) and cordoned at
    once, over every node change a watch delivers."""

    def __init__(self) -> None:
        self.most_in_progress = 0
        self.most_cordoned = 0

    def __call__(self, objects: Objects) -> bool:
        in_progress = cordoned = 0
        for body in objects.values():
            labels = body["metadata"].get("labels") or {}
            in_progress += labels.get(STATE_LABEL, "") not in IDLE
            cordoned += bool((body.get("spec") or {}).get("unschedulable"))
        self.most_in_progress = max(self.most_in_progress, in_progress)
        self.most_cordoned = max(self.most_cordoned, cordoned)
        return False  # never done: stopped by the caller


class ValidatorRestarts:
    """k8s-driver-manager's part (see the module docstring): a driver pod newly placed on a node → the
    validator pod of that node deleted (its DaemonSet starts a new one)."""

    def __init__(self, api: SyncKube) -> None:
        self.api = api
        self.placed: set[str] = set()
        self.restarts = 0

    def __call__(self, objects: Objects) -> bool:
        for body in objects.values():
            uid, node = body["metadata"].get("uid", ""), (body.get("spec") or {}).get("nodeName")
            if node and uid not in self.placed:
                self.placed.add(uid)
                self.restart(node)
        return False

    def prime(self, pods: list[dict[str, Any]]) -> None:
        """The driver pods that exist before the upgrade are not new."""
        self.placed |= {b["metadata"].get("uid", "") for b in pods}

    def restart(self, node: str) -> None:
        query = {
            "labelSelector": f"app.kubernetes.io/component={VALIDATOR.component_label}",
            "fieldSelector": f"spec.nodeName={node}",
        }
        for pod in kubeapi.items(self.api, PODS, query):
            kubeapi.delete(self.api, f"{PODS}/{pod['metadata']['name']}", body={"gracePeriodSeconds": 0})
            self.restarts += 1


class UpgradeBench(SizeBench):
    def __init__(self, settings: Settings, nodes: int, parallel: int) -> None:
        settings.work.mkdir(parents=True, exist_ok=True)
        self.parallel = parallel
        self.policies = {}
        for version in (VERSION_A, VERSION_B):
            path = settings.work / f"upgrade-policy-{version}.yaml"
            path.write_text(yaml.safe_dump(policy_at(version, parallel)))
            self.policies[version] = path
        super().__init__(settings, nodes, policy=self.policies[VERSION_A])

    def setup(self) -> None:
        super().setup()
        # The limit's objects: the same as the operator's, the driver DaemonSet RollingUpdate.
        documents = [d for d in yaml.safe_load_all(self.rendered.read_text()) if d]
        driver = next(
            d for d in documents if d["kind"] == "DaemonSet" and d["metadata"]["name"] == DRIVER.daemonset
        )
        driver["spec"]["updateStrategy"] = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": self.parallel},
        }
        self.image_a = driver["spec"]["template"]["spec"]["containers"][0]["image"]
        self.image_b = self.image_a.replace(VERSION_A, VERSION_B)
        self.limit_objects = self.work / "rendered-limit.yaml"
        self.limit_objects.write_text(yaml.safe_dump_all(documents))

    def upgrade_round(self, round_no: int, cleanup: bool) -> dict[str, Any]:
        proc = self.start_operator(round_no)
        try:
            return self._upgrade_round(proc, round_no, cleanup)
        finally:
            proc.stop()

    def _upgrade_round(self, proc: OperatorProcess, round_no: int, cleanup: bool) -> dict[str, Any]:
        name, query = self.policy_name, {"fieldSelector": f"metadata.name={self.policy_name}"}
        ready = Watcher(self.api, POLICIES, policy_ready(name, self.n), query, "policy ready").start()
        self.kc("apply", "--server-side", "-f", str(self.policies[VERSION_A]))
        ready.wait(self.timeout)
        self.quiet()
        restarts = ValidatorRestarts(self.api)
        drivers = {"labelSelector": f"app.kubernetes.io/component={DRIVER.component_label}"}
        restarts.prime(kubeapi.items(self.api, PODS, drivers))  # the pods of before are not new
        stand_in = Watcher(self.api, PODS, restarts, drivers, "driver pods (validator restarts)").start()
        concurrency = Concurrency()
        nodes = Watcher(
            self.api, NODES, concurrency, {"labelSelector": "gpu-operator.sim/simulated=true"}
        ).start()
        done = Watcher(self.api, POLICIES, upgraded(name, self.n, VERSION_B), query, "upgraded").start()
        peaks: list[float] = []
        before = self.operator_usage(proc, peaks)
        cpu0, busy0 = self.control_plane_cpu(proc), procstat.machine_busy()
        t0 = time.time()
        self.kc("apply", "--server-side", "-f", str(self.policies[VERSION_B]))
        t_done = done.wait(self.timeout)
        cpu1, busy1 = self.control_plane_cpu(proc), procstat.machine_busy()
        nodes.stop()
        stand_in.stop()
        after = self.operator_usage(proc, peaks)
        time.sleep(self.s.settle_s)
        requests = audit.in_window(self.audit.update(), t0, t_done)
        result: dict[str, Any] = {
            "round": round_no,
            "upgrade_s": t_done - t0,
            "most_in_progress": concurrency.most_in_progress,
            "most_cordoned": concurrency.most_cordoned,
            "validator_restarts": restarts.restarts,
            "requests": len(requests),
            "requests_by_kind": audit.by_verb_resource(requests),
            "timeline": audit.timeline(audit.writes(requests), t0),
            "operator_cpu_s": cpu1.get("operator", 0.0) - cpu0.get("operator", 0.0),
            "cpu_by_process": procstat.cpu_delta(cpu0, cpu1),
            "machine_busy": procstat.busy_fraction(busy0, busy1),
            "rss_before_mib": before.rss_mib,
            "rss_after_mib": after.rss_mib,
            "peak_rss_mib": after.peak_rss_mib,
            "load_average_1m": procstat.load_average()[0],
        }
        self.sample_load()
        log(
            f"N={self.n} r{round_no}: operator upgraded in {result['upgrade_s']:.2f}s, at most "
            f"{concurrency.most_in_progress} in progress, {len(requests)} requests"
        )
        if cleanup:
            kubeapi.delete(self.api, f"{POLICIES}/{name}")
            result["cleanup_s"] = self.clean_up(None)
        return result

    def limit_upgrade_round(self, round_no: int, cleanup: bool) -> dict[str, Any]:
        rollout = Watcher(
            self.api, DAEMONSETS, daemonsets_rolled_out(self.expected_daemonsets), {"labelSelector": SELECTOR}
        ).start()
        self.kc(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gpu-operator-bench-limit",
            "-f",
            str(self.limit_objects),
        )
        self.label_nodes(self.final_labels)
        rollout.wait(self.timeout)
        self.quiet()
        path = f"{DAEMONSETS}/{DRIVER.daemonset}"
        query = {"fieldSelector": f"metadata.name={DRIVER.daemonset}"}
        done = Watcher(
            self.api, DAEMONSETS, rolled_to(DRIVER.daemonset, self.image_b), query, "limit rolled"
        ).start()
        container = self.kube_container()
        cpu0, busy0 = self.control_plane_cpu(), procstat.machine_busy()
        t0 = time.time()
        self.api.request(
            "PATCH",
            path,
            body={
                "spec": {"template": {"spec": {"containers": [{"name": container, "image": self.image_b}]}}}
            },
            content_type="application/strategic-merge-patch+json",
        )
        t_done = done.wait(self.timeout)
        cpu1, busy1 = self.control_plane_cpu(), procstat.machine_busy()
        result: dict[str, Any] = {
            "round": round_no,
            "upgrade_s": t_done - t0,
            "cpu_by_process": procstat.cpu_delta(cpu0, cpu1),
            "machine_busy": procstat.busy_fraction(busy0, busy1),
            "load_average_1m": procstat.load_average()[0],
        }
        self.sample_load()
        log(f"N={self.n} r{round_no}: limit rolled the driver in {result['upgrade_s']:.2f}s")
        if cleanup:
            self.kc("delete", "--ignore-not-found", "--wait=false", "-f", str(self.limit_objects))
            self.label_nodes({name: {} for name in self.final_labels})
            result["cleanup_s"] = self.clean_up(None)
        return result

    def kube_container(self) -> str:
        body = kubeapi.get(self.api, f"{DAEMONSETS}/{DRIVER.daemonset}")
        return str(body["spec"]["template"]["spec"]["containers"][0]["name"])

    def run_upgrades(self, rounds: int) -> dict[str, Any]:
        started = time.time()
        try:
            self.setup()
            operator_runs, limit_runs = alternate(rounds, self.limit_upgrade_round, self.upgrade_round)
        finally:
            self.teardown()
        return summarise(self, operator_runs, limit_runs, time.time() - started)


def summarise(
    bench: UpgradeBench, operator_runs: list[dict[str, Any]], limit_runs: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    op = [r["upgrade_s"] for r in operator_runs]
    lim = [r["upgrade_s"] for r in limit_runs]
    first = operator_runs[0]
    return {
        "nodes": bench.n,
        "parallel": bench.parallel,
        "rounds": len(operator_runs),
        "operator_s": stats.median(op),
        "limit_s": stats.median(lim),
        "ratio": stats.median(stats.paired_ratios(op, lim)),
        "operator_runs_s": op,
        "limit_runs_s": lim,
        "most_in_progress": max(r["most_in_progress"] for r in operator_runs),
        "most_cordoned": max(r["most_cordoned"] for r in operator_runs),
        "requests_per_node": stats.median([r["requests"] / bench.n for r in operator_runs]),
        "requests_by_kind": first["requests_by_kind"],
        "peak_rss_mib": max(r["peak_rss_mib"] or 0.0 for r in operator_runs),
        "rss_before_mib": first["rss_before_mib"],
        "rss_after_mib": first["rss_after_mib"],
        "operator_cpu_s": stats.median([r["operator_cpu_s"] for r in operator_runs]),
        "operator_runs": operator_runs,
        "limit_runs": limit_runs,
        "wall_s": wall_s,
        "load_average_1m": {"min": min(bench.loads), "max": max(bench.loads)},
    }


def markdown(result: dict[str, Any], document: dict[str, Any]) -> str:
    lines = [
        f"# Driver upgrade benchmark ({document['date']}, commit {document['git_commit'][:7]})",
        "",
        "| GPU nodes | maxParallelUpgrades | runs | operator s | limit s | ratio | most in progress | "
        "requests/node | peak RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {result['nodes']} | {result['parallel']} | {result['rounds']} | {result['operator_s']:.2f} | "
        f"{result['limit_s']:.2f} | {result['ratio']:.2f} | {result['most_in_progress']} | "
        f"{result['requests_per_node']:.1f} | {result['peak_rss_mib']:.0f} |",
        "",
        f"Per run: operator {', '.join(f'{v:.2f}' for v in result['operator_runs_s'])} s; "
        f"limit {', '.join(f'{v:.2f}' for v in result['limit_runs_s'])} s.",
        "",
        "The operator's requests during its first upgrade, by verb and resource:",
        "",
        *(f"- `{key}`: {count}" for key, count in sorted(result["requests_by_kind"].items())),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=10, help="maxParallelUpgrades, and maxUnavailable")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cluster-name", default="bench")
    parser.add_argument("--port-base", type=int, default=29500)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "upgrade")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-upgrade")
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings(
        sizes=[args.nodes],
        rounds={args.nodes: args.rounds},
        rest_s=0.0,
        settle_s=args.settle_seconds,
        cluster_name=args.cluster_name,
        port_base=args.port_base,
        out=args.out,
        work=args.work,
        keep_cluster=args.keep_cluster,
    )
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bench = UpgradeBench(settings, args.nodes, args.parallel)
    result = bench.run_upgrades(args.rounds)
    document = {
        "date": started,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": procstat.machine(),
        "settings": {
            "nodes": args.nodes,
            "parallel": args.parallel,
            "rounds": args.rounds,
            "versions": [VERSION_A, VERSION_B],
        },
        "results": result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result, document))
    print(markdown(result, document), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
