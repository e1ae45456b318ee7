"""The prefill:decode search against brute force over every split it could have chosen."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ScenarioError
from pipeline.plan.disagg_plan import aggregated, plan_disaggregation, with_workers
from pipeline.plan.slo import parse_slos
from pipeline.sim.classes import whole_traffic_slos
from pipeline.sim.replay import summarize_prepared
from pipeline.sim.replay_input import prepare
from pipeline.sim.scenario import build_scenario
from tests.helpers import H100_8B_COST
from tests.sim.test_pools import _frame


def _scenario(**extra: object):
    return build_scenario(
        {
            "cost": H100_8B_COST,
            "num_gpu_blocks": 3000,
            "max_model_len": 4096,
            "prefill_replicas": 1,
            "decode_replicas": 1,
            "kv_bytes_per_token": 131072,
            "arrivals": "poisson",
            "rate": 40.0,
            "seed": 3,
            **extra,
        }
    )


def _met(sc, prep, slos) -> tuple[bool, float]:
    run, res = summarize_prepared(sc, prep, slos)
    s = whole_traffic_slos(res, prep.classes, slos, run.summary["duration_s"])
    return bool(s["slo_met"]), float(s["goodput"] or 0.0)


def test_the_split_found_is_the_fewest_workers_and_the_best_goodput_there() -> None:
    sc = _scenario()
    prep = prepare(_frame(400, 11), sc)
    slos = parse_slos(["ttft_p99=400ms", "tpot_p99=30ms"])
    plan = plan_disaggregation(sc, prep, slos, max_workers=8)
    assert plan.best is not None and plan.best.met
    n = plan.best.workers
    for total in range(2, n):  # no smaller total has a split that meets
        assert not any(_met(with_workers(sc, x, total - x), prep, slos)[0] for x in range(1, total))
    goodputs = {
        x: g
        for x in range(1, n)
        for met, g in [_met(with_workers(sc, x, n - x), prep, slos)]
        if met
    }
    assert plan.best.prefill in goodputs
    assert plan.best.goodput == pytest.approx(max(goodputs.values()))
    # the aggregated alternative: the fewest replicas that meet, by brute force
    agg = [r for r in range(1, 9) if _met(aggregated(sc, r), prep, slos)[0]]
    assert plan.aggregated_min is not None and plan.aggregated_min.decode == agg[0]
    assert plan.aggregated_same is not None and plan.aggregated_same.workers == n
    assert plan.best.kv_transfer_p99_s is not None and plan.best.kv_transfer_p99_s > 0
    assert plan.best.goodput_per_gpu == pytest.approx(plan.best.goodput / n)
    assert np.isfinite([p.ttft_p99_s for p in plan.probes if p.ttft_p99_s is not None]).all()


def test_an_unreachable_slo_gives_no_answer_and_says_what_was_tried() -> None:
    sc = _scenario()
    prep = prepare(_frame(200, 12), sc)
    plan = plan_disaggregation(sc, prep, parse_slos(["ttft_p99=1us"]), max_workers=4)
    assert plan.best is None and plan.aggregated_min is None
    assert {p.workers for p in plan.probes if not p.aggregated} == {2, 4}  # doubling to the top


def test_bad_requests_are_refused() -> None:
    plain = build_scenario({"cost": H100_8B_COST, "num_gpu_blocks": 3000, "max_model_len": 4096})
    prep = prepare(_frame(50, 1), plain)
    with pytest.raises(ScenarioError, match="not disaggregated"):
        plan_disaggregation(plain, prep, parse_slos(["ttft_p99=1s"]))
    sc = _scenario()
    with pytest.raises(ScenarioError, match="needs at least one SLO"):
        plan_disaggregation(sc, prepare(_frame(50, 1), sc), [])
