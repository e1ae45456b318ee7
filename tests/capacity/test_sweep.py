"""Sweeps: every scenario under one run id, in parallel, on Ray, and failures kept apart."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

import pipeline.plan.tasks
from pipeline.cli import cli
from pipeline.contracts import RUNS, SCENARIOS, SIM_REQUESTS, SIM_STEPS, read_table
from pipeline.plan.grid import load_grid
from pipeline.plan.sweep import sweep
from pipeline.warehouse import Warehouse
from tests.helpers import assert_nested_close
from tests.ray_cluster import local_ray_cluster

AXES = {"policy": ["static", "vllm"], "concurrency": [4, 32], "rate_scale": [1, 3]}
NAMES = [
    f"{p}-c{c}-x{x}" for p in ("static", "vllm") for c in (4, 32) for x in (1, 3)
]  # grid order


def _summaries(result: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for o in result.outcomes:
        s = dict(o.run.summary)
        out[o.name] = s
    return out


def test_every_scenario_lands_under_one_run_id(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse()
    grid = load_grid(write_grid(AXES, slo={"ttft_p99": "500ms"}))
    result = sweep(wh, grid, jobs=2, quiet=True)
    assert result.ok and result.executor == "2 local processes"
    assert [o.name for o in result.outcomes] == NAMES
    w = Warehouse(wh)
    for o in result.outcomes:
        assert o.run is not None
        sim = read_table(o.run.paths["sim_requests"], SIM_REQUESTS)
        steps = read_table(o.run.paths["sim_steps"], SIM_STEPS)
        assert sim.num_rows == 300 == o.run.summary["completed"]
        assert pc.sum(steps["num_steps"]).as_py() == o.run.summary["num_steps"]
        assert o.run.paths["sim_requests"].parent.name == f"run_id={result.run_id}"
        # goodput and the verdict are in the summary the scenarios table keeps
        assert o.run.summary["slo_met"] == (o.run.summary["ttft_p99_s"] <= 0.5)
        assert o.slo is not None and o.run.summary["goodput"] == o.slo.goodput
    (scen_file,) = [p for p in w.files(SCENARIOS) if result.run_id in str(p)]
    scen = read_table(scen_file, SCENARIOS).to_pylist()
    assert [s["scenario"] for s in scen] == NAMES
    assert json.loads(scen[1]["config_json"])["time_scale"] == pytest.approx(1 / 3)
    (run_row,) = read_table(wh / "runs" / f"{result.run_id}.parquet", RUNS).to_pylist()
    assert run_row["command"] == "sweep" and run_row["status"] == "ok"
    assert run_row["rows_kept"] == 300 * len(NAMES)
    assert json.loads(run_row["details"])["failures"] == {}
    con = w.connect()
    got = con.execute(
        "SELECT count(DISTINCT scenario), count(*) FROM sim_requests WHERE run_id = ?",
        [result.run_id],
    ).fetchone()
    assert got == (len(NAMES), 300 * len(NAMES))


def test_parallel_equals_serial(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse()
    grid = load_grid(write_grid(AXES))
    serial = sweep(wh, grid, jobs=1, quiet=True)
    parallel = sweep(wh, grid, jobs=2, quiet=True)
    assert serial.executor == "this process"
    assert _summaries(serial) == _summaries(parallel)
    a = read_table(serial.outcomes[5].run.paths["sim_requests"], SIM_REQUESTS)
    b = read_table(parallel.outcomes[5].run.paths["sim_requests"], SIM_REQUESTS)
    assert a.equals(b)


def _fail_one(name: str, how: str) -> Callable[..., Any]:
    real = pipeline.plan.tasks.run_prepared

    def run_prepared(sc: Any, prep: Any, *slos: Any) -> Any:
        if sc.name == name:
            if how == "die":
                os._exit(3)  # the worker process dies, as if killed
            raise RuntimeError("boom")
        return real(sc, prep, *slos)

    return run_prepared


@pytest.mark.parametrize(("how", "message"), [("raise", "RuntimeError: boom"), ("die", "died")])
def test_one_failing_scenario_does_not_lose_the_others(
    small_warehouse: Callable[..., Path],
    write_grid: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    message: str,
) -> None:
    wh = small_warehouse(100)
    # forked workers inherit the patched module
    monkeypatch.setattr(pipeline.plan.tasks, "run_prepared", _fail_one("vllm-c4-x3", how))
    r = CliRunner().invoke(
        cli, ["sweep", str(write_grid(AXES)), "--warehouse", str(wh), "--jobs", "2"]
    )
    assert r.exit_code == 1, r.output
    assert "failed: vllm-c4-x3:" in r.output and message in r.output
    assert "7 of 8 scenario(s) written" in r.output
    w = Warehouse(wh)
    written = {p.stem for p in w.files(SIM_REQUESTS)}
    assert written == set(NAMES) - {"vllm-c4-x3"}
    (run_file,) = w.files(RUNS)
    (row,) = read_table(run_file, RUNS).to_pylist()
    assert row["status"] == "partial"
    assert list(json.loads(row["details"])["failures"]) == ["vllm-c4-x3"]


def test_command_json_and_dry_run(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse(50)
    grid = write_grid(AXES, slo={"ttft_p99": "1s"})
    r = CliRunner().invoke(cli, ["sweep", str(grid), "--warehouse", str(wh), "--dry-run"])
    assert r.exit_code == 0 and "8 scenario(s)" in r.output
    assert not (wh / "runs").exists()
    r = CliRunner().invoke(
        cli,
        ["sweep", str(grid), "--warehouse", str(wh), "-j", "2", "--json", "--slo", "e2e_p50=9s"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["slos"] == ["ttft_p99<=1s", "e2e_p50<=9s"] and out["failures"] == {}
    assert out["scenarios"]["static-c32-x3"]["axes"] == {
        "policy": "static",
        "concurrency": 32,
        "rate_scale": 3,
    }
    assert out["scenarios"]["vllm-c4-x1"]["summary"]["completed"] == 50


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    with local_ray_cluster() as address:
        yield address


@pytest.mark.slow
def test_sweep_on_a_local_ray_cluster(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path], ray_cluster: str
) -> None:
    wh = small_warehouse(100)
    grid = load_grid(write_grid(AXES))
    local = sweep(wh, grid, jobs=2, quiet=True)
    on_ray = sweep(wh, grid, ray_address=ray_cluster, quiet=True)
    assert on_ray.ok and on_ray.executor == f"ray {ray_cluster}", on_ray.failures
    assert _summaries(on_ray) == _summaries(local)
    assert {p.stem for p in Warehouse(wh).files(SIM_REQUESTS) if on_ray.run_id in str(p)} == set(
        NAMES
    )


def test_scenarios_in_parts_write_what_whole_scenarios_write(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    """``--shards``: each scenario replayed in replica groups (round_robin: exact) writes the
    rows and figures of its whole replay, SLO verdicts and goodput included."""
    wh = small_warehouse(n=600, rate=60.0)
    axes = {"replicas": [2, 4]}
    slo = {"ttft_p99": "500ms", "tpot_mean": "40ms"}
    grid = load_grid(write_grid(axes, slo=slo, policy="vllm", router="round_robin"))
    whole = sweep(wh, grid, jobs=1, quiet=True)
    parts = sweep(wh, grid, jobs=2, quiet=True, shards=2)
    assert whole.ok and parts.ok and parts.executor == "2 local processes, each scenario in parts"
    for a, b in zip(whole.outcomes, parts.outcomes, strict=True):
        assert a.run is not None and b.run is not None and a.slo is not None and b.slo is not None
        sa, sb = dict(a.run.summary), dict(b.run.summary)
        assert_nested_close(sb.pop("classes"), sa.pop("classes"), "classes")
        assert sb.pop("sharding")["exact"]
        measured_a, measured_b = sa.pop("slo"), sb.pop("slo")
        for key, entry in measured_a.items():
            assert measured_b[key]["met"] == entry["met"]
            assert measured_b[key]["measured_s"] == pytest.approx(entry["measured_s"], rel=1e-12)
        assert sb["num_good"] == sa["num_good"] == b.slo.num_good == a.slo.num_good
        assert sb == sa
        assert (b.slo.met, b.offered_rate) == (a.slo.met, a.offered_rate)
        files = sorted(b.run.paths["sim_requests"].parent.glob(f"{b.name}.*parquet"))
        assert [f.name for f in files] == [f"{b.name}.part-{k:05d}.parquet" for k in range(2)]
        rows = sum(read_table(f, SIM_REQUESTS).num_rows for f in files)
        assert rows == read_table(a.run.paths["sim_requests"], SIM_REQUESTS).num_rows == 600


def test_scenarios_that_cannot_run_in_parts_are_refused_before_writing(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse()
    grid = write_grid({"replicas": [2]})
    before = sorted(p.name for p in (wh / "runs").iterdir()) if (wh / "runs").exists() else []
    args = ["sweep", str(grid), "--warehouse", str(wh), "--quiet", "--shards", "2"]
    res = CliRunner().invoke(cli, [*args[:-1], "0", "--slo", "ttft_p99=1s"])
    assert res.exit_code == 1 and "--shards" in res.output, res.output
    assert "Traceback" not in res.output
    after = sorted(p.name for p in (wh / "runs").iterdir()) if (wh / "runs").exists() else []
    assert after == before
