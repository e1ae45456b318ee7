"""Grids: expansion, names, derived axes, and every way a grid can be wrong."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import ConfigError, ScenarioError
from pipeline.plan.grid import build_grid, load_grid
from pipeline.plan.slo import parse_slos
from tests.helpers import BASE


def _grid(axes: dict[str, Any], **base: Any) -> Any:
    return build_grid({"base": {**BASE, **base}, "axes": axes}, where="g.toml")


def test_product_names_and_derived_axes() -> None:
    g = build_grid(
        {
            "name": "lab",
            "base": BASE,
            "axes": {
                "policy": ["static", "vllm", "sarathi"],
                "concurrency": [8, 64],
                "rate_scale": [1, 4],
                "sarathi": {"chunk_size": [512, 2048]},
            },
            "slo": {"ttft_p99": "200ms"},
        },
        where="g.toml",
    )
    assert len(g.points) == 2 * 2 + 2 * 2 + 2 * 2 * 2
    names = [p.scenario.name for p in g.points]
    assert len(set(names)) == len(names)
    assert names[0] == "lab-static-c8-x1" and names[-1] == "lab-sarathi-c64-x4-chunk_size-2048"
    by_name = {p.scenario.name: p.scenario for p in g.points}
    assert by_name["lab-static-c64-x1"].params.max_batch_size == 64
    assert by_name["lab-vllm-c8-x4"].params.max_num_seqs == 8
    assert by_name["lab-vllm-c8-x4"].arrivals.time_scale == 0.25
    assert by_name["lab-sarathi-c8-x1-chunk_size-512"].params.chunk_size == 512
    assert [str(s) for s in g.slos] == ["ttft_p99<=200ms"]


def test_rate_scale_multiplies_a_base_rate_and_divides_a_base_time_scale() -> None:
    (p,) = _grid({"rate_scale": [2.0]}, rate=5.0).points
    assert p.scenario.arrivals.rate == 10.0 and p.scenario.arrivals.time_scale == 1.0
    (q,) = _grid({"rate_scale": [2.0]}, time_scale=0.5).points
    assert q.scenario.arrivals.time_scale == 0.25


def test_only_varying_axes_name_a_scenario_and_extra_slos_replace() -> None:
    g = build_grid(
        {"base": BASE, "axes": {"policy": ["vllm"], "replicas": [1, 2]}, "slo": {"ttft_p99": "1s"}},
        extra_slos=parse_slos(["ttft_p99=2s", "tpot_p50=20ms"]),
    )
    assert [p.scenario.name for p in g.points] == ["r1", "r2"]
    assert [str(s) for s in g.slos] == ["ttft_p99<=2s", "tpot_p50<=20ms"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"base": BASE}, "[axes] is empty"),
        ({"base": BASE, "axes": {}}, "[axes] is empty"),
        ({"base": BASE, "axes": {"replicas": []}}, "[axes] replicas is empty"),
        ({"base": BASE, "axes": {"replicas": 2}}, "replicas must be a list of values"),
        ({"base": BASE, "axes": {"max_num_seq": [1]}}, "unknown axis 'max_num_seq'; allowed:"),
        ({"base": BASE, "axes": {"name": ["a"]}}, "name cannot be an axis"),
        ({"base": BASE, "axis": {"replicas": [1]}}, "unknown key(s) axis; a grid has"),
        ({"base": BASE, "axes": {"policy": ["vllm", "fast"]}}, "unknown policy 'fast'"),
        (
            {"base": BASE, "axes": {"policy": ["static", "vllm"], "max_num_seqs": [8]}},
            "max_num_seqs is not a parameter of static",
        ),
        (
            {"base": BASE, "axes": {"policy": ["vllm"], "orca": {"max_num_seqs": [8]}}},
            "[axes.orca]: the grid has no orca points",
        ),
        (
            {"base": BASE, "axes": {"concurrency": [8], "max_num_seqs": [16]}},
            "the concurrency axis sets max_num_seqs of vllm",
        ),
        ({"base": BASE, "axes": {"rate_scale": [1], "rate": [2.0]}}, "give rate_scale or rate"),
        ({"base": BASE, "axes": {"rate_scale": [0]}}, "rate_scale values must be > 0"),
        (
            {"base": BASE, "axes": {"replicas": [1]}, "slo": {"ttft_p99": "200 parsecs"}},
            "unknown unit 'parsecs'",
        ),
        ({"base": BASE, "axes": {"replicas": [1]}, "slo": {"ttft_p99": "200"}}, "give a unit"),
    ],
)
def test_bad_grids_name_the_problem(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build_grid(raw, where="g.toml")
    assert message in str(exc.value) and str(exc.value).startswith("g.toml")


def test_a_bad_point_names_the_scenario_and_the_key() -> None:
    with pytest.raises(ScenarioError, match=r"g\.toml \[r0\]: replicas must be >= 1"):
        _grid({"replicas": [0, 1]})


def test_a_bad_grid_fails_before_running_and_writes_nothing(
    tmp_path: Path, small_warehouse: Callable[..., Path], write_grid: Callable[..., Path]
) -> None:
    wh = small_warehouse(20)
    grid = write_grid({"concurrency": [8, 16]}, slo={"ttft_p99": "200 fortnights"})
    before = sorted(p.relative_to(wh) for p in wh.rglob("*"))
    r = CliRunner().invoke(cli, ["sweep", str(grid), "--warehouse", str(wh)])
    assert r.exit_code == 1
    assert "unknown unit 'fortnights'; allowed units: us, ms, s" in r.output
    assert len(r.output.strip().splitlines()) == 1
    # the warehouse lock's file is not data
    after = sorted(p.relative_to(wh) for p in wh.rglob("*") if p.name != ".lock")
    assert after == before


def test_load_grid_reads_toml_and_reports_bad_toml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_grid(bad)


# --- the swap-space and speculation knobs (docs/replay.md, "Swap preemption",
# "Speculative decoding") ---------------------------------------------------------------

# swap preemption with a [cost] table needs the KV bytes and the link; V0 had no async
# scheduling, and swapping cached blocks is not modelled
SWAP_BASE = {"swap_kv_bytes_per_token": 131072, "swap_link_gb_s": 25.0,
             "async_scheduling": False, "enable_prefix_caching": False}  # fmt: skip
SPEC_BASE = {"async_scheduling": False, "speculative": {"method": "eagle", "acceptance": 0.7}}


def test_the_swap_space_axis_sizes_each_points_host_memory() -> None:
    g = _grid({"swap_space_gb": [1, 4.5]}, preemption_mode="swap", **SWAP_BASE)
    assert [p.scenario.name for p in g.points] == ["swap1", "swap4.5"]
    for p, gb in zip(g.points, (1, 4.5), strict=True):
        sw = p.scenario.swap
        assert sw is not None and p.scenario.params.swap_space_gb == gb
        block_bytes = SWAP_BASE["swap_kv_bytes_per_token"] * p.scenario.memory.block_size
        assert sw.block_bytes == block_bytes
        assert sw.host_blocks == int(gb * 2**30) // block_bytes


def test_the_speculation_axes_set_k_and_the_acceptance_of_the_base_table() -> None:
    g = _grid({"spec_num_tokens": [1, 4], "spec_acceptance": [0.5, 0.9]}, **SPEC_BASE)
    got = {p.scenario.name: p.scenario.speculative for p in g.points}
    assert list(got) == ["k1-acc0.5", "k1-acc0.9", "k4-acc0.5", "k4-acc0.9"]
    for p in g.points:
        spec = p.scenario.speculative
        assert spec is not None and spec.method == "eagle"
        k, rate = p.coords["spec_num_tokens"], p.coords["spec_acceptance"]
        assert (spec.num_tokens, spec.acceptance) == (k, (rate,) * k)
    # k alone: the base table's one rate at every position
    (one,) = _grid({"spec_num_tokens": [3]}, **SPEC_BASE).points
    assert one.scenario.speculative is not None
    assert one.scenario.speculative.acceptance == (0.7,) * 3


@pytest.mark.parametrize(
    ("axes", "base", "message"),
    [
        ({"swap_space_gb": [1, 4]}, SWAP_BASE,
         "the swap_space_gb axis does nothing with preemption_mode = 'recompute'"),
        ({"swap_space_gb": [-1]}, {**SWAP_BASE, "preemption_mode": "swap"},
         "[axes] swap_space_gb must be a finite number in [0, 1e+06], got -1"),
        ({"swap_space_gb": [True]}, {**SWAP_BASE, "preemption_mode": "swap"},
         "swap_space_gb must be a finite number"),
        ({"policy": ["vllm", "sglang"], "swap_space_gb": [1]},
         {**SWAP_BASE, "preemption_mode": "swap"}, "swap_space_gb is not a parameter of sglang"),
        ({"policy": ["sglang"], "spec_num_tokens": [2]}, {},
         "spec_num_tokens: speculative decoding is modelled for policy vllm only, not sglang"),
        ({"spec_num_tokens": [1, 3]}, {"async_scheduling": False},
         "give the rest in [base.speculative], at least method"),
        ({"spec_num_tokens": [0]}, SPEC_BASE, "spec_num_tokens values must be whole numbers 1 to"),
        ({"spec_num_tokens": [2.5]}, SPEC_BASE, "got 2.5"),
        ({"spec_num_tokens": [99]}, SPEC_BASE, "got 99"),
        ({"spec_acceptance": [1.5]}, SPEC_BASE,
         "[axes] spec_acceptance must be a finite number in [0, 1], got 1.5"),
        ({"spec_acceptance": [float("nan")]}, SPEC_BASE, "spec_acceptance must be a finite"),
        ({"spec_acceptance": ["high"]}, SPEC_BASE, "spec_acceptance must be a finite"),
        ({"spec_num_tokens": [2, 3]},
         {"async_scheduling": False,
          "speculative": {"method": "eagle", "acceptance": [0.7, 0.6, 0.5]}},
         "acceptance is a list of one rate per position"),
    ],
)  # fmt: skip
def test_bad_swap_and_speculation_axes_are_one_line(
    axes: dict[str, Any], base: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        _grid(axes, **base)
    text = str(exc.value)
    assert message in text and text.startswith("g.toml: ") and "\n" not in text
