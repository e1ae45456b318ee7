"""Routers on many replicas: the fast loop against the reference, and lazy advancing.

With least_outstanding and prefix_aware the fast loop advances replicas
lazily (only those with a step or a completion before an arrival, and decode
runs past the arrival deferred rather than cut). The reference advances every
replica to every arrival, one step at a time; both must route every request
to the same replica and agree on everything else (``check_equal``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    R_QDEPTH,
    R_REPLICA,
    S_REPLICA,
    SimInput,
)
from tests.sim.test_differential import _case, check_case

LOAD_AWARE = ("least_outstanding", "prefix_aware")


@st.composite
def many_replicas(draw: Any) -> tuple[SimInput, Scenario]:
    policy = draw(st.sampled_from(sorted(POLICIES)))
    return _case(draw, policy, replicas=(2, 7), routers=LOAD_AWARE)


@st.composite
def many_replicas_cached(draw: Any) -> tuple[SimInput, Scenario]:
    policy = draw(st.sampled_from(["vllm", "sglang", "tgi"]))
    return _case(draw, policy, caching=True, replicas=(2, 7), routers=("prefix_aware",))


@settings(max_examples=80)
@given(many_replicas())
def test_load_aware_routers_on_many_replicas_equal_reference(
    case: tuple[SimInput, Scenario],
) -> None:
    check_case(case)


@settings(max_examples=60)
@given(many_replicas_cached())
def test_prefix_aware_router_on_many_replicas_equals_reference(
    case: tuple[SimInput, Scenario],
) -> None:
    check_case(case)


@settings(max_examples=40)
@given(many_replicas())
def test_each_replica_runs_as_if_alone(case: tuple[SimInput, Scenario]) -> None:
    """A replica's timeline is the one it has replaying only its own requests, alone.

    So decode runs are cut only by the replica's own arrivals, never by
    arrivals routed elsewhere: rows, step times and request outcomes are
    bit-identical to a one-replica replay of the requests routed to it.
    """
    inp, sc = case
    assume(sc.router == "least_outstanding" and not sc.prefix_caching)
    assume(getattr(sc.params, "schedule_policy", "") != "random")  # seeded per replica index
    multi = simulate(inp, sc.engine())
    alone_sc = dataclasses.replace(sc, replicas=1, router="round_robin")
    for r in range(sc.replicas):
        mine = np.flatnonzero(multi.rq[:, R_REPLICA] == r)
        rows = multi.st[:, S_REPLICA] == r
        if len(mine) == 0:
            assert not rows.any()
            continue
        sub = SimInput(
            inp.arrival_s[mine],
            inp.prompt_tokens[mine],
            inp.output_tokens[mine],
            priority=None if inp.priority is None else inp.priority[mine],
        )
        alone = simulate(sub, alone_sc.engine())
        same = np.ones(multi.rq.shape[1], dtype=bool)
        same[R_REPLICA] = False
        assert np.array_equal(multi.rq[mine][:, same], alone.rq[:, same])
        assert np.array_equal(multi.rq[mine, R_QDEPTH], alone.rq[:, R_QDEPTH])
        assert np.array_equal(multi.rqf[mine], alone.rqf, equal_nan=True)
        st_multi = multi.st[rows].copy()
        st_multi[:, S_REPLICA] = 0
        assert np.array_equal(st_multi, alone.st)
        assert np.array_equal(multi.stf[rows], alone.stf)
