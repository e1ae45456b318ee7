"""The 90% interval of each change ``compare`` reports, and whether it holds zero.

For the latency percentiles of a pair of scenarios (``sql/compare_runs.sql`` pairs
them), two sources, added side by side in quadrature:

- **arrivals**: the block bootstrap of the replayed requests
  (``pipeline.sim.intervals``). *Paired* where both runs replayed the same
  requests (the same ids: one trace under two settings, or the same day twice):
  each resample draws the same windows of arrivals from both runs, in run A's
  arrival order, and the interval is that of B's statistic minus A's over the
  resamples, so the traffic they share cancels and what the change did to it
  remains. *Unpaired* otherwise (other days, other selections): independent
  resamples of each run.
- **profile**: from each scenario's summary (``intervals.stats.*.at_cost``, the
  statistic replayed at the low and the high step cost). With the same profile
  and sd in both runs one error moves both, so the term is the change replayed
  at the low and at the high cost; otherwise the two runs' terms are
  independent. A run replayed without intervals has no profile term (the
  interval is then the arrivals' alone).

Capacity answers: the two answers' intervals (``capacity_search``), independent.
Throughput, preemptions, hit rates and costs carry no interval. A change whose
interval holds 0 is *within noise*.
"""

from __future__ import annotations

import json
import math
from typing import Any

import duckdb
import numpy as np
import polars as pl

from pipeline.report.sql import query
from pipeline.sim import intervals as iv
from pipeline.sim.uncertainty import windows_for

# compare_runs.sql metric -> (sim_requests column, percentile)
PERCENTILES = {
    "p50_ttft_s": ("ttft_s", 50),
    "p90_ttft_s": ("ttft_s", 90),
    "p99_ttft_s": ("ttft_s", 99),
    "p50_tpot_s": ("tpot_s", 50),
    "p99_tpot_s": ("tpot_s", 99),
}
COLUMNS = ("change_lo", "change_hi", "interval", "within_noise")
SEED_SALT = 0xC0DE_0A1B  # the bootstrap of a comparison: (run A's scenario seed, this, side)


def _summaries(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    """Per scenario of a run: its configuration and summary (parsed)."""
    out = {}
    for r in query(con, "run_scenarios", run_id=run_id).to_dicts():
        try:
            out[r["scenario"]] = {
                "config": json.loads(r["config_json"] or "{}"),
                "summary": json.loads(r["summary_json"] or "{}"),
            }
        except json.JSONDecodeError:
            out[r["scenario"]] = {"config": {}, "summary": {}}
    return out


def _at_cost(meta: dict[str, Any], metric: str, q: int) -> list[float]:
    """A scenario's statistic at the low and high step cost (empty: none stored)."""
    stats = (meta.get("summary", {}).get("intervals") or {}).get("stats") or {}
    values = (stats.get(f"{metric.removesuffix('_s')}_p{q}_s") or {}).get("at_cost")
    return [float(v) for v in values or () if v is not None]


def _halfwidths(value: float, around: list[float]) -> tuple[float, float]:
    """How far below and above ``value`` the values ``around`` reach (each >= 0)."""
    return max([0.0, *(value - v for v in around)]), max([0.0, *(v - value for v in around)])


def _profile_term(
    a: dict[str, Any], b: dict[str, Any], metric: str, q: int, va: float, vb: float
) -> tuple[float, float]:
    """Half-widths (below, above) of the change B - A from the profile term."""
    low_a, low_b = _at_cost(a, metric, q), _at_cost(b, metric, q)
    if not low_a or not low_b:
        return 0.0, 0.0
    keys = ("profile", "cost_uncertainty")
    if all(a["config"].get(k) == b["config"].get(k) for k in keys) and len(low_a) == len(low_b):
        # one profile error moves both runs: the change at the low and at the high cost
        return _halfwidths(vb - va, [y - x for x, y in zip(low_a, low_b, strict=True)])
    a_lo, a_hi = _halfwidths(va, low_a)
    b_lo, b_hi = _halfwidths(vb, low_b)
    return math.hypot(a_hi, b_lo), math.hypot(a_lo, b_hi)


def _paired(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame | None:
    """B's rows in A's order when both hold the same requests, else None."""
    if a.height != b.height or a.height == 0:
        return None
    joined = a.select("request_id").join(b, on="request_id", how="left", maintain_order="left")
    if joined["arrival_s"].null_count() or b["request_id"].n_unique() != b.height:
        return None
    return joined


def _series(df: pl.DataFrame) -> list[np.ndarray]:
    return [
        df["ttft_s"].to_numpy().astype(np.float64),
        np.nan_to_num(df["tpot_s"].fill_null(np.nan).to_numpy().astype(np.float64)),
        df["e2e_s"].to_numpy().astype(np.float64),
    ]


def _resampled(df: pl.DataFrame, metric: str, q: int, windows: iv.Windows) -> np.ndarray | None:
    values = df[metric].fill_null(np.nan).to_numpy().astype(np.float64)
    keep = ~np.isnan(values)
    return iv.resampled_quantile(values[keep], windows.index[keep], windows, q / 100)


def pair_intervals(
    a: pl.DataFrame, b: pl.DataFrame, meta_a: dict[str, Any], meta_b: dict[str, Any]
) -> dict[str, tuple[float, float, str]]:
    """Per ``PERCENTILES`` metric: (low, high, paired | unpaired) of the change from the
    requests ``a`` to ``b`` (``compare_requests.sql`` rows of one scenario each)."""
    if a.height < iv.MIN_REQUESTS or b.height < iv.MIN_REQUESTS:
        return {}
    seed = int(meta_a.get("config", {}).get("seed") or 0)
    matched = _paired(a, b)
    if matched is not None:
        num = min(windows_for(_series(d), d.height, seed).num for d in (a, matched))
        shared = iv.make_windows(a.height, [], np.random.default_rng([seed, SEED_SALT]), num=num)
        windows, b_rows, how = (shared, shared), matched, "paired"
    else:
        windows = tuple(
            iv.make_windows(d.height, _series(d), np.random.default_rng([seed, SEED_SALT, side]))
            for side, d in enumerate((a, b))
        )  # type: ignore[assignment]
        b_rows, how = b, "unpaired"
    out = {}
    for name, (metric, q) in PERCENTILES.items():
        ra, rb = _resampled(a, metric, q, windows[0]), _resampled(b_rows, metric, q, windows[1])
        if ra is None or rb is None:
            continue
        va = float(np.nanpercentile(a[metric].fill_null(np.nan).to_numpy(), q))
        vb = float(np.nanpercentile(b_rows[metric].fill_null(np.nan).to_numpy(), q))
        arrivals = iv.percentile_interval(rb - ra)
        assert arrivals is not None
        change = vb - va
        p_lo, p_hi = _profile_term(meta_a, meta_b, metric, q, va, vb)
        lo = change - math.hypot(max(0.0, change - arrivals[0]), p_lo)
        hi = change + math.hypot(max(0.0, arrivals[1] - change), p_hi)
        out[name] = (lo, hi, how)
    return out


def _capacity(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    has = con.execute("SELECT count(*) FROM capacity_search WHERE run_id = ?", [run_id]).fetchone()
    if not has or not has[0]:
        return {}
    return {r["search"]: r for r in query(con, "capacity_answers", run_id=run_id).to_dicts()}


def _capacity_interval(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float] | None:
    """The change of a capacity answer from the two answers' intervals (independent)."""
    values = [
        a.get("answer"),
        a.get("answer_lo"),
        a.get("answer_hi"),
        b.get("answer"),
        b.get("answer_lo"),
        b.get("answer_hi"),
    ]
    nums = [float(v) for v in values if v is not None]
    if len(nums) < len(values):
        return None
    va, a_lo, a_hi, vb, b_lo, b_hi = nums
    change = vb - va
    return change - math.hypot(a_hi - va, vb - b_lo), change + math.hypot(va - a_lo, b_hi - vb)


def with_intervals(con: duckdb.DuckDBPyConnection, df: pl.DataFrame) -> pl.DataFrame:
    """``compare_runs.sql`` rows with each change's interval (``change_lo``, ``change_hi``),
    how it was made (``interval``: paired, unpaired; null: none) and ``within_noise``."""
    n = df.height
    lo: list[float | None] = [None] * n
    hi: list[float | None] = [None] * n
    how: list[str | None] = [None] * n
    if n:
        run_a, run_b = df["run_a"][0], df["run_b"][0]
        rows = query(con, "compare_requests", run_id=run_a, compare_run_id=run_b)
        by = rows.partition_by("run_id", "scenario", as_dict=True)
        meta = {run_a: _summaries(con, run_a), run_b: _summaries(con, run_b)}
        caps = {run_a: _capacity(con, run_a), run_b: _capacity(con, run_b)}
        found: dict[tuple[str, str], dict[str, tuple[float, float, str]]] = {}
        for i, r in enumerate(df.to_dicts()):
            if r["value_a"] is None or r["value_b"] is None:
                continue
            if r["scenario"] == "(capacity)":
                search = r["metric"].removeprefix("capacity_")
                got = _capacity_interval(caps[run_a].get(search, {}), caps[run_b].get(search, {}))
                if got is not None:
                    lo[i], hi[i], how[i] = got[0], got[1], "unpaired"
                continue
            if r["metric"] not in PERCENTILES:
                continue
            key = (r["scenario"], r["scenario_b"])
            if key not in found:
                a = by.get((run_a, r["scenario"]))
                b = by.get((run_b, r["scenario_b"]))
                found[key] = (
                    pair_intervals(
                        a,
                        b,
                        meta[run_a].get(r["scenario"], {}),
                        meta[run_b].get(r["scenario_b"], {}),
                    )
                    if a is not None and b is not None
                    else {}
                )
            if r["metric"] in found[key]:
                lo[i], hi[i], how[i] = found[key][r["metric"]]
    noise = [None if a is None or b is None else a <= 0.0 <= b for a, b in zip(lo, hi, strict=True)]
    return df.with_columns(
        pl.Series("change_lo", lo, dtype=pl.Float64),
        pl.Series("change_hi", hi, dtype=pl.Float64),
        pl.Series("interval", how, dtype=pl.String),
        pl.Series("within_noise", noise, dtype=pl.Boolean),
    )


__all__ = ["COLUMNS", "PERCENTILES", "pair_intervals", "with_intervals"]
