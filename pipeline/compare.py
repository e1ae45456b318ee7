"""Compare replay or capacity runs: the summary of run B against run A, with signed changes.

The figures come from ``sql/compare_runs.sql`` (the same query the report's
comparison section draws): per scenario, throughput, TTFT and TPOT percentiles,
preemptions and the prefix-cache hit rate, and each capacity search's answer.
Scenarios pair as ``pair_scenarios`` says (``--by name``, ``--by position``,
``--pair A=B``), and the comparison says how it paired them.
Each latency percentile's and capacity answer's change comes with its 90%
interval (``pipeline.report.changes``: paired where both runs replayed the same
requests) and is marked *within noise* when that interval holds zero.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb
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
    "p99_e2e_s": ("p99 E2E", 1000.0, " ms", False),
    "replicas": ("replicas", 1.0, "", False),
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


PAIR_BY: tuple[str, ...] = ("name", "position")


@dataclass(frozen=True)
class Pairing:
    """Which scenario of run A pairs with which of run B, and how that was decided."""

    by: str  # name | position | mapping
    pairs: list[tuple[str, str]]
    a_only: list[str] = field(default_factory=list)
    b_only: list[str] = field(default_factory=list)
    note: str = ""  # why, where the pairing fell back from the one asked for

    def describe(self) -> str:
        """One line: how the scenarios were paired."""
        n = len(self.pairs)
        text = f"paired {n} scenario{'' if n == 1 else 's'} by {self.by}"
        if self.note:
            text += f" ({self.note})"
        if self.a_only:
            text += f"; only in A: {', '.join(self.a_only)}"
        if self.b_only:
            text += f"; only in B: {', '.join(self.b_only)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "pairs": [list(p) for p in self.pairs],
            "a_only": self.a_only,
            "b_only": self.b_only,
            "note": self.note or None,
        }

    def pairs_json(self) -> str:
        """The ``pairs_json`` parameter of ``sql/compare_runs.sql``."""
        return json.dumps([list(p) for p in self.pairs])


def parse_pairs(specs: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """``--pair a=b`` values as (name in A, name in B).

    Raises:
        PipelineError: a value without ``=`` or with an empty side.
    """
    out = []
    for spec in specs:
        a, sep, b = spec.partition("=")
        if not sep or not a.strip() or not b.strip():
            raise PipelineError(
                f"--pair {spec!r}: give SCENARIO_A=SCENARIO_B (a scenario of run A, one of run B)"
            )
        out.append((a.strip(), b.strip()))
    return out


def run_scenario_names(
    con: duckdb.DuckDBPyConnection, run_a: str, run_b: str
) -> tuple[list[str], list[str]]:
    """Each run's scenario names, in the order the run replayed them."""
    df = query(con, "compare_scenarios", run_id=run_a, compare_run_id=run_b)
    names = {
        rid: df.filter(pl.col("run_id") == rid).sort("position")["scenario"].to_list()
        for rid in (run_a, run_b)
    }
    return names[run_a], names[run_b]


def pair_scenarios(
    names_a: list[str],
    names_b: list[str],
    *,
    by: str = "name",
    pairs: list[tuple[str, str]] | None = None,
) -> Pairing:
    """Pair run A's scenarios with run B's.

    ``by="name"`` pairs equal names; when no name matches and both runs have as
    many scenarios, it pairs by position and says so. ``by="position"`` pairs the
    first with the first, and so on. ``pairs`` (``--pair a=b``) pairs those, and
    the rest by name.

    Raises:
        PipelineError: a mapping naming a scenario a run does not have (its names are
            listed), a scenario mapped twice, or (by name) no name in common and a
            different number of scenarios.
    """
    if by not in PAIR_BY:
        raise PipelineError(f"--by {by!r}: pair by one of {', '.join(PAIR_BY)}")
    if pairs:
        for side, names, picked in (
            ("A", names_a, [a for a, _ in pairs]),
            ("B", names_b, [b for _, b in pairs]),
        ):
            for name in picked:
                if name not in names:
                    raise PipelineError(
                        f"--pair: run {side} has no scenario {name!r}; its scenarios: "
                        f"{', '.join(names) or 'none'}"
                    )
            twice = sorted({n for n in picked if picked.count(n) > 1})
            if twice:
                raise PipelineError(
                    f"--pair: run {side}'s scenario {twice[0]!r} is paired twice; "
                    "pair each scenario once"
                )
        mapped_a, mapped_b = {a for a, _ in pairs}, {b for _, b in pairs}
        rest = [n for n in names_a if n in names_b and n not in mapped_a and n not in mapped_b]
        got = list(pairs) + [(n, n) for n in rest]
        return _pairing("mapping", got, names_a, names_b)
    if by == "position":
        got = list(zip(names_a, names_b, strict=False))
        return _pairing("position", got, names_a, names_b)
    common = [n for n in names_a if n in names_b]
    if common or not names_a or not names_b:
        return _pairing("name", [(n, n) for n in common], names_a, names_b)
    if len(names_a) == len(names_b):
        return _pairing(
            "position",
            list(zip(names_a, names_b, strict=True)),
            names_a,
            names_b,
            note="no scenario name is in both runs; both have "
            f"{len(names_a)} scenario{'' if len(names_a) == 1 else 's'}",
        )
    raise PipelineError(
        f"no scenario name is in both runs (A has {len(names_a)}: {_few(names_a)}; B has "
        f"{len(names_b)}: {_few(names_b)}): pair them with --by position or "
        "--pair SCENARIO_A=SCENARIO_B"
    )


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def _pairing(
    by: str, pairs: list[tuple[str, str]], names_a: list[str], names_b: list[str], note: str = ""
) -> Pairing:
    in_a, in_b = {a for a, _ in pairs}, {b for _, b in pairs}
    return Pairing(
        by=by,
        pairs=pairs,
        a_only=[n for n in names_a if n not in in_a],
        b_only=[n for n in names_b if n not in in_b],
        note=note,
    )


def runs_pairing(
    con: duckdb.DuckDBPyConnection,
    run_a: str,
    run_b: str,
    *,
    by: str = "name",
    pairs: list[tuple[str, str]] | None = None,
) -> Pairing:
    """``pair_scenarios`` over the two runs' scenarios in the warehouse."""
    names_a, names_b = run_scenario_names(con, run_a, run_b)
    return pair_scenarios(names_a, names_b, by=by, pairs=pairs)


def compare_runs(
    wh: Warehouse,
    run_a: str,
    run_b: str,
    prices: dict[str, float] | None = None,
    *,
    by: str = "name",
    pairs: list[tuple[str, str]] | None = None,
) -> pl.DataFrame:
    """The rows of ``sql/compare_runs.sql`` for run A (baseline) against run B, the
    scenarios paired as ``pair_scenarios`` says (``compare_paired`` gives the pairing too).

    Raises:
        PipelineError: as ``compare_paired``.
    """
    return compare_paired(wh, run_a, run_b, prices, by=by, pairs=pairs)[0]


def compare_paired(
    wh: Warehouse,
    run_a: str,
    run_b: str,
    prices: dict[str, float] | None = None,
    *,
    by: str = "name",
    pairs: list[tuple[str, str]] | None = None,
) -> tuple[pl.DataFrame, Pairing]:
    """``compare_runs``'s rows and how the scenarios were paired.

    Raises:
        PipelineError: no warehouse, a run id it does not hold (the latest are named), or
            a pairing ``pair_scenarios`` refuses.
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
        pairing = runs_pairing(con, run_a, run_b, by=by, pairs=pairs)
        df = query(
            con,
            "compare_runs",
            run_id=run_a,
            compare_run_id=run_b,
            prices_json=prices_json(prices or {}),
            pairs_json=pairing.pairs_json(),
        )
        return with_intervals(con, df), pairing
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


def class_changes(wh: Warehouse, df: pl.DataFrame, pairing: Pairing | None = None) -> pl.DataFrame:
    """Per tenant and per model of each scenario pair of ``df`` (``compare_runs``' rows, so
    paired as they pair): requests and TTFT/TPOT percentiles in A and B, with the change
    B - A and the relative change. Only kinds with more than one class in A or B; a class
    found in one run only has the other's values null."""
    empty = pl.DataFrame(schema={c: pl.Float64 if c.startswith(("value", "change", "relative"))
                                 else pl.String for c in CLASS_COLUMNS})  # fmt: skip
    if df.is_empty():
        return empty
    run_a, run_b = df["run_a"][0], df["run_b"][0]
    pairs = _scenario_pairs(df, pairing)
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
                    values = _change(a.get(name), b.get(name), column)
                    rows.append((shown, b_name, kind, name, metric, *values))
    if not rows:
        return empty
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


# the per-pool rows (view pool_latency): its column -> the compare_runs metric it reads as
POOL_METRICS = {
    "requests": "num_requests",
    "replicas": "replicas",
    "ttft_p50_s": "p50_ttft_s",
    "ttft_p90_s": "p90_ttft_s",
    "ttft_p99_s": "p99_ttft_s",
    "tpot_p50_s": "p50_tpot_s",
    "tpot_p99_s": "p99_tpot_s",
    "e2e_p99_s": "p99_e2e_s",
    "requests_per_s": "requests_per_s",
}
POOL_COLUMNS = ("scenario", "scenario_b", "pool", "metric", "value_a", "value_b", "change",
                "relative_change")  # fmt: skip


def _scenario_pairs(df: pl.DataFrame, pairing: Pairing | None) -> list[tuple[str, str | None, str]]:
    """(scenario shown, its name in A or None, its name in B) of each pair of ``df``."""
    if pairing is not None:  # as compare_paired paired the scenarios
        return [(a, a, b) for a, b in pairing.pairs]
    pairs: list[tuple[str, str | None, str]] = []
    sims = df.filter(pl.col("scenario") != "(capacity)")
    for (scenario, scenario_b), part in sims.group_by(
        ["scenario", "scenario_b"], maintain_order=True
    ):
        in_a = part["value_a"].is_not_null().any()
        pairs.append((scenario, scenario if in_a else None, scenario_b))
    return pairs


def pool_changes(wh: Warehouse, df: pl.DataFrame, pairing: Pairing | None = None) -> pl.DataFrame:
    """Per replica pool of each scenario pair of ``df`` (``compare_runs``' rows, so paired
    as they pair), pools paired by name: requests, replicas, TTFT/TPOT/E2E percentiles and
    requests per second in A and B, with the change B - A and the relative change. A pair
    where neither scenario is a fleet has no rows; a pool found in one run only has the
    other's values null (a fleet against a one-pool scenario: every pool, B's null)."""
    empty = pl.DataFrame(schema={c: pl.Float64 if c.startswith(("value", "change", "relative"))
                                 else pl.String for c in POOL_COLUMNS})  # fmt: skip
    if df.is_empty():
        return empty
    run_a, run_b = df["run_a"][0], df["run_b"][0]
    con = wh.connect()
    try:
        cols = ", ".join(POOL_METRICS)
        found = con.execute(
            f"SELECT run_id, scenario, pool, {cols} FROM pool_latency WHERE run_id IN (?, ?) "
            "ORDER BY run_id, scenario, pool_order NULLS LAST, pool",
            [run_a, run_b],
        ).fetchall()
    finally:
        con.close()
    names = ["run_id", "scenario", "pool", *POOL_METRICS]
    by_scenario: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in found:  # each fleet's pools in its order
        by_scenario.setdefault((r[0], r[1]), {})[r[2]] = dict(zip(names, r, strict=True))
    rows = []
    for shown, a_name, b_name in _scenario_pairs(df, pairing):
        a = by_scenario.get((run_a, a_name or ""), {})
        b = by_scenario.get((run_b, b_name), {})
        order = list(a) + [n for n in b if n not in a]
        for name in order:
            for column, metric in POOL_METRICS.items():
                rows.append(
                    (shown, b_name, name, metric, *_change(a.get(name), b.get(name), column))
                )
    if not rows:
        return empty
    return pl.DataFrame(rows, schema=empty.schema, orient="row")


def _change(
    a: dict[str, Any] | None, b: dict[str, Any] | None, column: str
) -> tuple[float | None, float | None, float | None, float | None]:
    """(A, B, B - A, (B - A) / |A|) of one figure of a class or pool in both runs (None
    where a run lacks it, or the relative change where A is 0)."""
    va, vb = (a or {}).get(column), (b or {}).get(column)
    va = None if va is None else float(va)
    vb = None if vb is None else float(vb)
    change = None if va is None or vb is None else vb - va
    rel = None if change is None or not va else change / abs(va)
    return va, vb, change, rel


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


def comparison_dict(
    df: pl.DataFrame,
    pairing: Pairing | None = None,
    classes: pl.DataFrame | None = None,
    pools: pl.DataFrame | None = None,
) -> dict[str, Any]:
    """The diff as JSON-able data: how the scenarios were paired, and per paired scenario
    (and the capacity answers), per metric, a, b, change, relative change; per class
    (``class_changes``) under ``classes``: ``{kind: {name: {metric: ...}}}``; and per pool
    of a fleet (``pool_changes``) under ``pools``: ``{pool: {metric: ...}}``."""
    out: dict[str, Any] = {
        "run_a": df["run_a"][0] if df.height else None,
        "run_b": df["run_b"][0] if df.height else None,
        "pairing": pairing.to_dict() if pairing is not None else None,
        "scenarios": {},
    }
    for row in _paired_rows(df, pairing).to_dicts():
        entry = out["scenarios"].setdefault(
            row["scenario"],
            {"scenario_b": row["scenario_b"], "metrics": {}, "classes": {}, "pools": {}},
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
    for row in (pools if pools is not None else pl.DataFrame()).to_dicts():
        entry = out["scenarios"].get(row["scenario"])
        if entry is None:
            continue
        entry["pools"].setdefault(row["pool"], {})[row["metric"]] = {
            "a": row["value_a"],
            "b": row["value_b"],
            "change": row["change"],
            "relative_change": row["relative_change"],
        }
    return out


def _paired_rows(df: pl.DataFrame, pairing: Pairing | None) -> pl.DataFrame:
    """The rows of paired scenarios and capacity answers (those a pairing leaves alone are
    named by it, not shown as tables of dashes)."""
    if pairing is None or df.is_empty():
        return df
    paired_a = [a for a, _ in pairing.pairs] + ["(capacity)"]
    return df.filter(pl.col("scenario").is_in(paired_a) & pl.col("value_a").is_not_null())


def format_comparison(
    df: pl.DataFrame,
    pairing: Pairing | None = None,
    *,
    notes: bool = True,
    classes: pl.DataFrame | None = None,
    pools: pl.DataFrame | None = None,
) -> str:
    """A line on how the scenarios were paired, then a text table per paired scenario:
    metric, A, B, signed change and relative change; then, with ``pools``
    (``pool_changes``), a table of the fleet's pools; with ``classes``
    (``class_changes``), a table per tenant and model kind; with ``notes``, a closing
    note on what the intervals are."""
    from pipeline.text import render_table

    if df.is_empty():
        return "nothing to compare: neither run has simulated requests or capacity searches"
    lines = [f"A = {df['run_a'][0]}", f"B = {df['run_b'][0]}"]
    if pairing is not None:
        lines.append(pairing.describe())
    for (scenario,), part in _paired_rows(df, pairing).group_by("scenario", maintain_order=True):
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
        if pools is not None:
            lines += pool_change_lines(pools.filter(pl.col("scenario") == scenario))
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


def _change_row(r: dict[str, Any]) -> list[str]:
    """metric, A, B, B - A, change and better or worse, of one per-class or per-pool row."""
    label, scale, unit, better_up = METRICS[r["metric"]]
    verdict = ""
    if r["change"]:
        verdict = "better" if (r["change"] > 0) == better_up else "worse"
    rel = r["relative_change"]
    return [
        label,
        _plain(r["value_a"], scale, unit),
        _plain(r["value_b"], scale, unit),
        signed(r["change"], scale, unit),
        "\u2014" if rel is None else f"{rel * 100:+.1f}%",
        verdict,
    ]


def pool_change_lines(pools: pl.DataFrame) -> list[str]:
    """One scenario's per-pool changes: one table (pool, metric, A, B, B - A, change,
    better or worse)."""
    from pipeline.text import render_table

    if pools.is_empty():
        return []
    rows = [[str(r["pool"]), *_change_row(r)] for r in pools.to_dicts()]
    table = render_table(["pool", "metric", "A", "B", "B - A", "change", ""], rows)
    return ["  per pool:", *("    " + line for line in table.splitlines())]


def class_change_lines(classes: pl.DataFrame) -> list[str]:
    """One scenario's per-class changes: a table per kind (class, metric, A, B, B - A,
    change, better or worse)."""
    from pipeline.text import render_table

    lines: list[str] = []
    for (kind,), part in classes.group_by("class_kind", maintain_order=True):
        rows = [[str(r["class_name"]), *_change_row(r)] for r in part.to_dicts()]
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
    "PAIR_BY",
    "Pairing",
    "class_changes",
    "compare_paired",
    "compare_runs",
    "comparison_dict",
    "format_comparison",
    "known_runs",
    "pair_scenarios",
    "parse_pairs",
    "pool_changes",
    "runs_pairing",
]
