"""Cost in dollars: prices per GPU kind, $/hour, $ per 1M tokens, in every summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.pricing import deployment_cost, format_cost, gpu_kind, gpu_prices, price_of
from pipeline.warehouse import Warehouse
from tests.helpers import build

PROFILE = "llama-3-8b_h100-80gb_tp1"


def test_kind_and_tensor_parallel_from_the_profile_name() -> None:
    assert gpu_kind(PROFILE) == ("h100-80gb", 1)
    assert gpu_kind("llama-3-70b_a100-80gb_tp4") == ("a100-80gb", 4)
    assert gpu_kind("custom") == (None, 1)


def test_cost_worked_by_hand(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("[gpu_prices]\nh100-80gb = 2.5\na100-80gb = 1.5\n")
    prices = gpu_prices(load_config(cfg_file))
    assert price_of(prices, "llama-3-70b_a100-80gb_tp4") == 1.5
    assert price_of(prices, "custom") is None
    summary = {"output_token_throughput": 1000.0, "total_token_throughput": 5000.0}
    cost = deployment_cost(prices, "llama-3-70b_a100-80gb_tp4", 3, summary)
    assert cost is not None
    # 3 replicas x TP 4 = 12 GPUs at $1.5: $18/hour; 3.6M output tokens an hour
    assert cost["gpus"] == 12 and cost["usd_per_hour"] == pytest.approx(18.0)
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(18.0 / 3.6)
    assert cost["usd_per_1m_total_tokens"] == pytest.approx(18.0 / 18.0)
    assert format_cost(cost) == (
        "cost: $18/hour (12 x a100-80gb at $1.5), $5 per 1M output tokens, $1 per 1M total tokens"
    )
    # the flag prices every kind, over the table
    assert price_of(gpu_prices(load_config(cfg_file), 3.0), "custom") == 3.0
    cfg_file.write_text('[gpu_prices]\nh100-80gb = "cheap"\n')
    with pytest.raises(
        ConfigError,
        match=r"c.toml: gpu_prices.h100-80gb must be a finite number in \(0, 1e\+06\], got a str",
    ):
        gpu_prices(load_config(cfg_file))


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("price") / "wh")


def test_replay_prints_and_returns_the_cost(wh: Warehouse, tmp_path: Path) -> None:
    base = ["replay", "--warehouse", str(wh.root), "--policy", "vllm", "--profile", PROFILE,
            "--replicas", "2"]  # fmt: skip
    r = CliRunner().invoke(cli, [*base, "--json", "--gpu-hour-price", "2"])
    assert r.exit_code == 0, r.output
    (scenario,) = json.loads(r.stdout)["scenarios"].values()
    cost, summary = scenario["cost"], scenario["summary"]
    assert cost["gpus"] == 2 and cost["usd_per_hour"] == 4.0
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(
        4.0 / (summary["output_token_throughput"] * 3600) * 1e6
    )
    cfg = tmp_path / "tracereplay.toml"
    cfg.write_text("[gpu_prices]\nh100-80gb = 3.0\n")
    r = CliRunner().invoke(cli, [*base, "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "cost: $6/hour (2 x h100-80gb at $3)" in r.output
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0 and "cost:" not in r.output  # no price, no cost line


def test_report_and_compare_show_costs(wh: Warehouse, tmp_path: Path) -> None:
    from pipeline.compare import compare_runs
    from pipeline.report import build_report
    from tests.helpers import R1, R2

    html = build_report(wh, R2, output=tmp_path / "r.html", gpu_prices={"*": 2.0}).read_text()
    assert "Cost of each deployment" in html and "* $2 per GPU-hour" in html
    assert "123.5" in html  # static-4: $4/hour at 9 output tokens/s
    plain = build_report(wh, R2, output=tmp_path / "p.html").read_text()
    assert "No GPU price given" in plain
    # R1's one scenario pairs with vllm-2: static-4 is A's alone
    pair = [("vllm-2", "old")]
    df = compare_runs(wh, R2, R1, {"*": 2.0}, pairs=pair)
    row = df.filter((df["scenario"] == "static-4") & (df["metric"] == "usd_per_hour")).to_dicts()
    assert row[0]["value_a"] == 4.0 and row[0]["value_b"] is None
    assert "usd_per_hour" not in set(compare_runs(wh, R2, R1, pairs=pair)["metric"])


def test_a_fleet_is_priced_pool_by_pool_at_each_gpu_kind() -> None:
    from pipeline.pricing import format_cost, scenario_cost
    from pipeline.sim.scenario import build_scenario

    sc = build_scenario(
        {
            "name": "mixed",
            "pool": [
                {"name": "chat", "tenants": ["chat"], "replicas": 3},
                {"name": "batch", "replicas": 2, "profile": "llama-3-8b_l40s_tp1"},
            ],
        }
    )
    prices = {"h100-80gb": 2.0, "l40s": 1.0}
    summary = {"output_token_throughput": 1000.0, "pools": {"chat": {}, "batch": {}}}
    cost = scenario_cost(prices, sc, summary)
    assert cost is not None
    assert cost["gpus"] == 5 and cost["usd_per_hour"] == 3 * 2.0 + 2 * 1.0
    assert cost["usd_per_1m_output_tokens"] == 8.0 / 3600 / 1000 * 1e6
    assert cost["pools"]["batch"]["gpu"] == "l40s"
    assert "batch: 2 x l40s" in (format_cost(cost) or "")
    assert scenario_cost({"h100-80gb": 2.0}, sc, summary) is None  # an L40S without a price
