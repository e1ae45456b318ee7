"""A fleet's pools where a user reads results, end to end through the commands: replay's
per-pool rows, the pool_latency view, compare's per-pool changes and nightly's per-pool
SLO headroom.

The view's figures are SQL's over sim_requests; the replay summary's per-pool entry is
numpy's over the simulator's result: the two must agree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.cli.pools import pool_lines, sweep_pool_lines
from pipeline.cli.sweep import seconds
from pipeline.compare import compare_paired, compare_runs, format_comparison, pool_changes
from pipeline.drift import headrooms, slo_figure
from pipeline.errors import UnknownQueryError
from pipeline.report.sql import available, load_query
from pipeline.warehouse import SQL_DIR, VIEWS_SQL, Warehouse, load_sql
from tests.helpers import fleet_toml, small_warehouse_at

COLUMNS = [
    "run_id", "scenario", "pool", "pool_order", "policy", "profile", "replicas", "requests",
    "completed", *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
    "duration_s", "requests_per_s", "output_tokens_per_s", "total_tokens_per_s",
]  # fmt: skip


def _replay(wh: Path, scenario: Path, *extra: str) -> tuple[str, str]:
    args = ["replay", "--warehouse", str(wh), "--scenario", str(scenario), "--no-intervals"]
    r = CliRunner().invoke(cli, [*args, *extra])
    assert r.exit_code == 0, r.output
    (run_id,) = re.findall(r"^run (\S+): ", r.output, re.M)
    return run_id, r.output


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two replays of the fleet through the CLI: A (a replica per pool) with an SLO and the
    one-pool scenario beside it, B with pool long on two replicas."""
    tmp = tmp_path_factory.mktemp("fleetcli")
    wh = small_warehouse_at(tmp / "wh", n=300, rate=20.0)
    single = tmp / "single.toml"
    single.write_text('name = "single"\npolicy = "vllm"\nmax_num_seqs = 32\n')
    a_file = fleet_toml(tmp / "a.toml", short=1, long=1)
    run_a, text = _replay(wh, a_file, "--scenario", str(single), "--slo", "ttft_p99=2s")
    run_b, _ = _replay(wh, fleet_toml(tmp / "b.toml", short=1, long=2))
    return {"wh": Warehouse(wh), "a": run_a, "b": run_b, "text": text}


def _summary(wh: Warehouse, run_id: str, scenario: str = "split") -> dict[str, Any]:
    con = wh.connect()
    try:
        (text,) = con.execute(
            "SELECT summary_json FROM scenarios WHERE run_id = ? AND scenario = ?",
            [run_id, scenario],
        ).fetchone()  # type: ignore[misc]
    finally:
        con.close()
    return json.loads(text)  # type: ignore[no-any-return]


def _view(wh: Warehouse, run_id: str) -> dict[str, dict[str, Any]]:
    con = wh.connect()
    try:
        df = con.sql(f"SELECT * FROM pool_latency WHERE run_id = '{run_id}'").pl()
    finally:
        con.close()
    return {(r["scenario"], r["pool"]): r for r in df.to_dicts()}  # type: ignore[misc]


# --- replay's summary ------------------------------------------------------------------


def test_replay_prints_a_row_per_pool_under_the_fleet_s_lines(fleet: dict[str, Any]) -> None:
    pools = _summary(fleet["wh"], fleet["a"])["pools"]
    text: str = fleet["text"]
    # the fleet's line names its pools' policies and profiles, each once
    start = text.index("split (fleet of 2 pools: vllm, 2 replicas, llama-3-8b_h100-80gb_tp1): ")
    lines = text[start:].split("\nsingle (")[0].splitlines()
    at = lines.index("  per pool:")
    assert lines[at - 1].startswith("  goodput")  # under the fleet's SLO lines
    header = lines[at + 1].split()
    assert header[:3] == ["pool", "takes", "policy"] and header[-3:] == ["goodput", "SLOs", "met"]
    for k, (name, e) in enumerate(_in_order(pools)):
        row = lines[at + 2 + k]
        assert row.split()[0] == name
        assert e["match"] in row and f" {e['replicas']} " in row
        for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s"):
            assert f" {seconds(e[key])} " in row, (key, row)
        met = sum(v["met"] for v in e["slo"].values())
        assert f"{met}/{len(e['slo'])}" in row
    assert "per pool:" not in fleet["text"].split("\nsingle (")[1]  # one pool: no table


def _in_order(pools: dict[str, Any]) -> list[tuple[str, Any]]:
    """The pools in the fleet's order (the stored summary's keys are sorted)."""
    return sorted(pools.items(), key=lambda kv: ["short", "long"].index(kv[0]))


def test_pool_lines_of_a_summary_without_pools_is_empty() -> None:
    assert pool_lines({"ttft_p50_s": 0.1}) == []
    assert pool_lines({"pools": {}}) == []


# --- the pool_latency view -------------------------------------------------------------


def test_pool_latency_gives_the_summary_s_figures(fleet: dict[str, Any]) -> None:
    wh, run_a = fleet["wh"], fleet["a"]
    summary = _summary(wh, run_a)
    rows = _view(wh, run_a)
    assert sorted(rows) == [("split", "long"), ("split", "short")]  # 'single': no row
    assert sum(r["requests"] for r in rows.values()) == summary["num_requests"]
    for (_, pool), r in rows.items():
        s = summary["pools"][pool]
        assert r["pool_order"] == ["short", "long"].index(pool) + 1
        assert (r["policy"], r["profile"], r["replicas"]) == (
            s["policy"],
            s["profile"],
            s["replicas"],
        )
        assert (r["requests"], r["completed"]) == (s["num_requests"], s["completed"])
        for m in ("ttft", "tpot", "e2e"):
            for q in (50, 90, 99):
                key = f"{m}_p{q}_s"
                assert r[key] == pytest.approx(s[key], rel=1e-9), key
        assert r["duration_s"] == pytest.approx(s["duration_s"], rel=1e-9)
        assert r["requests_per_s"] == pytest.approx(s["request_throughput"], rel=1e-9)
        assert r["output_tokens_per_s"] == pytest.approx(s["output_token_throughput"], rel=1e-9)
        assert r["total_tokens_per_s"] == pytest.approx(s["total_token_throughput"], rel=1e-9)


def test_pool_latency_columns_are_the_header_s(fleet: dict[str, Any]) -> None:
    con = fleet["wh"].connect()
    cols = [r[0] for r in con.execute("DESCRIBE pool_latency").fetchall()]
    assert cols == COLUMNS
    header = (SQL_DIR / "pool_latency.sql").read_text()
    for c in COLUMNS:
        assert re.search(rf"\b{c}\b", header), c


def test_pool_latency_pastes_into_the_duckdb_shell_after_views_sql(fleet: dict[str, Any]) -> None:
    wh: Warehouse = fleet["wh"]
    con = duckdb.connect()
    con.execute(f"SET file_search_path = '{wh.root.resolve()}'")
    con.execute(load_sql(VIEWS_SQL))
    con.execute((SQL_DIR / "pool_latency.sql").read_text())
    q = "SELECT * FROM pool_latency ORDER BY ALL"
    got = con.execute(q).fetchall()
    assert len(got) == 4 and got == wh.connect().execute(q).fetchall()


def test_pool_latency_is_a_view_not_a_query() -> None:
    assert "pool_latency" not in available()
    with pytest.raises(UnknownQueryError, match="is a view, not a query: SELECT"):
        load_query("pool_latency")


def test_pool_latency_reads_a_pool_name_json_would_trip_on(tmp_path: Path) -> None:
    """Names with '.', '/', '~', '$' and quotes find their summary entry all the same."""
    con = duckdb.connect()
    names = ["a.b", "s/l~", "$q", 'x "y"']
    summary = json.dumps({"pools": {n: {"replicas": k + 1} for k, n in enumerate(names)}})
    pointer = load_sql("pool_latency.sql").split("'/pools/' || ")[1].split(" AS ptr")[0]
    for k, n in enumerate(names):
        expr = f"(?::JSON) ->> ('/pools/' || {pointer.replace('p.pool', '?')} || '/replicas')"
        assert con.execute(f"SELECT {expr}", [summary, n]).fetchone() == (str(k + 1),)


# --- compare ---------------------------------------------------------------------------


def test_compare_pairs_the_pools_by_name(fleet: dict[str, Any]) -> None:
    wh, run_a, run_b = fleet["wh"], fleet["a"], fleet["b"]
    df = compare_runs(wh, run_a, run_b)
    pools = pool_changes(wh, df)
    assert set(pools["scenario"]) == {"split"}  # 'single' is no fleet
    a, b = _view(wh, run_a), _view(wh, run_b)
    got = {(r["pool"], r["metric"]): r for r in pools.to_dicts()}
    assert got[("long", "replicas")]["value_a"] == 1.0
    assert got[("long", "replicas")]["change"] == 1.0
    assert got[("short", "replicas")]["change"] == 0.0
    for pool in ("short", "long"):
        r = got[(pool, "p99_ttft_s")]
        assert r["value_a"] == a[("split", pool)]["ttft_p99_s"]
        assert r["value_b"] == b[("split", pool)]["ttft_p99_s"]
        assert r["change"] == pytest.approx(r["value_b"] - r["value_a"])
    assert pools["pool"].unique(maintain_order=True).to_list() == ["short", "long"]
    text = format_comparison(df, pools=pools)
    part = text.split("\nsplit")[1]
    assert "  per pool:" in part
    (line,) = [x for x in part.splitlines() if x.split()[:2] == ["long", "replicas"]]
    assert line.split()[2:5] == ["1", "2", "+1"]


def test_compare_json_and_text_hold_the_pools(fleet: dict[str, Any]) -> None:
    base = ["compare", fleet["a"], fleet["b"], "--warehouse", str(fleet["wh"].root)]
    r = CliRunner().invoke(cli, [*base, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    long = out["scenarios"]["split"]["pools"]["long"]
    assert long["replicas"] == {"a": 1.0, "b": 2.0, "change": 1.0, "relative_change": 1.0}
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0, r.output
    assert r.output.count("  per pool:") == 1


def test_a_pool_in_one_run_only_has_the_other_s_values_null(fleet: dict[str, Any]) -> None:
    wh = fleet["wh"]
    # 'split' of A against the one-pool 'single' of A: every pool of split, B's values null
    df, pairing = compare_paired(wh, fleet["a"], fleet["a"], pairs=[("split", "single")])
    pools = pool_changes(wh, df, pairing)
    rows = pools.filter(pools["scenario"] == "split")
    assert set(rows["pool"]) == {"short", "long"}
    assert rows["value_b"].is_null().all() and rows["value_a"].is_not_null().all()


# --- nightly's per-pool headroom -------------------------------------------------------


def test_each_pool_s_headroom_by_hand() -> None:
    assert slo_figure("prod", "ttft_p99") == "slo.prod.ttft_p99"
    assert slo_figure("prod", "ttft_p99", "long") == "slo.prod.pool=long.ttft_p99"
    # the fleet's p99 holds 40% of its limit; pool long's has closed in on it
    prev = {"slo.prod.ttft_p99": 0.55, "slo.prod.pool=long.ttft_p99": 0.70,
            "slo.prod.pool=short.ttft_p99": 0.20}  # fmt: skip
    cur = {"slo.prod.ttft_p99": 0.60, "slo.prod.pool=long.ttft_p99": 0.97,
           "slo.prod.pool=short.ttft_p99": 0.21}  # fmt: skip
    heads = headrooms(prev, cur, [("prod", "ttft_p99", 1.0)], 10.0, {"prod": ["short", "long"]})
    assert [h.pool for h in heads] == [None, "short", "long"]
    fleet_h, short, long = heads
    assert not fleet_h.below_margin and not short.below_margin
    assert long.below_margin
    assert long.headroom_pct == pytest.approx(3.0)
    assert long.change_s == pytest.approx(0.27)
    assert long.describe().startswith("ttft_p99 in prod (pool long): 970.0 ms of 1,000.0 ms")
    assert long.to_dict()["pool"] == "long" and fleet_h.to_dict()["pool"] is None
    # a scenario without pools: only its own headroom, as before
    (one,) = headrooms(prev, cur, [("prod", "ttft_p99", 1.0)], 10.0)
    assert one.pool is None


def test_sweep_prints_a_row_per_fleet_scenario_and_pool() -> None:
    pool = {"replicas": 2, "num_requests": 10, "ttft_p50_s": 0.0415, "ttft_p99_s": 1.5,
            "tpot_p99_s": 0.0086}  # fmt: skip
    missed = {**pool, "slo": {"ttft_p99": {"met": False}}, "goodput": 0.5}
    runs = [
        ("one-pool", {"ttft_p50_s": 0.1}),
        ("fleet-a", {"pools": {"chat": pool, "long": missed}}),
    ]
    lines = sweep_pool_lines(runs)
    assert lines[:2] == ["", "per pool:"]
    table = lines[2].splitlines()
    assert table[0].split() == ["scenario", "pool", "replicas", "requests", "TTFT", "p50", "TTFT",
                                "p99", "TPOT", "p99", "goodput", "SLOs", "met"]  # fmt: skip
    chat, long = table[1].split(), table[2].split()
    assert chat[:4] == ["fleet-a", "chat", "2", "10"] and chat[4:10] == [
        "41.5", "ms", "1.5", "s", "8.6", "ms"]  # fmt: skip
    assert chat[-2:] == ["-", "-"]  # no SLO judged this pool
    assert long[-4:] == ["0.50", "0/1", "(missed", "ttft_p99)"]
    assert sweep_pool_lines(runs[:1]) == []  # no fleet: no table


def test_the_python_api_gives_each_pool_s_summary(tmp_path: Path) -> None:
    from pipeline import api

    wh = small_warehouse_at(tmp_path / "wh", n=120, rate=20.0)
    run = api.replay(fleet_toml(tmp_path / "f.toml", short=1, long=2), warehouse=wh,
                     intervals=False)  # fmt: skip
    result = run.scenarios["split"]
    pools = result.summary.pools
    assert list(pools) == ["short", "long"]
    entry = result.summary.figures["pools"]["long"]
    assert pools["long"].ttft_p99_s == entry["ttft_p99_s"]
    assert pools["long"].figures["replicas"] == 2
    assert sum(p.num_requests for p in pools.values()) == result.summary.num_requests
    assert set(result.requests["pool"]) == {"short", "long"}
    assert api.replay(policy="vllm", warehouse=wh, intervals=False).scenarios[
        "vllm"].summary.pools == {}  # fmt: skip
