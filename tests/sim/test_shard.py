"""Sharded replays (``shard.py``) against the whole replay.

Replica groups under round_robin must give every request's row and the summary bit
for bit; time windows under a load-aware router are approximate, within a loose bound.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ScenarioError
from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import Scenario, resolve_scenarios
from pipeline.sim.shard import (
    ShardPlan,
    coupling_note,
    plan_shards,
    run_shards,
    run_windows,
    simulate_sharded,
    take,
)
from pipeline.sim.simulate import LeadInput, simulate
from pipeline.sim.state import S_REPLICA, SF_START, W_HOFF, SimInput
from pipeline.sim.summary import (
    RequestTotals,
    StepTotals,
    request_metric,
    summarize,
    summarize_totals,
)
from tests.sim.test_differential import _case


def _sorted_steps(st: Any, stf: Any) -> tuple[Any, Any]:
    order = np.lexsort((stf[:, SF_START], st[:, S_REPLICA]))
    return st[order], stf[order]


def check_exact(inp: SimInput, sc: Scenario, groups: int) -> None:
    whole = simulate(inp, sc.engine())
    plan = plan_shards(sc, groups)
    assert plan.by == "replicas" and sc.replicas % plan.shards == 0
    got, totals = simulate_sharded(inp, sc, plan)
    # every column but W_HOFF (int32 columns 2*W_HOFF, +1): the offset of the request's
    # prefix keys in its own replay's key array, an index, not an outcome
    cols = np.setdiff1d(np.arange(whole.rq.shape[1]), [2 * W_HOFF, 2 * W_HOFF + 1])
    np.testing.assert_array_equal(got.rq[:, cols], whole.rq[:, cols])
    np.testing.assert_array_equal(got.rqf, whole.rqf)
    a, af = _sorted_steps(got.st, got.stf)
    b, bf = _sorted_steps(whole.st, whole.stf)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(af, bf)
    assert summarize(got, totals) == summarize(whole)


@st.composite
def round_robin_case(draw: Any) -> tuple[SimInput, Scenario, int]:
    policy = draw(st.sampled_from(sorted(POLICIES)))
    inp, sc = _case(draw, policy, replicas=(2, 8), routers=("round_robin",))
    return inp, sc, draw(st.integers(2, 8))


@settings(max_examples=30, deadline=None)
@given(round_robin_case())
def test_round_robin_replica_groups_equal_the_whole_replay(
    case: tuple[SimInput, Scenario, int],
) -> None:
    check_exact(*case)


def _poisson(n: int, rate: float, seed: int = 3) -> SimInput:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    prompt = np.minimum(rng.lognormal(6.5, 1.0, n).astype(np.int64) + 1, 8000)
    output = np.minimum(rng.lognormal(5.0, 1.0, n).astype(np.int64) + 1, 1000)
    return SimInput(arrival, prompt, output)


def _scenario(**kw: Any) -> Scenario:
    return resolve_scenarios([], kw)[0]


def test_round_robin_groups_exact_with_a_lead_in() -> None:
    """A busiest window's lead-in is cut against the replay's first measured arrival."""
    inp = _poisson(3000, 40.0)
    lead = LeadInput(inp.arrival_s, inp.prompt_tokens, inp.output_tokens, lead=700)
    check_exact(lead, _scenario(replicas=8), 4)


def test_time_windows_under_least_outstanding_are_close() -> None:
    inp = _poisson(20_000, 60.0)
    sc = _scenario(replicas=8, router="least_outstanding")
    whole = summarize(simulate(inp, sc.engine()))
    plan = plan_shards(sc, 4, warmup_s=30.0)
    assert plan == ShardPlan("time", 4, 30.0)
    got, totals = simulate_sharded(inp, sc, plan)
    # every request replayed once, on the same arrivals
    np.testing.assert_array_equal(np.isnan(request_metric(got, "ttft_s")), False)
    part = summarize(got, totals)
    assert part["num_requests"] == whole["num_requests"]
    for key in ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "request_throughput"):
        assert part[key] == pytest.approx(whole[key], rel=0.15), key


def test_plans_and_bad_input() -> None:
    assert plan_shards(_scenario(replicas=64), 8) == ShardPlan("replicas", 8)
    assert plan_shards(_scenario(replicas=6), 4) == ShardPlan("replicas", 3)  # divides 6
    assert coupling_note(_scenario(replicas=6)) is None
    lo = _scenario(replicas=6, router="least_outstanding")
    assert plan_shards(lo, 4).by == "time"
    assert "coupled" in (coupling_note(lo) or "")
    for bad, words in (
        (_scenario(replicas=4, autoscale={"max_replicas": 4, "target": 4.0}), "autoscaling"),
        (_scenario(replicas=4), "shards must be >= 1"),
    ):
        with pytest.raises(ScenarioError, match=words) as err:
            plan_shards(bad, 0 if words.startswith("shards") else 2)
        assert "\n" not in str(err.value)


def test_step_totals_of_shards_add_up() -> None:
    inp = _poisson(4000, 40.0)
    sc = _scenario(replicas=4)
    rows: list[Any] = []
    _, totals = simulate_sharded(
        inp, sc, plan_shards(sc, 2), on_steps=lambda a, b: rows.append((a, b))
    )
    whole = StepTotals.of(
        np.concatenate([a for a, _ in rows]), np.concatenate([b for _, b in rows])
    )
    assert whole == totals


def _shard_totals(inp: SimInput, sc: Scenario, plan: ShardPlan, dtype: Any) -> dict[str, Any]:
    """The summary of ``plan``'s shards, added up shard by shard as a sharded replay does."""
    rt, steps = RequestTotals(dtype=dtype), StepTotals()
    for sh in run_shards(inp, sc, plan):
        rt.add(sh.result)
        steps.merge(sh.steps)
    return summarize_totals(rt, steps)


def test_shard_by_shard_totals_give_the_whole_summary() -> None:
    """A summary added up shard by shard (``RequestTotals``) is the whole replay's: exactly
    in float64, to float32's precision in float32 (a fleet's day's)."""
    inp = _poisson(6000, 80.0)
    sc = _scenario(replicas=6)
    whole = summarize(simulate(inp, sc.engine()))
    plan = plan_shards(sc, 3)
    assert _shard_totals(inp, sc, plan, np.float64) == whole
    narrow = _shard_totals(inp, sc, plan, np.float32)
    assert narrow.keys() == whole.keys()
    for key, value in whole.items():
        if isinstance(value, float):
            assert narrow[key] == pytest.approx(value, rel=1e-6), key
        else:
            assert narrow[key] == value, key


def _windows(inp: SimInput, starts: Any) -> list[SimInput]:
    return [take(inp, np.arange(a, b, dtype=np.int64)) for a, b in itertools.pairwise(starts)]


def test_streamed_windows_are_the_time_shards() -> None:
    """Windows handed in one at a time replay as the time shards of the whole input do
    (when each warm-up lies within the window before)."""
    inp = _poisson(8000, 60.0)
    sc = _scenario(replicas=4, router="least_outstanding")
    plan = plan_shards(sc, 4, warmup_s=20.0)
    cut = list(run_shards(inp, sc, plan))
    starts = [int(sh.rows[0]) for sh in cut] + [len(inp)]
    streamed = list(run_windows(_windows(inp, starts), sc, warmup_s=20.0))
    assert len(streamed) == len(cut)
    for a, b in zip(streamed, cut, strict=True):
        np.testing.assert_array_equal(a.rows, b.rows)
        np.testing.assert_array_equal(a.result.rq, b.result.rq)
        np.testing.assert_array_equal(a.result.rqf, b.result.rqf)
        assert a.steps == b.steps


def test_streamed_windows_bad_input() -> None:
    inp = _poisson(2000, 40.0)
    sc = _scenario(replicas=2)
    half = len(inp) // 2
    first, second = _windows(inp, [0, half, len(inp)])
    with pytest.raises(ScenarioError, match="window 1: its first arrival .* time order") as err:
        list(run_windows([second, first], sc))
    assert "\n" not in str(err.value)
    keyed = dataclasses.replace(first, priority=np.zeros(len(first), dtype=np.int64))
    with pytest.raises(ScenarioError, match="window 0: streamed windows carry"):
        list(run_windows([keyed], sc))
    with pytest.raises(ScenarioError, match="warm-up must be >= 0"):
        list(run_windows([first], sc, warmup_s=-1.0))
    pooled = _scenario(replicas=2, autoscale={"max_replicas": 2, "target": 4.0})
    with pytest.raises(ScenarioError, match="autoscaling"):
        list(run_windows([first], pooled))
    # empty windows are skipped; the rows still count from 0 across the windows
    got = list(run_windows([first, take(inp, np.arange(0, dtype=np.int64)), second], sc))
    assert [int(sh.rows[0]) for sh in got] == [0, half]
