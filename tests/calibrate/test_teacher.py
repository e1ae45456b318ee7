"""Teacher rows: a replay's per-request latencies as sums of cost-group seconds, exact at the
profile they were taken at, and the step parts summing to every timeline row's duration."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.calibrate.teacher import LAUNCH, NAMES, step_parts, teacher_rows
from pipeline.sim.cost_model import StepCost
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SF_DURATION, SimInput
from pipeline.sim.summary import request_metrics

V2 = StepCost(1e-3, 2e-5, 1e-9, 5e-3, 1e-7, 1e-6, 0.0, 0.0, 3e-5, 64.0, 0.1, 2e-3)


def _workload(n: int, seed: int, rate: float = 12.0) -> SimInput:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    return SimInput(arrival, rng.integers(20, 3000, n), rng.integers(1, 400, n))


@pytest.mark.parametrize(
    "values",
    [
        {"policy": "vllm"},  # the default v3 profile: attention apart, the lm head per sequence
        {"policy": "vllm", "replicas": 3, "router": "least_outstanding", "max_num_seqs": 32},
        {"policy": "vllm", "num_gpu_blocks": 400, "max_num_batched_tokens": 1024},  # preempts
        {"policy": "sglang"},
        {"policy": "vllm", "cost": V2.to_dict(), "num_gpu_blocks": 3000},  # a v2 profile
    ],
    ids=["vllm", "replicas", "preempting", "sglang", "v2"],
)
def test_rows_reproduce_the_replay_exactly(values: dict[str, object]) -> None:
    sc = build_scenario(values)
    res = simulate(_workload(800, seed=3), sc.engine())
    cost = sc.cost.as_array()
    w = np.ones(len(NAMES))
    w[LAUNCH] = sc.cost.prefill_fixed_s
    parts = step_parts(cost, res.st, res.stf)
    dur = res.stf[:, SF_DURATION]
    assert parts @ w == pytest.approx(dur, rel=1e-9, abs=1e-15)
    rows = teacher_rows(res, cost)
    m = request_metrics(res, engine=True)
    decode = m["engine_e2e_s"] - m["engine_ttft_s"]
    assert rows.engine_ttft(np.ones(len(NAMES))) == pytest.approx(m["engine_ttft_s"], rel=1e-9)
    assert rows.engine_decode(np.ones(len(NAMES))) == pytest.approx(decode, rel=1e-9, abs=1e-12)
    # what the groups leave (the replica idle before a request) is a small share
    assert np.abs(rows.ttft_rest).max() <= 1e-9 + 0.5 * m["engine_ttft_s"].max()


def test_scaling_a_group_scales_what_it_explains() -> None:
    sc = build_scenario({"policy": "vllm"})
    res = simulate(_workload(300, seed=5, rate=1.0), sc.engine())
    rows = teacher_rows(res, sc.cost.as_array())
    s = np.ones(len(NAMES))
    base = rows.engine_decode(s)
    s[NAMES.index("memory")] = 2.0
    more = rows.engine_decode(s)
    memory = rows.decode[:, NAMES.index("memory")]
    assert more - base == pytest.approx(memory, rel=1e-9, abs=1e-15)
    # at low load decodes of a memory-bound model spend most of their time reading weights
    # and KV (prefills of other requests, compute, take a share of the rest)
    assert np.median(memory / np.maximum(base, 1e-12)) > 0.5
