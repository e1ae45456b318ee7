"""Small warehouses and grids for the sweep and capacity tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contracts import REQUESTS
from pipeline.warehouse import Warehouse
from tests.sim.conftest import H100_8B_COST, requests_table

# An explicit step cost and KV size: no profile needed, hand-sized memory.
BASE: dict[str, Any] = {"cost": H100_8B_COST, "num_gpu_blocks": 4000, "max_model_len": 4096}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def grid_toml(axes: dict[str, Any], *, slo: dict[str, str] | None = None, **base: Any) -> str:
    """A grid file over BASE (cost table included) with these axes."""
    lines = ["[base]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in {**BASE, **base}.items() if k != "cost"]
    lines.append("[base.cost]")
    lines += [f"{k} = {v!r}" for k, v in H100_8B_COST.items()]
    lines.append("[axes]")
    for k, v in axes.items():
        if isinstance(v, dict):
            continue
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in axes.items():
        if isinstance(v, dict):
            lines.append(f"[axes.{k}]")
            lines += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    if slo:
        lines.append("[slo]")
        lines += [f'{k} = "{v}"' for k, v in slo.items()]
    return "\n".join(lines) + "\n"


def capacity_file(path: Path, sections: str) -> Path:
    """A capacity file at ``path``: a [base] of BASE (its cost table included), then
    ``sections`` ([slo], [search.<kind>], ...) as written."""
    cost = "\n".join(f"{k} = {v!r}" for k, v in BASE["cost"].items())
    path.write_text(
        f"[base]\nnum_gpu_blocks = 4000\nmax_model_len = 4096\n[base.cost]\n{cost}\n{sections}"
    )
    return path


def seeded_warehouse(root: Path, n: int = 400, rate: float = 15.0, seed: int = 7) -> Path:
    """A warehouse at ``root`` of ``n`` requests, Poisson-ish at ``rate``, Azure-like lengths."""
    rng = np.random.default_rng(seed)
    table = requests_table(
        rng.integers(50, 2000, n), rng.integers(2, 300, n), rng.exponential(1 / rate, n)
    )
    Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
    return root


@pytest.fixture
def small_warehouse(tmp_path: Path) -> Callable[..., Path]:
    """small_warehouse(n=300, rate=20.0): Poisson-ish arrivals, Azure-like lengths, seed 1."""

    def make(n: int = 300, rate: float = 20.0, seed: int = 1) -> Path:
        rng = np.random.default_rng(seed)
        table = requests_table(
            rng.integers(50, 2000, n),
            rng.integers(1, 300, n),
            rng.exponential(1.0 / rate, n),
            start=datetime(2024, 5, 1, 12, tzinfo=UTC),
        )
        root = tmp_path / "wh"
        Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
        return root

    return make


@pytest.fixture
def write_grid(tmp_path: Path) -> Callable[..., Path]:
    def make(axes: dict[str, Any], *, slo: dict[str, str] | None = None, **base: Any) -> Path:
        path = tmp_path / "grid.toml"
        path.write_text(grid_toml(axes, slo=slo, **base))
        return path

    return make
