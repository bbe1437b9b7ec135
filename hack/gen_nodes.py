#!/usr/bin/env python3
"""Write the simulated nodes of the local e2e cluster as kubectl-ready JSON Lists.

GPU nodes ``gpu-node-<i>`` and CPU-only nodes ``cpu-node-<j>``, labelled the way Node Feature
Discovery's worker labels a fresh node (PCI and OS labels only; GPU Feature Discovery's labels come
from the emulated GFD once it runs). The simulated hardware is in annotations the emulators read:
``gpu-operator.sim/gpu-model`` and ``gpu-operator.sim/gpu-count`` (see hack/README.md).
Nodes are created with their status (addresses, capacity), as a kubelet registers itself: kwok's
node-initialize stage keeps what is there and only adds conditions.

Standard library only: it runs before the project's virtualenv may exist.

    gen_nodes.py --gpu 1000 --cpu 1 --skip-from existing.txt --out-dir DIR --chunk 100

writes DIR/nodes-0000.json, ... with at most --chunk nodes each, so the caller can create them
with several kubectl processes in parallel; names listed in --skip-from are left out. Prints the
number of nodes written.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

SIMULATED_LABEL = "gpu-operator.sim/simulated"
GPU_COUNT_ANNOTATION = "gpu-operator.sim/gpu-count"
GPU_MODEL_ANNOTATION = "gpu-operator.sim/gpu-model"
GPUS_PER_NODE = 8
# Keys of hack/emulators/gpus.py MODELS: gpu-node-0 has MIG-capable GPUs, the others do not.
MIG_NODE_MODEL = "H100-80GB-HBM3"
GPU_NODE_MODEL = "L4"

OS_LABELS = {
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/kernel-version.full": "5.15.0-105-generic",
}


def node_ip(kind: str, index: int) -> str:
    """127.1.x.y for GPU nodes, 127.1.255.y for CPU nodes: loopback only, never routed."""
    if kind == "gpu":
        return f"127.1.{index // 250}.{index % 250 + 1}"
    return f"127.1.255.{index % 250 + 1}"


def make_node(kind: str, index: int, kubelet_version: str) -> dict[str, Any]:
    name = f"{kind}-node-{index}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SIMULATED_LABEL: "true",
        **OS_LABELS,
    }
    annotations = {
        # kwok's convention for nodes it simulates; node TTL 0 as kubelets set it.
        "kwok.x-k8s.io/node": "fake",
        "node.alpha.kubernetes.io/ttl": "0",
    }
    taints: list[dict[str, str]] = []
    if kind == "gpu":
        labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
        annotations[GPU_COUNT_ANNOTATION] = str(GPUS_PER_NODE)
        annotations[GPU_MODEL_ANNOTATION] = MIG_NODE_MODEL if index == 0 else GPU_NODE_MODEL
        if index % 2 == 1:
            taints.append({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"})
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints} if taints else {},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": node_ip(kind, index)},
                {"type": "Hostname", "address": name},
            ],
            "capacity": dict(resources),
            "allocatable": dict(resources),
            # What a kubelet on the labelled OS would report (all fields are required).
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.4 LTS",
                "kernelVersion": "5.15.0-105-generic",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, required=True, help="number of GPU nodes")
    parser.add_argument("--cpu", type=int, default=1, help="number of CPU-only nodes")
    parser.add_argument("--skip-from", type=pathlib.Path, help="file with node names to leave out")
    parser.add_argument("--out-dir", type=pathlib.Path, required=True)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument(
        "--kubelet-version", default="v0.0.0", help="reported as status.nodeInfo.kubeletVersion"
    )
    args = parser.parse_args()

    skip: set[str] = set()
    if args.skip_from:
        skip = {line.strip().removeprefix("node/") for line in args.skip_from.read_text().splitlines()}
    version = args.kubelet_version
    nodes = [make_node("gpu", i, version) for i in range(args.gpu)] + [
        make_node("cpu", j, version) for j in range(args.cpu)
    ]
    nodes = [n for n in nodes if n["metadata"]["name"] not in skip]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(nodes), args.chunk):
        items = nodes[start : start + args.chunk]
        path = args.out_dir / f"nodes-{start // args.chunk:04d}.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    print(len(nodes))


if __name__ == "__main__":
    main()
