"""The ``runs`` row of a replay, sweep, capacity, calibration, live or validate run.

Shared by the simulator, planning, calibration and live stages, so it lives below them
all (it needs only the contracts and the warehouse).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline import __version__
from pipeline.contracts import RUNS
from pipeline.warehouse import Warehouse


def write_run_row(
    wh: Warehouse,
    *,
    run_id: str,
    command: str,
    started: datetime,
    status: str,
    inputs: list[str],
    rows_read: int,
    rows_kept: int,
    details: dict[str, Any],
) -> Path:
    """Write the run's ``runs`` row, finished now; written last, it commits the run."""
    table = pa.table(
        {
            "run_id": [run_id],
            "command": [command],
            "started_at": pa.array([started], pa.timestamp("us", tz="UTC")),
            "finished_at": pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC")),
            "status": [status],
            "inputs": [json.dumps(inputs)],
            "rows_read": pa.array([rows_read], pa.int64()),
            "rows_kept": pa.array([rows_kept], pa.int64()),
            "rows_quarantined": pa.array([0], pa.int64()),
            "rows_duplicate": pa.array([0], pa.int64()),
            "details": [json.dumps(details, sort_keys=True, default=str)],
            "version": [__version__],
        }
    )
    return wh.write(RUNS, table, {}, run_id)
