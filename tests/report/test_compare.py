"""tracereplay compare and report --compare: signed changes, worked by hand (tiny warehouse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.compare import compare_paired, compare_runs, comparison_dict, format_comparison
from pipeline.contracts import SCENARIOS, SIM_REQUESTS
from pipeline.errors import PipelineError
from pipeline.report import build_report
from pipeline.warehouse import Warehouse
from tests.helpers import R1, R2, build, config, sim_rows, specs, table, write_run

R3 = "20240503T000000Z-cccc"


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """The tiny warehouse plus R3: one scenario 'renamed', r1 with TTFT 4.5 s (R1's 'old': 9 s)."""
    wh = build(tmp_path_factory.mktemp("cmp") / "wh")
    rows = sim_rows("renamed", [0.0] * 4, [4.5] * 4, [10.0] * 4, [0] * 4, [0] * 4)[:1]
    wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": R3}, "renamed")
    meta = [{"scenario": "renamed", "policy": "vllm", "replicas": 1, "profile": "tiny",
             "config_json": config("renamed", "vllm", 8), "summary_json": "{}"}]  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": R3}, "scenarios")
    write_run(wh, R3, 3)  # a run is visible once it has its runs row
    return wh


def _metric(df, scenario: str, metric: str) -> dict:  # type: ignore[no-untyped-def]
    (row,) = [r for r in df.to_dicts() if r["scenario"] == scenario and r["metric"] == metric]
    return row  # type: ignore[no-any-return]


def test_one_scenario_runs_pair_whatever_their_names(three_runs: Warehouse) -> None:
    df = compare_runs(three_runs, R1, R3)
    assert set(df["scenario"]) == {"old"} and set(df["scenario_b"]) == {"renamed"}
    ttft = _metric(df, "old", "p99_ttft_s")
    assert (ttft["value_a"], ttft["value_b"], ttft["change"]) == (9.0, 4.5, -4.5)
    assert ttft["relative_change"] == pytest.approx(-0.5)
    # r1: 10 output tokens over 10 s in both runs
    tput = _metric(df, "old", "output_tokens_per_s")
    assert (tput["value_a"], tput["value_b"], tput["change"]) == (1.0, 1.0, 0.0)
    text = format_comparison(df)
    assert "old (B: renamed)" in text
    assert "p99 TTFT" in text and "-4,500 ms" in text and "-50.0%" in text and "better" in text


def test_scenarios_pair_by_name_and_a_run_against_itself_changes_nothing(
    three_runs: Warehouse,
) -> None:
    df = compare_runs(three_runs, R2, R2)
    assert sorted(set(df["scenario"])) == ["static-4", "vllm-2", "vllm-4", "vllm-4-fast"]
    assert all(c in (0.0, None) for c in df["change"].to_list())
    # vllm-2's TTFTs 0.1 0.2 0.3 0.5: p99 = 0.3 + 0.97 * 0.2
    assert _metric(df, "vllm-2", "p99_ttft_s")["value_a"] == pytest.approx(0.494)
    # vllm-4 served 400 of 1500 prompt tokens from cache
    assert _metric(df, "vllm-4", "prefix_hit_rate")["value_b"] == pytest.approx(400 / 1500)
    # no name in common, 4 scenarios against 1: no pairing to guess, so it says how to pair
    with pytest.raises(PipelineError, match="no scenario name is in both runs .*--by position"):
        compare_runs(three_runs, R2, R1)


def test_unknown_run_names_the_latest(three_runs: Warehouse) -> None:
    with pytest.raises(PipelineError, match=f"no run 'nope' .*latest runs: {R3}, {R2}, {R1}"):
        compare_runs(three_runs, R1, "nope")


def test_compare_command_text_and_json(three_runs: Warehouse) -> None:
    wh = ["--warehouse", str(three_runs.root)]
    r = CliRunner().invoke(cli, ["compare", R1, R3, *wh, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["run_a"] == R1 and out["run_b"] == R3
    p99 = out["scenarios"]["old"]["metrics"]["p99_ttft_s"]
    no_interval = {"change_lo": None, "change_hi": None, "interval": None, "within_noise": None}
    # four requests: too few for an interval
    assert p99 == {"a": 9.0, "b": 4.5, "change": -4.5, "relative_change": -0.5, **no_interval}
    assert out == comparison_dict(*compare_paired(three_runs, R1, R3))
    assert out["pairing"]["by"] == "position" and out["pairing"]["pairs"] == [["old", "renamed"]]
    r = CliRunner().invoke(cli, ["compare", R1, R3, R2, *wh])
    assert r.exit_code != 0 and "--by position" in r.output  # R2 shares no name with R1
    r = CliRunner().invoke(cli, ["compare", R1, R3, R2, *wh, "--by", "position"])
    assert r.exit_code == 0, r.output
    assert r.output.count("A = " + R1) == 2 and f"B = {R2}" in r.output
    # R2's first scenario pairs with R1's only one; the other three are named, not drawn
    assert "old (B: static-4)" in r.output
    assert "paired 1 scenario by position; only in B: vllm-2, vllm-4, vllm-4-fast" in r.output


def test_report_draws_both_runs(three_runs: Warehouse, tmp_path: Path) -> None:

    html = build_report(three_runs, R1, output=tmp_path / "c.html", compare=R3).read_text()
    assert 'id="compare"' in html and f"<code>{R3}</code>" in html
    spec = specs(html)["chart-compare-1"]
    runs = {v["run"] for v in spec["data"]["values"]}
    assert runs == {f"A: {R1}", f"B: {R3}"}
    plain = build_report(three_runs, R1, output=tmp_path / "p.html").read_text()
    assert 'id="compare"' not in plain
    with pytest.raises(PipelineError, match="--compare: no run 'nope'"):
        build_report(three_runs, R1, output=tmp_path / "x.html", compare="nope")
