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
