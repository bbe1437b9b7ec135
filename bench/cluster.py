"""The bench's cluster and operator processes: hack/cluster.mk for the cluster, the chart for RBAC,
`gpu-operator run` as the chart's ServiceAccount (its own process, so /proc tells its CPU and memory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator.runtime.kubeconfig import write_service_account_kubeconfig
from gpu_operator.runtime.sync_client import SyncKube

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "gpu-operator"
RELEASE = "gpu-operator"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
OPERATOR = Path(sys.executable).parent / "gpu-operator"


def log(message: str) -> None:
    print(f"bench {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


def bin_dir() -> Path:
    out = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "bin-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def versions() -> dict[str, str]:
    found = {}
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            found[key.strip()] = value.strip()
    return found


def _clean_env() -> dict[str, str]:
    """The environment for nested make: without the outer `make bench`'s variables (MAKEFLAGS carries
    its command line, e.g. NODES=10, which would override ours)."""
    return {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    }


@dataclass
class Cluster:
    """One kwok cluster of hack/cluster.sh, under its own name and ports."""

    name: str
    port_base: int
    nodes: int
    log_file: Path
    sim_profile: str = "instant"
    """The emulators' timing profile (hack/emulators/profile.py) and its scale."""
    sim_time_scale: float = 1.0

    def _make(self, *args: str, capture: bool = False) -> str:
        command = [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            *(["-s"] if capture else []),
            *args,
            f"NODES={self.nodes}",
            "CPU_NODES=1",
            f"CLUSTER_NAME={self.name}",
            f"CLUSTER_PORT_BASE={self.port_base}",
            f"SIM_PROFILE={self.sim_profile}",
            f"SIM_TIME_SCALE={self.sim_time_scale:g}",
        ]
        if capture:
            return subprocess.run(
                command, capture_output=True, text=True, check=True, env=_clean_env()
            ).stdout
        with self.log_file.open("a") as out:
            result = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=_clean_env(), check=False
            )
        if result.returncode != 0:
            tail = self.log_file.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(
                f"make {' '.join(args)} failed; last lines of {self.log_file}:\n" + "\n".join(tail)
            )
        return ""

    def up(self) -> None:
        self._make("cluster-up")

    def down(self) -> None:
        self._make("cluster-down")

    @property
    def kubeconfig(self) -> Path:
        return Path(self._make("kubeconfig", capture=True).strip())

    @property
    def audit_log(self) -> Path:
        return Path(self._make("audit-log", capture=True).strip())

    def pids(self) -> dict[str, int]:
        """The control plane's processes (kwokctl's pid files and the emulators')."""
        found = {}
        for pid_file in sorted((self.kubeconfig.parent / "pids").glob("*.pid")):
            text = pid_file.read_text().strip()
            if text.isdigit():
                found[pid_file.stem] = int(text)
        return found


def run(command: list[str], *, input: str | None = None, log_file: Path | None = None) -> str:
    result = subprocess.run(command, input=input, capture_output=True, text=True, check=False)
    if log_file is not None:
        with log_file.open("a") as out:
            out.write(f"$ {' '.join(command)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}\n")
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:4])}... failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
        )
    return result.stdout


def install_chart(helm: Path, kubeconfig: Path, log_file: Path) -> None:
    """The chart's ServiceAccount and RBAC (the operator runs here, not in a Deployment), no node agent."""
    run(
        [
            str(helm),
            "--kubeconfig",
            str(kubeconfig),
            "upgrade",
            "--install",
            RELEASE,
            str(ROOT / "charts" / "gpu-operator"),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--set",
            "operator.replicas=0",
            "--set",
            "clusterPolicy.create=false",
            # The simulated nodes carry NFD's labels already; a node agent pod per node (simulated, so
            # idle) would only add scheduler and kwok load to what is timed.
            "--set",
            "nodeDiscovery=none",
        ],
        log_file=log_file,
    )


# A sample of what the operator needs (gpu_operator/runtime/client.py), checked before anything is timed:
# (verb, group, resource, namespace).
REQUIRED_ACCESS = (
    ("watch", "", "nodes", ""),
    ("patch", "", "nodes", ""),
    ("watch", "nvidia.com", "clusterpolicies", ""),
    ("patch", "nvidia.com", "clusterpolicies/status", ""),
    ("watch", "", "pods", NAMESPACE),
    ("create", "apps", "daemonsets", NAMESPACE),
    ("patch", "apps", "daemonsets", NAMESPACE),
    ("delete", "apps", "daemonsets", NAMESPACE),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    ("create", "", "events", "default"),
)


def missing_access(api: SyncKube, user: str) -> list[str]:
    """The REQUIRED_ACCESS that `user` (a ServiceAccount) lacks, by SubjectAccessReview."""
    namespace = user.split(":")[2] if user.startswith("system:serviceaccount:") else ""
    groups = ["system:authenticated", "system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    missing = []
    for verb, group, resource, ns in REQUIRED_ACCESS:
        plural, _, subresource = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": plural, "subresource": subresource}
        if ns:
            attributes["namespace"] = ns
        review = api.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
            },
        )
        if not review.get("status", {}).get("allowed"):
            missing.append(f"{verb} {resource}" + (f" in {ns}" if ns else ""))
    return missing


def sa_kubeconfig(api: SyncKube, admin_kubeconfig: Path, path: Path) -> Path:
    """A kubeconfig that logs in as the chart's ServiceAccount with a fresh TokenRequest token."""
    return write_service_account_kubeconfig(api, admin_kubeconfig, NAMESPACE, RELEASE, path, seconds=14400)


class OperatorProcess:
    """`gpu-operator run` with its own kubeconfig and a liveness endpoint on loopback."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        probe_port: int,
        env: Mapping[str, str] | None = None,
        module: str = "gpu_operator.cli",
    ) -> None:
        self.module = module
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.probe_port = probe_port
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> OperatorProcess:
        # The operator's images come from the policy and its defaults, never from this shell's env.
        environ = {k: v for k, v in os.environ.items() if not k.endswith("_IMAGE")}
        environ.update(
            KUBECONFIG=str(self.kubeconfig),
            PYTHONUNBUFFERED="1",
            OPERATOR_NAMESPACE=NAMESPACE,
            GPU_OPERATOR_LISTEN=f"127.0.0.1:{self.probe_port}",
            **self.env,
        )
        # `python -m gpu_operator.cli run` is the `gpu-operator` entry point; with the settings in the
        # environment its command line does not contain "gpu-operator", so no stale pid-file check of
        # the form `grep gpu-operator /proc/PID/cmdline` (hack/demo.sh's) can mistake it for its own.
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environ,
                cwd=ROOT,
            )
        self.started_at = time.time()
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def up(self) -> bool:
        """Past its first reconcile pass (no policy yet: its watches are open and it has looked)."""
        return int(self.probe().get("reconcile", {}).get("passes", 0)) >= 1

    def probe(self) -> dict[str, Any]:
        """Kopf's liveness answer (our `reconcile` probe: passes, failures, ...); {} while not up.
        Kopf caches probe results for 10 s."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/healthz", timeout=5) as answer:
                result: dict[str, Any] = json.loads(answer.read() or b"{}")
                return result
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return {}

    def stop(self) -> None:
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)

    def tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
