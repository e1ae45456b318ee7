"""The report's autoscaling section and its queries, autoscale_timeline and
autoscale_summary, over replays with an autoscaled scenario and an autoscaled pool.

The queries read the replay summary's autoscale entries with DuckDB's JSON functions
and count arrivals in sim_requests: their rows must be the summary's figures, and the
arrivals must add up to the requests each scenario (or pool) replayed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.plan.autoscale_plan import run_autoscale_capacity
from pipeline.plan.capacity import SearchSpec
from pipeline.plan.slo import parse_slos
from pipeline.report import build_report
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import AUTOSCALE_COMMON, AUTOSCALE_TABLE, specs

SLOS = parse_slos(["ttft_p99=2s"])


@pytest.fixture
def runs(autoscale_warehouse: tuple[Warehouse, str, str]) -> tuple[Warehouse, str, str]:
    """tests/helpers.py's build_autoscaled: run A (an autoscaled scenario 'auto' and a
    fleet whose pool 'short' is autoscaled), run B (one fixed scenario)."""
    return autoscale_warehouse


def _summaries(wh: Warehouse, run_id: str) -> dict[str, Any]:
    con = wh.connect()
    try:
        rows = con.execute(
            "SELECT scenario, summary_json FROM scenarios WHERE run_id = ?", [run_id]
        ).fetchall()
    finally:
        con.close()
    return {name: json.loads(text) for name, text in rows}


def _entries(wh: Warehouse, run_id: str) -> dict[tuple[str, str | None], dict[str, Any]]:
    """(scenario, pool) -> (autoscale entry, requests replayed) from the summaries."""
    out = {}
    for name, s in _summaries(wh, run_id).items():
        if s.get("autoscale"):
            out[(name, None)] = {**s["autoscale"], "requests": s["num_requests"]}
        for pool, p in (s.get("pools") or {}).items():
            if p.get("autoscale"):
                out[(name, pool)] = {**p["autoscale"], "requests": p["num_requests"]}
    return out


def test_timeline_rows_are_the_summarys_and_arrivals_add_up(
    runs: tuple[Warehouse, str, str],
) -> None:
    wh, run_a, _ = runs
    entries = _entries(wh, run_a)
    assert set(entries) == {("auto", None), ("fleet", "short")}
    df = query(wh.connect(), "autoscale_timeline", run_id=run_a)
    for (scenario, pool), e in entries.items():
        mine = df.filter((df["scenario"] == scenario) & (df["pool"].eq_missing(pool)))
        for col, measure in ((1, "active"), (2, "starting")):
            got = mine.filter(mine["measure"] == measure).sort("t_s")
            points = [(p[0], p[col]) for p in e["timeline"]]
            if e["end_s"] > points[-1][0]:  # held to the replay's end
                points.append((e["end_s"], points[-1][1]))
            assert got["t_s"].to_list() == pytest.approx([t for t, _ in points])
            assert got["value"].to_list() == [v for _, v in points]
        arrivals = mine.filter(mine["measure"] == "arrivals")
        assert arrivals["value"].sum() == e["requests"]
        # the buckets are the autoscaler's interval (the span needs fewer than 300 of them)
        assert set(arrivals["bucket_s"]) == {AUTOSCALE_TABLE["interval_s"]}
        assert (arrivals["t_s"] % arrivals["bucket_s"] == 0).all()


def test_summary_rows_are_the_summarys(runs: tuple[Warehouse, str, str]) -> None:
    wh, run_a, _ = runs
    entries = _entries(wh, run_a)
    df = query(wh.connect(), "autoscale_summary", run_id=run_a)
    assert df.height == len(entries)
    for row in df.to_dicts():
        e = entries[(row["scenario"], row["pool"])]
        for key in ("gpu_hours", "gpu_hours_at_max", "mean_active", "startup_s", "end_s"):
            assert row[key] == pytest.approx(e[key]), key
        for key in ("peak_active", "scale_ups", "scale_downs"):
            assert row[key] == e[key], key
        assert row["saved_share"] == pytest.approx(1 - e["gpu_hours"] / e["gpu_hours_at_max"])
        d = e["during_scale_ups"]
        assert row["during_requests"] == d["num_requests"]
        assert row["during_over"] == f"ttft_p99 {d['over_limit']['ttft_p99']}"
        assert row["fixed_replicas"] is None  # a replay, not a capacity run


def test_the_section_shows_only_for_autoscaled_runs(
    runs: tuple[Warehouse, str, str], tmp_path: Path
) -> None:
    wh, run_a, run_b = runs
    page = build_report(wh, run_a, output=tmp_path / "a.html", slos=["ttft_p99<=2s"]).read_text()
    assert '<section id="autoscaling">' in page
    spec = specs(page)["chart-autoscaling-1"]
    labels = {c["title"] for c in spec["vconcat"]}
    assert labels == {"auto", "fleet / short"}
    other = build_report(wh, run_b, output=tmp_path / "b.html").read_text()
    assert '<section id="autoscaling">' not in other


def test_a_capacity_run_shows_the_fixed_count(
    runs: tuple[Warehouse, str, str],
) -> None:
    wh, _, _ = runs
    values = {**AUTOSCALE_COMMON, "name": "cap", "replicas": 1, "autoscale": AUTOSCALE_TABLE}
    result, cmp = run_autoscale_capacity(
        wh.root, values, SLOS, SearchSpec("replicas", lo=1, hi=16), quiet=True, intervals=False
    )
    df = query(wh.connect(), "autoscale_summary", run_id=result.run_id)
    assert df["scenario"].to_list() == [cmp.scenario]  # the fixed probes are not autoscaled
    row = df.row(0, named=True)
    assert row["fixed_replicas"] == cmp.fixed_replicas
    assert row["fixed_gpu_hours"] == pytest.approx(cmp.fixed_gpu_hours)
    assert row["slo_met"] == cmp.all_met
