"""Importing this registers every emulated program (one module per operand image)."""

from __future__ import annotations

from . import (
    cc_manager,
    dcgm,
    device_plugin,
    dra_plugin,
    driver,
    driver_container,
    gfd,
    kata_device_plugin,
    kubevirt_device_plugin,
    mig_manager,
    toolkit,
    validator,
    vfio_manager,
    vgpu_device_manager,
)
from .process import PROGRAMS

MODULES = (
    driver,
    driver_container,
    toolkit,
    validator,
    device_plugin,
    gfd,
    mig_manager,
    dcgm,
    vfio_manager,
    kubevirt_device_plugin,
    vgpu_device_manager,
    cc_manager,
    kata_device_plugin,
    dra_plugin,
)
NAMES: tuple[str, ...] = tuple(sorted(PROGRAMS))
