"""The swaps, speculation and sched_cpu queries, and the report's sections over them, on
the hand-written run of tests/helpers.py's ``build_features``: every figure is summed here,
in Python, from the sim_steps rows written (``feature_steps``), and a few are worked out by
hand beside it. A run without the features (the tiny warehouse) shows none of the sections.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from pipeline.report import build_report
from pipeline.report.charts.features import SPEC_MEASURES, SWAP_MEASURES
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import (
    BASE,
    FEATURE_EXTRAS,
    R3,
    SWAP_BLOCK_BYTES,
    SWAP_LINK_BYTES_PER_S,
    feature_steps,
    small_warehouse_at,
    specs,
)


@pytest.fixture(scope="module")
def con(features_warehouse: Warehouse) -> duckdb.DuckDBPyConnection:
    return features_warehouse.connect()


def _buckets(rows: list[dict[str, Any]], width: float, *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[(*(r[k] for k in keys), width * (r["start_s"] // width))].append(r)
    return dict(out)


def test_swaps_per_replica_and_bucket_sum_the_steps(con: duckdb.DuckDBPyConnection) -> None:
    df = query(con, "swaps", bucket_s=2.0)
    steps = [r for rows in feature_steps().values() for r in rows]
    want = []
    for (scenario, replica, start), rows in sorted(
        _buckets(steps, 2.0, "scenario", "replica").items()
    ):
        out = sum(r["swap_out_bytes"] or 0 for r in rows)
        back = sum(r["swap_in_bytes"] or 0 for r in rows)
        if out + back == 0:
            continue
        want.append({
            "scenario": scenario, "replica": replica, "bucket_start_s": start, "bucket_s": 2.0,
            "num_preemptions": sum(r["num_preemptions"] for r in rows),
            "swap_out_bytes": out, "swap_in_bytes": back,
            "swap_out_blocks": out // SWAP_BLOCK_BYTES, "swap_in_blocks": back // SWAP_BLOCK_BYTES,
            "swap_s": pytest.approx((out + back) / SWAP_LINK_BYTES_PER_S),
            "swap_share": pytest.approx(
                (out + back) / SWAP_LINK_BYTES_PER_S / sum(r["duration_s"] for r in rows)
            ),
        })  # fmt: skip
    got = [{k: row[k] for k in want[0]} for row in df.iter_rows(named=True)]
    assert got == want
    # by hand: replica 0 moved 4 blocks out and back in [0, 2): 8,000 bytes at 10 kB/s,
    # 0.8 s of its 2 s of steps
    assert (want[0]["replica"], want[0]["swap_s"], want[0]["swap_share"]) == (0, 0.8, 0.4)
    # only the scenario that swapped: the recompute one preempted, but moved nothing
    assert set(df["scenario"]) == {"swap"}
    # replica 1's recomputed preemption at 1.5 s counts beside its swap at 0.5 s
    assert df.filter(df["replica"] == 1)["num_preemptions"].to_list() == [2]


def test_swaps_default_bucket_is_a_round_width(con: duckdb.DuckDBPyConnection) -> None:
    df = query(con, "swaps")
    # the swapping scenario ends at 4 s: 0.1 s x 300 covers it
    assert set(df["bucket_s"]) == {0.1}
    assert df["swap_out_bytes"].sum() == 7000 and df["swap_in_bytes"].sum() == 4000


def test_speculation_per_bucket_sums_the_steps(con: duckdb.DuckDBPyConnection) -> None:
    df = query(con, "speculation", bucket_s=2.0)
    steps = [r for r in feature_steps()["spec"] if r["num_draft_tokens"]]
    want = []
    for (_, start), rows in sorted(_buckets(steps, 2.0, "scenario").items()):
        n = sum(r["num_steps"] for r in rows)
        drafts = sum(r["num_draft_tokens"] for r in rows)
        acc = sum(r["num_accepted_tokens"] for r in rows)
        want.append({
            "scenario": "spec", "bucket_start_s": start, "num_steps": n, "draft_tokens": drafts,
            "accepted_tokens": acc, "acceptance_rate": pytest.approx(acc / drafts),
            "draft_per_step": pytest.approx(drafts / n),
            "accepted_per_step": pytest.approx(acc / n),
            "num_tokens": FEATURE_EXTRAS["spec"]["speculative"]["num_tokens"],
            "method": "eagle",
        })  # fmt: skip
    got = [{k: row[k] for k in want[0]} for row in df.iter_rows(named=True)]
    assert got == want
    # by hand: [0, 2) verified 15 drafts in 3 steps (the prefill step has none), took 10
    assert (want[0]["num_steps"], want[0]["acceptance_rate"]) == (3, 10 / 15)


def test_sched_cpu_per_scenario_sums_the_steps(con: duckdb.DuckDBPyConnection) -> None:
    df = query(con, "sched_cpu")
    assert df["scenario"].to_list() == ["cpu-async", "cpu-sync"]  # the others paid none
    for row in df.iter_rows(named=True):
        rows = feature_steps()[row["scenario"]]
        cpu = sum(r["sched_cpu_s"] for r in rows)
        exposed = sum(r["sched_cpu_exposed_s"] for r in rows)
        busy = sum(r["duration_s"] for r in rows)
        assert row["overlap"] is FEATURE_EXTRAS[row["scenario"]]["async_scheduling"]
        assert row["num_steps"] == sum(r["num_steps"] for r in rows)
        assert row["sched_cpu_s"] == pytest.approx(cpu)
        assert row["exposed_s"] == pytest.approx(exposed)
        assert row["hidden_s"] == pytest.approx(cpu - exposed)
        assert row["hidden_share"] == pytest.approx((cpu - exposed) / cpu)
        assert row["exposed_share"] == pytest.approx(exposed / busy)
    # by hand: synchronous hides nothing; async hid 8 of its 9 ms
    assert df["hidden_share"].to_list() == pytest.approx([8 / 9, 0.0])


@pytest.mark.parametrize("name", ["swaps", "speculation", "sched_cpu"])
def test_an_explicit_run_id_and_a_run_without_the_feature(
    con: duckdb.DuckDBPyConnection, name: str
) -> None:
    assert query(con, name, run_id=R3).height > 0
    assert query(con, name, run_id="no-such-run").height == 0


# --- the report's sections -------------------------------------------------------------

FEATURE_SECTIONS = ("swaps", "speculation", "sched_cpu")


@pytest.fixture(scope="module")
def features_html(features_warehouse: Warehouse, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = build_report(features_warehouse, output=tmp_path_factory.mktemp("f") / "f.html")
    return out.read_text()


def _section(page: str, sid: str) -> str:
    part = page[page.index(f'<section id="{sid}">') :]
    return part[: part.index("</section>")]


def test_a_run_with_the_features_shows_their_sections(features_html: str) -> None:
    for sid in FEATURE_SECTIONS:
        assert f'<section id="{sid}">' in features_html, sid
    assert "cpu-async" in _section(features_html, "sched_cpu")
    # the recompute scenario preempted but swapped nothing: not drawn
    assert {r["scenario"] for r in specs(features_html)["chart-swaps-1"]["data"]["values"]} == {
        "swap"
    }


def test_the_swap_chart_sums_the_replicas_and_fills_idle_buckets(
    features_html: str, con: duckdb.DuckDBPyConnection
) -> None:
    rows = specs(features_html)["chart-swaps-1"]["data"]["values"]
    by = defaultdict(float)
    for r in rows:
        by[r["measure"]] += r["value"]
    df = query(con, "swaps")
    assert by[SWAP_MEASURES["out_mb"]] == pytest.approx(df["swap_out_bytes"].sum() / 1e6)
    assert by[SWAP_MEASURES["in_mb"]] == pytest.approx(df["swap_in_bytes"].sum() / 1e6)
    # one row per bucket and measure from 0 to the last bucket with traffic, zeros between
    width = df["bucket_s"][0]
    last = df["bucket_start_s"].max()
    starts = sorted(r["bucket_start_s"] for r in rows if r["measure"] == SWAP_MEASURES["out_mb"])
    assert starts == pytest.approx([k * width for k in range(round(last / width) + 1)])
    # the busiest replica's share: replica 0 at 0 s (4,000 bytes out: 0.4 s of its 1 s step)
    waits = [r for r in rows if r["measure"] == SWAP_MEASURES["wait_share"]]
    wait = {r["bucket_start_s"]: r["value"] for r in waits}
    assert wait[0.0] == pytest.approx(df.filter(df["bucket_start_s"] == 0.0)["swap_share"].max())


def test_the_speculation_chart_draws_the_query(
    features_html: str, con: duckdb.DuckDBPyConnection
) -> None:
    rows = specs(features_html)["chart-speculation-1"]["data"]["values"]
    df = query(con, "speculation")
    got = sorted(
        (r["bucket_start_s"], r["value"])
        for r in rows
        if r["measure"] == SPEC_MEASURES["accepted_per_step"]
    )
    assert got == sorted(zip(df["bucket_start_s"], df["accepted_per_step"], strict=True))


def test_the_sections_match_the_vega_lite_schema(features_html: str) -> None:
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import load_schema

    schema = load_schema()
    for element_id in ("chart-swaps-1", "chart-speculation-1"):
        error = validate_jsonschema(specs(features_html)[element_id], schema, raise_error=False)
        assert error is None, f"{element_id}: {error.message if error else ''}"


def test_a_run_without_the_features_has_none_of_their_sections(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    page = build_report(tiny_warehouse, output=tmp_path / "t.html").read_text()
    for sid in FEATURE_SECTIONS:
        assert f'<section id="{sid}">' not in page, sid
    assert '<section id="engine">' in page  # the sections around them are still there


# --- a real sweep of the knobs: the views against the replay's summaries ----------------

SWAP_GRID = {
    "base": {**BASE, "num_gpu_blocks": 400, "max_num_seqs": 64, "async_scheduling": False,
             "enable_prefix_caching": False, "preemption_mode": "swap",
             "swap_kv_bytes_per_token": 131072, "swap_link_gb_s": 25.0},
    "axes": {"swap_space_gb": [0.05, 4]},
}  # fmt: skip
SPEC_GRID = {
    "base": {**BASE, "async_scheduling": False,
             "speculative": {"method": "eagle", "acceptance": 0.7}},
    "axes": {"spec_num_tokens": [1, 3]},
}  # fmt: skip


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str]:
    """300 requests at 20/s replayed through a sweep of the swap space (a KV cache small
    enough to preempt) and one of k."""
    from pipeline.plan.grid import build_grid
    from pipeline.sim.replay import replay

    root = tmp_path_factory.mktemp("swept") / "wh"
    small_warehouse_at(root, n=300, rate=20.0)
    scenarios = [
        *build_grid(SWAP_GRID, where="swap.toml").scenarios,
        *build_grid(SPEC_GRID, where="spec.toml").scenarios,
    ]
    return Warehouse(root), replay(root, scenarios, quiet=True, intervals=False).run_id


def _summaries(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    rows = con.execute(
        "SELECT scenario, summary_json FROM scenarios WHERE run_id = ?", [run_id]
    ).fetchall()
    return {name: json.loads(text) for name, text in rows}


def test_the_views_add_up_to_the_replays_summaries(swept: tuple[Warehouse, str]) -> None:
    wh, run_id = swept
    con = wh.connect()
    summary = _summaries(con, run_id)
    swaps = query(con, "swaps", run_id=run_id)
    assert set(swaps["scenario"]) == {"swap0.05", "swap4"}
    for name in ("swap0.05", "swap4"):
        mine = swaps.filter(swaps["scenario"] == name)
        assert summary[name]["swap"]["swap_out_bytes"] > 0
        assert mine["swap_out_bytes"].sum() == summary[name]["swap"]["swap_out_bytes"]
        assert mine["swap_in_bytes"].sum() == summary[name]["swap"]["swap_in_bytes"]
        assert mine["swap_share"].max() <= 1.0  # the copies are part of the steps' time
    spec = query(con, "speculation", run_id=run_id)
    assert set(spec["scenario"]) == {"k1", "k3"}
    for name, k in (("k1", 1), ("k3", 3)):
        mine = spec.filter(spec["scenario"] == name)
        assert mine["draft_tokens"].sum() == summary[name]["spec_draft_tokens"]
        assert mine["accepted_tokens"].sum() == summary[name]["spec_accepted_tokens"]
        assert set(mine["num_tokens"]) == {k}
        assert (mine["accepted_tokens"] <= mine["draft_tokens"]).all()


@pytest.mark.parametrize(("kind", "names"), [("swap_space", ("swap0.05", "swap4")),
                                             ("spec_k", ("k1", "k3"))])  # fmt: skip
def test_slo_capacity_finds_the_least_swap_space_and_k_that_meet(
    swept: tuple[Warehouse, str], kind: str, names: tuple[str, str]
) -> None:
    wh, run_id = swept
    con = wh.connect()
    ttft = {
        name: float(np.quantile(np.array(v, dtype=float), 0.99))
        for name, v in con.execute(
            "SELECT scenario, list(ttft_s) FROM sim_requests WHERE run_id = ? GROUP BY 1",
            [run_id],
        ).fetchall()
    }
    a, b = (ttft[n] for n in names)
    assert a != b
    # a limit between the two points' p99 TTFT: one meets it; both do at the larger
    for limit in ((a + b) / 2, max(a, b) * 1.01):
        df = query(con, "slo_capacity", run_id=run_id, slos=json.dumps([f"ttft_p99<={limit}s"]))
        rows = df.filter(df["sweep"] == kind)
        assert sorted(rows["scenario"]) == sorted(names)
        meeting = [n for n in names if ttft[n] <= limit]  # names: the knob's values, rising
        assert rows["capacity_scenario"].unique().to_list() == [meeting[0]]
        assert rows.filter(rows["is_capacity"])["scenario"].to_list() == [meeting[0]]
        for row in rows.iter_rows(named=True):
            assert row["measured_s"] == pytest.approx(ttft[row["scenario"]], rel=1e-9)


def test_the_report_draws_the_sweeps_and_the_features(
    swept: tuple[Warehouse, str], tmp_path: Path
) -> None:
    wh, run_id = swept
    page = build_report(wh, run_id, output=tmp_path / "s.html", slos=["ttft_p99<=100s"])
    html = page.read_text()
    for sid in ("swaps", "speculation", "capacity"):
        assert f'<section id="{sid}">' in html, sid
    cap = next(v for k, v in specs(html).items() if k.startswith("chart-capacity-"))
    titles = json.dumps(cap)
    assert "swap_space sweeps" in titles and "spec_k sweeps" in titles
    assert "host swap space (GiB per GPU)" in titles and "draft tokens per step (k)" in titles
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import load_schema

    schema = load_schema()
    for element_id, spec in specs(html).items():
        error = validate_jsonschema(spec, schema, raise_error=False)
        assert error is None, f"{element_id}: {error.message if error else ''}"
