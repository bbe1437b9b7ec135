"""Fixtures shared by the unit tests (the objects they are built of are in builders.py)."""

from __future__ import annotations

import pytest
from builders import Clock


@pytest.fixture
def clock() -> Clock:
    """A clock that moves only when the test moves it."""
    return Clock()
