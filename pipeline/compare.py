"""Compare replay or capacity runs: the summary of run B against run A, with signed changes.

The figures come from ``sql/compare_runs.sql`` (the same query the report's
comparison section draws): per scenario, throughput, TTFT and TPOT percentiles,
preemptions and the prefix-cache hit rate, and each capacity search's answer.
Scenarios pair by name; two runs of one scenario each pair whatever their names.
Each latency percentile's and capacity answer's change comes with its 90%
interval (``pipeline.report.changes``: paired where both runs replayed the same
requests) and is marked *within noise* when that interval holds zero.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.errors import PipelineError
from pipeline.pricing import prices_json
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse

# how each metric reads: (label, unit scale, unit, higher is better)
METRICS: dict[str, tuple[str, float, str, bool]] = {
    "num_requests": ("requests", 1.0, "", True),
    "requests_per_s": ("throughput", 1.0, " req/s", True),
    "output_tokens_per_s": ("output tokens/s", 1.0, "", True),
    "p50_ttft_s": ("p50 TTFT", 1000.0, " ms", False),
    "p90_ttft_s": ("p90 TTFT", 1000.0, " ms", False),
    "p99_ttft_s": ("p99 TTFT", 1000.0, " ms", False),
    "p50_tpot_s": ("p50 TPOT", 1000.0, " ms", False),
    "p99_tpot_s": ("p99 TPOT", 1000.0, " ms", False),
    "num_preemptions": ("preemptions", 1.0, "", False),
    "prefix_hit_rate": ("prefix-cache hit rate", 100.0, "%", True),
    "usd_per_hour": ("$/hour", 1.0, "", False),
    "usd_per_1m_output_tokens": ("$ per 1M output tokens", 1.0, "", False),
    "usd_per_1m_total_tokens": ("$ per 1M total tokens", 1.0, "", False),
    "capacity_concurrency": ("capacity: highest cap", 1.0, "", True),
    "capacity_rate": ("capacity: highest rate", 1.0, " req/s", True),
    "capacity_replicas": ("capacity: fewest replicas", 1.0, "", False),
}


def known_runs(wh: Warehouse) -> list[str]:
    """Every run with simulated requests or a capacity search, newest first."""
    con = wh.connect()
    try:
        rows = con.execute(
            "SELECT DISTINCT run_id FROM sim_requests UNION "
            "SELECT DISTINCT run_id FROM capacity_search ORDER BY run_id DESC"
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def compare_runs(
    wh: Warehouse, run_a: str, run_b: str, prices: dict[str, float] | None = None
) -> pl.DataFrame:
    """The rows of ``sql/compare_runs.sql`` for run A (baseline) against run B.

    Raises:
        PipelineError: no warehouse, or a run id it does not hold (the latest are named).
    """
    if not wh.root.is_dir():
        raise PipelineError(f"no warehouse at {wh.root}: run `tracereplay ingest` first")
    runs = known_runs(wh)
    for rid in (run_a, run_b):
        if rid not in runs:
            latest = ", ".join(runs[:5]) or "none"
            raise PipelineError(f"no run {rid!r} in {wh.root}; latest runs: {latest}")
    from pipeline.report.changes import with_intervals

    con = wh.connect()
    try:
        df = query(
            con,
            "compare_runs",
            run_id=run_a,
            compare_run_id=run_b,
            prices_json=prices_json(prices or {}),
        )
        return with_intervals(con, df)
    finally:
        con.close()


# the per-class rows (view class_latency): its column -> the compare_runs metric it reads as
CLASS_METRICS = {
    "requests": "num_requests",
    "ttft_p50_s": "p50_ttft_s",
    "ttft_p90_s": "p90_ttft_s",
    "ttft_p99_s": "p99_ttft_s",
    "tpot_p50_s": "p50_tpot_s",
    "tpot_p99_s": "p99_tpot_s",
}
CLASS_COLUMNS = ("scenario", "scenario_b", "class_kind", "class_name", "metric", "value_a",
                 "value_b", "change", "relative_change")  # fmt: skip


def class_changes(wh: Warehouse, df: pl.DataFrame) -> pl.DataFrame:
    """Per tenant and per model of each scenario pair of ``df`` (``compare_runs``' rows, so
    paired as they pair): requests and TTFT/TPOT percentiles in A and B, with the change
    B - A and the relative change. Only kinds with more than one class in A or B; a class
    found in one run only has the other's values null."""
    empty = pl.DataFrame(schema={c: pl.Float64 if c.startswith(("value", "change", "relative"))
                                 else pl.String for c in CLASS_COLUMNS})  # fmt: skip
    if df.is_empty():
        return empty
    run_a, run_b = df["run_a"][0], df["run_b"][0]
    pairs = []
    sims = df.filter(pl.col("scenario") != "(capacity)")
    for (scenario, scenario_b), part in sims.group_by(
        ["scenario", "scenario_b"], maintain_order=True
    ):
        in_a = part["value_a"].is_not_null().any()
        pairs.append((scenario, scenario if in_a else None, scenario_b))
    con = wh.connect()
    try:
        cols = ", ".join(CLASS_METRICS)
        found = con.execute(
            f"SELECT run_id, scenario, class_kind, class_name, {cols} FROM class_latency "
            "WHERE run_id IN (?, ?)",
            [run_a, run_b],
        ).fetchall()
    finally:
        con.close()
    names = ["run_id", "scenario", "class_kind", "class_name", *CLASS_METRICS]
    by_key = {(r[0], r[1], r[2], r[3]): dict(zip(names, r, strict=True)) for r in found}
    rows = []
    for shown, a_name, b_name in pairs:
        for kind in ("tenant", "model"):
            a = {k[3]: v for k, v in by_key.items() if k[:3] == (run_a, a_name, kind)}
            b = {k[3]: v for k, v in by_key.items() if k[:3] == (run_b, b_name, kind)}
            if max(len(a), len(b)) < 2:  # one class is the whole traffic again
                continue
            order = sorted(
                set(a) | set(b),
                key=lambda n: (
                    -max(
                        (a.get(n) or {}).get("requests") or 0, (b.get(n) or {}).get("requests") or 0
                    ),
                    n,
                ),
            )
            for name in order:
                for column, metric in CLASS_METRICS.items():
                    va = (a.get(name) or {}).get(column)
                    vb = (b.get(name) or {}).get(column)
                    va = None if va is None else float(va)
                    vb = None if vb is None else float(vb)
                    change = None if va is None or vb is None else vb - va
                    rel = None if change is None or not va else change / abs(va)
                    rows.append((shown, b_name, kind, name, metric, va, vb, change, rel))
    if not rows:
        return empty
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


def signed(x: float | None, scale: float = 1.0, unit: str = "") -> str:
    """+12.5 ms, -3, 0: a change with its sign."""
    if x is None:
        return "\u2014"
    v = x * scale
    text = f"{v:+,.4g}" if abs(v) < 1e4 else f"{v:+,.0f}"
    return text + unit


def _plain(x: float | None, scale: float, unit: str) -> str:
    if x is None:
        return "\u2014"
    v = x * scale
    return (f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}") + unit


def comparison_dict(df: pl.DataFrame, classes: pl.DataFrame | None = None) -> dict[str, Any]:
    """The diff as JSON-able data: per scenario, per metric, a, b, change, relative change;
    and per class (``class_changes``) under ``classes``: ``{kind: {name: {metric: ...}}}``."""
    out: dict[str, Any] = {
        "run_a": df["run_a"][0] if df.height else None,
        "run_b": df["run_b"][0] if df.height else None,
        "scenarios": {},
    }
    for row in df.to_dicts():
        entry = out["scenarios"].setdefault(
            row["scenario"], {"scenario_b": row["scenario_b"], "metrics": {}, "classes": {}}
        )
        entry["metrics"][row["metric"]] = {
            "a": row["value_a"],
            "b": row["value_b"],
            "change": row["change"],
            "relative_change": row["relative_change"],
            "change_lo": row.get("change_lo"),  # the change's 90% interval (null: none)
            "change_hi": row.get("change_hi"),
            "interval": row.get("interval"),  # paired | unpaired
            "within_noise": row.get("within_noise"),  # the interval holds 0
        }
    for row in (classes if classes is not None else pl.DataFrame()).to_dicts():
        entry = out["scenarios"].get(row["scenario"])
        if entry is None:
            continue
        per_class = entry["classes"].setdefault(row["class_kind"], {})
        per_class.setdefault(row["class_name"], {})[row["metric"]] = {
            "a": row["value_a"],
            "b": row["value_b"],
            "change": row["change"],
            "relative_change": row["relative_change"],
        }
    return out


def format_comparison(
    df: pl.DataFrame, *, notes: bool = True, classes: pl.DataFrame | None = None
) -> str:
    """A text table per scenario: metric, A, B, signed change and relative change; then,
    with ``classes`` (``class_changes``), a table per tenant and model kind; with
    ``notes``, a closing note on what the intervals are."""
    from pipeline.text import render_table

    if df.is_empty():
        return "nothing to compare: neither run has simulated requests or capacity searches"
    lines = [f"A = {df['run_a'][0]}", f"B = {df['run_b'][0]}"]
    for (scenario,), part in df.group_by("scenario", maintain_order=True):
        other = part["scenario_b"][0]
        head = str(scenario) if other in (None, scenario) else f"{scenario} (B: {other})"
        rows = []
        for r in part.to_dicts():
            label, scale, unit, better_up = METRICS.get(r["metric"], (r["metric"], 1.0, "", True))
            rel = r["relative_change"]
            verdict = ""
            if r.get("within_noise"):
                verdict = "within noise"
            elif r["change"]:
                verdict = "better" if (r["change"] > 0) == better_up else "worse"
            a, b = _plain(r["value_a"], scale, unit), _plain(r["value_b"], scale, unit)
            pct = "\u2014" if rel is None else f"{rel * 100:+.1f}%"
            rows.append(
                [
                    label,
                    a,
                    b,
                    signed(r["change"], scale, unit),
                    _interval(r, scale, unit),
                    pct,
                    verdict,
                ]
            )
        lines.append("")
        lines.append(head)
        table = render_table(["metric", "A", "B", "B - A", "90% interval", "change", ""], rows)
        lines += ["  " + line for line in table.splitlines()]
        if classes is not None:
            lines += class_change_lines(classes.filter(pl.col("scenario") == scenario))
    if notes and "interval" in df.columns and df["interval"].is_not_null().any():
        lines += [
            "",
            "90% interval of B - A: paired where both runs replayed the same requests (a "
            "bootstrap drawing the same windows of arrivals from both), else unpaired; with "
            "each run's profile term. 'within noise': the interval holds 0.",
        ]
    return "\n".join(lines)


def class_change_lines(classes: pl.DataFrame) -> list[str]:
    """One scenario's per-class changes: a table per kind (class, metric, A, B, B - A,
    change, better or worse)."""
    from pipeline.text import render_table

    lines: list[str] = []
    for (kind,), part in classes.group_by("class_kind", maintain_order=True):
        rows = []
        for r in part.to_dicts():
            label, scale, unit, better_up = METRICS[r["metric"]]
            verdict = ""
            if r["change"]:
                verdict = "better" if (r["change"] > 0) == better_up else "worse"
            rel = r["relative_change"]
            rows.append(
                [
                    r["class_name"],
                    label,
                    _plain(r["value_a"], scale, unit),
                    _plain(r["value_b"], scale, unit),
                    signed(r["change"], scale, unit),
                    "\u2014" if rel is None else f"{rel * 100:+.1f}%",
                    verdict,
                ]
            )
        table = render_table([str(kind), "metric", "A", "B", "B - A", "change", ""], rows)
        lines += [f"  per {kind}:", *("    " + line for line in table.splitlines())]
    return lines


def _interval(r: dict[str, Any], scale: float, unit: str) -> str:
    """``-12.3 to +4.5 ms (paired)``, or a dash without an interval."""
    lo, hi = r.get("change_lo"), r.get("change_hi")
    if lo is None or hi is None:
        return "\u2014"
    return f"{signed(lo, scale)} to {signed(hi, scale, unit)} ({r['interval']})"


__all__ = [
    "METRICS",
    "class_changes",
    "compare_runs",
    "comparison_dict",
    "format_comparison",
    "known_runs",
]
