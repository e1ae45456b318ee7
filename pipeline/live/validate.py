"""``tracereplay validate LIVE_RUN``: the simulator against a live run of the same requests.

The requests of the live run (``live_requests``, completed ones) are replayed through
the simulator with the engine's own settings, read back from the run's ``engine_info``:
the ``transformers`` policy with its ``scheduler``, ``max_batch_tokens``,
``max_requests_per_batch``, ``block_size`` and the number of KV blocks the engine
actually allocated, and a step-cost profile (``--profile``: a calibrated one, e.g. from
``calibrate live``). ``--scenario`` replaces that with a scenario file of one's own.

Each request arrives in the simulator when it reached the engine (``sent_s``), so the
client's own delay is left out of both; latencies are measured from the same zero
(``arrival_s``) in both. Errors are ``simulated / live - 1`` per request and per
statistic (p50, p90, p99, mean of TTFT, TPOT, E2E; request and output-token throughput
over the span from the first arrival to the last completion).

Tables: ``validation`` (one row per metric and statistic) and ``validation_requests``
(one row per request, live and simulated side by side), partitioned by ``run_id``;
a ``runs`` row (command ``validate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.contracts import VALIDATION, VALIDATION_REQUESTS, Contract
from pipeline.errors import ConfigError
from pipeline.runs import write_run_row
from pipeline.warehouse import Warehouse, new_run_id

F64 = npt.NDArray[np.float64]
METRICS = ("ttft", "tpot", "e2e")
STATS = ("p50", "p90", "p99", "mean")


@dataclass
class Validation:
    run_id: str
    live_run_id: str
    aggregate: pl.DataFrame  # metric, stat, live, simulated, error
    requests: pl.DataFrame  # per request
    scenario: dict[str, Any]
    engine_info: dict[str, str]
    paths: dict[str, Path] = field(default_factory=dict)

    def error(self, metric: str, stat: str) -> float | None:
        row = self.aggregate.filter((pl.col("metric") == metric) & (pl.col("stat") == stat))
        return None if row.height == 0 else row["error"][0]


def read_live_run(wh: Warehouse, live_run_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """(its live_requests rows, its runs-row details). Raises ConfigError if unknown."""
    con = wh.connect()
    try:
        runs = con.execute(
            "SELECT command, details, status FROM runs WHERE run_id = ?", [live_run_id]
        ).fetchall()
        if not runs or runs[0][0] != "live":
            known = [
                r[0]
                for r in con.execute(
                    "SELECT run_id FROM runs WHERE command = 'live' ORDER BY run_id DESC LIMIT 5"
                ).fetchall()
            ]
            raise ConfigError(
                f"{live_run_id!r} is not a live run in {wh.root}; latest live runs: "
                + (", ".join(known) or "none (run tracereplay live first)")
            )
        if runs[0][2] == "failed":
            raise ConfigError(
                f"live run {live_run_id} failed (no request streamed a token, or it was "
                "interrupted): nothing to validate; run tracereplay live again"
            )
        details = json.loads(runs[0][1] or "{}")
        frame = con.sql(
            "SELECT * FROM live_requests WHERE run_id = ? ORDER BY arrival_s, request_id",
            params=[live_run_id],
        ).pl()
    except duckdb.CatalogException as exc:
        raise ConfigError(f"{wh.root}: no runs or live_requests table ({exc})") from exc
    finally:
        con.close()
    if frame.height == 0:
        raise ConfigError(f"live run {live_run_id} has no live_requests rows")
    return frame, details


def engine_scenario(
    info: dict[str, str], frame: pl.DataFrame, profile: str | None
) -> dict[str, Any]:
    """Scenario values of the transformers policy with the live engine's settings."""
    if info.get("engine") != "inprocess":
        raise ConfigError(
            f"the live run's engine is {info.get('engine')!r}: validate reproduces the "
            "in-process engine's settings; for another engine pass --scenario"
        )
    if profile is None:
        raise ConfigError(
            "give --profile (a calibrated profile, e.g. from `tracereplay calibrate live`) "
            "or --scenario"
        )
    longest = int((frame["prompt_tokens"] + frame["output_tokens"]).cast(pl.Int64).to_numpy().max())
    blocks = int(info.get("num_blocks_effective") or info["num_blocks"])
    return {
        "name": "validate",
        "policy": "transformers",
        "profile": profile,
        "num_gpu_blocks": blocks,
        "block_size": int(info["block_size"]),
        "max_model_len": longest + 1,
        "max_batch_tokens": int(info["max_batch_tokens"]),
        "scheduler_type": info.get("scheduler", "fifo"),
        "max_requests_per_batch": int(info.get("max_requests_per_batch", 1024)),
    }


def _stat(x: F64, stat: str) -> float | None:
    x = x[~np.isnan(x)]
    if not len(x):
        return None
    if stat == "mean":
        return float(x.mean())
    return float(np.percentile(x, float(stat[1:])))


def _rel(sim: float | None, live: float | None) -> float | None:
    if sim is None or live is None or live == 0:
        return None
    return sim / live - 1.0


def compare(
    live: dict[str, F64], sim: dict[str, F64], arrival: F64, out_tokens: F64
) -> pl.DataFrame:
    """Aggregate rows: every metric x statistic, and the throughputs."""
    rows: list[dict[str, Any]] = []
    for metric in METRICS:
        for stat in STATS:
            a, b = _stat(live[metric], stat), _stat(sim[metric], stat)
            rows.append(
                {"metric": metric, "stat": stat, "live": a, "simulated": b, "error": _rel(b, a)}
            )
    t0 = float(arrival.min())
    span_live = float(np.nanmax(live["finished"])) - t0
    span_sim = float(np.nanmax(sim["finished"])) - t0
    n = float(len(arrival))
    tokens = float(out_tokens.sum())
    for metric, num in (("request_throughput", n), ("output_token_throughput", tokens)):
        a = num / span_live if span_live > 0 else None
        b = num / span_sim if span_sim > 0 else None
        rows.append(
            {"metric": metric, "stat": "overall", "live": a, "simulated": b, "error": _rel(b, a)}
        )
    return pl.DataFrame(
        rows,
        schema={
            "metric": pl.String,
            "stat": pl.String,
            "live": pl.Float64,
            "simulated": pl.Float64,
            "error": pl.Float64,
        },
    )


def simulate_live(frame: pl.DataFrame, values: dict[str, Any]) -> tuple[dict[str, F64], Any]:
    """Replay the live requests through the scenario: per request times, and the scenario."""
    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate
    from pipeline.sim.state import F_FINISH, F_FIRST_SCHED, F_FIRST_TOKEN, SimInput

    sc = build_scenario(values)
    arrival = frame["arrival_s"].to_numpy().astype(np.float64)
    sent = frame["sent_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    start = np.where(np.isnan(sent), arrival, sent)
    order = np.argsort(start, kind="stable")
    prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
    output = frame["output_tokens"].to_numpy().astype(np.int64)
    inp = SimInput(start[order], prompt[order], output[order])
    res = simulate(inp, sc.engine())
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    rqf = res.rqf[back]
    first = rqf[:, F_FIRST_TOKEN]
    fin = rqf[:, F_FINISH]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (fin - first) / (output - 1), np.nan)
    return {
        "first_scheduled": rqf[:, F_FIRST_SCHED],
        "first_token": first,
        "finished": fin,
        "ttft": first - arrival,
        "tpot": tpot,
        "e2e": fin - arrival,
    }, sc


def validate_live(
    warehouse: Path,
    live_run_id: str,
    *,
    profile: str | None = None,
    scenario: Path | None = None,
    run_id: str | None = None,
) -> Validation:
    """Replay live run ``live_run_id`` through the simulator and compare; write the tables."""
    from pipeline.sim.scenario import read_scenario_file

    wh = Warehouse(warehouse)
    frame, details = read_live_run(wh, live_run_id)
    info = {str(k): str(v) for k, v in (details.get("engine_info") or {}).items()}
    ok = frame.filter(pl.col("ok"))
    if ok.height == 0:
        raise ConfigError(f"live run {live_run_id}: no request completed; nothing to compare")
    if scenario is not None:
        values = read_scenario_file(scenario)
        if profile is not None:
            values["profile"] = profile
    else:
        values = engine_scenario(info, ok, profile)
    sim, _ = simulate_live(ok, values)
    arrival = ok["arrival_s"].to_numpy().astype(np.float64)
    live = {
        "ttft": ok["ttft_s"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "tpot": ok["tpot_s"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "e2e": ok["e2e_s"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "finished": ok["finished_s"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "first_scheduled": ok["first_scheduled_s"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
    }
    out_tokens = ok["output_tokens_received"].to_numpy().astype(np.float64)
    aggregate = compare(live, sim, arrival, out_tokens)

    def err(a: F64, b: F64) -> F64:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(a > 0, b / a - 1.0, np.nan)

    per_request = pl.DataFrame(
        {
            "request_id": ok["request_id"],
            "arrival_s": arrival,
            "prompt_tokens": ok["prompt_tokens"].cast(pl.Int32),
            "output_tokens": ok["output_tokens"].cast(pl.Int32),
            "live_first_scheduled_s": live["first_scheduled"],
            "sim_first_scheduled_s": sim["first_scheduled"],
            "live_ttft_s": live["ttft"],
            "sim_ttft_s": sim["ttft"],
            "ttft_error": err(live["ttft"], sim["ttft"]),
            "live_tpot_s": live["tpot"],
            "sim_tpot_s": sim["tpot"],
            "tpot_error": err(live["tpot"], sim["tpot"]),
            "live_e2e_s": live["e2e"],
            "sim_e2e_s": sim["e2e"],
            "e2e_error": err(live["e2e"], sim["e2e"]),
        }
    ).with_columns(pl.selectors.float().fill_nan(None))
    started = datetime.now(UTC)
    run_id = run_id or new_run_id(started)
    wh.init()
    part = {"run_id": run_id}
    agg_table = aggregate.with_columns(pl.lit(live_run_id).alias("live_run_id"))
    req_table = per_request.with_columns(pl.lit(live_run_id).alias("live_run_id"))
    paths = {
        "validation": wh.write(VALIDATION, _arrow(agg_table, VALIDATION), part, "validation"),
        "validation_requests": wh.write(
            VALIDATION_REQUESTS, _arrow(req_table, VALIDATION_REQUESTS), part, "validation"
        ),
    }
    scenario_json = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    details = {
        "live_run_id": live_run_id,
        "engine_info": info,
        "scenario": scenario_json,
        "profile": profile,
        "dropped_failed": frame.height - ok.height,
        "errors": {f"{r['metric']}_{r['stat']}": r["error"] for r in aggregate.to_dicts()},
    }
    write_run_row(
        wh,
        run_id=run_id,
        command="validate",
        started=started,
        status="ok",
        inputs=[live_run_id],
        rows_read=frame.height,
        rows_kept=ok.height,
        details=details,
    )
    return Validation(run_id, live_run_id, aggregate, per_request, scenario_json, info, paths)


def _arrow(frame: pl.DataFrame, contract: Contract) -> pa.Table:
    """The frame's file columns, in the contract's order and types (NaN stored as null)."""
    table = frame.select(contract.file_columns).to_arrow()
    return table.cast(contract.schema())
