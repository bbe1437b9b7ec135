"""Run the operator as its own process, logged in as a ServiceAccount (the Helm chart's), so every API
call it makes is checked against that account's RBAC, exactly as in a cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_operator.runtime.kubeconfig import write_service_account_kubeconfig

from .kube_helpers import SIMULATED_NODE_LABEL, Cluster, client

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = Path(sys.executable).parent / "gpu-operator"


def helm(cluster: Cluster, *args: str) -> str:
    """Run the pinned helm (or one on PATH) against the cluster; fail the test with helm's stderr."""
    binary = Path(cluster.kubectl_path).parent / "helm"
    if not binary.is_file():
        found = shutil.which("helm")
        assert found is not None, "no helm: run `make tools` or put helm on PATH"
        binary = Path(found)
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def run_cleanup_hook(cluster: Cluster, policy: str) -> None:
    """What the chart's pre-delete hook Job runs (`gpu-operator cleanup`), run here where kwok would
    complete the Job without running it (simulated nodes run no container)."""
    core: Any = client.CoreV1Api(cluster.api)
    if not core.list_node(label_selector=f"{SIMULATED_NODE_LABEL}=true").items:
        return  # a real cluster runs the hook itself
    subprocess.run(
        [str(OPERATOR), "cleanup", "--policy", policy, "--timeout", "120"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        check=True,
        timeout=150,
    )


def sa_kubeconfig(
    cluster: Cluster, namespace: str, service_account: str, path: Path, bound_pod: Any = None
) -> Path:
    """A kubeconfig at `path` that authenticates with a fresh token of the ServiceAccount
    (gpu_operator.runtime.kubeconfig); with `bound_pod` (a V1Pod) the token is bound to that pod."""
    bound = None if bound_pod is None else (bound_pod.metadata.name, bound_pod.metadata.uid)
    return write_service_account_kubeconfig(
        cluster.api, cluster.kubeconfig, namespace, service_account, path, bound_pod=bound
    )


class OperatorProcess:
    """`gpu-operator run` in a subprocess with its own kubeconfig; output goes to a log file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        env: dict[str, str] | None = None,
        listen: str = "127.0.0.1:0",
        args: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.args = args
        """More `gpu-operator run` flags."""
        self.namespace = namespace
        self.log_path = log
        self.env = env or {}
        self.listen = listen
        """HTTP address of /metrics, /healthz, /readyz; port 0 (a free one, see `url`) by default."""
        self.process: subprocess.Popen[bytes] | None = None
        self.log_offset = 0
        """Where this run's output starts in the (appended) log."""

    def start(self) -> OperatorProcess:
        environ = {k: v for k, v in os.environ.items() if not k.endswith("_IMAGE")}
        environ.update(KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(OPERATOR), "run", "--namespace", self.namespace, "--listen", self.listen, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environ,
                cwd=ROOT,
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def url(self) -> str:
        """The operator's HTTP base URL, from its log (this run's, the log is appended to)."""
        run = self.log_path.read_bytes()[self.log_offset :].decode(errors="replace")
        found = re.findall(r"serving /metrics, /healthz and /readyz on (http://\S+)", run)
        assert found, "the operator has not started its HTTP server (yet)"
        return str(found[-1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def probe(self, which: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of /healthz or /readyz of this run."""
        try:
            with urllib.request.urlopen(f"{self.url()}/{which}", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def metric(self, name: str) -> float:
        """The sum of a metric's samples in this run's /metrics."""
        with urllib.request.urlopen(f"{self.url()}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {"
        )

    def assert_clean_log(self) -> None:
        """No tracebacks and no RBAC denials: either would mean a bug or a missing chart rule."""
        text = self.log()
        assert "Traceback" not in text, f"operator traceback:\n{text[-4000:]}"
        assert not re.search(r"\b403\b", text) and "forbidden" not in text.lower(), (
            f"operator hit RBAC denials:\n{text[-4000:]}"
        )


RELEASE = "gpu-operator"


@contextmanager
def chart_operator(
    cluster: Cluster, folder: Path, namespace: str, *helm_args: str
) -> Iterator[OperatorProcess]:
    """The chart's ServiceAccount and RBAC (no in-cluster Deployment, no ClusterPolicy) and the
    operator running as that ServiceAccount; uninstalled afterwards."""
    helm(
        cluster,
        "upgrade",
        "--install",
        RELEASE,
        str(ROOT / "charts" / "gpu-operator"),
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--set",
        "operator.replicas=0",
        "--set",
        "clusterPolicy.create=false",
        # The simulated nodes carry NFD's labels; the tests count every pod on a node as an operand.
        "--set",
        "nodeDiscovery=none",
        *helm_args,
    )
    kubeconfig = sa_kubeconfig(cluster, namespace, RELEASE, folder / "kubeconfig")
    process = OperatorProcess(kubeconfig, namespace, folder / "operator.log").start()
    try:
        yield process
    finally:
        process.stop()
        print(process.log()[-6000:])
        helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--wait")
