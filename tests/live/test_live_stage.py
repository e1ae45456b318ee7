"""The live stage: the slice it takes, the tables it writes (figures worked out by hand),
its SQL against the same figures, and `tracereplay live --engine http` end to end against
the token server (a real local HTTP server)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline import runs
from pipeline.cli import cli
from pipeline.contracts import LIVE_METRICS, LIVE_REQUESTS
from pipeline.errors import ConfigError
from pipeline.live.replay import (
    Selection,
    live_metrics_table,
    live_requests_table,
    make_batch,
    summarize_live,
)
from pipeline.live.types import LiveBatch, LiveResult
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.extras import needs, require
from tests.helpers import requests_file
from tests.live.servers import token_server

NAN = np.nan
TIMEOUT = "timeout after 5 s (0 chunks received)"


def hand_run() -> tuple[LiveBatch, LiveResult]:
    """Four requests; the last one timed out."""
    batch = LiveBatch(
        ["r0", "r1", "r2", "r3"],
        np.array([0.0, 1.0, 2.0, 3.0]),
        np.array([10, 20, 30, 40], dtype=np.int64),
        np.array([5, 1, 3, 4], dtype=np.int64),
    )
    res = LiveResult.empty(4)
    res.sent_s[:] = [0.001, 1.0, 2.002, 3.0]
    res.first_token_s[:] = [0.5, 1.2, 2.4, NAN]
    res.finished_s[:] = [1.3, 1.2, 3.0, NAN]
    res.output_tokens_received[:] = [5, 1, 3, 0]
    res.itl_mean_s[:] = [0.2, NAN, 0.3, NAN]
    res.itl_max_s[:] = [0.3, NAN, 0.35, NAN]
    res.error = [None, None, None, TIMEOUT]
    res.metrics = {
        "time_s": np.array([0.0, 0.5, 1.0]),
        "num_requests_running": np.array([0.0, 2.0, 1.0]),
        "kv_cache_usage": np.array([NAN, 0.5, 0.25]),
    }
    return batch, res


# ttft of the ok ones: 0.5 0.2 0.4; tpot: 0.2 (r0) 0.3 (r2); e2e: 1.3 0.2 1.0.
# Linear percentiles of three sorted values a<b<c: p50 = b, p90 = b + 0.8 (c - b),
# p99 = b + 0.98 (c - b); of two: p50 = mean, p90 = a + 0.9 (b - a).
EXPECTED = {
    "num_requests": 4,
    "completed": 3,
    "failed": 1,
    "duration_s": 3.0,  # first arrival 0 to last completion 3.0
    "request_throughput": 1.0,
    "output_token_throughput": 3.0,  # 5 + 1 + 3 tokens
    "total_token_throughput": 23.0,  # + 10 + 20 + 30 prompt tokens
    "ttft_p50_s": 0.4,
    "ttft_p90_s": 0.48,
    "ttft_p99_s": 0.498,
    "ttft_mean_s": 1.1 / 3,
    "tpot_p50_s": 0.25,
    "tpot_p90_s": 0.29,
    "tpot_p99_s": 0.299,
    "tpot_mean_s": 0.25,
    "e2e_p50_s": 1.0,
    "e2e_p99_s": 1.294,
    "late_p50_s": 0.0005,
    "late_max_s": 0.002,
}


def test_requests_table_and_summary_by_hand() -> None:
    batch, res = hand_run()
    t = live_requests_table("http", batch, res)
    assert t.column_names == LIVE_REQUESTS.file_columns
    rows = t.to_pylist()
    assert [r["ok"] for r in rows] == [True, True, True, False]
    assert rows[3]["error"] == TIMEOUT and rows[3]["ttft_s"] is None
    assert rows[1]["tpot_s"] is None and rows[1]["itl_mean_s"] is None  # one token
    assert rows[0]["tpot_s"] == pytest.approx(0.2)
    assert rows[2]["e2e_s"] == pytest.approx(1.0)
    assert rows[0]["first_scheduled_s"] is None  # an HTTP client cannot know it
    s = summarize_live(t)
    for key, want in EXPECTED.items():
        assert s[key] == pytest.approx(want), key
    assert s["failure_reasons"] == {TIMEOUT: 1}


def test_metrics_table_is_long_and_skips_missing_samples() -> None:
    _, res = hand_run()
    t = live_metrics_table(res.metrics)
    assert t.column_names == LIVE_METRICS.file_columns
    assert t.to_pylist() == [
        {"time_s": 0.5, "metric": "kv_cache_usage", "value": 0.5},
        {"time_s": 1.0, "metric": "kv_cache_usage", "value": 0.25},
        {"time_s": 0.0, "metric": "num_requests_running", "value": 0.0},
        {"time_s": 0.5, "metric": "num_requests_running", "value": 2.0},
        {"time_s": 1.0, "metric": "num_requests_running", "value": 1.0},
    ]
    assert live_metrics_table({}).num_rows == 0


def test_sql_gives_the_summary_figures(tmp_path: Path) -> None:
    batch, res = hand_run()
    wh = Warehouse(tmp_path / "wh")
    wh.init()
    run, old = "20261130T120000Z-bbbb", "20261130T110000Z-aaaa"
    wh.write(LIVE_REQUESTS, live_requests_table("http", batch, res), {"run_id": run}, "http")
    first = LiveBatch(["x"], np.array([0.0]), np.array([1]), np.array([1]))
    refused = LiveResult.empty(1)
    refused.error = ["ConnectError: refused"]
    wh.write(LIVE_REQUESTS, live_requests_table("inprocess", first, refused), {"run_id": old}, "x")
    wh.write(LIVE_METRICS, live_metrics_table(res.metrics), {"run_id": run}, "http")
    for run_id in (run, old):  # the runs rows commit them
        runs.write_run_row(
            wh,
            run_id=run_id,
            command="live",
            started=datetime.now(UTC),
            status="ok",
            inputs=[],
            rows_read=1,
            rows_kept=1,
            details={},
        )
    con = wh.connect()
    rows = query(con, "live_latency").to_dicts()  # the latest run
    assert len(rows) == 1
    got = rows[0]
    assert (got["run_id"], got["engine"], got["num_requests"]) == (run, "http", 4)
    assert (got["num_ok"], got["num_failed"]) == (3, 1)
    pairs = {
        "duration_s": "duration_s",
        "request_throughput": "request_throughput",
        "output_token_throughput": "output_token_throughput",
        "p50_ttft_s": "ttft_p50_s",
        "p90_ttft_s": "ttft_p90_s",
        "p99_ttft_s": "ttft_p99_s",
        "mean_ttft_s": "ttft_mean_s",
        "p50_tpot_s": "tpot_p50_s",
        "p90_tpot_s": "tpot_p90_s",
        "p99_tpot_s": "tpot_p99_s",
        "mean_tpot_s": "tpot_mean_s",
        "p50_e2e_s": "e2e_p50_s",
        "p99_e2e_s": "e2e_p99_s",
        "max_late_s": "late_max_s",
    }
    for column, key in pairs.items():
        assert got[column] == pytest.approx(EXPECTED[key]), column
    old_row = query(con, "live_latency", run_id=old).to_dicts()
    assert old_row[0]["num_ok"] == 0 and old_row[0]["p50_ttft_s"] is None
    metrics = query(con, "live_metrics").to_dicts()
    assert metrics == [
        {"run_id": run, "metric": "kv_cache_usage", "num_samples": 2, "first_s": 0.5,
         "last_s": 1.0, "min_value": 0.25, "mean_value": 0.375, "max_value": 0.5,
         "last_value": 0.25, "change": -0.25},
        {"run_id": run, "metric": "num_requests_running", "num_samples": 3, "first_s": 0.0,
         "last_s": 1.0, "min_value": 0.0, "mean_value": 1.0, "max_value": 2.0,
         "last_value": 1.0, "change": 1.0},
    ]  # fmt: skip


def frame(arrivals: list[float], prompts: list[int], outputs: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "request_id": [f"q{i}" for i in range(len(arrivals))],
            "arrival_s": arrivals,
            "prompt_tokens": prompts,
            "output_tokens": outputs,
        }
    )


def test_slice_rebases_scales_and_caps() -> None:
    f = frame([0.0, 1.0, 2.0, 5.0, 9.0], [10, 900, 30, 40, 50], [0, 7, 300, 4, 5])
    sel = Selection(sample=3, skip=1, time_scale=0.5, max_prompt_tokens=64, max_output_tokens=8)
    b = make_batch(f, sel)
    assert b.request_id == ["q1", "q2", "q3"]
    assert b.arrival_s.tolist() == [0.0, 0.5, 2.0]
    assert b.prompt_tokens.tolist() == [64, 30, 40]
    assert b.output_tokens.tolist() == [7, 8, 4]
    whole = make_batch(f, Selection())
    assert len(whole) == 5 and whole.output_tokens[0] == 1  # 0 output tokens asked as 1
    assert whole.prefix_hashes is None  # no hashes in this frame
    hashed = f.with_columns(
        pl.Series("prefix_hashes", [[1, 2], [], None, [1], [3]], dtype=pl.List(pl.UInt64)),
        pl.Series("block_size", [16, None, None, 16, 16], dtype=pl.Int32),
    )
    b2 = make_batch(hashed, Selection(skip=1))
    assert b2.prefix_hashes == [[], [], [1], [3]]
    assert b2.block_size is not None and b2.block_size.tolist() == [0, 0, 16, 16]
    with pytest.raises(ConfigError, match="--skip 5 leaves none of the 5 requests"):
        make_batch(f, Selection(skip=5))
    with pytest.raises(ConfigError, match="--time-scale 0"):
        Selection(time_scale=0)
    with pytest.raises(ConfigError, match="--num-requests 0"):
        Selection(sample=0)


def test_live_command_end_to_end_over_http(tmp_path: Path) -> None:
    reqs = requests_file(tmp_path / "requests.parquet", 12, 0.02)
    wh = tmp_path / "wh"
    with token_server(0.03, 0.005) as url:
        args = ["live", "--engine", "http", "--base-url", url, "--requests", str(reqs)]
        args += ["--warehouse", str(wh), "--num-requests", "10", "--skip", "2", "--time-scale", "2"]
        args += ["--metrics-interval-s", "0.05"]
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        assert "live http (vllm at http://127.0.0.1:" in r.output
        assert "10 requests, 10 completed, 0 failed" in r.output
        assert re.search(r"TTFT p50 \d\.\d{3} s", r.output)
        js = CliRunner().invoke(cli, [*args, "--json"])
    assert js.exit_code == 0, js.output
    out = json.loads(js.output)
    s = out["summary"]
    # the summary is the stored requests' percentiles; TTFT no less than the server's 30 ms
    # (an upper bound would be the machine's load: tests/live/test_http.py times the client)
    assert s["completed"] == 10 and s["ttft_p50_s"] >= 0.03
    con = Warehouse(wh).connect()
    (stored,) = con.sql(
        "SELECT quantile_cont(ttft_s, 0.5), quantile_cont(tpot_s, 0.5), min(tpot_s) "
        f"FROM live_requests WHERE run_id = '{out['run_id']}'"
    ).fetchall()
    assert stored[2] > 0
    assert (s["ttft_p50_s"], s["tpot_p50_s"]) == pytest.approx(stored[:2], rel=1e-9)
    rows = con.sql(
        "SELECT request_id, arrival_s, output_tokens, output_tokens_received, ok "
        f"FROM live_requests WHERE run_id = '{out['run_id']}' ORDER BY arrival_s"
    ).fetchall()
    assert [r[0] for r in rows] == [f"req-{i:02d}" for i in range(2, 12)]
    assert [r[1] for r in rows] == pytest.approx([0.04 * i for i in range(10)])
    assert all(r[2] == r[3] and r[4] for r in rows)
    run = con.sql(f"SELECT * FROM runs WHERE run_id = '{out['run_id']}'").pl().to_dicts()[0]
    assert (run["command"], run["status"], run["rows_read"], run["rows_kept"]) == (
        "live",
        "ok",
        12,
        10,
    )
    details = json.loads(run["details"])
    assert details["engine_info"]["server_kind"] == "vllm"
    assert details["summary"]["completed"] == 10
    assert details["selection"] == {
        "sample": 10,
        "skip": 2,
        "time_scale": 2.0,
        "max_prompt_tokens": None,
        "max_output_tokens": None,
        "max_wait_s": 300.0,
    }
    metrics = pq.read_table(wh / "live_metrics" / f"run_id={out['run_id']}" / "http.parquet")
    assert "num_requests_running" in set(metrics.column("metric").to_pylist())


@needs("httpx")
def test_live_command_errors_are_one_line(tmp_path: Path) -> None:
    reqs = requests_file(tmp_path / "requests.parquet", 2, 0.1)
    args = ["live", "--engine", "http", "--requests", str(reqs), "--warehouse", str(tmp_path)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1 and "--engine http needs --base-url" in r.output
    r = CliRunner().invoke(cli, [*args, "--base-url", "http://127.0.0.1:9"])
    assert r.exit_code == 1 and "cannot reach http://127.0.0.1:9" in r.output
    runs = pq.read_table(next((tmp_path / "runs").glob("2*.parquet"))).to_pylist()
    assert runs[0]["command"] == "live" and runs[0]["status"] == "failed"


def test_live_command_in_process(tmp_path: Path) -> None:
    """The stage hands its options to the in-process engine and stores what it reports."""
    require("transformers")
    reqs = requests_file(tmp_path / "requests.parquet", 6, 0.05)
    wh = tmp_path / "wh"
    args = ["live", "--engine", "inprocess", "--requests", str(reqs), "--warehouse", str(wh)]
    args += ["--model-config", "tiny", "--num-gpu-blocks", "64", "--block-size", "16", "--json"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["summary"]["completed"] == 6
    info = out["engine_info"]
    assert (info["num_blocks"], info["block_size"], info["device"]) == ("64", "16", "cpu")
    con = Warehouse(wh).connect()
    got = con.sql(
        "SELECT output_tokens_received, first_scheduled_s, arrival_s FROM live_requests "
        "ORDER BY arrival_s"
    ).fetchall()
    assert [g[0] for g in got] == [3, 4, 5, 3, 4, 5]
    assert all(g[1] is not None and g[1] >= g[2] for g in got)  # known in process
