"""How ``compare`` (and ``report --compare``) pairs two runs' scenarios: by name, by position
(said so where name pairing finds nothing), by a mapping; and the errors of a bad one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.compare import compare_paired, pair_scenarios, parse_pairs
from pipeline.contracts import SCENARIOS, SIM_REQUESTS
from pipeline.errors import PipelineError
from pipeline.report import build_report
from pipeline.warehouse import Warehouse
from tests.helpers import config, sim_rows, table, write_run

SHARED = "20240601T000000Z-5555"
PRIORITY = "20240602T000000Z-6666"
MIXED = "20240603T000000Z-7777"
CAPS = (16, 64, 256)  # the order the runs replayed them (not the names' sorted order)


def _write(wh: Warehouse, rid: str, day: int, scenarios: list[tuple[str, int, float]]) -> None:
    """A run of ``scenarios`` (name, cap, TTFT of every request), written in that order."""
    meta = []
    for name, cap, ttft in scenarios:
        rows = sim_rows(name, [0.0, 1.0, 2.0, 3.0], [ttft] * 4, [10.0] * 4, [0] * 4, [0] * 4)
        wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": rid}, name)
        meta.append({"scenario": name, "policy": "vllm", "replicas": 2, "profile": "tiny",
                     "config_json": config(name, "vllm", cap), "summary_json": "{}"})  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": rid}, "scenarios")
    write_run(wh, rid, day)


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """A shared-capacity run and a priority-capacity run of the same three caps (TTFT cap/1000
    and cap/2000 s), and a run sharing one name with the first."""
    w = Warehouse(tmp_path_factory.mktemp("pairing") / "wh")
    w.init()
    _write(w, SHARED, 1, [(f"shared-{c}", c, c / 1000) for c in CAPS])
    _write(w, PRIORITY, 2, [(f"priority-{c}", c, c / 2000) for c in CAPS])
    _write(w, MIXED, 3, [("other", 8, 1.0), ("shared-64", 64, 0.032)])
    return w


def _p99(df, scenario: str) -> dict:  # type: ignore[no-untyped-def]
    (row,) = df.filter((df["scenario"] == scenario) & (df["metric"] == "p99_ttft_s")).to_dicts()
    return row  # type: ignore[no-any-return]


def test_differently_named_runs_pair_by_position_and_say_so(wh: Warehouse) -> None:
    df, pairing = compare_paired(wh, SHARED, PRIORITY)
    assert pairing.by == "position" and "no scenario name is in both runs" in pairing.note
    # the runs' own order: 16 with 16, 64 with 64, 256 with 256
    assert pairing.pairs == [(f"shared-{c}", f"priority-{c}") for c in CAPS]
    for c in CAPS:
        row = _p99(df, f"shared-{c}")
        assert row["scenario_b"] == f"priority-{c}"
        assert (row["value_a"], row["value_b"]) == pytest.approx((c / 1000, c / 2000))
    assert df["value_b"].null_count() == 0  # nothing came out as a dash


def test_by_position_and_by_mapping(wh: Warehouse) -> None:
    _, pairing = compare_paired(wh, SHARED, PRIORITY, by="position")
    assert pairing.by == "position" and not pairing.note
    df, pairing = compare_paired(wh, SHARED, PRIORITY, pairs=[("shared-16", "priority-256")])
    assert pairing.by == "mapping" and pairing.pairs == [("shared-16", "priority-256")]
    assert pairing.a_only == ["shared-64", "shared-256"]
    assert pairing.b_only == ["priority-16", "priority-64"]
    row = _p99(df, "shared-16")
    assert (row["scenario_b"], row["value_b"]) == ("priority-256", pytest.approx(0.128))


def test_names_in_common_pair_by_name_and_the_rest_are_named(wh: Warehouse) -> None:
    df, pairing = compare_paired(wh, SHARED, MIXED)
    assert pairing.by == "name" and pairing.pairs == [("shared-64", "shared-64")]
    assert pairing.a_only == ["shared-16", "shared-256"] and pairing.b_only == ["other"]
    assert _p99(df, "shared-64")["change"] == pytest.approx(0.032 - 0.064)


def test_pairing_errors_say_what_to_give() -> None:
    names_a, names_b = ["a-1", "a-2"], ["b-1", "b-2", "b-3"]
    with pytest.raises(PipelineError, match=r"--by position or --pair SCENARIO_A=SCENARIO_B"):
        pair_scenarios(names_a, names_b)
    with pytest.raises(PipelineError, match=r"run B has no scenario 'nope'; its scenarios: b-1, "):
        pair_scenarios(names_a, names_b, pairs=[("a-1", "nope")])
    only_a = r"run A has no scenario 'b-1'; its scenarios: a-1, a-2$"
    with pytest.raises(PipelineError, match=only_a):
        pair_scenarios(names_a, names_b, pairs=[("b-1", "a-1")])
    with pytest.raises(PipelineError, match=r"run A's scenario 'a-1' is paired twice"):
        pair_scenarios(names_a, names_b, pairs=[("a-1", "b-1"), ("a-1", "b-2")])
    with pytest.raises(PipelineError, match=r"--pair 'a-1': give SCENARIO_A=SCENARIO_B"):
        parse_pairs(["a-1"])
    # by position, the longer run's extra scenarios are named as unpaired
    got = pair_scenarios(names_a, names_b, by="position")
    assert got.pairs == [("a-1", "b-1"), ("a-2", "b-2")] and got.b_only == ["b-3"]


def test_compare_command_says_how_it_paired(wh: Warehouse) -> None:
    where = ["--warehouse", str(wh.root)]
    r = CliRunner().invoke(cli, ["compare", SHARED, PRIORITY, *where])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[2].startswith("paired 3 scenarios by position (no scenario name is in both")
    block = r.output.split("shared-64 (B: priority-64)")[1].split("\n\n")[0]
    (p99,) = [line for line in block.splitlines() if "p99 TTFT" in line]
    assert p99.split()[2:6] == ["64", "ms", "32", "ms"]  # A's and B's, not dashes
    r = CliRunner().invoke(cli, ["compare", SHARED, PRIORITY, *where, "--json", "--pair",
                                 "shared-64=priority-16"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["pairing"]["by"] == "mapping"
    assert out["pairing"]["pairs"] == [["shared-64", "priority-16"]]
    assert set(out["scenarios"]) == {"shared-64"}
    assert out["scenarios"]["shared-64"]["scenario_b"] == "priority-16"
    r = CliRunner().invoke(cli, ["compare", SHARED, PRIORITY, *where, "--pair", "shared-64=x"])
    assert r.exit_code != 0
    assert "run B has no scenario 'x'; its scenarios: priority-16, priority-64, priority-256" in (
        r.output
    )


def test_report_compare_pairs_as_compare_does(wh: Warehouse, tmp_path: Path) -> None:
    html = build_report(wh, SHARED, output=tmp_path / "r.html", compare=PRIORITY).read_text()
    assert "priority-64" in html and "priority-256" in html
    mapped = build_report(
        wh, SHARED, output=tmp_path / "m.html", compare=PRIORITY,
        pairs=[("shared-16", "priority-256")],
    ).read_text()  # fmt: skip
    assert "priority-256" in mapped and "priority-64" in mapped  # B's alone: shown as B's
    r = CliRunner().invoke(
        cli, ["report", SHARED, "--compare", PRIORITY, "--warehouse", str(wh.root),
              "-o", str(tmp_path / "x.html"), "--pair", "nope=priority-16"],
    )  # fmt: skip
    assert r.exit_code != 0 and "run A has no scenario 'nope'" in r.output
