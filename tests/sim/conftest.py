"""Fixtures of the simulator tests (their builders are in tests/helpers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from tests.helpers import write_requests


@pytest.fixture
def warehouse_with(tmp_path: Path) -> Callable[..., Path]:
    """warehouse_with(table, day="2024-05-01"): a warehouse holding one requests file."""

    def make(table: pa.Table, day: str = "2024-05-01", stem: str = "src-test") -> Path:
        return write_requests(tmp_path / "wh", table, day, stem)

    return make
