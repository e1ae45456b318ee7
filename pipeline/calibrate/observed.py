"""``tracereplay calibrate observed``: scale a profile until the replayed production traffic
shows the TTFT and TPOT that the logs observed.

The requests that carry observed latencies (gateway logs, OTel spans: ``observed_ttft_s``,
``observed_e2e_s``) are replayed, at their logged arrival times, through the user's
production scenario. Each request's simulated TTFT and TPOT are paired with its observed
ones and the profile's coefficients are scaled in two groups:

    prefill side  flop_s_per_token, flop_s_per_attn, comm_s_per_token
                  (compute and all-reduce bandwidth: what a prompt's prefill costs)
                  scaled by s_prefill until the typical observed / simulated TTFT is 1
    decode side   fixed_s, comm_s_fixed, seq_s, mem_s_weights, mem_s_per_kv_token,
                  mem_s_per_token (per-step overheads and memory traffic: what a decode
                  step costs) scaled by s_decode until the typical observed / simulated
                  TPOT is 1

where "typical" is the geometric mean of the per-request ratios, the 10% lowest and
highest left out.

TTFT also holds queueing, and a prefill waits for decode steps, so each scale moves both
figures: the two scales are found together by a secant iteration in log space, one replay
per step, until both ratios are within ``TOLERANCE`` of 1 (or ``max_iterations``).
Observed TPOT is (E2E - TTFT) / (output tokens - 1), as for simulated requests.

Results: the calibrated profile JSON, a ``calibration`` table (observed against simulated
p50/p90/p99 TTFT and TPOT, before and after) and a ``runs`` row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline import __version__
from pipeline.calibrate.profile import derived_profile, read_profile_json, write_profile
from pipeline.contracts import CALIBRATION
from pipeline.errors import ConfigError, ScenarioError
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim.cost_model import StepCost
from pipeline.sim.loop import simulate
from pipeline.sim.replay import prepare, read_requests, select_request_files
from pipeline.sim.scenario import Scenario
from pipeline.sim.summary import request_metrics
from pipeline.warehouse import Warehouse, new_run_id

F64 = npt.NDArray[np.float64]

PREFILL_SIDE = ("flop_s_per_token", "flop_s_per_attn", "comm_s_per_token")
DECODE_SIDE = (
    "fixed_s",
    "comm_s_fixed",
    "seq_s",
    "mem_s_weights",
    "mem_s_per_kv_token",
    "mem_s_per_token",
)
PHASE_METRIC = {"prefill": "ttft", "decode": "tpot"}
STATISTICS = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
TOLERANCE = 0.002  # |log typical observed / simulated| at which the iteration stops
MAX_STEP = 4.0  # a scale moves by at most this factor per iteration
METHOD = "calibrated from observed latencies"


def scaled_cost(cost: StepCost, scales: dict[str, float]) -> StepCost:
    """``cost`` with the prefill-side terms times scales['prefill'] and the decode-side
    terms times scales['decode']."""
    values = cost.to_dict()
    for name in PREFILL_SIDE:
        values[name] *= scales["prefill"]
    for name in DECODE_SIDE:
        values[name] *= scales["decode"]
    return StepCost.from_dict(values)


@dataclass
class Latencies:
    """Per replayed request: TTFT and TPOT (NaN where there is none)."""

    ttft_s: F64
    tpot_s: F64

    def of(self, metric: str) -> F64:
        return self.ttft_s if metric == "ttft" else self.tpot_s


@dataclass
class Stage:
    """One replay of the iteration: the scales it ran with and what it gave."""

    scales: dict[str, float]
    simulated: Latencies
    ratio: dict[str, float]  # per phase: typical observed / simulated (_typical_ratio)


@dataclass
class ObservedCalibration:
    run_id: str
    scenario: Scenario
    like_name: str
    output: Path
    observed: Latencies
    num_requests: int  # replayed
    num_observed: dict[str, int]  # per metric: requests with both figures
    stages: list[Stage]
    profile: dict[str, Any]
    table: pa.Table
    converged: bool
    inputs: list[str] = field(default_factory=list)

    @property
    def before(self) -> Stage:
        return self.stages[0]

    @property
    def after(self) -> Stage:
        return self.stages[-1]


def _observed(frame: pl.DataFrame, files: list[Path], ids: pa.Array) -> Latencies:
    """Observed TTFT and TPOT of the replayed requests, in replay order."""
    obs = (
        pl.scan_parquet([str(p) for p in files], hive_partitioning=False)
        .select("request_id", "output_tokens", "observed_ttft_s", "observed_e2e_s")
        .collect()
    )
    order = pl.DataFrame({"request_id": pl.Series(ids.to_pylist(), dtype=pl.String)})
    got = order.join(obs, on="request_id", how="left", maintain_order="left")
    ttft = got["observed_ttft_s"].fill_null(np.nan).to_numpy().astype(np.float64)
    e2e = got["observed_e2e_s"].fill_null(np.nan).to_numpy().astype(np.float64)
    out = got["output_tokens"].fill_null(0).to_numpy().astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    ttft = np.where(ttft >= 0, ttft, np.nan)
    tpot = np.where(tpot >= 0, tpot, np.nan)
    return Latencies(ttft, tpot)


def _check_arrivals(sc: Scenario) -> None:
    a = sc.arrivals
    if a.process != "trace" or a.time_scale != 1.0 or a.rate is not None or a.num_requests:
        raise ScenarioError(
            f"scenario {sc.name!r}: calibrate observed replays each request at its logged "
            "arrival to compare it with what the log observed; use arrivals = 'trace' with "
            "time_scale = 1 and no rate or num_requests"
        )


def _typical_ratio(obs: F64, sim: F64) -> tuple[float, int]:
    """(the typical observed / simulated ratio, requests with both).

    The geometric mean of the per-request ratios with the 10% lowest and highest left
    out: robust to a few odd requests, and smooth in the scales (a median jumps from
    request to request, which stalls the iteration).
    """
    both = np.isfinite(obs) & np.isfinite(sim) & (sim > 0) & (obs > 0)
    if not both.any():
        return math.nan, 0
    logs = np.sort(np.log(obs[both] / sim[both]))
    cut = len(logs) // 10
    kept = logs[cut : len(logs) - cut] if len(logs) > 2 * cut else logs
    return float(np.exp(kept.mean())), int(both.sum())


def _replay(sc: Scenario, prep: Any, scales: dict[str, float], observed: Latencies) -> Stage:
    run_sc = dataclasses.replace(sc, cost=scaled_cost(sc.cost, scales))
    m = request_metrics(simulate(prep.inp, run_sc.engine()))
    sim = Latencies(m["ttft_s"], m["tpot_s"])
    ratio = {p: _typical_ratio(observed.of(k), sim.of(k))[0] for p, k in PHASE_METRIC.items()}
    return Stage(dict(scales), sim, ratio)


def _next_scales(stages: list[Stage]) -> dict[str, float]:
    """A secant step per phase in log space: log ratio falls by `slope` per log scale."""
    now = stages[-1]
    out = {}
    for phase in PHASE_METRIC:
        slope = 1.0
        if len(stages) > 1:
            prev = stages[-2]
            ds = math.log(now.scales[phase]) - math.log(prev.scales[phase])
            dr = math.log(prev.ratio[phase]) - math.log(now.ratio[phase])
            if abs(ds) > 1e-9 and dr / ds > 0:
                slope = min(max(dr / ds, 0.2), 3.0)
        step = math.log(now.ratio[phase]) / slope
        step = min(max(step, -math.log(MAX_STEP)), math.log(MAX_STEP))
        out[phase] = now.scales[phase] * math.exp(step)
    return out


def calibrate_observed(
    warehouse: Path,
    scenario: Scenario,
    profile_ref: str,
    output: Path,
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    max_iterations: int = 12,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
) -> ObservedCalibration:
    """Fit a prefill and a decode scale of ``scenario``'s profile to the observed latencies.

    Args:
        warehouse: the warehouse (requests are read from it unless ``requests_file``).
        scenario: the production scenario (trace arrivals, time_scale 1).
        profile_ref: the scenario's ``profile`` as given (shipped name or JSON path).
        output: where to write the calibrated profile JSON.
        max_iterations: replays after the first (before) one, at most.

    Raises:
        ScenarioError: a scenario that does not replay the logged arrivals, or a [cost]
            table instead of a profile.
        ConfigError: no requests, or none with observed TTFT and TPOT.
    """
    started = datetime.now(UTC)
    if scenario.profile == "custom":
        raise ScenarioError(
            f"scenario {scenario.name!r}: calibrate observed scales a profile; give the "
            "scenario a profile instead of a [cost] table"
        )
    _check_arrivals(scenario)
    like, like_name = read_profile_json(profile_ref)
    wh = Warehouse(warehouse)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    frame = read_requests(files, selection)
    prep = prepare(frame, scenario)
    observed = _observed(frame, files, prep.request_ids)
    have = {k: int(np.isfinite(observed.of(k)).sum()) for k in PHASE_METRIC.values()}
    if min(have.values()) == 0:
        raise ConfigError(
            f"{len(prep.inp):,} requests selected, {have['ttft']:,} with an observed TTFT and "
            f"{have['tpot']:,} with an observed TPOT (E2E and 2+ output tokens); calibrate "
            "observed needs both: ingest gateway or OTel logs that record them"
        )
    stages = [_replay(scenario, prep, {"prefill": 1.0, "decode": 1.0}, observed)]
    converged = False
    for _ in range(max_iterations):
        if all(abs(math.log(r)) < TOLERANCE for r in stages[-1].ratio.values()):
            converged = True
            break
        stages.append(_replay(scenario, prep, _next_scales(stages), observed))
    else:
        converged = all(abs(math.log(r)) < TOLERANCE for r in stages[-1].ratio.values())
    run_id = run_id or new_run_id(started)
    cal = ObservedCalibration(
        run_id=run_id,
        scenario=scenario,
        like_name=like_name,
        output=Path(output),
        observed=observed,
        num_requests=len(prep.inp),
        num_observed={},
        stages=stages,
        profile={},
        table=pa.table({}),
        converged=converged,
        inputs=[str(f) for f in files],
    )
    cal.num_observed = {
        k: _typical_ratio(observed.of(k), cal.after.simulated.of(k))[1]
        for k in PHASE_METRIC.values()
    }
    cal.table = calibration_table(cal)
    cal.profile = _profile(like, cal)
    write_profile(cal.profile, cal.output)
    wh.init()
    wh.write(CALIBRATION, cal.table, {"run_id": run_id}, "calibration")
    write_run_row(
        wh,
        run_id=run_id,
        command="calibrate",
        started=started,
        status="ok",
        inputs=cal.inputs,
        rows_read=frame.height,
        rows_kept=cal.num_requests,
        details={
            "scenario": scenario.to_dict(),
            "profile": like_name,
            "output": str(cal.output),
            "scales": cal.after.scales,
            "iterations": len(stages) - 1,
            "converged": converged,
        },
    )
    return cal


def _pct(x: F64, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def _rel(sim: float | None, obs: float | None) -> float | None:
    return None if sim is None or not obs else sim / obs - 1.0


def statistics(cal: ObservedCalibration) -> list[dict[str, Any]]:
    """Observed and simulated (before, after) p50/p90/p99 of TTFT and TPOT.

    Over the requests that have both the observed and the simulated figure.
    """
    rows = []
    for phase, metric in PHASE_METRIC.items():
        obs = cal.observed.of(metric)
        before, after = cal.before.simulated.of(metric), cal.after.simulated.of(metric)
        both = np.isfinite(obs) & np.isfinite(before) & np.isfinite(after)
        for stat, q in STATISTICS.items():
            o, b, a = (_pct(x[both], q) for x in (obs, before, after))
            rows.append(
                {
                    "scenario": cal.scenario.name,
                    "profile": cal.like_name,
                    "calibrated_profile": str(cal.output),
                    "metric": metric,
                    "statistic": stat,
                    "num_requests": int(both.sum()),
                    "observed_s": o,
                    "before_s": b,
                    "after_s": a,
                    "before_error": _rel(b, o),
                    "after_error": _rel(a, o),
                    "scale": cal.after.scales[phase],
                    "iterations": len(cal.stages) - 1,
                }
            )
    return rows


def calibration_table(cal: ObservedCalibration) -> pa.Table:
    rows = statistics(cal)
    types = dict(CALIBRATION.columns)
    return pa.table(
        {n: pa.array([r[n] for r in rows], type=types[n]) for n in CALIBRATION.file_columns}
    )


def _per_request_error(cal: ObservedCalibration, stage: Stage) -> dict[str, Any]:
    out = {}
    for metric in PHASE_METRIC.values():
        obs, sim = cal.observed.of(metric), stage.simulated.of(metric)
        both = np.isfinite(obs) & np.isfinite(sim) & (obs > 0)
        err = np.abs(sim[both] / obs[both] - 1.0)
        out[metric] = {
            "requests": int(both.sum()),
            "median": float(np.median(err)) if len(err) else None,
            "p90": float(np.percentile(err, 90)) if len(err) else None,
        }
    return out


def _profile(like: dict[str, Any], cal: ObservedCalibration) -> dict[str, Any]:
    provenance = {
        "method": METHOD,
        "source_requests": cal.inputs,
        "scenario": cal.scenario.name,
        "rows_used": cal.num_observed,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "tool_version": __version__,
        "like_profile": cal.like_name,
        "run_id": cal.run_id,
        "scales": cal.after.scales,
        "prefill_side": list(PREFILL_SIDE),
        "decode_side": list(DECODE_SIDE),
        "iterations": len(cal.stages) - 1,
        "converged": cal.converged,
        "fit_error": _per_request_error(cal, cal.after),
        "like_error": _per_request_error(cal, cal.before),
    }
    cost = scaled_cost(cal.scenario.cost, cal.after.scales)
    return derived_profile(like, cal.output.stem, provenance, cost.to_dict())
