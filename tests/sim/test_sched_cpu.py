"""The scheduler's CPU time (cost model v4): synchronous engines pay it, asynchronous hide it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import (
    V4_COEFFICIENTS,
    StepCost,
    decode_gpu_s,
    decode_run_s,
    gpu_step_time,
    step_time,
)
from pipeline.sim.profiles import DEFAULT_PROFILE, load_profile
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SF_DURATION, SF_SCHED_CPU, SF_SCHED_EXPOSED, SimInput
from pipeline.sim.summary import summarize
from tests.sim.test_cost_model import older_profile, v3_costs

cpu_coef = st.sampled_from([0.0, 1e-4, 1e-3, 5e-3, 2e-2])
seq_coef = st.sampled_from([0.0, 1e-6, 3e-5, 1e-3])


def _with_cpu(c: StepCost, cpu: float, per_seq: float) -> StepCost:
    return dataclasses.replace(c, sched_cpu_s=cpu, sched_cpu_per_seq_s=per_seq)


@settings(max_examples=500, deadline=None)
@given(
    c=v3_costs,
    cpu=cpu_coef,
    per_seq=seq_coef,
    overlap=st.booleans(),
    d=st.integers(1, 512),
    ctx0=st.integers(0, 200_000),
    k=st.integers(0, 400),
)
def test_a_decode_run_with_cpu_time_equals_its_steps_summed(
    c: StepCost, cpu: float, per_seq: float, overlap: bool, d: int, ctx0: int, k: int
) -> None:
    arr = _with_cpu(c, cpu, per_seq).as_array(overlap)
    ref = sum(step_time(arr, 0.0, 0.0, float(d), float(d), float(ctx0 + j * d)) for j in range(k))
    got = decode_run_s(arr, float(d), float(ctx0), k)
    assert abs(got - ref) <= 1e-9 * abs(ref) + 1e-15


def test_a_run_that_turns_gpu_bound_inside_splits_where_the_gpu_overtakes() -> None:
    # GPU step j = 1 ms + 1e-5 s * (j * d) of KV reads: past the CPU's 3 ms from step 50
    c = StepCost(1e-3, 0.0, 0.0, 0.0, 1e-5, 0.0, 0.0, 0.0, sched_cpu_s=3e-3)
    sync, overlapped = c.as_array(False), c.as_array(True)
    d, ctx0, k = 4, 0, 200
    gpu = [gpu_step_time(sync, 0.0, 0.0, d, d, ctx0 + j * d) for j in range(k)]
    assert gpu[0] < 3e-3 < gpu[-1]  # the crossover is inside the run
    expect_async = sum(max(g, 3e-3) for g in gpu)
    assert decode_run_s(overlapped, d, ctx0, k) == pytest.approx(expect_async, rel=1e-12)
    assert decode_run_s(sync, d, ctx0, k) == pytest.approx(sum(gpu) + k * 3e-3, rel=1e-12)
    assert decode_gpu_s(sync, d, ctx0, k) == pytest.approx(sum(gpu), rel=1e-12)


def test_one_step_synchronous_adds_asynchronous_takes_the_larger() -> None:
    c = StepCost(1e-3, 1e-5, 0.0, 2e-3, 0.0, 0.0, 0.0, 0.0, sched_cpu_s=1e-3)
    c = dataclasses.replace(c, sched_cpu_per_seq_s=2e-4)
    gpu = gpu_step_time(c.as_array(), 0.0, 0.0, 8.0, 8.0, 100.0)
    cpu = 1e-3 + 8 * 2e-4
    assert step_time(c.as_array(False), 0.0, 0.0, 8.0, 8.0, 100.0) == gpu + cpu
    assert step_time(c.as_array(True), 0.0, 0.0, 8.0, 8.0, 100.0) == max(gpu, cpu)
    assert step_time(c.as_array(True), 0.0, 0.0, 0.0, 0.0, 0.0) == 0.0  # nothing to do


def test_a_v3_profile_loads_with_no_cpu_time_and_its_v3_times(tmp_path: Path) -> None:
    prof = load_profile(older_profile(tmp_path, 3, V4_COEFFICIENTS))
    assert prof.cost_model_version == 3
    assert prof.cost.sched_cpu_s == prof.cost.sched_cpu_per_seq_s == 0.0
    for overlap in (False, True):
        arr = prof.cost.as_array(overlap)
        for p, a, n, d, ctx in [(0, 0, 8, 8, 8000), (512, 131328, 3, 2, 900), (1, 1, 1, 0, 0)]:
            assert step_time(arr, p, a, n, d, ctx) == gpu_step_time(arr, p, a, n, d, ctx)
        assert decode_run_s(arr, 8.0, 800.0, 50) == decode_gpu_s(arr, 8.0, 800.0, 50)


@pytest.mark.parametrize(
    ("values", "overlaps"),
    [
        ({"policy": "vllm"}, True),  # async_scheduling defaults to true
        ({"policy": "vllm", "async_scheduling": False}, False),
        ({"policy": "sglang"}, True),  # the overlap scheduler is on by default
        ({"policy": "sglang", "overlap_schedule": False}, False),
        ({"policy": "tgi"}, False),
        ({"policy": "sarathi"}, False),
        ({"policy": "orca"}, False),
    ],
)
def test_which_engines_overlap(values: dict[str, Any], overlaps: bool) -> None:
    sc = build_scenario(values)
    assert sc.sched_overlap is overlaps
    assert sc.engine().cost[-1] == float(overlaps)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sched_cpu_s", -1e-3, "sched_cpu_s"),
        ("sched_cpu_s", float("nan"), "sched_cpu_s"),
        ("sched_cpu_per_seq_s", "fast", "sched_cpu_per_seq_s"),
        ("sched_cpu_per_seq_s", 1e9, "sched_cpu_per_seq_s"),
    ],
)
def test_bad_cpu_times_are_refused_naming_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        build_scenario({key: value})


def test_the_scenario_keys_override_the_profile() -> None:
    sc = build_scenario({"sched_cpu_s": 1.5e-3, "sched_cpu_per_seq_s": 1e-5})
    assert (sc.cost.sched_cpu_s, sc.cost.sched_cpu_per_seq_s) == (1.5e-3, 1e-5)
    assert sc.cost.fixed_s == load_profile(DEFAULT_PROFILE).cost.fixed_s


def _replay(**keys: Any) -> tuple[Any, dict[str, Any]]:
    rng = np.random.default_rng(7)
    n = 60
    inp = SimInput(
        np.sort(rng.uniform(0, 4.0, n)),
        rng.integers(50, 900, n).astype(np.int64),
        rng.integers(20, 200, n).astype(np.int64),
    )
    sc = build_scenario({"policy": "vllm", "num_gpu_blocks": 4000, **keys})
    res = simulate(inp, sc.engine())
    return res, summarize(res)


def test_synchronous_pays_all_asynchronous_hides_some_and_off_changes_nothing() -> None:
    base, base_sum = _replay()
    zero, zero_sum = _replay(sched_cpu_s=0.0, sched_cpu_per_seq_s=0.0)
    assert np.array_equal(base.rqf, zero.rqf, equal_nan=True) and base_sum == zero_sum
    assert "sched_cpu_s" not in base_sum and not base.stf[:, SF_SCHED_CPU].any()
    cpu = {"sched_cpu_s": 2e-3, "sched_cpu_per_seq_s": 2e-5}
    sync, sync_sum = _replay(async_scheduling=False, **cpu)
    asyn, asyn_sum = _replay(async_scheduling=True, **cpu)
    assert sync_sum["sched_cpu_exposed_s"] == pytest.approx(sync_sum["sched_cpu_s"])
    assert sync_sum["sched_cpu_hidden_s"] == pytest.approx(0.0, abs=1e-12)
    assert 0 <= asyn_sum["sched_cpu_exposed_s"] < asyn_sum["sched_cpu_s"]
    assert asyn_sum["sched_cpu_hidden_s"] > 0
    # a step's time is its GPU time plus what of its CPU time is on the critical path
    for res in (sync, asyn):
        busy = res.stf[:, SF_DURATION].sum()
        assert res.stf[:, SF_SCHED_EXPOSED].sum() == pytest.approx(busy - _gpu_busy(res, cpu))
    assert sync_sum["e2e_p50_s"] > _replay(async_scheduling=False)[1]["e2e_p50_s"]


def _gpu_busy(res: Any, cpu: dict[str, float]) -> float:
    """The GPU's busy time of a replay's rows, recomputed from their features."""
    from pipeline.sim.state import S_DECODE, S_NUM_STEPS, S_PREFILL, S_RUNNING, SF_ATTN, SF_CTX

    arr = build_scenario({"policy": "vllm", "num_gpu_blocks": 4000, **cpu}).cost.as_array()
    total = 0.0
    for st_row, stf_row in zip(res.st, res.stf, strict=True):
        k, d = int(st_row[S_NUM_STEPS]), float(st_row[S_DECODE])
        if k == 1:
            total += gpu_step_time(
                arr, float(st_row[S_PREFILL]), stf_row[SF_ATTN], float(st_row[S_RUNNING]), d,
                stf_row[SF_CTX],
            )  # fmt: skip
        else:
            total += decode_gpu_s(arr, d, stf_row[SF_CTX], k)
    return total


def test_a_sweep_axis_turns_each_engines_overlap_on_and_off() -> None:
    from pipeline.plan.grid import build_grid
    from tests.helpers import BASE

    raw = {
        "base": dict(BASE),
        "axes": {"policy": ["vllm", "sglang"], "sched_overlap": [True, False]},
    }
    got = {(sc.policy, sc.sched_overlap) for sc in build_grid(raw, where="g.toml").scenarios}
    assert got == {("vllm", True), ("vllm", False), ("sglang", True), ("sglang", False)}
    sync_only = {"base": dict(BASE), "axes": {"policy": ["tgi"], "sched_overlap": [False]}}
    assert [sc.sched_overlap for sc in build_grid(sync_only, where="g.toml").scenarios] == [False]
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="tgi.*schedules synchronously"):
        build_grid(
            {"base": dict(BASE), "axes": {"policy": ["tgi"], "sched_overlap": [True]}},
            where="g.toml",
        )
    with pytest.raises(ConfigError, match="do not give async_scheduling"):
        build_grid(
            {"base": dict(BASE), "axes": {"sched_overlap": [True], "async_scheduling": [False]}},
            where="g.toml",
        )
