"""``tracereplay validate``: the simulator against a live run.

By hand: a live run written with known times, a profile whose steps cost a known constant,
and the simulated latencies worked out step by step. End to end: a real in-process run,
a probe calibration, validate through the CLI, and the SQL against the stored figures.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from pipeline import __version__
from pipeline.cli import cli
from pipeline.contracts import LIVE_REQUESTS, RUNS
from pipeline.errors import ConfigError
from pipeline.live.replay import live_requests_table
from pipeline.live.types import LiveBatch, LiveResult
from pipeline.live.validate import validate_live
from pipeline.report.sql import query
from pipeline.sim.cost_model import StepCost
from pipeline.warehouse import Warehouse
from tests.extras import require

INFO = {
    "engine": "inprocess",
    "num_blocks": "8",
    "num_blocks_effective": "8",
    "block_size": "16",
    "max_batch_tokens": "64",
    "scheduler": "fifo",
    "max_requests_per_batch": "16",
    "transformers": "test",
    "device": "cpu",
}


def write_live_run(wh: Warehouse, run_id: str, batch: LiveBatch, res: LiveResult) -> None:
    wh.init()
    wh.write(LIVE_REQUESTS, live_requests_table("inprocess", batch, res), {"run_id": run_id}, "x")
    ts = pa.timestamp("us", tz="UTC")
    now = datetime.now(UTC)
    details = {"engine": "inprocess", "engine_info": res.engine_info}
    row = pa.table(
        {
            "run_id": [run_id],
            "command": ["live"],
            "started_at": pa.array([now], ts),
            "finished_at": pa.array([now], ts),
            "status": ["ok"],
            "inputs": ["[]"],
            "rows_read": pa.array([len(batch)], pa.int64()),
            "rows_kept": pa.array([len(batch)], pa.int64()),
            "rows_quarantined": pa.array([0], pa.int64()),
            "rows_duplicate": pa.array([0], pa.int64()),
            "details": [json.dumps(details)],
            "version": [__version__],
        }
    )
    wh.write(RUNS, row, {}, run_id)


def constant_profile(path: Path, step_s: float) -> Path:
    """A profile whose every step costs ``step_s``."""
    coefficients: dict[str, Any] = {f.name: 0.0 for f in StepCost.__dataclass_fields__.values()}
    coefficients["fixed_s"] = step_s
    profile = {
        "name": "constant",
        "cost_model_version": 2,
        "coefficients": coefficients,
        "memory": {
            "kv_bytes_per_token": 1,
            "weight_bytes": 0,
            "gpu_memory_bytes": 10**9,
            "max_model_len": 4096,
        },
    }
    path.write_text(json.dumps(profile))
    return path


def hand_run() -> tuple[LiveBatch, LiveResult]:
    """Two requests; a third failed (it is left out of the comparison)."""
    batch = LiveBatch(
        ["a", "b", "c"],
        np.array([0.0, 0.05, 0.06]),
        np.array([10, 20, 500], dtype=np.int64),
        np.array([3, 2, 2], dtype=np.int64),
    )
    res = LiveResult.empty(3)
    res.sent_s[:] = [0.0, 0.05, 0.06]
    res.first_token_s[:] = [0.2, 0.25, np.nan]
    res.finished_s[:] = [0.4, 0.45, np.nan]
    res.output_tokens_received[:] = [3, 2, 0]
    res.error = [None, None, "prompt + output exceeds the KV cache"]
    res.engine_info = dict(INFO)
    return batch, res


def test_simulated_latencies_worked_out_by_hand(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    batch, res = hand_run()
    write_live_run(wh, "live1", batch, res)
    profile = constant_profile(tmp_path / "p.json", 0.1)
    v = validate_live(wh.root, "live1", profile=str(profile), run_id="val1")
    # steps of 0.1 s; a arrives at 0, b at 0.05 (during step 1):
    # step 1 [0, 0.1]: a prefill (10)            -> a first token 0.1
    # step 2 [0.1, 0.2]: a decode, b prefill (20) -> b first token 0.2
    # step 3 [0.2, 0.3]: a decode (a done), b decode (b done)
    sim = v.requests.sort("request_id")
    assert sim["sim_ttft_s"].to_list() == pytest.approx([0.1, 0.15])
    assert sim["sim_e2e_s"].to_list() == pytest.approx([0.3, 0.25])
    assert sim["sim_tpot_s"].to_list() == pytest.approx([0.1, 0.1])
    # live: ttft 0.2, 0.2; e2e 0.4, 0.4; tpot (0.4 - 0.2) / 2 = 0.1, 0.2 / 1 = 0.2
    assert sim["live_tpot_s"].to_list() == pytest.approx([0.1, 0.2])
    assert sim["ttft_error"].to_list() == pytest.approx([0.1 / 0.2 - 1, 0.15 / 0.2 - 1])
    assert v.error("ttft", "p50") == pytest.approx(0.125 / 0.2 - 1)
    assert v.error("tpot", "mean") == pytest.approx(0.1 / 0.15 - 1)
    assert v.error("e2e", "p99") == pytest.approx((0.25 + 0.99 * 0.05) / 0.4 - 1)
    # 2 requests over [0, 0.45] live and [0, 0.3] simulated
    assert v.error("request_throughput", "overall") == pytest.approx(0.45 / 0.3 - 1)
    assert v.error("output_token_throughput", "overall") == pytest.approx(0.45 / 0.3 - 1)
    assert v.scenario["num_gpu_blocks"] == 8 and v.scenario["policy"] == "transformers"
    # the same figures through SQL
    con = wh.connect()
    rows = query(con, "validation").to_dicts()
    assert [(r["metric"], r["stat"]) for r in rows[:2]] == [("ttft", "p50"), ("ttft", "p90")]
    assert rows[0]["error"] == pytest.approx(v.error("ttft", "p50"))
    assert len(rows) == 14
    cdf = query(con, "validation_cdf").to_dicts()
    ttft_sim = [r for r in cdf if r["metric"] == "ttft" and r["source"] == "simulated"]
    assert [r["value_s"] for r in ttft_sim] == pytest.approx([0.1, 0.15])
    assert [r["cdf"] for r in ttft_sim] == pytest.approx([0.5, 1.0])
    per = query(con, "validation_requests").to_dicts()
    assert [r["request_id"] for r in per] == ["a", "b"]
    (details,) = con.execute("SELECT details FROM runs WHERE run_id = 'val1'").fetchall()
    assert json.loads(details[0])["dropped_failed"] == 1


def test_bad_runs_and_missing_settings_are_one_line_errors(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    batch, res = hand_run()
    write_live_run(wh, "live1", batch, res)
    profile = str(constant_profile(tmp_path / "p.json", 0.1))
    with pytest.raises(ConfigError, match="not a live run .* latest live runs: live1"):
        validate_live(wh.root, "nope", profile=profile)
    with pytest.raises(ConfigError, match="give --profile"):
        validate_live(wh.root, "live1")
    res.engine_info = {**INFO, "engine": "http"}
    write_live_run(wh, "live2", batch, res)
    with pytest.raises(ConfigError, match="pass --scenario"):
        validate_live(wh.root, "live2", profile=profile)
    r = CliRunner().invoke(cli, ["validate", "nope", "--warehouse", str(wh.root)])
    assert r.exit_code == 1 and "not a live run" in r.output


def test_a_scenario_file_replaces_the_engine_settings(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    batch, res = hand_run()
    res.engine_info = {**INFO, "engine": "http"}
    write_live_run(wh, "live1", batch, res)
    profile = constant_profile(tmp_path / "p.json", 0.1)
    sc = tmp_path / "orca.toml"
    sc.write_text(
        f'policy = "orca"\nprofile = "{profile}"\nnum_gpu_blocks = 100\nblock_size = 16\n'
        "max_model_len = 64\nmax_num_seqs = 1\n"
    )
    v = validate_live(wh.root, "live1", scenario=sc)
    # one at a time: a [0, 0.3], then b prefill at 0.3, first token 0.4, done 0.5
    sim = v.requests.sort("request_id")
    assert sim["sim_ttft_s"].to_list() == pytest.approx([0.1, 0.35])


def test_validate_end_to_end_on_the_in_process_engine(tmp_path: Path) -> None:
    require("transformers")
    from tests.helpers import requests_file

    reqs = requests_file(tmp_path / "requests.parquet", 12, 0.02)
    wh = tmp_path / "wh"
    runner = CliRunner()
    args = ["live", "--engine", "inprocess", "--requests", str(reqs), "--warehouse", str(wh)]
    args += ["--model-config", "tiny", "--num-gpu-blocks", "32", "--block-size", "16", "--json"]
    args += ["--max-num-batched-tokens", "32"]
    r = runner.invoke(cli, args)
    assert r.exit_code == 0, r.output
    live_run = json.loads(r.output)["run_id"]
    profile = tmp_path / "tiny.json"
    r = runner.invoke(
        cli,
        ["calibrate", "live", "--model-config", "tiny", "--design", "smoke", "-o", str(profile)],
    )
    assert r.exit_code == 0, r.output
    prof = json.loads(profile.read_text())
    assert prof["provenance"]["engine"]["engine"] == "inprocess"
    assert prof["provenance"]["engine"]["dtype"] == "float32"
    # profile check of that profile on its measurements file: the figure calibrate live
    # printed and recorded, over the same rows (docs/calibration.md, "the error figure")
    mfile = tmp_path / "tiny.measurements.csv"
    r_check = runner.invoke(cli, ["profile", "check", str(profile), str(mfile), "--json"])
    assert r_check.exit_code == 0, r_check.output
    checked = json.loads(r_check.output)["errors"]
    for phase in ("prefill", "decode"):
        e = checked[phase]
        assert prof["provenance"]["fit_error"][phase] == pytest.approx(e, rel=1e-12)
        cells = rf"{phase}\s+{e['rows']}\s+[\d.]+%\s+[\d.]+%\s+{e['median']:.1%}\s+{e['p90']:.1%}"
        assert re.search(cells, r.output), r.output
    assert f"rows of {mfile} (start, fit: all measured):" in r.output
    r = runner.invoke(
        cli, ["validate", live_run, "--warehouse", str(wh), "--profile", str(profile), "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["scenario"]["max_batch_tokens"] == 32 and out["scenario"]["block_size"] == 16
    errors = {(e["metric"], e["stat"]): e for e in out["errors"]}
    for metric in ("ttft", "tpot", "e2e"):
        e = errors[(metric, "p50")]
        assert e["live"] > 0 and e["simulated"] > 0
        assert e["error"] == pytest.approx(e["simulated"] / e["live"] - 1)
    con = Warehouse(wh).connect()
    assert con.execute("SELECT count(*) FROM validation_requests").fetchall() == [(12,)]
