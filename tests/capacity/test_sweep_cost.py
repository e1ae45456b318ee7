"""sweep --gpu-hour-price: each scenario's cost, in the table and in --json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from pipeline.cli import cli


def test_sweep_shows_each_scenarios_cost(
    small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse(60)
    grid = write_grid({"replicas": [1, 3]}, policy="vllm")
    args = ["sweep", str(grid), "--warehouse", str(wh), "-j", "1", "-q"]
    r = CliRunner().invoke(cli, [*args, "--json", "--gpu-hour-price", "2.5"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["scenarios"]
    assert len(out) == 2
    for name, sc in out.items():
        cost, summary, replicas = sc["cost"], sc["summary"], sc["config"]["replicas"]
        # the explicit [cost] table names no GPU kind: one GPU per replica at the flag's price
        assert cost["gpus"] == replicas and cost["usd_per_hour"] == 2.5 * replicas, name
        per_1m = cost["usd_per_hour"] / (summary["output_token_throughput"] * 3600) * 1e6
        assert cost["usd_per_1m_output_tokens"] == per_1m
    r = CliRunner().invoke(cli, [*args, "--gpu-hour-price", "2.5"])
    assert r.exit_code == 0, r.output
    head, *rows = [line for line in r.output.splitlines() if line.strip()][:3]
    assert head.split()[-3:] == ["$/hour", "$/1M", "out"]
    hourly = sorted(row.split()[-2] for row in rows)
    assert hourly == ["$2.50", "$7.50"]
    # no price: no cost columns, and a null cost
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert all(sc["cost"] is None for sc in json.loads(r.stdout)["scenarios"].values())
    r = CliRunner().invoke(cli, args)
    assert "$/hour" not in r.output
    r = CliRunner().invoke(cli, [*args, "--gpu-hour-price", "0"])
    assert r.exit_code != 0 and "--gpu-hour-price" in r.output
