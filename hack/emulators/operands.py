"""Importing this registers every emulated program (one module per operand image)."""

from __future__ import annotations

from . import driver, toolkit, validator
from .process import PROGRAMS

MODULES = (driver, toolkit, validator)
NAMES: tuple[str, ...] = tuple(sorted(PROGRAMS))
