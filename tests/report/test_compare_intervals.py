"""compare: each latency change with its 90% interval, paired where both runs replayed the
same requests, and marked within noise when the interval holds zero."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.compare import compare_paired, compare_runs, comparison_dict, format_comparison
from pipeline.contracts import REQUESTS
from pipeline.selection import RequestFilter
from pipeline.sim.cost_model import StepCost
from pipeline.sim.cost_uncertainty import scaled_cost
from pipeline.sim.replay import replay
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, make_scenario, requests_table

LATENCY = ["p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    n = 500
    table = requests_table(
        rng.integers(50, 1500, n), rng.integers(2, 200, n), rng.exponential(1 / 12.0, n)
    )
    root = tmp_path_factory.mktemp("cmpiv") / "wh"
    Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")

    def run(cost: float = 1.0, **keys: Any) -> str:
        scaled = scaled_cost(StepCost(**H100_8B_COST), cost).to_dict()
        sc = make_scenario("vllm", scaled, name="v", num_gpu_blocks=4000, **keys)
        return replay(root, [sc], quiet=True).run_id

    ids = {
        "base": run(),
        "same": run(),
        "faster": run(cost=0.6),
        "nudged": run(cost=0.99),
    }
    subset = RequestFilter(where="prompt_tokens > 300")
    ids["other"] = replay(
        root,
        [make_scenario("vllm", H100_8B_COST, name="v", num_gpu_blocks=4000)],
        quiet=True,
        selection=subset,
    ).run_id
    return {"wh": Warehouse(root), **ids}


def _rows(df: pl.DataFrame) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in df.to_dicts() if r["scenario"] != "(capacity)"}


def test_a_run_against_its_rerun_changes_nothing_within_noise(runs: dict[str, Any]) -> None:
    rows = _rows(compare_runs(runs["wh"], runs["base"], runs["same"]))
    for m in LATENCY:
        r = rows[m]
        assert r["change"] == 0.0 and r["interval"] == "paired"
        assert r["change_lo"] == pytest.approx(0.0, abs=1e-12)
        assert r["change_hi"] == pytest.approx(0.0, abs=1e-12)
        assert r["within_noise"] is True
    assert rows["requests_per_s"]["interval"] is None  # no interval on throughput


def test_a_faster_profile_is_a_change_beyond_noise(runs: dict[str, Any]) -> None:
    df = compare_runs(runs["wh"], runs["base"], runs["faster"])
    rows = _rows(df)
    for m in ("p50_ttft_s", "p90_ttft_s", "p50_tpot_s"):
        r = rows[m]
        assert r["interval"] == "paired" and r["change"] < 0
        assert r["change_lo"] <= r["change"] <= r["change_hi"] < 0
        assert r["within_noise"] is False
    text = format_comparison(df)
    assert "90% interval" in text and "(paired)" in text and "better" in text


def test_a_small_nudge_is_marked_within_noise(runs: dict[str, Any]) -> None:
    df = compare_runs(runs["wh"], runs["base"], runs["nudged"])
    rows = _rows(df)
    assert all(rows[m]["interval"] == "paired" for m in LATENCY)
    assert any(rows[m]["within_noise"] for m in LATENCY)
    for m in LATENCY:
        r = rows[m]
        assert r["change_lo"] <= r["change"] <= r["change_hi"]
        assert r["within_noise"] is (r["change_lo"] <= 0 <= r["change_hi"])
    text = format_comparison(df)
    assert "within noise" in text


def test_quiet_leaves_out_the_intervals_note(runs: dict[str, Any]) -> None:
    base = ["compare", runs["base"], runs["faster"], "--warehouse", str(runs["wh"].root)]
    loud, quiet = (CliRunner().invoke(cli, [*base, *extra]) for extra in ([], ["--quiet"]))
    assert loud.exit_code == quiet.exit_code == 0, loud.output + quiet.output
    note = "90% interval of B - A: paired where"
    assert note in loud.stdout and note not in quiet.stdout
    assert "(paired)" in quiet.stdout  # the table is all there


def test_other_requests_are_compared_unpaired(runs: dict[str, Any]) -> None:
    rows = _rows(compare_runs(runs["wh"], runs["base"], runs["other"]))
    assert {rows[m]["interval"] for m in LATENCY} == {"unpaired"}
    for m in LATENCY:
        assert rows[m]["change_lo"] <= rows[m]["change"] <= rows[m]["change_hi"]


def test_the_json_carries_the_intervals(runs: dict[str, Any]) -> None:
    wh = runs["wh"]
    r = CliRunner().invoke(
        cli, ["compare", runs["base"], runs["faster"], "--warehouse", str(wh.root), "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    p99 = out["scenarios"]["v"]["metrics"]["p99_ttft_s"]
    assert {"change_lo", "change_hi", "interval", "within_noise"} <= set(p99)
    assert out == json.loads(
        json.dumps(comparison_dict(*compare_paired(wh, runs["base"], runs["faster"])))
    )


def test_report_compare_section_shows_the_intervals(runs: dict[str, Any], tmp_path: Path) -> None:
    from pipeline.report import build_report

    html = build_report(
        runs["wh"], runs["base"], output=tmp_path / "c.html", compare=runs["nudged"]
    ).read_text()
    assert "90% interval of B - A" in html and "within noise" in html
