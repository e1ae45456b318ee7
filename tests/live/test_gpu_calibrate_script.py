"""scripts/gpu_calibrate.sh end to end on CPU with the tiny shape: every output lands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.contracts import LIVE_REQUESTS, VALIDATION, VALIDATION_REQUESTS
from tests.extras import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_script_runs_on_cpu_with_a_tiny_shape(tmp_path: Path) -> None:
    require("transformers")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "TR_SHAPE": "tiny",
        "TR_DESIGN": "smoke",
        "TR_SAMPLE": "16",
        "TR_SKIP": "100",
        "TR_NUM_BLOCKS": "128",
        "TR_BLOCK_SIZE": "32",
        "TR_MAX_BATCH_TOKENS": "256",
    }
    r = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_calibrate.sh"),
            str(ROOT / "traces" / "azure_conv.csv"),
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    profile = json.loads((out / "profile.json").read_text())
    assert profile["provenance"]["engine"]["model"] == "tiny"
    assert (out / "profile.measurements.csv").is_file()
    live = pq.read_table(out / "live_requests.parquet")
    assert live.num_rows == 16 and set(LIVE_REQUESTS.file_columns) <= set(live.column_names)
    assert pq.read_table(out / "validation.parquet").num_rows == 14
    assert set(VALIDATION.file_columns) <= set(
        pq.read_table(out / "validation.parquet").column_names
    )
    per = pq.read_table(out / "validation_requests.parquet")
    assert set(VALIDATION_REQUESTS.file_columns) <= set(per.column_names)
    log = (out / "gpu_calibrate.log").read_text()
    for step in ("calibrate live", "live: 16 requests", "validate", "done:"):
        assert step in log
