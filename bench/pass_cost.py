"""The CPU one reconcile pass spends planning (plan.build) at N GPU nodes mid-rollout, with its memos
warm, when K operand pods changed since the last pass: what the operator pays for each of the ~1000
passes of a 1000-node rollout. Pure: a Store filled as the watches would fill it, no cluster.

Half the nodes are done (every operand Ready), half wait for their toolkit; every node carries the
labels the plan wants, so a pass writes nothing unless a change asks for it. Between passes, K random
operand pods turn Ready or not, and K nodes are replaced by an equal copy (a heartbeat).

    python -m bench.pass_cost --nodes 1000 --changes 50
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from gpu_operator.core.caches import Caches
from gpu_operator.core.components import COMPONENTS as EVERY_COMPONENT
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.observed import PodInfo
from gpu_operator.core.plan import build
from gpu_operator.core.workloads import CONTAINER
from gpu_operator.runtime.store import Store

POLICY = Path(__file__).resolve().parents[1] / "examples" / "clusterpolicy.yaml"
NOW = "2026-12-01T00:00:00Z"
COMPONENTS = [c for c in EVERY_COMPONENT if CONTAINER in c.workloads]
"""The container stack: the nodes run containers (a VM stack's pods on them would hold it back)."""
NAMESPACE = "gpu-operator"
NFD = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1-generic",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "kubernetes.io/os": "linux",
    **{f"nvidia.com/gfd.example-{i}": "x" for i in range(40)},  # about as many as GFD and NFD write
}


@dataclass(frozen=True)
class Result:
    nodes: int
    changes: int
    passes: int
    median_ms: float
    max_ms: float


def filled_store(nodes: int, caches: Caches) -> Store:
    """A settled store of `nodes` GPU nodes; the passes that settle it warm `caches`."""
    store = Store()
    policy = yaml.safe_load(POLICY.read_text())
    policy["metadata"].update(uid="uid-policy", generation=1, creationTimestamp=NOW)
    store.record_policy(policy, False)
    for i in range(nodes):
        name = f"gpu-node-{i}"
        store.put("nodes", name, NodeInfo(name, dict(NFD), 8, uid=f"uid-{i}", runtime="containerd"))
        done = i % 2 == 1
        for component in COMPONENTS if done else COMPONENTS[:2]:
            ready = done or component.name == "driver"
            pod = PodInfo(f"{component.name}-{i}", component.name, name, ready, "", "", False, NOW, True)
            store.put("pods", f"{NAMESPACE}/{pod.name}", pod)
    # The labels the plan wants, as if written (twice: the second plan wants what the first wrote).
    for _ in range(2):
        for name, labels in build(store.snapshot(NAMESPACE, {}), NOW, caches=caches).node_labels.items():
            node = store.nodes[name]
            kept = {k: v for k, v in node.labels.items() if k not in node.own_labels}
            store.put("nodes", name, replace(node, labels={**kept, **labels}, own_labels=frozenset(labels)))
    return store


def measure(nodes: int, changes: int, passes: int, seed: int = 1) -> Result:
    caches = Caches()  # one for every pass, as the operator keeps one: the passes measured are warm
    store = filled_store(nodes, caches)
    rng = random.Random(seed)
    spent = []
    for _ in range(passes):
        for _ in range(changes):
            i, component = rng.randrange(nodes), rng.choice(COMPONENTS)
            node = f"gpu-node-{i}"
            pod = PodInfo(
                f"{component.name}-{i}", component.name, node, rng.random() < 0.5, "", "", False, NOW
            )
            store.put("pods", f"{NAMESPACE}/{pod.name}", pod)
            other = f"gpu-node-{rng.randrange(nodes)}"
            store.put("nodes", other, replace(store.nodes[other], labels=dict(store.nodes[other].labels)))
        observed = store.snapshot(NAMESPACE, {})
        started = time.thread_time()
        build(observed, NOW, caches=caches)
        spent.append(time.thread_time() - started)
    return Result(nodes, changes, passes, statistics.median(spent) * 1000, max(spent) * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--changes", type=int, default=50, help="operand pods changed between passes")
    parser.add_argument("--passes", type=int, default=40)
    args = parser.parse_args(argv)
    for nodes in args.nodes:
        r = measure(nodes, args.changes, args.passes)
        print(
            f"{r.nodes} nodes, {r.changes} changes a pass: median {r.median_ms:.1f} ms, max {r.max_ms:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
