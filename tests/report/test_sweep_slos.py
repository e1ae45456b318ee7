"""The sweep charts judge every SLO of the run, scoped ones against their scope's statistic:
slo_capacity.sql against pipeline.plan.slo.evaluate (what `capacity` and `sweep` use), the
run's own SLOs as the default, and the data the chart draws."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.contracts import RUNS
from pipeline.plan.slo import Slo, evaluate, parse_slos
from pipeline.report import build_report, charts, render
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import EVIL_TENANT, R2, build, table

# one of each kind of scope, a hostile tenant name, and p97 (no usual quantile: sorted list)
ITEMS = [
    "ttft_p99=2s",
    "ttft_p90@tenant=team-a=1s",
    f"tpot_p97@tenant={EVIL_TENANT}=30ms",
    "e2e_mean@model=llama-3-8b=20s",
    "queue_p50@prompt>700=0.5s",
    "ttft_p99.9@prompt<=700=3s",
]


def _reference(wh: Warehouse, run_id: str, slos: list[Slo]) -> dict[tuple[str, str], Any]:
    """(scenario, SLO) -> (measured, met) by pipeline.plan.slo.evaluate, from the rows."""
    con = wh.connect()
    try:
        rows = con.sql(
            "SELECT s.*, r.tenant, r.model FROM sim_requests AS s "
            "LEFT JOIN requests AS r USING (request_id) WHERE s.run_id = ?",
            params=[run_id],
        ).pl()
    finally:
        con.close()
    out = {}
    for (scenario,), g in rows.group_by("scenario"):
        metrics = {c: g[c].cast(pl.Float64).fill_null(np.nan).to_numpy()
                   for c in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}  # fmt: skip
        groups = {"tenant": g["tenant"].to_numpy(), "model": g["model"].to_numpy(),
                  "prompt_tokens": g["prompt_tokens"].to_numpy()}  # fmt: skip
        rep = evaluate(slos, metrics, 1.0, groups)
        for s in slos:
            out[(str(scenario), s.key)] = (rep.measured_s[s.key], rep.met[s.key])
    return out


def test_scoped_slos_match_the_reference(replayed_warehouse: Warehouse) -> None:
    parsed = parse_slos(ITEMS)
    slos = [str(s) for s in parsed]
    con = replayed_warehouse.connect()
    try:
        run_id = query(con, "replay_runs")["run_id"][0]
        df = query(con, "slo_capacity", run_id=run_id, slos=json.dumps(slos))
    finally:
        con.close()
    expected = _reference(replayed_warehouse, run_id, parsed)
    assert set(df["slo"]) == {s.key for s in parsed}
    assert df["scope_requests"].min() > 0  # every scope holds requests
    checked = 0
    for r in df.to_dicts():
        measured, met = expected[(r["scenario"], r["slo"])]
        assert r["measured_s"] == pytest.approx(measured, rel=1e-9, abs=1e-12), r["slo"]
        assert r["meets_slo"] == met
        checked += 1
    assert checked == df.height >= 6 * 4
    # a point meets all when it meets each, and says which it meets and misses
    for _, g in df.group_by("sweep", "scenario"):
        met = set(g.filter("meets_slo")["slo"])
        assert g["meets_all"].unique().to_list() == [len(met) == g.height]
        assert set((g["slos_met"][0] or "").split(", ")) - {""} == met
        assert set((g["slos_missed"][0] or "").split(", ")) - {""} == set(g["slo"]) - met
    # capacity: the highest value of the sweep meeting every SLO
    for _, g in df.group_by("sweep", "sweep_id"):
        ok = g.filter("meets_all")["value"]
        assert g["capacity"][0] == (ok.max() if ok.len() else None)


def _with_run_slos(root: Path, slos: list[str]) -> Warehouse:
    """The tiny warehouse, its latest run written by a sweep with these SLOs."""
    wh = build(root)
    run = {
        "run_id": R2, "command": "sweep", "started_at": datetime(2024, 5, 2, tzinfo=UTC),
        "finished_at": datetime(2024, 5, 2, 0, 1, tzinfo=UTC), "status": "ok",
        "inputs": "[]", "rows_read": 0, "rows_kept": 0, "rows_quarantined": 0,
        "rows_duplicate": 0, "details": json.dumps({"slos": slos}), "version": "0.1.0",
    }  # fmt: skip
    wh.write(RUNS, table(RUNS, [run]), {}, R2)
    return wh


def test_the_runs_own_slos_are_the_default(tmp_path: Path) -> None:
    own = ["ttft_p50@tenant=t1<=150ms", "e2e_p100@model=m-b<=2s"]
    wh = _with_run_slos(tmp_path / "wh", own)
    con = wh.connect()
    try:
        df = query(con, "slo_capacity")
        given = query(con, "slo_capacity", slos='["ttft_p99<=600ms"]')
        loose = query(con, "slo_capacity", slo_ttft_s=5.0)  # the run's SLOs still win
    finally:
        con.close()
    assert sorted(set(df["slo"])) == ["e2e_p100@model=m-b", "ttft_p50@tenant=t1"]
    assert sorted(set(loose["slo"])) == sorted(set(df["slo"]))
    # vllm-2 misses tenant t1's p50 (0.2 s), vllm-4 meets both: the concurrency capacity is 4
    conc = df.filter(pl.col("sweep") == "concurrency")
    assert conc["capacity"].unique().to_list() == [4.0]
    # given SLOs replace the run's: p99 TTFT 0.494 and 0.197 s both meet 600 ms
    assert set(given["slo"]) == {"ttft_p99"}
    assert given.filter(pl.col("sweep") == "concurrency")["capacity"][0] == 4.0
    assert given["meets_all"].all()
    html = build_report(wh, output=tmp_path / "r.html").read_text()
    assert "ttft_p50 of tenant=t1 &lt;= 150ms" in html


def test_the_chart_draws_each_slo_against_its_scope(tiny_warehouse: Warehouse) -> None:
    slos = ["ttft_p99<=200ms", "ttft_p50@tenant=t1<=150ms"]
    con = tiny_warehouse.connect()
    try:
        df = query(con, "slo_capacity", slos=json.dumps(slos))
    finally:
        con.close()
    spec = charts.spec("slo_capacity", df, charts.ChartOptions(title="t"))
    panels = spec["hconcat"]
    assert [p["title"] for p in panels] == ["concurrency sweeps", "rate sweeps"]
    for panel in panels:
        # one row of panels per SLO, its header the SLO with its scope
        assert panel["facet"]["row"]["field"] == "slo_label"
        assert panel["facet"]["row"]["sort"] == ["ttft_p50 of tenant=t1 <= 150ms",
                                                  "ttft_p99 <= 200ms"]  # fmt: skip
        assert panel["resolve"]["scale"]["y"] == "independent"
        rows = panel["data"]["values"]
        assert {r["slo_label"] for r in rows} == set(panel["facet"]["row"]["sort"])
        layers = panel["spec"]["layer"]
        marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
                 for layer in layers]  # fmt: skip
        assert marks == ["line", "point", "point", "rule"]
        # the rule is each panel's SLO limit; the points say met or missed
        assert layers[3]["encoding"]["y"]["field"] == "limit_s"
        assert layers[1]["encoding"]["shape"]["field"] == "meets_slo"
        tips = {t.get("title") for t in layers[1]["encoding"]["tooltip"]}
        assert {"SLOs met here", "SLOs missed here", "requests in scope"} <= tips
    concurrency = {(r["scenario"], r["slo"]): r for r in panels[0]["data"]["values"]}
    assert concurrency[("vllm-2", "ttft_p50@tenant=t1")]["measured_s"] == pytest.approx(0.2)
    assert concurrency[("vllm-2", "ttft_p50@tenant=t1")]["meets_slo"] is False
    assert concurrency[("vllm-4", "ttft_p50@tenant=t1")]["slos_met"] == (
        "ttft_p50@tenant=t1, ttft_p99"
    )
    assert concurrency[("vllm-4", "ttft_p99")]["is_capacity"] is True


def _goodputs(html: str) -> list[str]:
    """The goodput column of the report's throughput table, as rendered."""
    table = html[html.index("goodput (requests/s meeting the SLOs)") :]
    table = table[: table.index("</tbody>")]
    return re.findall(r'<td class="num">([^<]*)</td></tr>', table)


def _goodputs_at(wh: Warehouse, slos: list[str]) -> list[str]:
    con = wh.connect()
    try:
        df = query(con, "throughput", slos=json.dumps(slos))
    finally:
        con.close()
    return [render.fmt(v, "float")[0] for v in df["goodput_per_s"].to_list()]


def _slos_line(html: str) -> str:
    m = re.search(r'<dd id="slos"[^>]*>(.*?)</dd>', html, re.S)
    assert m
    return m.group(1)


def test_the_report_judges_by_the_runs_slos_scoped_too(tmp_path: Path) -> None:
    stored = ["ttft_p99@tenant=t1<=100ms", "ttft_p99<=450ms"]
    wh = _with_run_slos(tmp_path / "wh", stored)
    own = build_report(wh, output=tmp_path / "own.html").read_text()
    given = build_report(wh, output=tmp_path / "given.html", slos=["ttft_p99<=300ms"])
    explicit = build_report(wh, output=tmp_path / "explicit.html", slo_ttft_s=0.25)
    assert _slos_line(own) == (
        "ttft_p99 of tenant=t1 &lt;= 100ms; ttft_p99 &lt;= 450ms "
        "(the run&#39;s own (sweep --slo, capacity --slo or [slo]))"
    )
    assert _slos_line(given.read_text()).startswith("ttft_p99 &lt;= 300ms (given")
    assert _slos_line(explicit.read_text()).startswith("ttft_p99 &lt;= 250ms (given")
    # goodput is judged by both stored SLOs, the scoped one on its tenant's requests only
    assert _goodputs(own) == _goodputs_at(wh, stored) != _goodputs_at(wh, ["ttft_p99<=450ms"])
    plain = build(tmp_path / "plain")  # a replay without SLOs: none, and the example
    line = _slos_line(build_report(plain, output=tmp_path / "p.html").read_text())
    assert line.startswith("none given") and "ttft_p99 &lt;= 200ms as an example" in line
