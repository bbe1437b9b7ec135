"""What watching GPU workload pods costs in memory: one cluster-wide pod watch against the driver
upgrade's per-node watches (gpu_operator/runtime/drain_watches.py), measured with tracemalloc on copies
of a real
pod (bench/data/workload-pod.json: a Deployment's pod as the local cluster's API server returned it,
managedFields included, with a GPU limit).

A cluster-wide watch would receive, list and hold every pod of the cluster all the time, at rest too;
the per-node watches hold the pods of the nodes being emptied, at most maxParallelUpgrades of them.
Both keep the same slim records (gpu_operator/core/upgrade/facts.py WorkloadPod) in the Store.

    python -m bench.pod_memory --nodes 1000 --pods-per-node 30 --watched-nodes 10
"""

from __future__ import annotations

import argparse
import copy
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_operator.runtime.store import Store

SAMPLE = Path(__file__).resolve().parent / "data" / "workload-pod.json"
MIB = 2**20


def pods(nodes: int, per_node: int) -> dict[str, list[dict[str, Any]]]:
    """Node → its pods: copies of the sample with their own names, UIDs and node."""
    sample: dict[str, Any] = json.loads(SAMPLE.read_text())
    found: dict[str, list[dict[str, Any]]] = {}
    for n in range(nodes):
        node = f"gpu-node-{n}"
        for i in range(per_node):
            body = copy.deepcopy(sample)
            body["metadata"]["name"] = f"train-{n}-{i}"
            body["metadata"]["uid"] = f"uid-{n}-{i}"
            body["spec"]["nodeName"] = node
            found.setdefault(node, []).append(body)
    return found


def traced(work: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated after `work` (what it keeps), and what it returned (kept alive)."""
    before = tracemalloc.get_traced_memory()[0]
    kept = work()
    return tracemalloc.get_traced_memory()[0] - before, kept


def measure(nodes: int, per_node: int, watched: int) -> dict[str, float]:
    by_node = pods(nodes, per_node)
    every = [body for bodies in by_node.values() for body in bodies]
    text = json.dumps({"apiVersion": "v1", "kind": "PodList", "items": every})
    tracemalloc.start()
    try:
        parsed, _ = traced(lambda: json.loads(text))

        def hold(names: list[str]) -> Store:
            store = Store()
            for name in names:
                store.list_node_pods(name, by_node[name])
            return store

        cluster_wide, _ = traced(lambda: hold(list(by_node)))
        watched_only, _ = traced(lambda: hold(list(by_node)[:watched]))
    finally:
        tracemalloc.stop()
    return {
        "pods": len(every),
        "pod_json_bytes": len(text) / len(every),
        "listing_json_mib": len(text) / MIB,
        "parsed_bytes_per_pod": parsed / len(every),
        "cluster_wide_records_mib": cluster_wide / MIB,
        "per_node_records_mib": watched_only / MIB,
        "watched_pods": watched * per_node,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--watched-nodes", type=int, default=10, help="nodes being emptied at once")
    args = parser.parse_args(argv)
    found = measure(args.nodes, args.pods_per_node, args.watched_nodes)
    parsed_kib = found["parsed_bytes_per_pod"] / 1024
    print(
        f"{found['pods']} pods ({found['pod_json_bytes']:.0f} B of JSON each, {parsed_kib:.0f} KiB parsed): "
        f"a cluster-wide watch lists {found['listing_json_mib']:.1f} MiB of JSON and holds "
        f"{found['cluster_wide_records_mib']:.1f} MiB of records at all times; {args.watched_nodes} per-node "
        f"watches hold {found['per_node_records_mib'] * 1024:.0f} KiB ({found['watched_pods']} pods), "
        "and nothing at rest"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
