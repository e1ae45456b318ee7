"""pipeline.api: each function gives what its command gives, typed, and fails as it does."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from pipeline import api
from pipeline.cli import cli
from pipeline.errors import ConfigError, PipelineError, ScenarioError, SourceError
from pipeline.report.sql import QueryError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "azure_conv.csv"  # 600 requests of 2023-11-16
SMALL = {"num_requests": 120, "time_scale": 0.25}  # a small, loaded replay


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("TRACEREPLAY_CONFIG", "TRACEREPLAY_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./tracereplay.toml, no ./warehouse


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("api") / "wh"
    counts = api.ingest(str(SAMPLE), warehouse=root)
    assert counts.ok
    return root


def cli_json(*args: str) -> dict[str, Any]:
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_ingest_counts_are_the_commands(tmp_path: Path) -> None:
    counts = api.ingest([SAMPLE], warehouse=tmp_path / "a")
    by_cli = cli_json("ingest", str(SAMPLE), "--warehouse", str(tmp_path / "b"), "--quiet")
    assert counts.ok and counts.errors == []
    assert counts.warehouse == tmp_path / "a"
    for key in ("rows_read", "rows_kept", "rows_quarantined", "rows_duplicate"):
        assert getattr(counts, key) == by_cli[key]
    assert [f.dates for f in counts.files] == [f["dates"] for f in by_cli["files"]]


def test_ingest_of_nothing_raises(tmp_path: Path) -> None:
    with pytest.raises(SourceError):
        api.ingest(tmp_path / "no-such-log.csv", warehouse=tmp_path / "wh")


def test_replay_gives_the_commands_summary(wh: Path) -> None:
    scenario = {"name": "v16", "policy": "vllm", "max_num_seqs": 16}
    run = api.replay(scenario, warehouse=wh, **SMALL)
    by_cli = cli_json(
        "replay", "--warehouse", str(wh), "--name", "v16", "--policy", "vllm",
        "--max-num-seqs", "16", "--num-requests", "120", "--time-scale", "0.25", "--quiet",
    )  # fmt: skip
    assert list(run.scenarios) == ["v16"]
    result = run.scenarios["v16"]
    assert result.summary.figures == by_cli["scenarios"]["v16"]["summary"]
    assert result.config == by_cli["scenarios"]["v16"]["config"]
    assert result.summary.num_requests == 120
    assert result.summary.ttft_p99_s == by_cli["scenarios"]["v16"]["summary"]["ttft_p99_s"]
    assert result.cost is None  # no GPU price given
    stats = by_cli["scenarios"]["v16"]["summary"]["intervals"]["stats"]
    lo, hi = result.summary.interval("tpot_p50_s") or (None, None)
    assert (lo, hi) == (stats["tpot_p50_s"]["lo"], stats["tpot_p50_s"]["hi"])
    assert result.summary.tpot_p50_s is not None and lo <= result.summary.tpot_p50_s <= hi


def test_replay_frames_are_the_runs_rows(wh: Path, tmp_path: Path) -> None:
    toml = tmp_path / "chunky.toml"
    toml.write_text('policy = "vllm"\nmax_num_seqs = 8\n')
    run = api.replay(
        [toml, {"name": "wide", "policy": "vllm"}], warehouse=wh, intervals=False, **SMALL
    )
    assert list(run.scenarios) == ["chunky", "wide"]  # a file's scenario is named by its stem
    for name, result in run.scenarios.items():
        reqs, steps = result.requests, result.steps
        assert reqs.height == result.summary.num_requests == 120
        assert set(reqs["scenario"]) == {name} and set(reqs["run_id"]) == {run.run_id}
        assert reqs["arrival_s"].is_sorted()
        assert steps["num_steps"].sum() == result.summary.figures["num_steps"]
    # a tighter cap queues more
    assert run.scenarios["chunky"].summary.max_queue_depth >= (
        run.scenarios["wide"].summary.max_queue_depth
    )


def test_replay_with_a_price_has_a_cost(wh: Path) -> None:
    run = api.replay(
        {"name": "priced", "policy": "vllm"}, warehouse=wh, intervals=False, gpu_hour_price=2.0,
        **SMALL,
    )  # fmt: skip
    assert run.scenarios["priced"].summary.interval("ttft_p99_s") is None  # intervals off
    cost = run.scenarios["priced"].cost
    assert cost is not None and cost["usd_per_gpu_hour"] == 2.0  # one GPU: llama-3-8b tp1
    assert cost["usd_per_hour"] == 2.0 * cost["gpus"]


@pytest.mark.parametrize("day", ["2023-11-16", date(2023, 11, 16), datetime(2023, 11, 16, 0, 0)])
def test_selection_takes_days_as_text_dates_and_datetimes(wh: Path, day: Any) -> None:
    run = api.replay({"name": "day", "policy": "vllm"}, warehouse=wh, intervals=False,
                     date_from=day, date_to="2023-11-16", **SMALL)  # fmt: skip
    assert run.scenarios["day"].summary.num_requests == 120


def test_selection_errors_name_the_argument(wh: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="date_from: 'yesterday' is not a day or a time"):
        api.replay({"policy": "vllm"}, warehouse=wh, date_from="yesterday")
    with pytest.raises(ConfigError, match="requests_file .*no such file"):
        api.replay({"policy": "vllm"}, warehouse=wh, requests_file=tmp_path / "none.parquet")
    with pytest.raises(PipelineError, match="--where"):
        api.replay({"policy": "vllm"}, warehouse=wh, where="prompt_tokens >")


def test_a_one_name_selection_is_one_name_not_its_letters(wh: Path, tmp_path: Path) -> None:
    rows = api.query("SELECT * EXCLUDE (date) FROM requests", warehouse=wh)
    tenants = pl.Series("tenant", ["chat", "t"] * (rows.height // 2))
    path = tmp_path / "tenants.parquet"
    rows.with_columns(tenants).write_parquet(path)
    run = api.replay({"name": "chat", "policy": "vllm"}, warehouse=wh, requests_file=path,
                     tenants="chat", intervals=False)  # fmt: skip
    assert run.scenarios["chat"].summary.num_requests == rows.height // 2


def test_a_bad_scenario_key_raises_before_anything_runs(wh: Path) -> None:
    with pytest.raises(ScenarioError, match="max_num_seq"):
        api.replay({"policy": "vllm", "max_num_seq": 4}, warehouse=wh)


def test_capacity_answers_as_the_command_does(wh: Path) -> None:
    plan = api.capacity(
        "ttft_p99=2s", searches="concurrency", max_concurrency=32, warehouse=wh,
        policy="vllm", intervals=False, **SMALL,
    )  # fmt: skip
    by_cli = cli_json(
        "capacity", "--warehouse", str(wh), "--slo", "ttft_p99=2s", "--search", "concurrency",
        "--max-concurrency", "32", "--policy", "vllm", "--num-requests", "120",
        "--time-scale", "0.25", "--no-intervals", "--quiet",
    )["searches"]["concurrency"]  # fmt: skip
    found = plan.searches["concurrency"]
    assert list(plan.searches) == ["concurrency"]
    assert (found.knob, found.answer, found.note) == (
        by_cli["knob"],
        by_cli["answer"],
        by_cli["note"],
    )
    assert found.num_probes == len(by_cli["probes"])
    assert plan.slos == ["ttft_p99<=2s"]
    probes = plan.probes
    assert set(probes["run_id"]) == {plan.run_id}
    assert probes.height == found.num_probes  # one SLO: one row per probe
    assert sorted(probes["value"].to_list()) == sorted(p["value"] for p in by_cli["probes"])


def test_capacity_input_errors(wh: Path) -> None:
    with pytest.raises(ConfigError, match="give at least one SLO"):
        api.capacity(warehouse=wh, policy="vllm")
    with pytest.raises(ConfigError, match="unknown search 'widest'"):
        api.capacity({"ttft_p99": "1s"}, searches="widest", warehouse=wh)
    with pytest.raises(ConfigError, match="slos: ttft_p99 = 0.2: give the limit as a string"):
        api.capacity({"ttft_p99": 0.2}, warehouse=wh)  # type: ignore[dict-item]


def test_query_sql_a_named_file_and_typed_params(wh: Path) -> None:
    n = api.query("SELECT count(*) AS n FROM requests", warehouse=wh)
    assert n.to_dicts() == [{"n": 600}]
    typed = api.query("SELECT getvariable('x') + 1 AS y", params={"x": 41}, warehouse=wh)
    assert typed["y"].to_list() == [42]
    summary = api.query(file="trace_summary", warehouse=wh)
    assert summary["num_requests"].to_list() == [600]
    assert api.query("SET VARIABLE a = 1", warehouse=wh).height == 0
    assert isinstance(n, pl.DataFrame)


def test_query_errors(wh: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one of them"):
        api.query("SELECT 1", file="throughput", warehouse=wh)
    with pytest.raises(ConfigError, match="one of them"):
        api.query(warehouse=wh)
    with pytest.raises(QueryError, match="read-only: the statement is a DROP"):
        api.query("DROP VIEW requests", warehouse=wh)
    with pytest.raises(QueryError, match="has no parameter nope"):
        api.query(file="throughput", params={"nope": 1}, warehouse=wh)
    with pytest.raises(PipelineError, match="no warehouse at"):
        api.query("SELECT 1", warehouse=tmp_path / "none")
