"""Importing this registers every emulated program (one module per operand image)."""

from __future__ import annotations

from .process import PROGRAMS

MODULES: tuple[object, ...] = ()
NAMES: tuple[str, ...] = tuple(sorted(PROGRAMS))
