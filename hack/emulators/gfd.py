"""GPU Feature Discovery, k8s-device-plugin v0.20.0 (``gpu-feature-discovery``).

cmd/gpu-feature-discovery/main.go ``start`` (l.158-230) and ``run`` (l.240-316): loads its config,
creates the label outputer, then labels, sleeps ``GFD_SLEEP_INTERVAL`` (60 s) and labels again
until SIGTERM (SIGHUP reloads). The outputer publishes through NFD's NodeFeature API by default
(``USE_NODE_FEATURE_API``, l.100-105), which requires ``NODE_NAME`` (internal/lm/output.go:47-71:
*failed to create label outputer: required flag node-name not set*, fidelity reference B6), writes
``nvidia-features-for-<node>`` in ``NAMESPACE`` (default ``default``) with the DaemonSet and pod as
owners (read with ``pods get``; a failure is only a warning, l.59-63, 174-218) and updates it only
when it changed (l.123-172). With the API off it writes ``/etc/kubernetes/node-feature-discovery/
features.d/gfd`` for nfd-worker's local source.

Labels (internal/lm): ``gpu.machine`` (machine-type.go), the CUDA driver and runtime versions
(nvml.go:101-143), ``mig.capable`` (nvml.go:145-174), ``mps.capable`` (nvml.go:176-193),
``gpu.mode`` (nvml.go:213-246), per-resource ``product``/``count``/``replicas``/``sharing-strategy``
/``memory`` and ``family``/``compute.*`` (resource.go:38-178, 263-316), ``mig.strategy`` and the
single/mixed MIG resource labels (mig-strategy.go:44-311), ``gfd.timestamp`` (timestamp.go, fixed for
the life of the process).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from . import gpus
from .api import Api, ApiError
from .common import duration, flag, nvml_error
from .device_plugin import load_config, mig_strategy, time_slicing
from .node import MigGpu, NodeState
from .process import Proc, program

JSON = dict[str, Any]
NODEFEATURE_PREFIX = "nvidia-features-for"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
MACHINE_FILE = "/sys/class/dmi/id/product_name"


def _resource_labels(name: str, count: int, parts: list[str], replicas: int, renamed: bool) -> dict[str, str]:
    """resourceLabeler.baseLabeler (resource.go:159-206)."""
    shared = replicas > 1
    product = "-".join(gpus.sanitise(p) for p in parts if p)
    if shared and not renamed:
        product += "-SHARED"
    return {
        f"{name}.product": product,
        f"{name}.count": str(count),
        f"{name}.replicas": str(replicas),
        f"{name}.sharing-strategy": "time-slicing" if shared else "none",
    }


def labels_for(node: NodeState, strategy: str, config: JSON, machine: str) -> dict[str, str]:
    """Every label GFD v0.20 computes for this node's simulated GPUs and driver."""
    model = node.model
    driver = node.driver
    if model is None or driver is None or not node.gpu_count:
        return {}
    replicas_by_name, rename = time_slicing(config)
    parts = driver.split(".")
    cuda = gpus.cuda_version(driver)
    labels: dict[str, str] = {
        "nvidia.com/gpu.machine": gpus.sanitise(machine) or "unknown",
        "nvidia.com/cuda.driver.major": parts[0],
        "nvidia.com/cuda.driver.minor": parts[1] if len(parts) > 1 else "",
        "nvidia.com/cuda.driver.rev": parts[2] if len(parts) > 2 else "",
        "nvidia.com/cuda.runtime.major": str(cuda[0]),
        "nvidia.com/cuda.runtime.minor": str(cuda[1]),
        "nvidia.com/cuda.driver-version.major": parts[0],
        "nvidia.com/cuda.driver-version.minor": parts[1] if len(parts) > 1 else "",
        "nvidia.com/cuda.driver-version.revision": parts[2] if len(parts) > 2 else "",
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime-version.major": str(cuda[0]),
        "nvidia.com/cuda.runtime-version.minor": str(cuda[1]),
        "nvidia.com/cuda.runtime-version.full": f"{cuda[0]}.{cuda[1]}",
        "nvidia.com/mig.capable": "true" if model.mig_capable else "false",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/gpu.mode": "compute",
    }
    layout = node.mig or [MigGpu() for _ in range(node.gpu_count)]
    family = gpus.arch_family(*model.compute)
    arch = {"nvidia.com/gpu.family": family, "nvidia.com/gpu.compute.major": str(model.compute[0]),
            "nvidia.com/gpu.compute.minor": str(model.compute[1])}  # fmt: skip
    # Full-GPU labels: MIG-enabled GPUs without sharing (replicas 0), full GPUs with it (newGPULabelers).
    gpu_replicas = replicas_by_name.get("nvidia.com/gpu", 1)
    full = [g for g in layout if not g.enabled]
    replicas = gpu_replicas if full else 0
    labels.update(
        _resource_labels("nvidia.com/gpu", len(layout), [model.name], replicas, rename and replicas > 1)
    )
    labels["nvidia.com/gpu.memory"] = str(model.memory_mib)
    labels.update(arch)
    enabled = [g for g in layout if g.enabled]
    if strategy != "none":
        labels["nvidia.com/mig.strategy"] = strategy
    if strategy == "single" and enabled:
        profiles = Counter(p for g in enabled for p in g.devices)
        invalid = len(enabled) != len(layout) or len(profiles) != 1 or any(not g.devices for g in enabled)
        if invalid:
            # newInvalidMigStrategyLabeler (mig-strategy.go:244-264).
            labels.update({
                "nvidia.com/gpu.product": f"{gpus.sanitise(model.name)}-MIG-INVALID",
                "nvidia.com/gpu.count": "0", "nvidia.com/gpu.replicas": "0",
                "nvidia.com/gpu.sharing-strategy": "", "nvidia.com/gpu.memory": "0",
            })  # fmt: skip
        else:
            ((profile_name, count),) = profiles.items()
            labels.update(_mig_labels("nvidia.com/gpu", model, profile_name, count, replicas_by_name, rename))
    elif strategy == "mixed":
        for profile_name, count in Counter(p for g in enabled for p in g.devices).items():
            labels.update(
                _mig_labels(
                    f"nvidia.com/mig-{profile_name}", model, profile_name, count, replicas_by_name, rename
                )
            )
    return labels


def _mig_labels(
    name: str, model: gpus.GpuModel, profile_name: str, count: int, replicas: dict[str, int], rename: bool
) -> dict[str, str]:
    """NewMIGResourceLabeler (resource.go:75-108) with the profile's attributes."""
    factor = replicas.get(name, 1)
    labels = _resource_labels(name, count, [model.name, "MIG", profile_name], factor, rename and factor > 1)
    profile = model.profile(profile_name)
    for key, value in (profile.attributes() if profile else {}).items():
        labels[f"{name}.{key}"] = str(value)
    return labels


class Outputer:
    def __init__(self, proc: Proc, api: Api | None) -> None:
        self.proc = proc
        self.api = api
        env = proc.env
        self.node = env.get("NODE_NAME", "")
        self.namespace = env.get("NAMESPACE") or "default"
        self.pod_name = env.get("POD_NAME", "")
        self.owners: list[JSON] = []

    async def owner_references(self) -> None:
        if not self.pod_name or self.api is None:
            self.proc.out("Pod name not provided, skipping owner reference resolution")
            return
        try:
            pod = await self.api.get(f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}")
        except ApiError as exc:
            self.proc.out(
                f"Failed to resolve owner references: failed to get pod {self.namespace}/{self.pod_name}: "
                f"{exc}"
            )
            return
        ds = next(
            (r for r in pod["metadata"].get("ownerReferences") or [] if r.get("kind") == "DaemonSet"), None
        )
        if ds is None:
            return
        self.owners = [
            {
                "apiVersion": ds["apiVersion"],
                "kind": "DaemonSet",
                "name": ds["name"],
                "uid": ds["uid"],
                "controller": True,
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        ]

    async def output(self, labels: dict[str, str]) -> None:
        assert self.api is not None
        name = f"{NODEFEATURE_PREFIX}-{self.node}"
        path = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{self.namespace}/nodefeatures"
        spec = {"features": {"flags": {}, "attributes": {}, "instances": {}}, "labels": labels}
        try:
            current = await self.api.get(f"{path}/{name}")
        except ApiError as exc:
            if not exc.not_found:
                self.proc.fail(f"failed to get NodeFeature object: {exc}")
            body = {
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeature",
                "metadata": {
                    "name": name,
                    "labels": {NODE_NAME_LABEL: self.node},
                    "ownerReferences": self.owners,
                },
                "spec": spec,
            }
            try:
                await self.api.create(path, body)
            except ApiError as error:
                self.proc.fail(f'failed to create NodeFeature object "{name}": {error}')
            self.proc.out(f"created NodeFeature object {name}")
            return
        same = (current.get("spec") or {}).get("labels") == labels and (
            current["metadata"].get("ownerReferences") or []
        ) == self.owners
        if same and (current["metadata"].get("labels") or {}).get(NODE_NAME_LABEL) == self.node:
            self.proc.out(f"no changes in NodeFeature object {name}")
            return
        current["metadata"]["labels"] = {NODE_NAME_LABEL: self.node}
        current["metadata"]["ownerReferences"] = self.owners
        current["spec"] = spec
        try:
            await self.api.update(f"{path}/{name}", current)
        except ApiError as exc:
            self.proc.fail(f'failed to update NodeFeature object "{name}": {exc}')


@program("gpu-feature-discovery")
async def gfd(proc: Proc, argv: tuple[str, ...]) -> None:
    env = proc.env
    while True:
        config = load_config(proc, env.get("GFD_CONFIG_FILE") or env.get("CONFIG_FILE") or "")
        strategy = env.get("GFD_MIG_STRATEGY") or mig_strategy(env, config)
        use_api = flag(env, "GFD_USE_NODE_FEATURE_API", flag(env, "USE_NODE_FEATURE_API", True))
        outputer: Outputer | None = None
        if use_api:
            outputer = Outputer(proc, await proc.api())
            if not outputer.node:
                proc.fail("failed to create label outputer: required flag node-name not set")
            await outputer.owner_references()
        stamp = str(int(time.time()))
        # The labelers are built again on every pass (main.go:261-284); the timestamp is not.
        while True:
            root = env.get("DRIVER_ROOT_CTR_PATH") or env.get("CONTAINER_DRIVER_ROOT") or "/driver-root"
            problem = nvml_error(proc, root)
            if problem:
                if flag(env, "GFD_FAIL_ON_INIT_ERROR", flag(env, "FAIL_ON_INIT_ERROR", True)):
                    proc.fail(
                        "error creating labeler: failed to initialize resource manager: failed to "
                        f"initialize NVML: {problem}"
                    )
                labels: dict[str, str] = {}
            else:
                machine = proc.fs.read(env.get("GFD_MACHINE_TYPE_FILE") or MACHINE_FILE) or "unknown"
                labels = labels_for(proc.node, strategy, config, machine.strip())
            if not flag(env, "GFD_NO_TIMESTAMP", False):
                labels["nvidia.com/gfd.timestamp"] = stamp
            if outputer is not None:
                await outputer.output(labels)
            else:
                proc.fs.write(
                    env.get("GFD_OUTPUT_FILE") or OUTPUT_FILE,
                    "".join(f"{k}={v}\n" for k, v in sorted(labels.items())),
                )
            if flag(env, "GFD_ONESHOT", False):
                return
            proc.set_ready(True)
            interval = env.get("GFD_SLEEP_INTERVAL", "60s")
            if await _sleep_or_signal(proc, None if interval == "infinite" else duration(interval, 60.0)):
                proc.out("Received SIGHUP, restarting.")
                break


async def _sleep_or_signal(proc: Proc, seconds: float | None) -> bool:
    """Until the relabel interval passes (False) or SIGHUP arrives (True).

    The interval is GFD's own period, kept (scaled) in every profile: it is a loop, not a wait.
    """
    timeout = None if seconds is None else seconds * proc.profile.scale
    try:
        async with asyncio.timeout(timeout):
            signum = await proc.signals.get()
    except TimeoutError:
        return False
    return signum == "SIGHUP"
