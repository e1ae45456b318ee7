"""``tracereplay calibrate observed``: fit a profile's step-cost shape and front end to the
TTFT and TPOT that production logs observed, and say how well it predicts hours it did not
see.

The requests that carry observed latencies (gateway logs, OTel spans: ``observed_ttft_s``,
``observed_e2e_s``) are replayed, at their logged arrival times, through the user's
production scenario, every load level the selection holds (quiet and busy hours, several
days). The fit (``observed_fit``) moves five groups of the profile's cost (compute,
memory, per-step, per-sequence, prefill launch) and its front end (per request, per prompt
token, per streamed token) so that each request's simulated client TTFT and TPOT match the
logged ones: one replay, a fit with the replay's batches held fixed (``teacher``), a
replay with the fit, and so on until the fit stops moving (``CONVERGED``) or
``max_iterations`` replays.

Then it cross-validates by hour: the requests are split by the UTC hour they arrived in
(into up to ``FOLDS`` folds; a log of under two hours into that many stretches of time),
each fold is predicted by a fit on the others, and the held-out error of p50 / p90 / p99
TTFT and TPOT is printed beside the starting profile's on the same requests.

It writes nothing unless the fit is sound: it refuses, with a ``CalibrationRefusedError`` (one
line: the reason and what data would help), a fit that did not converge, one that pushed a
factor to its limit (x1/50 or x50: the latencies do not look like this engine's), and one
whose held-out error is worse than the starting profile's. Otherwise it writes the profile
(provenance: the factors, the front end, the fit and held-out errors, the terms the logs
could not pin), a ``calibration`` table and a ``runs`` row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline import __version__
from pipeline.calibrate.observed_fit import (
    SCALED,
    UNKNOWN_NAMES,
    FitOutcome,
    Params,
    QuantileTargets,
    Targets,
    fit_rows,
    relative_standard_error,
)
from pipeline.calibrate.profile import derived_profile, read_profile_json, write_profile
from pipeline.calibrate.teacher import teacher_rows
from pipeline.contracts import CALIBRATION
from pipeline.errors import ConfigError, PipelineError, ScenarioError
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import prepare, read_requests, select_request_files
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput
from pipeline.sim.summary import request_metrics
from pipeline.warehouse import Warehouse, new_run_id

F64 = npt.NDArray[np.float64]

METHOD = "calibrated from observed latencies"
METRICS = {"ttft": "ttft_s", "tpot": "tpot_s"}
STATISTICS = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
FOLDS = 4  # cross-validation folds (hours grouped into at most this many)
# a replay's fit has stopped moving: every factor within 0.3%, the absolute terms within
CONVERGED = {
    "log": 0.003,
    "prefill_fixed_s": 5e-5,
    "request_s": 1e-4,
    "prompt_token_s": 1e-7,
    "output_token_s": 1e-5,
}
IMPROVES = 0.002  # RMS log error of the quantiles: an improvement below this has settled
EXPLAINS = 0.25  # a fit whose own statistics stay further off than this explains nothing
WORSE = 0.25  # a held-out statistic the fit makes worse than 3x the start and this: refused
PINNED = 0.25  # a relative standard error above this: the logs do not pin the unknown
HINTS = {
    "scale_compute": "prompts of more lengths (the prefill cost per token)",
    "scale_memory": "decodes at more batch sizes and contexts (the decode step's cost)",
    "scale_step": "hours of different load (what a step costs whatever its batch)",
    "scale_sequence": "busy and quiet hours (what each extra running sequence costs)",
    "prefill_fixed_s": "short prompts at low load (what a step that prefills costs extra)",
    "request_s": "quiet hours with short prompts (the front end's fixed time)",
    "prompt_token_s": "short and long prompts at low load (tokenisation per token)",
    "output_token_s": "long outputs at low load (the stream's per-token delay)",
}


class CalibrationRefusedError(PipelineError):
    """The fit is not sound: nothing is written (the message says why and what would help)."""


@dataclass
class Latencies:
    """Per replayed request: client TTFT and TPOT (NaN where there is none)."""

    ttft_s: F64
    tpot_s: F64
    queue_s: F64 | None = None  # simulated only: time before its first step

    def of(self, metric: str) -> F64:
        return self.ttft_s if metric == "ttft" else self.tpot_s


@dataclass
class Stage:
    """One replay of the iteration: the params it ran with and what it gave."""

    params: Params
    simulated: Latencies
    loss: float  # replay_loss against the observed latencies


@dataclass
class HeldOut:
    """Cross-validation: per fold the requests held out and the latencies a fit on the
    other folds gave them."""

    folds: list[npt.NDArray[np.bool_]]
    labels: list[str]
    predicted: list[Latencies]
    basis: str  # "hour" | "time"


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
    fit: FitOutcome | None
    held_out: HeldOut | None
    profile: dict[str, Any]
    table: pa.Table
    converged: bool
    unpinned: list[str] = field(default_factory=list)
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
    ttft = np.where(ttft > 0, ttft, np.nan)
    tpot = np.where(tpot > 0, tpot, np.nan)
    return Latencies(ttft, tpot)


def _check_arrivals(sc: Scenario) -> None:
    a = sc.arrivals
    if a.process != "trace" or a.time_scale != 1.0 or a.rate is not None or a.num_requests:
        raise ScenarioError(
            f"scenario {sc.name!r}: calibrate observed replays each request at its logged "
            "arrival to compare it with what the log observed; use arrivals = 'trace' with "
            "time_scale = 1 and no rate or num_requests"
        )


WINDOWS = 8  # stretches of the log whose latency distributions a replay must match
QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.99)


def replay_loss(observed: Latencies, simulated: Latencies) -> float:
    """How far a replay's latency distributions are from the log's: the mean squared log
    error of the quantiles of TTFT and TPOT in each of ``WINDOWS`` stretches of the log
    (in arrival order, so every load level counts). Per request a small change of the
    profile reorders batches; distributions do not move that way."""
    n = len(observed.ttft_s)
    errs: list[float] = []
    for part in np.array_split(np.arange(n), min(WINDOWS, max(n // 50, 1))):
        for metric in METRICS:
            o, s = observed.of(metric)[part], simulated.of(metric)[part]
            ok = np.isfinite(o) & np.isfinite(s) & (s > 0)
            if ok.sum() < 10:
                continue
            qo = np.quantile(o[ok], QUANTILES)
            qs = np.quantile(s[ok], QUANTILES)
            errs.extend(np.log(qs / qo) ** 2)
    return float(np.mean(errs)) if errs else math.inf


def _replay(sc: Scenario, inp: SimInput, p: Params) -> tuple[Any, Scenario, Latencies]:
    run_sc = dataclasses.replace(sc, cost=p.apply(sc.cost), frontend=p.frontend)
    res = simulate(inp, run_sc.engine())
    m = request_metrics(res)
    return res, run_sc, Latencies(m["ttft_s"], m["tpot_s"], m["queue_s"])


def _targets(observed: Latencies, replayed: Latencies) -> Targets:
    """The fit's targets, a request's TTFT counting as much as the replay did not queue it."""
    weight = None
    if replayed.queue_s is not None:
        served = np.maximum(replayed.ttft_s - replayed.queue_s, 1e-6)
        weight = served / np.maximum(replayed.ttft_s, 1e-6)
        weight = np.clip(np.nan_to_num(weight, nan=1.0), 0.05, 1.0)
    return Targets(observed.ttft_s, observed.tpot_s, weight)


def _moved(a: Params, b: Params) -> bool:
    if any(abs(math.log(b.scales[g] / a.scales[g])) > CONVERGED["log"] for g in SCALED):
        return True
    if abs(b.prefill_fixed_s - a.prefill_fixed_s) > CONVERGED["prefill_fixed_s"]:
        return True
    fa, fb = a.frontend.to_dict(), b.frontend.to_dict()
    return any(abs(fb[k] - fa[k]) > CONVERGED[k] for k in fa)


def _between(a: Params, b: Params, t: float) -> Params:
    """The params a fraction t of the way from a to b (factors in log space)."""
    return Params.of(a.vector() + t * (b.vector() - a.vector()))


def fit_observed(
    inp: SimInput,
    scenario: Scenario,
    observed: Latencies,
    *,
    max_iterations: int = 8,
) -> tuple[list[Stage], FitOutcome | None, Any, bool]:
    """Alternate replays and fits to per-request observed latencies (module docstring).
    Returns the replays, the last fit, the teacher rows of the accepted replay, and
    whether it converged."""
    return fit_loop(
        inp,
        scenario,
        lambda replayed: _targets(observed, replayed),
        lambda replayed: replay_loss(observed, replayed),
        max_iterations=max_iterations,
    )


def fit_loop(
    inp: SimInput,
    scenario: Scenario,
    make_targets: Callable[[Latencies], Targets | QuantileTargets],
    loss: Callable[[Latencies], float],
    *,
    max_iterations: int = 8,
) -> tuple[list[Stage], FitOutcome | None, Any, bool]:
    """Replay, fit on the replay's batches to ``make_targets(replayed)``, replay the fit
    (a shorter step when it is worse by ``loss``), until the fit stops moving or the
    replays stop improving (``IMPROVES``)."""
    start = Params.start(scenario.cost, scenario.frontend)
    res, run_sc, lat = _replay(scenario, inp, start)
    stages = [Stage(start, lat, loss(lat))]
    best = stages[0]
    rows = teacher_rows(res, run_sc.cost.as_array())
    best_rows = rows
    outcome: FitOutcome | None = None
    converged = False
    last_step = 1.0  # the step that last helped: after a halved one, start halved
    for _ in range(max_iterations):
        outcome = fit_rows(rows, make_targets(best.simulated), best.params, prior=start)
        proposal = outcome.params
        if not _moved(best.params, proposal):
            converged = True
            break
        before = best.loss
        steps = (1.0, 0.5, 0.25) if last_step == 1.0 else (0.5, 0.25)
        for t in steps:  # a replay that is worse: a shorter step from the best
            cand = proposal if t == 1.0 else _between(best.params, proposal, t)
            res, run_sc, lat = _replay(scenario, inp, cand)
            stage = Stage(cand, lat, loss(lat))
            stages.append(stage)
            if stage.loss <= best.loss * (1 + 1e-6):
                last_step = t
                break
        if stage.loss <= best.loss * (1 + 1e-6):
            best = stage
            rows = teacher_rows(res, run_sc.cost.as_array())
            best_rows = rows
            # the replays have stopped improving: the RMS log error of the quantiles moved by
            # under IMPROVES (absolute)
            if math.sqrt(before) - math.sqrt(best.loss) < IMPROVES:
                converged = True
                break
        else:  # no step along the fit helps: the best replay is where the fit stops
            converged = True
            break
    if stages[-1] is not best:
        stages.append(best)  # the accepted replay is the last one (``after``)
    return stages, outcome, best_rows, converged


def folds_by_hour(
    arrival_time_us: npt.NDArray[np.int64], k: int = FOLDS
) -> tuple[list[Any], list[str], str]:
    """Up to k folds of whole UTC hours (hours dealt round-robin in time order), or of k
    stretches of time when the log spans under two hours."""
    hours = arrival_time_us // 3_600_000_000
    uniq = np.unique(hours)
    if len(uniq) >= 2:
        n = min(k, len(uniq))
        which = {h: i % n for i, h in enumerate(uniq)}
        fold = np.array([which[h] for h in hours])
        labels = []
        for f in range(n):
            hs = [
                datetime.fromtimestamp(int(h) * 3600, UTC).strftime("%m-%d %H:00")
                for h in uniq
                if which[h] == f
            ]
            labels.append(", ".join(hs[:3]) + (f" +{len(hs) - 3}" if len(hs) > 3 else ""))
        return [fold == f for f in range(n)], labels, "hour"
    order = np.argsort(arrival_time_us, kind="stable")
    fold = np.empty(len(hours), dtype=np.int64)
    for f, part in enumerate(np.array_split(order, k)):
        fold[part] = f
    return [fold == f for f in range(k)], [f"part {f + 1} of {k}" for f in range(k)], "time"


def cross_validate(
    inp: SimInput,
    scenario: Scenario,
    observed: Latencies,
    rows: Any,
    final: Params,
    final_replay: Latencies,
    arrival_time_us: npt.NDArray[np.int64],
) -> HeldOut:
    """Each fold predicted by a fit on the others (on the final replay's batches), replayed."""
    start = Params.start(scenario.cost, scenario.frontend)
    targets = _targets(observed, final_replay)
    folds, labels, basis = folds_by_hour(arrival_time_us)
    predicted = []
    for held in folds:
        train = ~held
        if not (
            np.isfinite(observed.ttft_s[train]).any() and np.isfinite(observed.tpot_s[train]).any()
        ):
            predicted.append(Latencies(np.full(len(held), np.nan), np.full(len(held), np.nan)))
            continue
        out = fit_rows(rows, targets, final, start=final, prior=start, use=train)
        _, _, lat = _replay(scenario, inp, out.params)
        predicted.append(lat)
    return HeldOut(folds, labels, predicted, basis)


def _pct(x: F64, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def _rel(sim: float | None, obs: float | None) -> float | None:
    return None if sim is None or not obs else sim / obs - 1.0


def held_out_errors(cal: ObservedCalibration) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per (metric, statistic): the starting profile's and the fold fits' error on the
    held-out requests, each the median over folds."""
    out: dict[tuple[str, str], dict[str, float | None]] = {}
    ho = cal.held_out
    if ho is None:
        return out
    for metric in METRICS:
        obs = cal.observed.of(metric)
        for stat, q in STATISTICS.items():
            before, after = [], []
            for mask, pred in zip(ho.folds, ho.predicted, strict=True):
                o = _pct(obs[mask], q)
                b = _rel(_pct(cal.before.simulated.of(metric)[mask & np.isfinite(obs)], q), o)
                a = _rel(_pct(pred.of(metric)[mask & np.isfinite(obs)], q), o)
                if b is not None and a is not None:
                    before.append(b)
                    after.append(a)
            out[(metric, stat)] = {
                "before": float(np.median(before)) if before else None,
                "after": float(np.median(after)) if after else None,
            }
    return out


def _score(errors: dict[tuple[str, str], dict[str, float | None]], side: str) -> float:
    v = [abs(x) for e in errors.values() if (x := e[side]) is not None]
    return float(np.median(v)) if v else math.nan


def _refuse_unless_sound(cal: ObservedCalibration) -> None:
    fit = cal.fit
    if fit is not None and fit.at_bound:
        name = fit.at_bound[0]
        factor = cal.after.params.scales.get(name.removeprefix("scale_"), math.nan)
        raise CalibrationRefusedError(
            f"calibrate observed: the fit pushed the {name.removeprefix('scale_')} cost to "
            f"its limit (x{factor:.3g}): the logged latencies do not look like this engine's; "
            "check that the log's TTFT and E2E are the server's and the scenario (policy, caps, "
            "replicas, profile) is what served them; nothing written"
        )
    if not cal.converged:
        raise CalibrationRefusedError(
            f"calibrate observed: the fit did not converge in {len(cal.stages) - 1} replays "
            f"(it still moves: {_movement(cal)}); more hours of logs, or --iterations higher, "
            f"would help ({_hint(cal)}); nothing written"
        )
    fitted = _in_sample_error(cal)
    if math.isfinite(fitted) and fitted > EXPLAINS:
        raise CalibrationRefusedError(
            f"calibrate observed: the best profile the fit finds still misses the logged "
            f"latencies by {fitted:.0%} (median over p50/p90/p99 TTFT and TPOT): they do not "
            "look like this scenario's engine; check that the log's TTFT and E2E are the "
            "server's and the scenario (policy, caps, replicas, profile) is what served them; "
            "nothing written"
        )
    errors = held_out_errors(cal)
    before, after = _score(errors, "before"), _score(errors, "after")
    if math.isfinite(before) and math.isfinite(after) and after > before:
        raise CalibrationRefusedError(
            f"calibrate observed: the calibrated profile predicts held-out hours worse than "
            f"the one it started from (median |error| {after:.1%} against {before:.1%}); "
            f"{_hint(cal)}; nothing written"
        )
    for (metric, stat), e in errors.items():
        b, a = e["before"], e["after"]
        if a is not None and b is not None and abs(a) > max(3 * abs(b), WORSE):
            raise CalibrationRefusedError(
                f"calibrate observed: the calibrated profile predicts held-out hours' {metric} "
                f"{stat} worse than the one it started from ({a:+.1%} against {b:+.1%}); "
                f"{_hint(cal)}; nothing written"
            )


def _in_sample_error(cal: ObservedCalibration) -> float:
    """Median |error| of the accepted replay's p50/p90/p99 TTFT and TPOT."""
    errs = []
    for metric in METRICS:
        obs, sim = cal.observed.of(metric), cal.after.simulated.of(metric)
        both = np.isfinite(obs) & np.isfinite(sim)
        for q in STATISTICS.values():
            e = _rel(_pct(sim[both], q), _pct(obs[both], q))
            if e is not None:
                errs.append(abs(e))
    return float(np.median(errs)) if errs else math.nan


def _movement(cal: ObservedCalibration) -> str:
    a, b = cal.stages[-2].params if len(cal.stages) > 1 else cal.before.params, cal.after.params
    parts = [f"{g} x{b.scales[g] / a.scales[g]:.3f}" for g in SCALED]
    return ", ".join(parts)


def _hint(cal: ObservedCalibration) -> str:
    if cal.unpinned:
        wants = "; ".join(HINTS[n] for n in cal.unpinned[:3])
        return f"the logs do not pin {', '.join(cal.unpinned)}: logs with {wants} would"
    return "logs of more load levels would pin the shape"


def _unpinned(fit: FitOutcome | None) -> list[str]:
    if fit is None:
        return []
    return [n for n in UNKNOWN_NAMES if relative_standard_error(fit, n) > PINNED]


def calibrate_observed(
    warehouse: Path,
    scenario: Scenario,
    profile_ref: str,
    output: Path,
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    max_iterations: int = 8,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
) -> ObservedCalibration:
    """Fit ``scenario``'s profile to the observed latencies and cross-validate it by hour.

    Args:
        warehouse: the warehouse (requests are read from it unless ``requests_file``).
        scenario: the production scenario (trace arrivals, time_scale 1).
        profile_ref: the scenario's ``profile`` as given (shipped name or JSON path).
        output: where to write the calibrated profile JSON.
        max_iterations: replays after the first, at most.

    Raises:
        ScenarioError: a scenario that does not replay the logged arrivals, or a [cost]
            table instead of a profile.
        ConfigError: no requests, or none with observed TTFT and TPOT.
        CalibrationRefusedError: the fit is not sound (see the module docstring).
    """
    started = datetime.now(UTC)
    if scenario.profile == "custom":
        raise ScenarioError(
            f"scenario {scenario.name!r}: calibrate observed fits a profile; give the "
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
    have = {k: int(np.isfinite(observed.of(k)).sum()) for k in METRICS}
    if min(have.values()) == 0:
        raise ConfigError(
            f"{len(prep.inp):,} requests selected, {have['ttft']:,} with an observed TTFT and "
            f"{have['tpot']:,} with an observed TPOT (E2E and 2+ output tokens); calibrate "
            "observed needs both: ingest gateway or OTel logs that record them"
        )
    stages, fit, rows, converged = fit_observed(
        prep.inp, scenario, observed, max_iterations=max_iterations
    )
    arrival_us = frame["arrival_time"].dt.epoch("us").to_numpy()
    if len(arrival_us) != len(prep.inp):  # the replay reordered or dropped rows
        arrival_us = (prep.inp.arrival_s * 1e6).astype(np.int64) + int(arrival_us.min())
    held = None
    if converged and not (fit is not None and fit.at_bound):
        held = cross_validate(
            prep.inp, scenario, observed, rows, stages[-1].params, stages[-1].simulated, arrival_us
        )
    run_id = run_id or new_run_id(started)
    cal = ObservedCalibration(
        run_id=run_id,
        scenario=scenario,
        like_name=like_name,
        output=Path(output),
        observed=observed,
        num_requests=len(prep.inp),
        num_observed={
            k: int((np.isfinite(observed.of(k)) & np.isfinite(stages[-1].simulated.of(k))).sum())
            for k in METRICS
        },
        stages=stages,
        fit=fit,
        held_out=held,
        profile={},
        table=pa.table({}),
        converged=converged,
        unpinned=_unpinned(fit),
        inputs=[str(f) for f in files],
    )
    _refuse_unless_sound(cal)
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
            "params": cal.after.params.to_dict(),
            "iterations": len(stages) - 1,
            "converged": converged,
        },
    )
    return cal


def statistics(cal: ObservedCalibration) -> list[dict[str, Any]]:
    """Observed and simulated (before, after) p50/p90/p99 of TTFT and TPOT, with the
    held-out errors of cross-validation, over the requests that have both figures."""
    rows = []
    held = held_out_errors(cal)
    for metric in METRICS:
        obs = cal.observed.of(metric)
        before, after = cal.before.simulated.of(metric), cal.after.simulated.of(metric)
        both = np.isfinite(obs) & np.isfinite(before) & np.isfinite(after)
        group = "compute" if metric == "ttft" else "memory"
        for stat, q in STATISTICS.items():
            o, b, a = (_pct(x[both], q) for x in (obs, before, after))
            h = held.get((metric, stat), {})
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
                    "held_out_before_error": h.get("before"),
                    "held_out_error": h.get("after"),
                    "scale": cal.after.params.scales[group],
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
    for metric in METRICS:
        obs, sim = cal.observed.of(metric), stage.simulated.of(metric)
        both = np.isfinite(obs) & np.isfinite(sim) & (obs > 0)
        err = np.abs(sim[both] / obs[both] - 1.0)
        out[metric] = {
            "requests": int(both.sum()),
            "median": float(np.median(err)) if len(err) else None,
            "p90": float(np.percentile(err, 90)) if len(err) else None,
        }
    return out


def step_time_log_sd(cal: ObservedCalibration) -> float:
    """The spread the calibrated profile leaves on held-out hours: the root mean square of
    log(simulated / observed) of their p50 / p90 / p99 TTFT and TPOT (capacity answers'
    intervals take it as the profile's uncertainty)."""
    errs = [e["after"] for e in held_out_errors(cal).values() if e["after"] is not None]
    if not errs:
        return math.nan
    return float(math.sqrt(np.mean([math.log1p(e) ** 2 for e in errs])))


def _profile(like: dict[str, Any], cal: ObservedCalibration) -> dict[str, Any]:
    p = cal.after.params
    held = {f"{m} {s}": v for (m, s), v in held_out_errors(cal).items()}
    provenance = {
        "method": METHOD,
        "source_requests": cal.inputs,
        "scenario": cal.scenario.name,
        "rows_used": cal.num_observed,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "tool_version": __version__,
        "like_profile": cal.like_name,
        "run_id": cal.run_id,
        "scales": dict(p.scales),
        "prefill_fixed_s": p.prefill_fixed_s,
        "frontend": p.frontend.to_dict(),
        "iterations": len(cal.stages) - 1,
        "converged": cal.converged,
        "fit_error": _per_request_error(cal, cal.after),
        "like_error": _per_request_error(cal, cal.before),
        "held_out": {
            "basis": cal.held_out.basis if cal.held_out else None,
            "folds": cal.held_out.labels if cal.held_out else [],
            "error": held,
        },
        "not_pinned": cal.unpinned,
    }
    cost = p.apply(cal.scenario.cost)
    out = derived_profile(like, cal.output.stem, provenance, cost.to_dict())
    out["frontend"] = {**p.frontend.to_dict(), "source": f"{METHOD} ({cal.run_id})"}
    sd = step_time_log_sd(cal)
    if math.isfinite(sd):
        out["uncertainty"] = {
            "step_time_log_sd": sd,
            "source": "root mean square log error of the held-out hours' p50/p90/p99 TTFT "
            "and TPOT (calibrate observed)",
        }
    return out
