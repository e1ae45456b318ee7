"""Capacity on an autoscaled scenario (plan/autoscale_plan.py): the fewest fixed replicas
beside one autoscaled replay, written under one run id.

The fixed answer must be what the plain replicas search finds for the scenario without
its autoscale table; the fixed GPU-hours are that count over the autoscaled replay's
span; the autoscaled figures are its replay summary's, as written in the scenarios
table; the runs row carries the comparison.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import ConfigError
from pipeline.plan.autoscale_plan import fixed_values, run_autoscale_capacity
from pipeline.plan.capacity import SearchSpec, run_capacity
from pipeline.plan.slo import parse_slos
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST

TABLE = {"min_replicas": 1, "max_replicas": 4, "target": 2, "interval_s": 1, "startup_s": 3}


def _values(**over: Any) -> dict[str, Any]:
    return {
        "name": "auto",
        "policy": "vllm",
        "cost": H100_8B_COST,
        "num_gpu_blocks": 2000,
        "max_model_len": 4096,
        "max_num_seqs": 8,
        "replicas": 1,
        "router": "least_outstanding",
        "autoscale": dict(TABLE),
        **over,
    }


def _one(wh: Path, sql: str, *args: Any) -> Any:
    con = Warehouse(wh).connect()
    try:
        row = con.execute(sql, list(args)).fetchone()
    finally:
        con.close()
    assert row is not None
    return row[0]


def test_fixed_answer_and_autoscaled_figures(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse(n=300, rate=40.0)
    slos = parse_slos(["ttft_p99=2s"])  # 16 replicas: 2.5 req/s each, no queue
    spec = SearchSpec("replicas", lo=1, hi=16)
    result, cmp = run_autoscale_capacity(wh, _values(), slos, spec, quiet=True, intervals=False)
    plain = run_capacity(wh, fixed_values(_values()), slos, [spec], quiet=True, intervals=False)
    assert result.searches[0].answer == plain.searches[0].answer
    assert cmp.fixed_replicas == plain.searches[0].answer
    assert cmp.fixed_replicas is not None
    # no profile: one GPU a replica; the fixed count paid over the autoscaled span
    assert cmp.gpus_per_replica == 1
    assert cmp.fixed_gpu_hours == pytest.approx(cmp.fixed_replicas * cmp.span_s / 3600)
    # the autoscaled replay is a scenario of the run, with its summary's figures
    summary = json.loads(
        _one(
            wh,
            "SELECT summary_json FROM scenarios WHERE run_id = ? AND scenario = ?",
            result.run_id,
            cmp.scenario,
        )
    )
    auto = summary["autoscale"]
    assert cmp.gpu_hours == pytest.approx(auto["gpu_hours"])
    assert cmp.span_s == pytest.approx(auto["end_s"])
    measured = summary["slo"]["ttft_p99"]["measured_s"]
    assert cmp.slo["ttft_p99"]["measured_s"] == pytest.approx(measured)
    assert cmp.all_met == (measured <= 2.0)
    assert set(cmp.during_scale_ups["over_limit"]) == {"ttft_p99"}
    assert cmp.during_scale_ups == auto["during_scale_ups"]
    # the runs row's details carry the comparison
    details = json.loads(_one(wh, "SELECT details FROM runs WHERE run_id = ?", result.run_id))
    assert details["autoscale"]["fixed_replicas"] == cmp.fixed_replicas
    assert details["autoscale"]["gpu_hours"] == pytest.approx(cmp.gpu_hours)
    assert details["autoscale"]["scenario"] == cmp.scenario


def test_the_plain_search_refuses_an_autoscaled_base(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse()
    with pytest.raises(ConfigError, match="autoscale"):
        run_capacity(wh, _values(), parse_slos(["ttft_p99=1s"]), [SearchSpec("replicas")])


def test_only_the_replicas_search_applies(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse()
    with pytest.raises(ConfigError, match="concurrency"):
        run_autoscale_capacity(
            wh, _values(), parse_slos(["ttft_p99=1s"]), SearchSpec("concurrency"), quiet=True
        )


def test_the_command_prints_and_records_the_comparison(
    small_warehouse: Callable[..., Path], tmp_path: Path
) -> None:
    wh = small_warehouse(n=200, rate=40.0)
    scenario = tmp_path / "auto.toml"
    scenario.write_text(
        'name = "auto"\npolicy = "vllm"\nmax_num_seqs = 8\nnum_gpu_blocks = 2000\n'
        "max_model_len = 4096\nreplicas = 1\n\n[cost]\n"
        + "".join(f"{k} = {v!r}\n" for k, v in H100_8B_COST.items())
        + "\n[autoscale]\n"
        + "".join(f"{k} = {v!r}\n" for k, v in TABLE.items())
    )
    args = ["capacity", "--warehouse", str(wh), "--scenario", str(scenario)]
    args += ["--slo", "ttft_p99=2s", "--no-intervals", "--max-replicas", "16"]
    out = CliRunner().invoke(cli, [*args, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["autoscale"]["fixed_replicas"] == data["searches"]["replicas"]["answer"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "autoscaled vs fixed" in text.output and "during scale-ups" in text.output
    refused = CliRunner().invoke(cli, [*args, "--search", "rate"])
    assert refused.exit_code != 0 and "--search rate" in refused.output


def test_an_autoscaled_pool_is_searched_fixed_and_compared(
    small_warehouse: Callable[..., Path],
) -> None:
    """A fleet whose pool 'short' is autoscaled: the pool's fixed count is what the same
    fleet without that pool's autoscale table finds, and its autoscaled share is
    replayed once against it; the fleet check deploys the fixed counts."""
    from pipeline.plan.fleet import run_fleet_capacity

    wh = small_warehouse(n=300, rate=40.0)
    slos = parse_slos(["ttft_p99=2s"])
    common = {k: v for k, v in _values().items() if k not in ("autoscale", "replicas", "name")}

    def fleet(auto: bool) -> dict[str, Any]:
        short = {"name": "short", "max_prompt_tokens": 1000, "replicas": 1}
        if auto:
            short["autoscale"] = dict(TABLE)
        return {**common, "name": "fleet", "pool": [short, {"name": "long", "replicas": 1}]}

    spec = [SearchSpec("replicas", lo=1, hi=16)]
    res = run_fleet_capacity(wh, fleet(True), slos, spec, quiet=True, intervals=False)
    plain = run_fleet_capacity(wh, fleet(False), slos, spec, quiet=True, intervals=False)
    short = {p.name: p for p in res.split.pools}["short"]
    plain_short = {p.name: p for p in plain.split.pools}["short"]
    assert short.minimum == plain_short.minimum
    assert short.autoscale is not None and short.autoscale.fixed_replicas == short.minimum
    assert {p.name: p for p in res.split.pools}["long"].autoscale is None
    # the check replays the fleet at fixed counts: no autoscaled pool in it
    assert res.split.check is not None and res.split.check.run is not None
    assert not res.split.check.run.summary["pools"]["short"].get("autoscale")
    details = json.loads(_one(wh, "SELECT details FROM runs WHERE run_id = ?", res.run_id))
    assert details["autoscale"]["short"]["fixed_replicas"] == short.minimum
    assert details["autoscale"]["short"]["scenario"] == short.autoscale.scenario
