"""Importing this registers every emulated program (one module per operand image)."""

from __future__ import annotations

from . import dcgm, device_plugin, dra_plugin, driver, driver_container, gfd, mig_manager, toolkit, validator
from .process import PROGRAMS

MODULES = (driver, driver_container, toolkit, validator, device_plugin, gfd, mig_manager, dcgm, dra_plugin)
NAMES: tuple[str, ...] = tuple(sorted(PROGRAMS))
