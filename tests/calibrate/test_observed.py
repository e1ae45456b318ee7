"""``calibrate observed`` on a gateway log whose latencies a known profile produced.

The log is made the way production makes one: requests arrive, an engine serves them,
the gateway records start, first chunk and end. Here the engine is the simulator with
profile X (a shipped profile's model and memory, coefficients written out here),
replayed at the log's arrival times. Calibration starts from Y = X with its prefill
side 1.6x and its decode side 0.7x, and must find the factors that turn Y back into X.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.sim.cost_model import COST_MODEL_VERSION
from pipeline.calibrate.observed import DECODE_SIDE, PREFILL_SIDE
from pipeline.cli import cli
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.sim.loop import simulate
from pipeline.sim.profiles import PROFILE_DIR
from pipeline.sim.replay import prepare, read_requests, select_request_files
from pipeline.sim.scenario import build_scenario
from pipeline.sim.summary import request_metrics
from pipeline.warehouse import Warehouse

SHIPPED = "llama-3-8b_h100-80gb_tp1"  # its model, GPU and memory; coefficients X below
X = {
    "fixed_s": 0.0016,
    "comm_s_fixed": 0.0,
    "seq_s": 3e-5,
    "flop_s_per_token": 2.76e-05,
    "flop_tokens_half": 64.0,
    "flop_s_per_attn": 9.6e-10,
    "mem_s_weights": 0.00527,
    "mem_s_per_kv_token": 4.6e-08,
    "mem_s_per_token": 3.18e-06,
    "comm_s_per_token": 0.0,
    "overlap": 0.1,
}
PREFILL_FACTOR, DECODE_FACTOR = 1.6, 0.7
T0 = datetime(2024, 5, 1, tzinfo=UTC)
SCENARIO = {"name": "prod", "policy": "vllm", "max_num_seqs": 48, "max_num_batched_tokens": 2048}


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(3.0)
        out.append(
            {
                "request_id": f"req-{i}",
                "start": T0 + timedelta(microseconds=round(t * 1e6)),
                "prompt_tokens": rng.randint(50, 3000),
                "completion_tokens": rng.randint(2, 400),
            }
        )
    return out


def write_gateway(path: Path, recs: list[dict[str, Any]], latency: dict[str, Any]) -> Path:
    lines = []
    for r in recs:
        ttft, e2e = latency.get(r["request_id"], (0.1, 1.0))
        lines.append(
            json.dumps(
                {
                    "request_id": r["request_id"],
                    "startTime": _iso(r["start"]),
                    "completionStartTime": _iso(r["start"] + timedelta(seconds=ttft)),
                    "endTime": _iso(r["start"] + timedelta(seconds=e2e)),
                    "prompt_tokens": r["prompt_tokens"],
                    "completion_tokens": r["completion_tokens"],
                    "model": "llama-3-8b",
                    "status": "success",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def served_by(profile: str, wh: Warehouse) -> dict[str, tuple[float, float]]:
    """(TTFT, E2E) of every request in ``wh`` when ``profile`` serves it under SCENARIO."""
    sc = build_scenario({**SCENARIO, "profile": profile}, where="test")
    files = select_request_files(wh)
    prep = prepare(read_requests(files), sc)
    m = request_metrics(simulate(prep.inp, sc.engine()))
    ids = prep.request_ids.to_pylist()
    return {rid: (float(m["ttft_s"][i]), float(m["e2e_s"][i])) for i, rid in enumerate(ids)}


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("observed")
    recs = _records(600, seed=11)
    x = json.loads((PROFILE_DIR / f"{SHIPPED}.json").read_text())
    x["coefficients"] = dict(X)
    x["frontend"] = {}  # the engine alone: the two scales have no front end to fit
    x_path = root / "profile_x.json"
    x_path.write_text(json.dumps(x))
    y = json.loads(json.dumps(x))
    for name in PREFILL_SIDE:
        y["coefficients"][name] *= PREFILL_FACTOR
    for name in DECODE_SIDE:
        y["coefficients"][name] *= DECODE_FACTOR
    y_path = root / "profile_y.json"
    y_path.write_text(json.dumps(y))
    draft = Warehouse(root / "draft")
    quiet = IngestOptions(quiet=True)
    ingest_logs([str(write_gateway(root / "draft.jsonl", recs, {}))], draft, quiet)
    truth = served_by(str(x_path), draft)
    wh = Warehouse(root / "wh")
    assert ingest_logs([str(write_gateway(root / "gateway.jsonl", recs, truth))], wh, quiet).ok
    scenario = root / "prod.toml"
    scenario.write_text(
        "\n".join(f"{k} = {json.dumps(v)}" for k, v in {**SCENARIO, "profile": str(y_path)}.items())
        + "\n"
    )
    out = root / "calibrated.json"
    r = CliRunner().invoke(
        cli,
        ["calibrate", "observed", "--warehouse", str(wh.root), "--scenario", str(scenario),
         "-o", str(out), "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    return {"wh": wh, "x": x, "x_path": x_path, "out": out, "result": json.loads(r.output)}


def test_finds_the_scales_that_turn_y_back_into_x(production: dict[str, Any]) -> None:
    res = production["result"]
    assert res["converged"]
    assert res["scales"]["prefill"] == pytest.approx(1 / PREFILL_FACTOR, rel=0.03)
    assert res["scales"]["decode"] == pytest.approx(1 / DECODE_FACTOR, rel=0.03)
    # so the calibrated profile's coefficients are X's
    got = json.loads(production["out"].read_text())["coefficients"]
    want = production["x"]["coefficients"]
    for name in (*PREFILL_SIDE, *DECODE_SIDE):
        assert got[name] == pytest.approx(want[name], rel=0.03), name


def test_reports_before_and_after_against_observed(production: dict[str, Any]) -> None:
    rows = {(r["metric"], r["statistic"]): r for r in production["result"]["statistics"]}
    assert set(rows) == {(m, s) for m in ("ttft", "tpot") for s in ("p50", "p90", "p99")}
    for r in rows.values():
        assert r["num_requests"] >= 500
        # Y is visibly off before (its slower prefill chunks also slow the decode steps
        # they share a batch with), and within a few % after
        assert abs(r["before_error"]) > 0.1, r
        assert abs(r["after_error"]) <= 0.05, r
    assert rows[("ttft", "p50")]["before_error"] > 0.2


def test_writes_the_profile_provenance_table_and_run(production: dict[str, Any]) -> None:
    profile = json.loads(production["out"].read_text())
    prov = profile["provenance"]
    assert prov["method"] == "calibrated from observed latencies"
    assert prov["like_profile"] == SHIPPED  # the name inside Y's JSON
    assert prov["rows_used"]["ttft"] == 600 and prov["fit_error"]["ttft"]["median"] < 0.05
    assert profile["cost_model_version"] == COST_MODEL_VERSION and "memory" in profile
    wh: Warehouse = production["wh"]
    con = wh.connect()
    rows = con.execute(
        "SELECT metric, statistic, observed_s, after_s, scale FROM calibration "
        "ORDER BY metric, statistic"
    ).fetchall()
    assert len(rows) == 6
    assert {r[4] for r in rows if r[0] == "ttft"} == {production["result"]["scales"]["prefill"]}
    run = con.execute("SELECT command, status FROM runs WHERE command = 'calibrate'").fetchall()
    assert run == [("calibrate", "ok")]
    files = list((wh.root / "calibration").glob("run_id=2*/*.parquet"))
    assert len(files) == 1 and pq.read_table(files[0]).num_rows == 6


def test_the_calibrated_profile_replays_like_the_log(production: dict[str, Any]) -> None:
    """The written profile loads in a scenario and gives the logged latency distribution.

    (Request by request a 0.2% change in a scale reorders some batches, so single
    requests move by more; the percentiles do not.)"""
    wh: Warehouse = production["wh"]
    logged = served_by(str(production["x_path"]), wh)
    again = served_by(str(production["out"]), wh)
    for k, metric in enumerate(("TTFT", "E2E")):
        want = np.array([v[k] for v in logged.values()])
        got = np.array([again[rid][k] for rid in logged])
        for q in (50, 90, 99):
            assert np.percentile(got, q) == pytest.approx(np.percentile(want, q), rel=0.03), (
                metric,
                q,
            )


def test_refuses_requests_without_observed_latencies(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    assert ingest_logs([str(azure)], wh, IngestOptions(quiet=True)).ok
    scenario = tmp_path / "prod.toml"
    scenario.write_text('policy = "vllm"\n')
    r = CliRunner().invoke(
        cli, ["calibrate", "observed", "--warehouse", str(wh.root), "--scenario", str(scenario),
              "-o", str(tmp_path / "o.json")],
    )  # fmt: skip
    assert r.exit_code == 1
    assert r.output.strip() == (
        "Error: 2 requests selected, 0 with an observed TTFT and 0 with an observed TPOT "
        "(E2E and 2+ output tokens); calibrate observed needs both: ingest gateway or OTel "
        "logs that record them"
    )
    scenario.write_text('policy = "vllm"\ntime_scale = 0.5\n')
    r = CliRunner().invoke(
        cli, ["calibrate", "observed", "--warehouse", str(wh.root), "--scenario", str(scenario),
              "-o", str(tmp_path / "o.json")],
    )  # fmt: skip
    assert r.exit_code == 1 and "use arrivals = 'trace' with time_scale = 1" in r.output


def test_sql_and_report_show_the_calibration(production: dict[str, Any]) -> None:
    from pipeline.report import build_report
    from pipeline.report.sql import query

    wh: Warehouse = production["wh"]
    df = query(wh.connect(), "calibration")
    stats = production["result"]["statistics"]
    assert df["metric"].to_list() == ["ttft"] * 3 + ["tpot"] * 3
    assert df["statistic"].to_list() == ["p50", "p90", "p99"] * 2
    by_key = {(r["metric"], r["statistic"]): r for r in stats}
    for row in df.to_dicts():
        want = by_key[(row["metric"], row["statistic"])]
        for col in ("observed_s", "before_s", "after_s", "after_error", "scale"):
            assert row[col] == pytest.approx(want[col], rel=1e-12), col
    html = build_report(wh, output=wh.root / "review.html").read_text()
    assert "Observed vs simulated latency, before and after calibration" in html
    assert "No calibration results in this warehouse" not in html
    p50 = by_key[("ttft", "p50")]
    assert f"{p50['after_error'] * 100:.1f}%" in html
