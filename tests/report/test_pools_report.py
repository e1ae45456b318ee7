"""The report's per-pool section and its query, pool_slos, over a fleet's replay.

The query's figures are SQL's over sim_requests; the replay summary's per-pool entry is
numpy's over the simulator's result: the two must agree, SLO statistics and goodput too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.report import build_report
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import specs

SLOS = ["ttft_p99<=2s", "tpot_p99<=40ms", "ttft_p99@tenant=none<=1ms"]


def _pools_summary(wh: Warehouse, run_id: str) -> dict[str, Any]:
    con = wh.connect()
    try:
        (text,) = con.execute(
            "SELECT summary_json FROM scenarios WHERE run_id = ? AND scenario = 'split'", [run_id]
        ).fetchone()  # type: ignore[misc]
    finally:
        con.close()
    return json.loads(text)["pools"]  # type: ignore[no-any-return]


def _section(page: str, sid: str) -> str:
    part = page[page.index(f'<section id="{sid}">') :]
    return part[: part.index("</section>")]


def test_pool_slos_agree_with_the_replay_summary(
    fleet_warehouse: tuple[Warehouse, str, str],
) -> None:
    wh, run_a, _ = fleet_warehouse
    pools = _pools_summary(wh, run_a)
    df = query(wh.connect(), "pool_slos", run_id=run_a, slos=json.dumps(["ttft_p99<=2s"]))
    assert set(df["scenario"]) == {"split"}  # the one-pool scenario has no pool row
    assert df["pool"].to_list() == ["short", "long"]  # in the fleet's order
    for row in df.to_dicts():
        s = pools[row["pool"]]
        assert row["replicas"] == s["replicas"] and row["policy"] == s["policy"]
        assert (row["requests"], row["completed"]) == (s["num_requests"], s["completed"])
        for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):
            assert row[key] == pytest.approx(s[key], rel=1e-9), key
        assert row["requests_per_s"] == pytest.approx(s["request_throughput"], rel=1e-9)
        # the replay ran with the same SLO: its statistic, verdict and goodput
        assert row["measured_s"] == pytest.approx(s["slo"]["ttft_p99"]["measured_s"], rel=1e-9)
        assert row["meets_slo"] == s["slo"]["ttft_p99"]["met"]
        assert row["num_good"] == s["num_good"]
        assert row["goodput_per_s"] == pytest.approx(s["goodput"], rel=1e-9)


def test_a_scoped_slo_judges_no_pool(fleet_warehouse: tuple[Warehouse, str, str]) -> None:
    wh, run_a, _ = fleet_warehouse
    df = query(wh.connect(), "pool_slos", run_id=run_a, slos=json.dumps(SLOS))
    assert set(df["slo"]) == {"ttft_p99", "tpot_p99"}
    assert df.filter(df["is_first"]).height == 2  # one first row per pool


def test_the_report_shows_a_table_and_a_panel_per_pool(
    fleet_warehouse: tuple[Warehouse, str, str], tmp_path: Path
) -> None:
    wh, run_a, _ = fleet_warehouse
    page = build_report(wh, run_a, output=tmp_path / "p.html", slos=SLOS[:1]).read_text()
    section = _section(page, "pools")
    for name in ("pool=short", "pool=long"):
        assert f"<b>{name}</b>" in section
    rows = specs(page)["chart-pools-1"]["data"]["values"]
    points = [r for r in rows if r["layer"] == "point"]
    assert {r["pool_label"] for r in points} == {"pool=short", "pool=long"}
    assert {r["scenario"] for r in points} == {"split"}
    # the panels in the fleet's order of its pools, not by name
    chart = specs(page)["chart-pools-1"]
    assert chart["facet"]["sort"] == ["pool=short", "pool=long"]
    rules = {(r["pool_label"], r["slo_label"]) for r in rows if r["layer"] == "rule"}
    assert rules == {("pool=short", "ttft_p99 <= 2s"), ("pool=long", "ttft_p99 <= 2s")}


def test_a_run_without_fleets_has_no_pool_section(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    page = build_report(tiny_warehouse, output=tmp_path / "t.html").read_text()
    assert '<section id="pools">' not in page
    assert '<section id="classes">' in page  # the sections after it are still there
