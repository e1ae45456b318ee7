"""The replay stage and command, end to end on small warehouses."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import RUNS, SCENARIOS, SIM_REQUESTS, SIM_STEPS, read_table
from pipeline.errors import ScenarioError
from pipeline.sim.replay import replay
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, make_scenario, requests_table

N = 40


def _table(n: int = N, day: int = 1, prefix: str = "r") -> pa.Table:
    rng = np.random.default_rng(day)
    return requests_table(
        rng.integers(10, 400, n),
        rng.integers(1, 50, n),
        rng.exponential(0.05, n),
        start=datetime(2024, 5, day, 12, tzinfo=UTC),
        prefix=prefix,
    )


def _scenario_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    cost = "\n".join(f"{k} = {v!r}" for k, v in H100_8B_COST.items())
    path.write_text(f"{body}\nnum_gpu_blocks = 2000\n\n[cost]\n{cost}\n")
    return path


def test_replay_writes_every_table(warehouse_with: Callable[..., Path]) -> None:
    root = warehouse_with(_table())
    scenarios = [
        make_scenario("vllm", H100_8B_COST, name="v", num_gpu_blocks=2000),
        make_scenario("static", H100_8B_COST, name="s", num_gpu_blocks=2000, max_batch_size=8),
    ]
    result = replay(root, scenarios, quiet=True)
    assert result.num_requests_read == N
    for run in result.runs:
        sim = read_table(run.paths["sim_requests"], SIM_REQUESTS)
        steps = read_table(run.paths["sim_steps"], SIM_STEPS)
        assert sim.num_rows == N == run.summary["completed"]
        assert pc.min(sim["arrival_s"]).as_py() == 0.0
        assert pc.sum(steps["num_steps"]).as_py() == run.summary["num_steps"]
        assert run.paths["sim_requests"].parent.name == f"run_id={result.run_id}"
        e2e = sim["e2e_s"].to_numpy()
        assert np.allclose(e2e, (sim["finished_s"].to_numpy() - sim["arrival_s"].to_numpy()))
        one_token = pc.filter(sim["tpot_s"], pc.equal(sim["output_tokens"], 1))
        assert one_token.null_count == len(one_token) == sim["tpot_s"].null_count
    wh = Warehouse(root)
    (scen_file,) = [p for p in wh.files(SCENARIOS) if result.run_id in str(p)]
    scen = read_table(scen_file, SCENARIOS).to_pylist()
    assert [s["scenario"] for s in scen] == ["v", "s"]
    assert json.loads(scen[1]["config_json"])["max_batch_size"] == 8
    (run_row,) = read_table(root / "runs" / f"{result.run_id}.parquet", RUNS).to_pylist()
    assert run_row["command"] == "replay" and run_row["status"] == "ok"
    assert run_row["rows_read"] == N and run_row["rows_kept"] == 2 * N
    # the DuckDB views see the new run
    con = wh.connect()
    count = con.execute("SELECT count(*) FROM sim_requests WHERE run_id = ?", [result.run_id])
    assert count.fetchone() == (2 * N,)


def test_static_batching_is_slower_than_continuous(warehouse_with: Callable[..., Path]) -> None:
    root = warehouse_with(_table(200))
    result = replay(
        root,
        [
            make_scenario(
                "vllm",
                H100_8B_COST,
                name="v",
                num_gpu_blocks=4000,
                max_num_seqs=16,
                max_num_batched_tokens=4096,
            ),
            make_scenario(
                "static",
                H100_8B_COST,
                name="s",
                num_gpu_blocks=4000,
                max_batch_size=16,
                max_model_len=512,
            ),
        ],
        quiet=True,
    )
    v, s = (r.summary for r in result.runs)
    assert v["request_throughput"] > s["request_throughput"]
    assert v["ttft_p99_s"] < s["ttft_p99_s"]


def test_date_range_and_one_file(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wh = Warehouse(root)
    from pipeline.contracts import REQUESTS

    wh.write(REQUESTS, _table(10, day=1, prefix="a"), {"date": "2024-05-01"}, "src-a")
    p2 = wh.write(REQUESTS, _table(15, day=2, prefix="b"), {"date": "2024-05-02"}, "src-b")
    sc = [make_scenario("vllm", H100_8B_COST, num_gpu_blocks=2000)]
    assert replay(root, sc, quiet=True).num_requests_read == 25
    assert replay(root, sc, quiet=True, date_from=date(2024, 5, 2)).num_requests_read == 15
    assert replay(root, sc, quiet=True, date_to=date(2024, 5, 1)).num_requests_read == 10
    assert replay(root, sc, quiet=True, requests_file=p2).num_requests_read == 15
    with pytest.raises(Exception, match="no requests in warehouse"):
        replay(root, sc, quiet=True, date_from=date(2025, 1, 1))


def test_drawn_requests_get_unique_ids(warehouse_with: Callable[..., Path]) -> None:
    root = warehouse_with(_table(10))
    sc = make_scenario(
        "vllm", H100_8B_COST, num_gpu_blocks=2000, arrivals="poisson", rate=5.0, num_requests=30
    )
    (run,) = replay(root, [sc], quiet=True).runs
    ids = read_table(run.paths["sim_requests"], SIM_REQUESTS)["request_id"]
    assert len(set(ids.to_pylist())) == 30


def test_a_bad_scenario_writes_nothing(warehouse_with: Callable[..., Path]) -> None:
    root = warehouse_with(_table())
    good = make_scenario("vllm", H100_8B_COST, name="good", num_gpu_blocks=2000)
    tight = make_scenario("vllm", H100_8B_COST, name="tight", num_gpu_blocks=3)
    with pytest.raises(ScenarioError, match="tight"):
        replay(root, [good, tight], quiet=True)
    assert not (root / "sim_requests").exists()


def test_cli_prints_a_summary_per_scenario(
    warehouse_with: Callable[..., Path], tmp_path: Path
) -> None:
    root = warehouse_with(_table())
    f = _scenario_file(tmp_path, "small", 'policy = "vllm"\nmax_num_seqs = 8')
    r = CliRunner().invoke(
        cli,
        [
            "replay",
            "--warehouse",
            str(root),
            "--scenario",
            str(f),
            "--scenario",
            str(_scenario_file(tmp_path, "st", 'policy = "static"')),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "small (vllm, 1 replica, custom)" in r.output
    assert "st (static" in r.output
    for word in (
        "req/s",
        "TTFT",
        "TPOT",
        "E2E",
        "p50",
        "p90",
        "p99",
        "(90% intervals) arrivals: a block bootstrap",
        "queue depth max",
        "preemptions",
        "KV peak",
    ):
        assert word in r.output
    r = CliRunner().invoke(
        cli, ["replay", "--warehouse", str(root), "--scenario", str(f), "--quiet", "--no-intervals"]
    )
    assert r.exit_code == 0, r.output
    assert "TTFT p50" in r.output and "TPOT p50" in r.output and "intervals" not in r.output


def test_cli_json_with_flags_overriding_the_file(
    warehouse_with: Callable[..., Path], tmp_path: Path
) -> None:
    root = warehouse_with(_table())
    f = _scenario_file(tmp_path, "x", 'policy = "vllm"\nmax_num_seqs = 8')
    r = CliRunner().invoke(
        cli,
        [
            "replay",
            "--warehouse",
            str(root),
            "--scenario",
            str(f),
            "--max-num-seqs",
            "4",
            "--set",
            "watermark=0.01",
            "--replicas",
            "2",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    config = out["scenarios"]["x"]["config"]
    assert (config["max_num_seqs"], config["watermark"], config["replicas"]) == (4, 0.01, 2)
    summary = out["scenarios"]["x"]["summary"]
    assert summary["completed"] == N
    for key in (
        "request_throughput",
        "output_token_throughput",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "max_queue_depth",
        "mean_queue_depth",
        "num_preemptions",
        "kv_peak_usage",
    ):
        assert key in summary


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "vllm", "--set", "max_batch_size=4"], "max_batch_size is a parameter of"),
        (
            ["--policy", "vllm", "--rate", "-2", "--arrivals", "poisson"],
            "rate must be a finite number in [1e-06, 1e+06], got -2",
        ),
        (["--policy", "vllm", "--set", "nonsense"], "expected KEY=VALUE"),
    ],
)
def test_cli_bad_scenario_is_one_line(
    warehouse_with: Callable[..., Path], args: list[str], message: str
) -> None:
    root = warehouse_with(_table())
    r = CliRunner().invoke(cli, ["replay", "--warehouse", str(root), *args])
    assert r.exit_code == 1
    assert message in r.output
    assert "Traceback" not in r.output
    assert not (root / "sim_requests").exists()


def test_config_replay_section_gives_defaults(
    warehouse_with: Callable[..., Path], tmp_path: Path
) -> None:
    root = warehouse_with(_table())
    cfg = tmp_path / "tracereplay.toml"
    cost = "\n".join(f"{k} = {v!r}" for k, v in H100_8B_COST.items())
    cfg.write_text(f"[replay]\nnum_gpu_blocks = 2000\nseed = 7\n\n[replay.cost]\n{cost}\n")
    r = CliRunner().invoke(
        cli,
        ["replay", "--warehouse", str(root), "--config", str(cfg), "--policy", "orca", "--json"],
    )
    assert r.exit_code == 0, r.output
    config = json.loads(r.stdout)["scenarios"]["orca"]["config"]
    assert (config["num_gpu_blocks"], config["seed"], config["profile"]) == (2000, 7, "custom")
