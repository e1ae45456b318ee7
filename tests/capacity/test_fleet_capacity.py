"""Capacity for a fleet: each pool's fewest replicas, the fleet check, shared vs split.

The fleet's per-pool answers are held to what a user gets by running the single-pool
search on each pool's share by hand (the pool's keys as a plain scenario, the share
selected by tenant), and the shared alternative to the single-pool search on all the
traffic. Independence, which lets the search go pool by pool, is checked on its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import CAPACITY_SEARCH, REQUESTS, RUNS, SCENARIOS, read_table
from pipeline.errors import ConfigError
from pipeline.plan.capacity import SearchSpec, run_capacity
from pipeline.plan.fleet import (
    FleetPlan,
    PoolPlan,
    fleet_frame,
    pool_slos,
    pool_values,
    run_fleet_capacity,
    search_knob,
)
from pipeline.plan.slo import parse_slos
from pipeline.selection import RequestFilter
from pipeline.sim.fleet import prepare_fleet, simulate_fleet
from pipeline.sim.pools import MATCH_KEYS
from pipeline.sim.replay_input import prepare
from pipeline.sim.scenario import build_scenario
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, requests_table

SLOS = ["ttft_p99=300ms", "tpot_p99@tenant=chat=40ms"]
TOP: dict[str, Any] = {"cost": H100_8B_COST, "num_gpu_blocks": 4000, "max_model_len": 4096}
POOLS: list[dict[str, Any]] = [
    {"name": "chat", "tenants": ["chat"], "max_num_seqs": 64},
    {"name": "batch", "max_num_seqs": 16, "max_num_batched_tokens": 4096},
]


def _fleet_values(**top: Any) -> dict[str, Any]:
    return {"name": "f", **TOP, **top, "pool": [dict(p) for p in POOLS]}


def _two_tenants(n: int = 500, rate: float = 30.0, seed: int = 3) -> pa.Table:
    """Chat: short prompts and outputs; batch: long prompts and outputs."""
    rng = np.random.default_rng(seed)
    chat = rng.random(n) < 0.6
    prompt = np.where(chat, rng.integers(50, 800, n), rng.integers(500, 2500, n))
    output = np.where(chat, rng.integers(2, 150, n), rng.integers(100, 400, n))
    t = requests_table(prompt, output, rng.exponential(1 / rate, n))
    i = t.schema.get_field_index("tenant")
    return t.set_column(i, "tenant", pa.array(np.where(chat, "chat", "batch")))


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleetcap") / "wh"
    Warehouse(root).write(REQUESTS, _two_tenants(), {"date": "2024-05-01"}, "src-test")
    return root


@pytest.fixture(scope="module")
def searched(wh: Path) -> Any:
    """The fleet searched once with --compare-split (shared like batch), no intervals."""
    return run_fleet_capacity(
        wh,
        _fleet_values(),
        parse_slos(SLOS),
        [SearchSpec("replicas", hi=16)],
        quiet=True,
        intervals=False,
        compare_split=True,
        shared_like="batch",
    )


def _frame(wh: Path) -> pl.DataFrame:
    frame = pl.from_arrow(_two_tenants())
    assert isinstance(frame, pl.DataFrame)
    return frame


def _plain(pool: dict[str, Any], name: str) -> dict[str, Any]:
    """The pool's keys as a user would write them for one plain scenario."""
    own = {k: v for k, v in pool.items() if k not in MATCH_KEYS and k != "name"}
    return {**TOP, **own, "name": name}


def test_a_pools_results_do_not_change_with_another_pools_replicas(wh: Path) -> None:
    frame = _frame(wh)
    got = {}
    for batch_replicas in (1, 3):
        values = _fleet_values()
        values["pool"][1]["replicas"] = batch_replicas
        sc = build_scenario(values)
        fp = prepare_fleet(frame, sc)
        fr = simulate_fleet(sc, fp)
        mine = np.flatnonzero(fp.pool_of == 0)
        got[batch_replicas] = (fr.result.rq[mine], fr.result.rqf[mine], fr.pools[1].result)
    (rq1, rqf1, b1), (rq3, rqf3, b3) = got[1], got[3]
    np.testing.assert_array_equal(rq1, rq3)
    np.testing.assert_array_equal(rqf1, rqf3)
    # the other pool did change: the check is not vacuous
    assert b1 is not None and b3 is not None
    assert not np.array_equal(b1.rqf, b3.rqf)


def test_each_pools_share_is_what_the_fleet_replays(wh: Path) -> None:
    frame = _frame(wh)
    fleet = build_scenario(_fleet_values(arrivals="poisson", rate=25.0, seed=5))
    shares, which = fleet_frame(frame, fleet)
    fp = prepare_fleet(frame, fleet)
    for k, pool in enumerate(fleet.pools):
        sc = build_scenario(pool_values(_fleet_values(arrivals="poisson", rate=25.0, seed=5),
                                        fleet, pool.name))  # fmt: skip
        assert sc.arrivals.process == "trace"
        prep = prepare(shares[np.flatnonzero(which == k)], sc)
        want = fp.prepared[k]
        assert want is not None
        assert prep.request_ids.to_pylist() == want.request_ids.to_pylist()
        np.testing.assert_array_equal(prep.inp.arrival_s, want.inp.arrival_s)
        np.testing.assert_array_equal(prep.inp.prompt_tokens, want.inp.prompt_tokens)


def test_each_pools_minimum_is_the_single_pool_search_on_its_share(wh: Path, searched: Any) -> None:
    slos = parse_slos(SLOS)
    for pool, tenant in zip(POOLS, ("chat", "batch"), strict=True):
        alone = run_capacity(
            wh,
            _plain(pool, f"alone-{tenant}"),
            pool_slos(slos, _frame(wh).filter(pl.col("tenant") == tenant)),
            [SearchSpec("replicas", hi=16)],
            quiet=True,
            intervals=False,
            selection=RequestFilter(tenants=(tenant,)),
        )
        plan = next(p for p in searched.split.pools if p.name == pool["name"])
        (search,) = alone.searches
        assert search.answer is not None
        assert plan.minimum == int(search.answer)
        assert dict(plan.search.result.probes) == dict(search.result.probes)
    # the scoped chat SLO judges the chat pool only
    chat, batch = searched.split.pools
    assert [s.key for s in chat.slos] == ["ttft_p99", "tpot_p99@tenant=chat"]
    assert [s.key for s in batch.slos] == ["ttft_p99"]


def test_the_fleet_is_checked_at_the_minima_over_every_request(searched: Any) -> None:
    plan = searched.split
    assert plan.check is not None and plan.check.slo is not None
    if not plan.step_ups:  # the pools' own minima held over the whole fleet
        assert plan.replicas == {p.name: p.minimum for p in plan.pools}
    assert plan.check.slo.all_met and plan.found
    summary = plan.check.run.summary
    assert {k: v["replicas"] for k, v in summary["pools"].items()} == plan.replicas
    assert summary["num_requests"] == sum(p.num_requests for p in plan.pools)


def test_compare_split_searches_one_shared_pool_like_the_named_one(wh: Path, searched: Any) -> None:
    alone = run_capacity(
        wh,
        _plain(POOLS[1], "alone-all"),
        parse_slos(SLOS),
        [SearchSpec("replicas", hi=16)],
        quiet=True,
        intervals=False,
    )
    (search,) = alone.searches
    shared = searched.shared
    (pool,) = shared.pools
    assert searched.shared_like == "batch"
    assert pool.scenario.params.max_num_seqs == 16
    assert pool.num_requests == sum(p.num_requests for p in searched.split.pools)
    assert pool.replicas == int(search.answer)
    assert shared.check is pool.search.answer_probe
    # per class, the shared figures are those of its answer's replay
    classes = shared.classes["tenant"]
    assert set(classes) == {"chat", "batch"}
    assert (
        classes["chat"]["ttft_p99_s"]
        == search.answer_probe.run.summary["classes"]["tenant"]["chat"]["ttft_p99_s"]
    )


def test_cost_counts_each_pools_gpus_at_its_own_kind() -> None:
    fleet = build_scenario(
        {
            "name": "mixed",
            "pool": [
                {"name": "chat", "tenants": ["chat"], "profile": "llama-3-8b_h100-80gb_tp1"},
                {"name": "batch", "tenants": ["batch"], "profile": "llama-3-8b_l40s_tp1"},
                {"name": "big", "profile": "llama-3-70b_a100-80gb_tp4"},
            ],
        }
    )
    plans = [
        PoolPlan(p.name, "", p.scenario, {}, 10, 1.0, 1, 8, replicas=r)
        for p, r in zip(fleet.pools, (2, 3, 2), strict=True)
    ]
    plan = FleetPlan("split", plans)
    prices = {"h100-80gb": 2.5, "l40s": 1.0, "a100-80gb": 1.5}
    assert [p.gpu for p in plans] == ["h100-80gb", "l40s", "a100-80gb"]
    assert [p.gpus for p in plans] == [2, 3, 8]  # tensor parallel 4: 4 GPUs a replica
    assert plan.total_gpus == 13
    costs = plan.costs(prices)
    assert costs["chat"]["usd_per_hour"] == pytest.approx(2 * 2.5)
    assert costs["batch"]["usd_per_hour"] == pytest.approx(3 * 1.0)
    assert costs["big"]["usd_per_hour"] == pytest.approx(8 * 1.5)
    assert plan.usd_per_hour(prices) == pytest.approx(5.0 + 3.0 + 12.0)
    assert plan.usd_per_hour({"h100-80gb": 2.5}) is None  # a pool without a price


def test_the_run_records_split_and_shared(wh: Path, searched: Any) -> None:
    w = Warehouse(wh)
    runs = [r for p in w.files(RUNS) for r in read_table(p, RUNS).to_pylist()]
    row = next(r for r in runs if r["run_id"] == searched.run_id)
    assert row["command"] == "capacity" and row["status"] == "ok"
    fleet = json.loads(row["details"])["fleet"]
    assert fleet["split"]["pools"]["chat"]["replicas"] == searched.split.replicas["chat"]
    assert fleet["shared"]["pools"]["shared"]["replicas"] == searched.shared.pools[0].replicas
    assert fleet["shared_like"] == "batch"
    (path,) = [p for p in w.files(CAPACITY_SEARCH) if searched.run_id in str(p)]
    searches = set(read_table(path, CAPACITY_SEARCH).column("search").to_pylist())
    assert searches == {"replicas@pool=chat", "replicas@pool=batch", "replicas@shared"}
    (spath,) = [p for p in w.files(SCENARIOS) if searched.run_id in str(p)]
    names = read_table(spath, SCENARIOS).column("scenario").to_pylist()
    assert searched.split.check.name in names
    assert len(names) == searched.num_replays


def _toml(path: Path, values: dict[str, Any]) -> Path:
    from pipeline.plan.fleet import FleetRecommendation, fleet_toml

    path.write_text(fleet_toml(FleetRecommendation(10.0, {}, {}, values), "r"))
    return path


def test_the_command_prints_a_line_per_pool_the_total_and_the_comparison(
    wh: Path, tmp_path: Path
) -> None:
    scenario = _toml(tmp_path / "fleet.toml", _fleet_values())
    rec = tmp_path / "rec.toml"
    r = CliRunner().invoke(
        cli,
        ["capacity", "--warehouse", str(wh), "--scenario", str(scenario), "--no-intervals",
         "--max-replicas", "16", "--compare-split", "--gpu-hour-price", "2", "-q",
         "--recommend-out", str(rec), *(a for s in SLOS for a in ("--slo", s))],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    chat = next(line for line in lines if line.startswith("pool chat ("))
    assert "tenant chat p99 TTFT" in chat and "(SLO 300ms)" in chat and "/h" in chat
    assert any(line.startswith("pool batch (") for line in lines)
    assert any(line.startswith("total: ") and "meets every SLO" in line for line in lines)
    assert any(line.startswith("would splitting help?") for line in lines)
    assert any("splitting" in line and "shared pool" in line for line in lines)
    # the recommended fleet replays as written
    built = build_scenario(__import__("tomllib").loads(rec.read_text()))
    assert [p.name for p in built.pools] == ["chat", "batch"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--compare-split"], "--compare-split compares a fleet's pools"),
        (["--shared-like", "chat"], "--shared-like compares a fleet's pools"),
    ],
)
def test_compare_split_on_one_pool_is_refused_in_one_line(
    wh: Path, args: list[str], words: str
) -> None:
    r = CliRunner().invoke(
        cli, ["capacity", "--warehouse", str(wh), "--slo", "ttft_p99=300ms", *args]
    )
    assert r.exit_code != 0
    assert words in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"compare_split": True, "shared_like": "nope"}, "no such pool; the fleet's pools: chat"),
        ({"shared_like": "chat"}, "give both"),
        ({"specs": [SearchSpec("rate")]}, "--search rate is for one pool"),
    ],
)
def test_bad_fleet_input_is_refused_in_one_line(wh: Path, kwargs: dict, words: str) -> None:
    specs = kwargs.pop("specs", [SearchSpec("replicas")])
    with pytest.raises(ConfigError) as exc:
        run_fleet_capacity(wh, _fleet_values(), parse_slos(SLOS), specs, quiet=True, **kwargs)
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


def test_an_autoscaled_pool_is_compared_and_a_disaggregated_one_searches_its_split() -> None:
    pool = SimpleNamespace(name="p", scenario=SimpleNamespace(autoscale=object()))
    assert search_knob(pool) == "autoscale"  # type: ignore[arg-type]
    disagg = SimpleNamespace(name="d", scenario=SimpleNamespace(disagg=object()))
    assert search_knob(disagg) == "prefill:decode"  # type: ignore[arg-type]
    assert search_knob(SimpleNamespace(name="q", scenario=SimpleNamespace())) == "replicas"  # type: ignore[arg-type]


def test_a_disaggregated_pool_gets_the_split_its_own_search_finds(wh: Path) -> None:
    from pipeline.plan.disagg_plan import plan_disaggregation

    pd = {"prefill_replicas": 1, "decode_replicas": 1, "kv_bytes_per_token": 131072}
    values = _fleet_values()
    values["pool"][1].update(pd)
    slos = parse_slos(SLOS)
    result = run_fleet_capacity(
        wh, values, slos, [SearchSpec("replicas", hi=6)], quiet=True, intervals=False
    )
    batch = next(p for p in result.split.pools if p.name == "batch")
    assert batch.disagg is not None and batch.split is not None
    # by hand: the batch share, its pool's scenario, the same search
    fleet = build_scenario(values)
    frame, which = fleet_frame(pl.from_arrow(_two_tenants()), fleet)  # type: ignore[arg-type]
    share = frame[np.flatnonzero(which == 1)]
    own = plan_disaggregation(
        batch.scenario, prepare(share, batch.scenario), batch.slos, max_workers=6
    )
    assert own.best is not None and batch.disagg.best is not None
    assert (batch.disagg.best.prefill, batch.disagg.best.decode) == (
        own.best.prefill,
        own.best.decode,
    )
    assert batch.disagg.best.goodput == pytest.approx(own.best.goodput, rel=1e-3)
    assert batch.minimum == own.best.workers and batch.gpus == sum(batch.split)
    assert result.split.found
    check = result.split.check
    assert check is not None and check.run is not None
    assert check.run.scenario.pools[1].scenario.disagg is not None


def test_the_verdict_follows_the_numbers(searched: Any) -> None:
    from pipeline.cli.fleet_capacity import verdict

    shared, split = searched.shared.total_gpus, searched.split.total_gpus
    by_gpus = verdict(searched, {})
    assert ("splitting helps" in by_gpus) == (split < shared)
    assert ("costs more" in by_gpus) == (split > shared)
    priced = verdict(searched, {"*": 2.0})
    if split != shared:
        assert f"${abs(shared - split) * 2.0:,.2f}/hour" in priced


def test_the_fleet_check_steps_up_the_pool_furthest_over_the_failing_slo() -> None:
    from pipeline.plan.fleet import _pool_to_grow
    from pipeline.plan.slo import SloReport

    slos = parse_slos(["ttft_p99=200ms", "tpot_p99=50ms"])
    sc = build_scenario(_fleet_values())
    plans = [
        PoolPlan(p.name, "", p.scenario, {}, 10, 1.0, 1, 8, replicas=r)
        for p, r in zip(sc.pools, (2, 3), strict=True)
    ]
    pools = {
        "chat": {"slo": {"ttft_p99": {"measured_s": 0.19}, "tpot_p99": {"measured_s": 0.09}}},
        "batch": {"slo": {"ttft_p99": {"measured_s": 0.199}, "tpot_p99": {"measured_s": 0.01}}},
    }
    report = SloReport(
        {"ttft_p99": 0.201, "tpot_p99": 0.04}, {"ttft_p99": False, "tpot_p99": True}, 0, None
    )
    out = SimpleNamespace(slo=report, run=SimpleNamespace(summary={"pools": pools}))
    grow = _pool_to_grow(FleetPlan("split", plans), out, slos)  # type: ignore[arg-type]
    assert grow is not None and grow[0].name == "batch"  # the met tpot_p99 is not looked at
    plans[1].replicas = 8  # at the top of the range: it cannot grow
    grow = _pool_to_grow(FleetPlan("split", plans), out, slos)  # type: ignore[arg-type]
    assert grow is not None and grow[0].name == "chat"


def test_the_single_pool_search_refuses_a_fleet(wh: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        run_capacity(wh, _fleet_values(), parse_slos(SLOS), [SearchSpec("replicas")], quiet=True)
    assert "run_fleet_capacity" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "pools",
    [
        [{"name": "a", "tenants": ["chat"], "policy": "sglang"}, {"name": "b"}],
        [{"name": "a", "tenants": ["chat"], "profile": "llama-3-8b_a100-80gb_tp1"}, {"name": "b"}],
    ],
)
def test_a_pool_searched_alone_is_the_fleets_pool(pools: list[dict[str, Any]]) -> None:
    from pipeline.plan.fleet import _check_same

    values = {"name": "f", "max_num_batched_tokens": 4096, "rate": 9.0, "pool": pools}
    fleet = build_scenario(values)
    for pool in fleet.pools:
        alone = build_scenario(pool_values(values, fleet, pool.name))
        _check_same(alone, pool)  # raises when a key differs
        assert alone.name == f"f.{pool.name}" and alone.arrivals.rate is None


def test_each_pools_answer_has_its_interval(wh: Path, searched: Any) -> None:
    result = run_fleet_capacity(
        wh, _fleet_values(), parse_slos(SLOS), [SearchSpec("replicas", hi=16)], quiet=True
    )
    for plan, plain in zip(result.split.pools, searched.split.pools, strict=True):
        assert plan.search is not None and plan.search.interval is not None
        assert plan.minimum == plain.minimum  # intervals do not move the answer
        assert plan.search.interval.lo <= plan.minimum
    assert result.num_interval_replays > 0


def test_a_pool_no_request_goes_to_gets_the_least_count(wh: Path) -> None:
    values = _fleet_values()
    values["pool"].insert(0, {"name": "ops", "tenants": ["ops"]})
    result = run_fleet_capacity(
        wh, values, parse_slos(SLOS), [SearchSpec("replicas", lo=1, hi=8)], quiet=True,
        intervals=False,
    )  # fmt: skip
    ops = result.split.pools[0]
    assert ops.num_requests == 0 and ops.search is None and ops.replicas == 1
    assert any("pool ops: no request goes to it" in n for n in result.split.notes)
    assert result.split.found  # the fleet check ran with the empty pool in it
    from pipeline.cli.fleet_capacity import format_fleet_capacity

    text = format_fleet_capacity(result, {"*": 1.0})
    assert "pool ops (tenant in (ops); 0 requests" in text and "1 replica, 1 GPU, $1.00/h" in text


def test_a_target_rate_scales_the_whole_fleet_before_the_split(wh: Path) -> None:
    result = run_fleet_capacity(
        wh, _fleet_values(), parse_slos(SLOS), [SearchSpec("replicas", hi=16, rate=12.0)],
        quiet=True, intervals=False,
    )  # fmt: skip
    assert result.rate == 12.0 and result.base.arrivals.rate == 12.0
    chat, batch = result.split.pools
    # the shares keep the trace's mix: their requests add up, their rates to about the target
    assert chat.num_requests + batch.num_requests == result.num_requests_read
    assert chat.share_rate + batch.share_rate == pytest.approx(12.0, rel=0.1)
    assert chat.scenario.arrivals.process == "trace"
