"""Fixtures of the sweep and capacity tests (their builders are in tests/helpers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import grid_toml, small_warehouse_at


@pytest.fixture
def small_warehouse(tmp_path: Path) -> Callable[..., Path]:
    """small_warehouse(n=300, rate=20.0): Poisson-ish arrivals, Azure-like lengths, seed 1."""

    def make(n: int = 300, rate: float = 20.0, seed: int = 1) -> Path:
        return small_warehouse_at(tmp_path / "wh", n, rate, seed)

    return make


@pytest.fixture
def write_grid(tmp_path: Path) -> Callable[..., Path]:
    """write_grid(axes, slo=..., **base): a grid file (tests/helpers.py's grid_toml)."""

    def make(axes: dict[str, Any], *, slo: dict[str, str] | None = None, **base: Any) -> Path:
        path = tmp_path / "grid.toml"
        path.write_text(grid_toml(axes, slo=slo, **base))
        return path

    return make
