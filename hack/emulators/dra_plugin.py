"""NVIDIA's DRA driver (k8s-dra-driver-gpu), its ``gpu-kubelet-plugin``: the node's GPUs as a ResourceSlice.

Not fetched here: NVIDIA's k8s-dra-driver-gpu source was not available to this work (no mirror), so the
slice follows NVIDIA's documentation of the driver (docs.nvidia.com "NVIDIA DRA Driver for GPUs",
"ResourceSlice" examples) and the upstream ``k8s.io/dynamic-resource-allocation/kubeletplugin`` helper it
publishes through:

- one ResourceSlice per node and driver, ``spec.driver: gpu.nvidia.com``, ``spec.nodeName`` the node,
  ``spec.pool`` named after the node (generation 1, one slice), owned by the Node (the kubelet's helper
  sets that ownerReference, so a node deleted takes its slice along);
- one device per full GPU, ``gpu-<index>``, with attributes ``type: gpu``, ``uuid``, ``productName``,
  ``brand``, ``architecture``, ``cudaComputeCapability`` and ``driverVersion`` / ``cudaDriverVersion``
  (semantic versions), ``index``, ``minor``, ``pcieBusID``, and capacity ``memory``;
- with MIG enabled on a GPU, one device per MIG device instead, ``gpu-<index>-mig-<profile>-<n>``,
  ``type: mig``, its ``profile``, ``parentUUID``, ``parentIndex`` and its own ``uuid``, with capacity
  ``memory``, ``multiprocessors`` and its engines.

The plugin writes as its own ServiceAccount (``nvidia-dra-driver-kubeletplugin``, a pod-bound token that
names its node), so the GPUCluster's ValidatingAdmissionPolicy holds it to its own node's slice as it
holds NVIDIA's. It waits for the driver like NVIDIA's (NVML must initialise), publishes, republishes when
the node's GPUs or MIG layout change, and deletes its slice when its container is stopped (the kubelet
does that for a plugin that unregisters).
"""

from __future__ import annotations

import uuid
from typing import Any

from .api import ApiError
from .common import nvml_error
from .gpus import GpuModel, arch_family, cuda_version, sanitise
from .node import MigGpu, NodeState
from .process import Proc, program

JSON = dict[str, Any]
DRIVER = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def semver(version: str) -> str:
    """A version as DRA's `version` attribute takes it (semantic: no leading zeros, three parts)."""
    parts = [str(int(p)) for p in version.split(".") if p.isdigit()][:3]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/gpu/{index}"))


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def _common(model: GpuModel, driver: str) -> JSON:
    major, minor = model.compute
    cuda = cuda_version(driver)
    return {
        "productName": {"string": model.name},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": arch_family(major, minor).replace("-", " ").title().replace(" ", "")},
        "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
        "driverVersion": {"version": semver(driver)},
        "cudaDriverVersion": {"version": f"{cuda[0]}.{cuda[1]}.0"},
    }


def devices(node: str, model: GpuModel, count: int, mig: list[MigGpu], driver: str) -> list[JSON]:
    """The devices of the node's `count` healthy GPUs, MIG devices where MIG is on."""
    common = _common(model, driver)
    layout = (mig or [MigGpu() for _ in range(count)])[:count]
    found: list[JSON] = []
    for index, gpu in enumerate(layout):
        parent = gpu_uuid(node, index)
        if not gpu.enabled:
            found.append(
                {
                    "name": f"gpu-{index}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": parent},
                        **common,
                        "index": {"int": index},
                        "minor": {"int": index},
                        "pcieBusID": {"string": f"0000:{0x18 + index:02x}:00.0"},
                    },
                    "capacity": {"memory": {"value": f"{model.memory_mib}Mi"}},
                }
            )
            continue
        for n, name in enumerate(gpu.devices):
            profile = model.profile(name)
            if profile is None:
                continue
            found.append(
                {
                    "name": f"gpu-{index}-mig-{sanitise(name).replace('.', '')}-{n}",
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{parent}/{n}"))},
                        "parentUUID": {"string": parent},
                        "parentIndex": {"int": index},
                        "profile": {"string": name},
                        **common,
                    },
                    "capacity": {
                        "memory": {"value": f"{profile.memory_mib}Mi"},
                        "multiprocessors": {"value": str(profile.multiprocessors)},
                        "copyEngines": {"value": str(profile.copy_engines)},
                        "decoders": {"value": str(profile.decoders)},
                        "jpegEngines": {"value": str(profile.jpeg)},
                        "ofaEngines": {"value": str(profile.ofa)},
                    },
                }
            )
    return found


def resource_slice(node: str, node_uid: str, found: list[JSON], generation: int = 1) -> JSON:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": found,
        },
    }


def _layout(node: NodeState) -> tuple[Any, ...]:
    return (node.model, node.gpu_count, tuple((g.enabled, tuple(g.devices)) for g in node.mig), node.driver)


async def _publish(proc: Proc, body: JSON) -> None:
    api = await proc.api()
    path = f"{SLICES}/{body['metadata']['name']}"
    try:
        current = await api.get(path)
    except ApiError as exc:
        if not exc.not_found:
            raise
        await api.create(SLICES, body)
        return
    generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 1)
    if current.get("spec", {}).get("devices") == body["spec"]["devices"]:
        return
    body["spec"]["pool"]["generation"] = generation + 1
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await api.update(path, body)


async def _withdraw(proc: Proc) -> None:
    try:
        await (await proc.api()).delete(f"{SLICES}/{slice_name(proc.node.name)}")
    except ApiError as exc:
        if not exc.not_found:
            proc.out(f"failed to delete ResourceSlice: {exc}")


@program("gpu-kubelet-plugin")
async def gpu_kubelet_plugin(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    node = proc.node
    # driver-ready's DRIVER_ROOT_CTR_PATH: where this container sees the driver (NVIDIA_DRIVER_ROOT is the
    # host's path, which the plugin writes into its CDI specs).
    root = env.get("DRIVER_ROOT_CTR_PATH") or "/driver-root"
    try:
        while True:
            problem = nvml_error(proc, root)
            if problem is not None or node.model is None or node.driver is None:
                proc.fail(f"error creating driver: failed to initialize NVML: {problem or 'ERROR_UNKNOWN'}")
            seen = _layout(node)
            found = devices(node.name, node.model, node.gpu_count, node.mig, node.driver)
            try:
                await _publish(proc, resource_slice(node.name, node.uid, found))
            except ApiError as exc:
                proc.fail(f"error publishing resources: {exc}")
            proc.out(f"published ResourceSlice {slice_name(node.name)} with {len(found)} devices")
            while _layout(node) == seen:
                await node.wait_change()
    finally:
        if proc.sigterm or not proc.emu.stopping:
            await _withdraw(proc)
