"""The kv_tiers query and the report's KV offloading section, on a small replay of shared
prefixes with a GPU cache too small for them, with a CPU tier and without one: the view's
buckets sum the sim_steps rows the replay wrote (summed here in Python), they add up to the
replay's summary and to sim_requests' per-request tier columns, and a run without a tier
has no rows and no section."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from pipeline.contracts import REQUESTS
from pipeline.report import build_report
from pipeline.report.charts.features import TIER_MEASURES
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import BASE, requests_table, specs

BLOCK = 16
KV = 4096  # KV bytes per token
TIER_GB = 2000 * KV * BLOCK / 2**30  # a CPU tier of 2,000 blocks
GRID = {
    "base": {**BASE, "policy": "vllm", "num_gpu_blocks": 400, "block_size": BLOCK,
             "enable_prefix_caching": True, "kv_offloading_kv_bytes_per_token": KV,
             "kv_offloading_link_gb_s": 25.0},
    "axes": {"kv_offloading_size_gb": [0.0, TIER_GB]},
}  # fmt: skip


def _requests(n: int = 240, seed: int = 5) -> pa.Table:
    """n requests at 8/s, each a prompt of one of 8 shared roots (6 to 20 blocks of it) and a
    few blocks of its own, hashed per block (the GPU cache holds about two roots)."""
    rng = np.random.default_rng(seed)
    roots = [[int(x) for x in rng.integers(1, 2**62, 20)] for _ in range(8)]
    hashes, prompt = [], []
    for i in range(n):
        keys = roots[int(rng.integers(0, 8))][: int(rng.integers(6, 21))]
        keys = keys + [2**62 + i * 8 + b for b in range(int(rng.integers(0, 4)))]
        hashes.append(keys)
        prompt.append(len(keys) * BLOCK)
    table = requests_table(prompt, rng.integers(2, 40, n), rng.exponential(1 / 8.0, n))
    table = table.set_column(
        table.schema.get_field_index("prefix_hashes"),
        "prefix_hashes",
        pa.array(hashes, pa.list_(pa.uint64())),
    )
    return table.set_column(
        table.schema.get_field_index("block_size"), "block_size", pa.array([BLOCK] * n, pa.int32())
    )


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str]:
    from pipeline.plan.grid import build_grid
    from pipeline.sim.replay import replay

    root = tmp_path_factory.mktemp("tiers") / "wh"
    Warehouse(root).write(REQUESTS, _requests(), {"date": "2024-05-01"}, "src-test")
    scenarios = build_grid(GRID, where="tiers.toml").scenarios
    return Warehouse(root), replay(root, scenarios, quiet=True, intervals=False).run_id


def _steps(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict[str, Any]]:
    cur = con.execute(
        "SELECT scenario, start_s, num_prefix_query_tokens, num_prefix_hit_tokens, "
        "cpu_hit_tokens, disk_hit_tokens, tier_load_bytes FROM sim_steps WHERE run_id = ?",
        [run_id],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _tiered_name(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, str]:
    """(the scenario with the tier, the one without)."""
    rows = con.execute(
        "SELECT scenario, config_json FROM scenarios WHERE run_id = ?", [run_id]
    ).fetchall()
    on = [name for name, cfg in rows if json.loads(cfg).get("kv_tier_cpu_blocks", 0) > 0]
    off = [name for name, _ in rows if name not in on]
    assert len(on) == 1 and len(off) == 1
    return on[0], off[0]


def test_the_view_sums_the_steps_per_bucket(tiered: tuple[Warehouse, str]) -> None:
    wh, run_id = tiered
    con = wh.connect()
    on, off = _tiered_name(con, run_id)
    df = query(con, "kv_tiers", run_id=run_id, bucket_s=2.0)
    assert set(df["scenario"]) == {on}  # the scenario without a tier has no rows
    buckets: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in _steps(con, run_id):
        if r["scenario"] == on:
            buckets[2.0 * (r["start_s"] // 2.0)].append(r)
    want = []
    for start, rows in sorted(buckets.items()):
        q = sum(r["num_prefix_query_tokens"] for r in rows)
        loaded = sum(r["tier_load_bytes"] for r in rows)
        if q == 0 and loaded == 0:
            continue
        gpu, cpu, disk = (
            sum(r[c] for r in rows)
            for c in ("num_prefix_hit_tokens", "cpu_hit_tokens", "disk_hit_tokens")
        )
        want.append({
            "bucket_start_s": start, "bucket_s": 2.0, "query_tokens": q, "gpu_hit_tokens": gpu,
            "cpu_hit_tokens": cpu, "disk_hit_tokens": disk,
            "gpu_hit_rate": pytest.approx(gpu / q), "cpu_hit_rate": pytest.approx(cpu / q),
            "disk_hit_rate": pytest.approx(disk / q), "tier_load_bytes": loaded,
            "cpu_tier_blocks": 2000, "disk_tier_blocks": 0,
        })  # fmt: skip
    got = [{k: row[k] for k in want[0]} for row in df.iter_rows(named=True)]
    assert got == want
    assert df["cpu_hit_tokens"].sum() > 0  # the tier served hits the GPU had evicted
    assert df["disk_hit_tokens"].sum() == 0  # (no disk tier)
    # every loaded block is whole: KV * BLOCK bytes per block of hit tokens
    assert df["tier_load_bytes"].sum() == df["cpu_hit_tokens"].sum() * KV


def test_the_view_adds_up_to_the_summary_and_the_requests(tiered: tuple[Warehouse, str]) -> None:
    wh, run_id = tiered
    con = wh.connect()
    on, off = _tiered_name(con, run_id)
    df = query(con, "kv_tiers", run_id=run_id)
    (summary_json,) = con.execute(
        "SELECT summary_json FROM scenarios WHERE run_id = ? AND scenario = ?", [run_id, on]
    ).fetchone()
    tiers = json.loads(summary_json)["kv_tiers"]
    assert df["cpu_hit_tokens"].sum() == tiers["cpu_hit_tokens"] > 0
    assert df["tier_load_bytes"].sum() == tiers["tier_load_bytes"]
    per_request = dict(
        con.execute(
            "SELECT scenario, sum(cpu_hit_tokens) FROM sim_requests WHERE run_id = ? GROUP BY 1",
            [run_id],
        ).fetchall()
    )
    assert per_request == {on: tiers["cpu_hit_tokens"], off: 0}


def test_the_report_draws_the_tier_section(tiered: tuple[Warehouse, str], tmp_path: Path) -> None:
    wh, run_id = tiered
    html = build_report(wh, run_id, output=tmp_path / "t.html").read_text()
    assert '<section id="kv_tiers">' in html
    rows = specs(html)["chart-kv_tiers-1"]["data"]["values"]
    df = query(wh.connect(), "kv_tiers", run_id=run_id)
    loaded = sum(r["value"] for r in rows if r["measure"] == TIER_MEASURES["load_mb"])
    assert loaded == pytest.approx(df["tier_load_bytes"].sum() / 1e6)
    got = sorted(
        (r["bucket_start_s"], r["value"])
        for r in rows
        if r["measure"] == TIER_MEASURES["cpu_hit_rate"]
    )
    assert got == sorted(zip(df["bucket_start_s"], df["cpu_hit_rate"], strict=True))
    assert any(value > 0 for _, value in got)
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import load_schema

    error = validate_jsonschema(specs(html)["chart-kv_tiers-1"], load_schema(), raise_error=False)
    assert error is None, error.message if error else ""


def test_a_run_without_a_tier_has_no_rows_and_no_section(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    assert query(tiny_warehouse.connect(), "kv_tiers").height == 0
    page = build_report(tiny_warehouse, output=tmp_path / "t.html").read_text()
    assert '<section id="kv_tiers">' not in page
    assert '<section id="engine">' in page  # the sections around it are still there
