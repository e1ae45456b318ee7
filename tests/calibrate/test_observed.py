"""``calibrate observed`` on a gateway log whose latencies a known profile produced.

The log is made the way production makes one: requests arrive, an engine serves them,
the gateway records start, first chunk and end. Here the engine is the simulator with
profile X (the shipped default, with a front end of 6 ms), replayed at the log's arrival
times, the load rising from 1 to 7 requests per second over the log. Calibration starts
from Y = X with its compute 1.6x, its memory 0.7x and a 2 ms front end, and must find
the profile that turns Y back into X, predicting held-out stretches of the log.
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.calibrate.observed import Latencies, _unpinned, fit_observed, folds_by_hour
from pipeline.calibrate.observed_fit import Params
from pipeline.cli import cli
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.sim.cost_model import COST_MODEL_VERSION
from pipeline.sim.frontend import Frontend
from pipeline.sim.profiles import PROFILE_DIR
from pipeline.sim.replay_input import prepare, read_requests, select_request_files
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput
from pipeline.sim.summary import request_metrics
from pipeline.warehouse import Warehouse

SHIPPED = "llama-3-8b_h100-80gb_tp1"  # profile X: its coefficients and a 6 ms front end
TRUE_FRONTEND = {"request_s": 0.006, "prompt_token_s": 1e-6, "output_token_s": 0.0}
COMPUTE_FACTOR, MEMORY_FACTOR = 1.6, 0.7  # Y = X with these, and a 2 ms front end
T0 = datetime(2024, 5, 1, tzinfo=UTC)
SCENARIO = {"name": "prod", "policy": "vllm", "max_num_seqs": 48, "max_num_batched_tokens": 2048}


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1.0 + 6.0 * i / n)  # quiet at first, busy at the end
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
    recs = _records(900, seed=11)
    x = json.loads((PROFILE_DIR / f"{SHIPPED}.json").read_text())
    x["frontend"] = dict(TRUE_FRONTEND)
    x_path = root / "profile_x.json"
    x_path.write_text(json.dumps(x))
    y = json.loads(json.dumps(x))
    wrong = Params({"compute": COMPUTE_FACTOR, "memory": MEMORY_FACTOR, "step": 1.0,
                    "sequence": 1.0}, 0.0, Frontend(0.002, 1e-6, 0.0))  # fmt: skip
    from pipeline.sim.cost_model import StepCost

    y["coefficients"] = wrong.apply(StepCost.from_dict(x["coefficients"])).to_dict()
    y["frontend"] = wrong.frontend.to_dict()
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


def test_finds_the_profile_that_turns_y_back_into_x(production: dict[str, Any]) -> None:
    res = production["result"]
    assert res["converged"]
    p = res["params"]
    # the prefill cost and the front end are pinned by the log; the decode side's factors
    # trade off against each other (per step, per sequence, memory), their sum is pinned
    assert p["scales"]["compute"] == pytest.approx(1 / COMPUTE_FACTOR, rel=0.05)
    assert p["frontend"]["request_s"] == pytest.approx(TRUE_FRONTEND["request_s"], abs=0.0015)
    got = json.loads(production["out"].read_text())
    want = production["x"]["coefficients"]
    for name in ("flop_s_per_token", "flop_s_per_attn", "flop_s_per_seq"):
        assert got["coefficients"][name] == pytest.approx(want[name], rel=0.05), name
    assert got["frontend"]["request_s"] == pytest.approx(p["frontend"]["request_s"])


def test_reports_before_after_and_held_out_against_observed(production: dict[str, Any]) -> None:
    rows = {(r["metric"], r["statistic"]): r for r in production["result"]["statistics"]}
    assert set(rows) == {(m, s) for m in ("ttft", "tpot") for s in ("p50", "p90", "p99")}
    for r in rows.values():
        assert r["num_requests"] >= 800
        # within a few % after, and predicting held-out stretches of the log within 8%
        assert abs(r["after_error"]) <= 0.05, r
        assert abs(r["held_out_error"]) <= 0.08, r
    # Y is visibly off before (its slower prefills also stall the decodes they share a
    # step with, which its faster memory partly makes up for in the TPOT tail)
    for key in [("ttft", "p50"), ("ttft", "p90"), ("ttft", "p99"), ("tpot", "p50")]:
        assert abs(rows[key]["before_error"]) > 0.1, key
        assert abs(rows[key]["held_out_before_error"]) > 0.1, key
    assert production["result"]["held_out"]["basis"] == "time"  # the log spans minutes


def test_writes_the_profile_provenance_table_and_run(production: dict[str, Any]) -> None:
    profile = json.loads(production["out"].read_text())
    prov = profile["provenance"]
    assert prov["method"] == "calibrated from observed latencies"
    assert prov["like_profile"] == SHIPPED  # the name inside Y's JSON
    assert prov["rows_used"]["ttft"] == 900 and prov["fit_error"]["ttft"]["median"] < 0.05
    assert prov["converged"] and set(prov["scales"]) == {"compute", "memory", "step", "sequence"}
    assert set(prov["held_out"]["error"]) == {f"{m} {s}" for m in ("ttft", "tpot")
                                              for s in ("p50", "p90", "p99")}  # fmt: skip
    assert profile["cost_model_version"] == COST_MODEL_VERSION and "memory" in profile
    sd = profile["uncertainty"]["step_time_log_sd"]
    assert 0 < sd < 0.08  # the held-out error it predicts with, for capacity's intervals
    wh: Warehouse = production["wh"]
    con = wh.connect()
    rows = con.execute(
        "SELECT metric, statistic, observed_s, after_s, scale, held_out_error FROM calibration "
        "ORDER BY metric, statistic"
    ).fetchall()
    assert len(rows) == 6 and all(r[5] is not None for r in rows)
    scales = production["result"]["params"]["scales"]
    assert {r[4] for r in rows if r[0] == "ttft"} == {scales["compute"]}
    run = con.execute("SELECT command, status FROM runs WHERE command = 'calibrate'").fetchall()
    assert run == [("calibrate", "ok")]
    files = list((wh.root / "calibration").glob("run_id=2*/*.parquet"))
    assert len(files) == 1 and pq.read_table(files[0]).num_rows == 6


def test_the_calibrated_profile_replays_like_the_log(production: dict[str, Any]) -> None:
    """The written profile loads in a scenario and gives the logged latency distribution.

    (Request by request a small change of the profile reorders some batches, so single
    requests move by more; the percentiles do not.)"""
    wh: Warehouse = production["wh"]
    logged = served_by(str(production["x_path"]), wh)
    again = served_by(str(production["out"]), wh)
    for k, metric in enumerate(("TTFT", "E2E")):
        want = np.array([v[k] for v in logged.values()])
        got = np.array([again[rid][k] for rid in logged])
        for q in (50, 90, 99):
            assert np.percentile(got, q) == pytest.approx(np.percentile(want, q), rel=0.05), (
                metric,
                q,
            )


def _synthetic(n: int, seed: int) -> SimInput:
    rng = np.random.default_rng(seed)
    rate = np.linspace(0.5, 6.0, n)
    arrival = np.cumsum(rng.exponential(1 / rate))
    return SimInput(arrival, rng.integers(30, 3000, n), rng.integers(2, 300, n))


@pytest.mark.parametrize(
    ("truth", "start"),
    [
        # each new term found from a start without it: the three front-end terms ...
        (Params({}, 0.0, Frontend(0.008, 3e-6, 4e-4)), Params({}, 0.0, Frontend())),
        # ... and the prefill launch cost, with the per-step and per-sequence costs off
        (Params({"step": 0.5, "sequence": 2.0}, 0.003, Frontend()), Params({}, 0.0, Frontend())),
    ],
    ids=["frontend", "launch-step-sequence"],
)
def test_recovers_each_new_term_of_a_known_profile(truth: Params, start: Params) -> None:
    base = build_scenario({"policy": "vllm", "max_num_seqs": 128})
    full = {g: truth.scales.get(g, 1.0) for g in ("compute", "memory", "step", "sequence")}
    truth = Params(full, truth.prefill_fixed_s, truth.frontend)
    start = Params({g: 1.0 for g in full}, start.prefill_fixed_s, start.frontend)
    inp = _synthetic(1500, seed=4)
    x = dataclasses.replace(base, cost=truth.apply(base.cost), frontend=truth.frontend)
    m = request_metrics(simulate(inp, x.engine()))
    observed = Latencies(m["ttft_s"], m["tpot_s"])
    y = dataclasses.replace(base, cost=start.apply(base.cost), frontend=start.frontend)
    stages, fit, _, converged = fit_observed(inp, y, observed, max_iterations=10)
    assert converged and fit is not None
    got = stages[-1].params
    fe, want = got.frontend, truth.frontend
    assert fe.request_s == pytest.approx(want.request_s, abs=1.5e-3)
    assert fe.prompt_token_s == pytest.approx(want.prompt_token_s, abs=1e-6)
    # a delay per streamed token adds to TPOT as a dearer decode step would; only queueing
    # (TTFT at busy times) tells them apart: found, or said not to be pinned by the log
    found = fe.output_token_s == pytest.approx(want.output_token_s, abs=1.5e-4)
    assert found or "output_token_s" in _unpinned(fit)
    for metric in ("ttft", "tpot"):
        for q in (50, 99):
            sim = np.nanpercentile(stages[-1].simulated.of(metric), q)
            assert sim == pytest.approx(np.nanpercentile(observed.of(metric), q), rel=0.04)
    found = got.prefill_fixed_s == pytest.approx(truth.prefill_fixed_s, abs=1e-3)
    assert found or "prefill_fixed_s" in _unpinned(fit)
    for g in ("compute", "memory"):
        found = got.scales[g] == pytest.approx(truth.scales[g], rel=0.08)
        assert found or f"scale_{g}" in _unpinned(fit), g
    # what a step costs at a batch of 1 and of 64 (the per-step and per-sequence costs
    # together), within 8%
    for batch in (1, 64):
        a = got.apply(base.cost).decode_step_s(batch, 1000)
        b = truth.apply(base.cost).decode_step_s(batch, 1000)
        assert a == pytest.approx(b, rel=0.08), batch


def test_refuses_made_up_latencies_and_writes_nothing(tmp_path: Path) -> None:
    recs = _records(300, seed=5)
    rng = random.Random(9)
    # latencies no engine gives: TTFT anywhere from 1 ms to 60 s, a whole second a token
    made_up = {
        r["request_id"]: (t, t + r["completion_tokens"] * 1.0)
        for r in recs
        for t in [10 ** rng.uniform(-3, 1.8)]
    }
    wh = Warehouse(tmp_path / "wh")
    log = write_gateway(tmp_path / "gateway.jsonl", recs, made_up)
    assert ingest_logs([str(log)], wh, IngestOptions(quiet=True)).ok
    scenario = tmp_path / "prod.toml"
    scenario.write_text(
        "\n".join(f"{k} = {json.dumps(v)}" for k, v in {**SCENARIO, "profile": SHIPPED}.items())
    )
    out = tmp_path / "o.json"
    r = CliRunner().invoke(
        cli, ["calibrate", "observed", "--warehouse", str(wh.root), "--scenario", str(scenario),
              "-o", str(out)],
    )  # fmt: skip
    assert r.exit_code == 1, r.output
    line = r.output.strip()
    assert line.startswith("Error: calibrate observed: ") and line.endswith("nothing written")
    assert "\n" not in line
    assert not out.exists()
    assert not list((wh.root / "calibration").glob("run_id=2*/*.parquet"))


def test_folds_are_whole_hours_or_stretches_of_time() -> None:
    hour = 3_600_000_000
    t = np.array([0, 10, hour + 5, 2 * hour, 2 * hour + 1, 5 * hour, 6 * hour], dtype=np.int64)
    folds, labels, basis = folds_by_hour(t, k=3)
    assert basis == "hour" and len(folds) == 3 and len(labels) == 3
    assert (sum(f.astype(int) for f in folds) == 1).all()  # a partition
    assert folds[0][0] and folds[0][1]  # one hour stays in one fold
    short = np.arange(100, dtype=np.int64) * 1_000_000
    folds, labels, basis = folds_by_hour(short, k=4)
    assert basis == "time" and [int(f.sum()) for f in folds] == [25] * 4
    assert labels[0] == "part 1 of 4"


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
