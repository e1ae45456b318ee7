"""The per-request state is int32 (int64 where counts can pass 2**31): its edges."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.sim.reference import simulate_reference
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    R_PRIORITY,
    W_DISCARDED,
    W_TOTAL,
    PrefixKeys,
    priority_column,
    request_state,
    wide,
)
from tests.helpers import make_input, make_scenario


def test_priorities_beyond_int32_schedule_as_their_ranks() -> None:
    # tight KV and a burst: the priority policy preempts, so the order matters
    inp = make_input([0.0] * 6, [300, 40, 300, 40, 300, 40], [30, 5, 30, 5, 30, 5])
    sc = make_scenario("vllm", scheduling_policy="priority", num_gpu_blocks=40)
    huge = np.array([2**40, -(2**45), 7, 2**40, 2**62, -3], dtype=np.int64)
    ranks = np.array([3, 0, 2, 3, 4, 1], dtype=np.int64)
    big = simulate(dataclasses.replace(inp, priority=huge), sc.engine())
    small = simulate(dataclasses.replace(inp, priority=ranks), sc.engine())
    assert big.rq[:, R_PRIORITY].tolist() == ranks.tolist()
    assert np.array_equal(big.rq, small.rq)
    assert np.array_equal(big.rqf, small.rqf, equal_nan=True)
    assert big.rqw[:, W_DISCARDED].sum() > 0  # it did preempt
    ref = simulate_reference(dataclasses.replace(inp, priority=huge), sc)
    assert np.array_equal(big.rq, ref.rq)


def test_priorities_within_int32_are_kept() -> None:
    prio = np.array([-(2**31), 0, 2**31 - 1], dtype=np.int64)
    assert priority_column(prio).tolist() == prio.tolist()


def test_lengths_beyond_int32_are_refused_naming_the_request() -> None:
    inp = make_input([0.0, 1.0], [10, 2**31 - 5], [2, 10])
    with pytest.raises(ValueError, match="request 1 has 2,147,483,653 prompt"):
        request_state(inp, PrefixKeys.empty(2), 16)


def test_wide_columns_hold_int64_in_the_same_rows() -> None:
    rq = request_state(make_input([0.0, 0.0], [5, 6], [1, 2]), PrefixKeys.empty(2), 16)
    wide(rq)[1, W_TOTAL] = 3 * 2**40
    assert rq.dtype == np.int32 and wide(rq)[1, W_TOTAL] == 3 * 2**40
    assert wide(rq)[0, W_TOTAL] == 0 and rq[1, :2].tolist() == [6, 2]
