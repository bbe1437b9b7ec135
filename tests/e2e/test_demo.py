"""`make demo` end to end: the seed article's ClusterPolicy converges, GFD labels every GPU node, and
the demo's output shows each node's GPU product and memory.

Runs hack/demo.sh against the tests' local cluster (the same CLUSTER_NAME), then `hack/demo.sh stop`,
which removes what the demo installed and leaves the cluster up for the other tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .kube_helpers import Cluster, client, gpu_nodes
from .operator_process import ROOT

DEMO = ROOT / "hack" / "demo.sh"


def run_demo(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    binaries = Path(cluster.kubectl_path).parent
    env = {
        **os.environ,
        "KUBECTL": cluster.kubectl_path,
        "HELM": str(binaries / "helm"),
        "DEMO_TIMEOUT": "240",
    }
    return subprocess.run(
        [str(DEMO), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_demo_shows_gfd_labels_on_every_gpu_node(cluster: Cluster) -> None:
    if not cluster.local:
        pytest.skip("the demo runs on the local kwok cluster")
    try:
        demo = run_demo(cluster)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        out = demo.stdout
        # The node table: product and memory per node, as GFD labelled them.
        for product, memory in (("NVIDIA-H100-80GB-HBM3", "81559"), ("NVIDIA-L4", "23034")):
            rows = [line for line in out.splitlines() if product in line.split()]
            assert rows and all(memory in row.split() for row in rows), out
        for node in gpu_nodes(cluster.api):
            labels = client.CoreV1Api(cluster.api).read_node(node).metadata.labels
            assert labels.get("nvidia.com/gpu.product") and labels.get("nvidia.com/gpu.memory"), (
                node,
                labels,
            )
            row = next(line for line in out.splitlines() if line.startswith(node + " "))
            assert labels["nvidia.com/gpu.product"] in row.split(), row
    finally:
        stopped = run_demo(cluster, "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
