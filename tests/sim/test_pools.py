"""Replica pools: parsing, assignment, and a fleet's replay against its pools' own.

A fleet's replay is its pools' replays on one clock: each pool's requests in the
merged result must be what the reference loop gives for that pool's scenario on
that pool's share of the requests, at the fleet's arrival times.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ScenarioError
from pipeline.sim.fleet import prepare_fleet, simulate_fleet
from pipeline.sim.pools import assign
from pipeline.sim.reference import simulate_reference
from pipeline.sim.replay_input import prepare
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import F_ARRIVAL, F_FINISH, F_FIRST_TOKEN, R_REPLICA, SimInput
from tests.helpers import UNIT_COST, requests_table


def _fleet(pools: list[dict], **top: object):
    base = {"cost": UNIT_COST, "num_gpu_blocks": 900, "max_model_len": 4096, "name": "f"}
    return build_scenario({**base, **top, "pool": pools})


def _frame(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    t = requests_table(
        rng.integers(1, 600, n).tolist(),
        rng.integers(1, 60, n).tolist(),
        rng.exponential(0.05, n),
    )
    tenants = rng.choice(["chat", "batch", "ops"], n)
    frame = pl.from_arrow(t)
    assert isinstance(frame, pl.DataFrame)
    return frame.with_columns(pl.Series("tenant", tenants))


def test_first_match_wins_and_the_default_takes_the_rest() -> None:
    sc = _fleet(
        [
            {"name": "chat", "tenants": ["chat"]},
            {"name": "rest"},
            {"name": "short", "max_prompt_tokens": 100},
        ]
    )
    frame = _frame(300, 1)
    which = assign(frame, sc.pools)
    tenant = frame["tenant"].to_numpy()
    prompt = frame["prompt_tokens"].to_numpy()
    assert (which[tenant == "chat"] == 0).all()
    assert (which[(tenant != "chat") & (prompt <= 100)] == 2).all()
    assert (which[(tenant != "chat") & (prompt > 100)] == 1).all()


def test_a_where_predicate_matches_as_duckdb_reads_it() -> None:
    sc = _fleet(
        [{"name": "long", "where": "prompt_tokens >= 300 AND tenant <> 'ops'"}, {"name": "rest"}]
    )
    frame = _frame(200, 2)
    which = assign(frame, sc.pools)
    want = (frame["prompt_tokens"].to_numpy() >= 300) & (frame["tenant"].to_numpy() != "ops")
    assert np.array_equal(which == 0, want)


@pytest.mark.parametrize(
    ("pools", "top", "words"),
    [
        ([{"name": "a", "rate": 3.0}], {}, "which the whole fleet shares"),
        ([{"name": "a"}, {"name": "b"}], {}, "only one may take the rest"),
        ([{"name": "a"}, {"name": "a", "tenants": ["x"]}], {}, "two pools are named"),
        ([{"replicas": 2}], {}, "needs a name"),
        ([{"name": "a", "min_prompt_tokens": 10, "max_prompt_tokens": 5}], {}, "no request"),
        ([{"name": "a", "where": "1; DROP TABLE requests"}], {}, "where"),
        ([{"name": "a", "tenants": []}], {}, "non-empty list"),
        ([{"name": "a", "priorities": [1.5]}], {}, "list of integers"),
        ([{"name": "a", "replicas": 0}], {}, "replicas"),
        ([{"name": "a", "bogus": 1}], {}, "unknown key 'bogus'"),
        ("chat", {}, "one or more [[pool]] tables"),
    ],
)
def test_bad_pools_are_refused_in_one_line(pools: object, top: dict, words: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        _fleet(pools, **top)  # type: ignore[arg-type]
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_pool_of_another_policy_does_not_inherit_the_fleets_policy_parameters() -> None:
    sc = _fleet(
        [{"name": "a", "tenants": ["chat"]}, {"name": "b", "policy": "sglang"}],
        policy="vllm",
        max_num_batched_tokens=1024,
    )
    assert sc.pools[0].scenario.params.max_num_batched_tokens == 1024
    assert sc.pools[1].scenario.policy == "sglang"
    assert sc.replicas == 2


def test_one_default_pool_replays_as_the_plain_scenario() -> None:
    frame = _frame(250, 3)
    plain = build_scenario(
        {"cost": UNIT_COST, "num_gpu_blocks": 900, "max_model_len": 4096, "replicas": 2}
    )
    fleet = _fleet([{"name": "all", "replicas": 2}])
    want = simulate(prepare(frame, plain).inp, plain.engine())
    fp = prepare_fleet(frame, fleet)
    got = simulate_fleet(fleet, fp).result
    np.testing.assert_array_equal(got.rq, want.rq)
    np.testing.assert_allclose(got.rqf, want.rqf, rtol=0, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    replicas=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    policies=st.tuples(
        st.sampled_from(["vllm", "sglang", "orca"]), st.sampled_from(["vllm", "tgi", "sarathi"])
    ),
    router=st.sampled_from(["round_robin", "least_outstanding"]),
    rate=st.floats(2.0, 60.0),
)
def test_each_pool_of_a_fleet_is_the_reference_replay_of_its_share(
    seed: int, replicas: tuple[int, int], policies: tuple[str, str], router: str, rate: float
) -> None:
    frame = _frame(160, seed)
    fleet = _fleet(
        [
            {"name": "chat", "tenants": ["chat"], "policy": policies[0], "replicas": replicas[0]},
            {"name": "rest", "policy": policies[1], "replicas": replicas[1], "num_gpu_blocks": 700},
        ],
        router=router,
        rate=rate,
        arrivals="poisson",
        seed=seed,
    )
    fp = prepare_fleet(frame, fleet)
    fr = simulate_fleet(fleet, fp)
    merged = fr.result
    base = 0
    for k, pool in enumerate(fleet.pools):
        mine = np.flatnonzero(fp.pool_of == k)
        prep = fp.prepared[k]
        if prep is None:
            assert not len(mine)
            continue
        arrival = merged.rqf[mine, F_ARRIVAL]
        assert np.all(np.diff(arrival) >= 0)
        # the pool's share at the fleet's arrival times, through the reference loop
        inp = SimInput(arrival - arrival[0], prep.inp.prompt_tokens, prep.inp.output_tokens)
        ref = simulate_reference(inp, pool.scenario)
        assert np.array_equal(merged.rq[mine, R_REPLICA] - base, ref.rq[:, R_REPLICA])
        for col in (F_FIRST_TOKEN, F_FINISH):
            np.testing.assert_allclose(
                merged.rqf[mine, col] - arrival[0], ref.rqf[:, col], rtol=1e-9, atol=1e-9
            )
        base += pool.scenario.replicas
    # the merged requests are the fleet's arrivals, in order, every one replayed once
    assert np.all(np.diff(merged.rqf[:, F_ARRIVAL]) >= -1e-12)
    assert merged.num_requests == sum(len(p.inp) for p in fp.prepared if p is not None)


def test_an_autoscaled_pool_is_its_shares_autoscaled_replay_on_the_fleets_clock() -> None:
    from pipeline.plan.slo import parse_slos
    from pipeline.sim.fleet import fleet_summary

    auto = {
        "max_replicas": 4,
        "target": 2.0,
        "interval_s": 0.5,
        "cooldown_s": 1.0,
        "startup_s": 0.3,
    }
    fleet = _fleet(
        [{"name": "chat", "tenants": ["chat"], "replicas": 2}, {"name": "rest", "autoscale": auto}],
        rate=60.0,
        arrivals="poisson",
    )
    assert fleet.replicas == 2 + 4
    fp = prepare_fleet(_frame(400, 9), fleet)
    fr = simulate_fleet(fleet, fp)
    k = 1
    prep = fp.prepared[k]
    assert prep is not None
    mine = np.flatnonzero(fp.pool_of == k)
    arrival = fr.result.rqf[mine, F_ARRIVAL]
    own = SimInput(arrival - arrival[0], prep.inp.prompt_tokens, prep.inp.output_tokens)
    want = simulate(own, fleet.pools[k].scenario.engine())
    np.testing.assert_allclose(
        fr.result.rqf[mine, F_FINISH] - arrival[0], want.rqf[:, F_FINISH], atol=1e-9
    )
    ev = fr.result.scale_events
    assert len(ev) == len(want.scale_events) and len(ev) > 4  # it scaled
    np.testing.assert_array_equal(ev["replica"] - 2, want.scale_events["replica"])
    np.testing.assert_allclose(ev["time"] - arrival[0], want.scale_events["time"], atol=1e-9)
    summary = fleet_summary(fleet, fr, fp, {}, parse_slos(["ttft_p99=50ms"]))
    entry = summary["pools"]["rest"]["autoscale"]
    assert entry["scale_ups"] >= 1 and "during_scale_ups" in entry
    assert "autoscale" not in summary["pools"]["chat"]
