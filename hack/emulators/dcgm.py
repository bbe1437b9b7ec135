"""DCGM (``nv-hostengine``) and dcgm-exporter, and the node-status exporter's metrics server.

They only need the driver: ``nv-hostengine`` initialises NVML (through the nvidia runtime, which
injects the driver, or a mounted driver root) and serves on 5555; dcgm-exporter either embeds its
own host engine or, with ``DCGM_REMOTE_HOSTENGINE_INFO`` (ours and NVIDIA's when DCGM is deployed),
connects to the ``nvidia-dcgm`` Service, which routes to the node-local host engine
(``internalTrafficPolicy: Local``): until a DCGM pod is ready on the node it exits with the
exporter's connection error and restarts with back-off, as on a real node.
"""

from __future__ import annotations

from .common import nvml_error
from .process import Proc, program


def _nvml(proc: Proc, what: str) -> None:
    problem = nvml_error(proc, proc.env.get("DRIVER_ROOT_CTR_PATH") or "/driver-root")
    if problem:
        proc.fail(f"{what}: failed to initialize NVML: {problem}")


@program("nv-hostengine")
async def host_engine(proc: Proc, argv: tuple[str, ...]) -> None:
    _nvml(proc, "Error: DCGM failed to start")
    await proc.forever()


def _dcgm_ready(proc: Proc) -> bool:
    return any(
        r.pod.component == "dcgm" and all(s.ready for s in r.states.values() if not s.init)
        for r in proc.emu.pods_on(proc.node.name)
    )


@program("dcgm-exporter")
async def dcgm_exporter(proc: Proc, argv: tuple[str, ...]) -> None:
    remote = proc.env.get("DCGM_REMOTE_HOSTENGINE_INFO", "")
    if remote:
        if not _dcgm_ready(proc):
            proc.fail(
                f"Error connecting to nv-hostengine at {remote}: Host engine connection invalid/disconnected"
            )
    else:
        _nvml(proc, "Error starting embedded DCGM engine")
    await proc.forever()
