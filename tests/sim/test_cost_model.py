"""The step-cost function (model v3) and its closed-form sum over runs of decode steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import (
    COST_MODEL_VERSION,
    OPTIONAL_COEFFICIENTS,
    V2_COEFFICIENTS,
    V3_COEFFICIENTS,
    V4_COEFFICIENTS,
    StepCost,
    decode_run_s,
    load_step_cost,
    step_time,
)
from pipeline.sim.profiles import DEFAULT_PROFILE, PROFILE_DIR, load_profile
from pipeline.sim.scenario import build_scenario

coef = st.sampled_from([0.0, 1e-9, 3e-7, 2e-5, 1e-3])
half = st.sampled_from([0.0, 1.0, 64.0, 300.0, 5000.0])
overlap = st.sampled_from([0.0, 0.1, 0.5, 1.0])
v1_costs = st.builds(StepCost, coef, coef, coef, coef, coef, coef, coef, coef)
v2_costs = st.builds(
    StepCost, coef, coef, coef, coef, coef, coef, coef, coef, coef, half, overlap, coef
)
separate = st.sampled_from([0.0, 0.5, 1.0])
v3_costs = st.builds(
    StepCost, coef, coef, coef, coef, coef, coef, coef, coef, coef, half, overlap, coef, coef,
    separate,
)  # fmt: skip


def _step_by_step(arr: npt.NDArray[np.float64], d: int, ctx0: int, k: int) -> float:
    return sum(step_time(arr, 0.0, 0.0, float(d), float(d), float(ctx0 + j * d)) for j in range(k))


@settings(max_examples=600, deadline=None)
@given(
    # v2: per-sequence cost, half-efficiency tokens, overlap; v3: lm head, separate attention
    c=st.one_of(v1_costs, v2_costs, v3_costs),
    d=st.integers(1, 512),
    ctx0=st.integers(0, 200_000),
    k=st.integers(0, 400),
)
def test_closed_form_equals_step_by_step(c: StepCost, d: int, ctx0: int, k: int) -> None:
    arr = c.as_array()
    ref = _step_by_step(arr, d, ctx0, k)
    got = decode_run_s(arr, float(d), float(ctx0), k)
    assert abs(got - ref) <= 1e-9 * abs(ref) + 1e-15


def test_closed_form_crosses_over_inside_the_run_with_overlap() -> None:
    # memory leads at first, compute overtakes at step 39: both halves of the split count
    c = StepCost(
        fixed_s=1e-3,
        flop_s_per_token=1e-5,
        flop_s_per_attn=1e-5,
        mem_s_weights=5e-3,
        mem_s_per_kv_token=0.0,
        mem_s_per_token=0.0,
        comm_s_fixed=0.0,
        comm_s_per_token=0.0,
        seq_s=4e-4,
        flop_tokens_half=100.0,
        overlap=0.3,
    )
    arr = c.as_array()
    d, ctx0, k = 10, 0, 120
    compute = [1e-5 * (d + 100) + 1e-5 * (ctx0 + j * d) for j in range(k)]
    assert compute[0] < 5e-3 < compute[-1]
    ref = _step_by_step(arr, d, ctx0, k)
    assert decode_run_s(arr, float(d), float(ctx0), k) == pytest.approx(ref, rel=1e-12)


def test_equal_slopes_do_not_divide_by_zero() -> None:
    c = StepCost(1e-3, 1e-6, 0.0, 5e-3, 0.0, 0.0, 0.0, 0.0)
    assert decode_run_s(c.as_array(), 8.0, 100.0, 10) == pytest.approx(10 * (1e-3 + 5e-3))


def test_an_empty_step_costs_nothing() -> None:
    c = StepCost(1e-3, 1e-6, 1e-9, 5e-3, 1e-7, 1e-8, 1e-5, 1e-8, 4e-4, 128.0, 0.2)
    assert c.step_s(0, 0, 0, 0, 0) == 0.0
    assert c.step_s(10, 55, 1, 0, 0) > c.fixed_s


def test_v2_terms_by_hand() -> None:
    c = StepCost(
        fixed_s=1e-3,
        flop_s_per_token=1e-5,
        flop_s_per_attn=0.0,
        mem_s_weights=2e-3,
        mem_s_per_kv_token=0.0,
        mem_s_per_token=0.0,
        comm_s_fixed=5e-4,
        comm_s_per_token=0.0,
        seq_s=4e-4,
        flop_tokens_half=100.0,
        overlap=0.5,
    )
    # 4 decodes: compute 1e-5 * 104 = 1.04 ms < memory 2 ms
    assert c.step_s(0, 0, 4, 4, 400) == pytest.approx(1e-3 + 5e-4 + 4 * 4e-4 + 2e-3 + 0.5 * 1.04e-3)
    # one 1,000-token prefill: compute 11 ms > memory 2 ms
    assert c.prefill_step_s(1, 1000) == pytest.approx(1e-3 + 5e-4 + 4e-4 + 11e-3 + 0.5 * 2e-3)


steps = st.tuples(
    st.integers(0, 8192),  # P
    st.integers(0, 10**7),  # A
    st.integers(0, 256),  # N
    st.integers(0, 256),  # D
    st.integers(0, 10**6),  # C
)


@settings(max_examples=400, deadline=None)
@given(c=st.one_of(v2_costs, v3_costs), base=steps, more=steps)
def test_more_work_never_makes_a_step_cheaper(
    c: StepCost, base: tuple[int, ...], more: tuple[int, ...]
) -> None:
    # more tokens, more attention pairs, more sequences or more context: never cheaper
    arr = c.as_array()
    bigger = tuple(b + m for b, m in zip(base, more, strict=True))
    assert step_time(arr, *map(float, bigger)) >= step_time(arr, *map(float, base))


@settings(max_examples=200, deadline=None)
@given(c=st.one_of(v2_costs, v3_costs), batch=st.integers(1, 128), ctx=st.integers(0, 32_000))
def test_another_sequence_never_makes_a_step_cheaper(c: StepCost, batch: int, ctx: int) -> None:
    assert c.decode_step_s(batch + 1, ctx) >= c.decode_step_s(batch, ctx)
    assert c.prefill_step_s(batch + 1, 128) >= c.prefill_step_s(batch, 128)


@settings(max_examples=200, deadline=None)
@given(c=v1_costs, p=st.integers(0, 4096), d=st.integers(0, 64), ctx=st.integers(0, 10**5))
def test_v2_with_zero_new_terms_is_the_v1_formula(c: StepCost, p: int, d: int, ctx: int) -> None:
    a = p * (p + 1) // 2
    v1 = 0.0
    if p + d > 0:
        compute = c.flop_s_per_token * (p + d) + c.flop_s_per_attn * (a + ctx)
        memory = c.mem_s_weights + c.mem_s_per_kv_token * ctx + c.mem_s_per_token * (p + d)
        v1 = c.fixed_s + max(compute, memory) + c.comm_s_fixed + c.comm_s_per_token * (p + d)
    n = (1 if p else 0) + d  # N does not matter when seq_s is 0
    assert c.step_s(p, a, n, d, ctx) == v1


def test_a_v1_profile_loads_and_gives_the_v1_time(tmp_path: Path) -> None:
    v1 = {
        "fixed_s": 1e-3,
        "flop_s_per_token": 2e-5,
        "flop_s_per_attn": 1e-10,
        "mem_s_weights": 6e-3,
        "mem_s_per_kv_token": 1e-7,
        "mem_s_per_token": 1e-6,
        "comm_s_fixed": 0.0,
        "comm_s_per_token": 0.0,
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"coefficients": v1}))
    c = load_step_cost(path)
    assert all(getattr(c, n) == 0.0 for n in V2_COEFFICIENTS)
    # decode of 8 at 1,000 context: memory 6 ms + 0.8 ms of KV + 8 us > compute 0.16 ms + 0.8 us
    assert c.step_s(0, 0, 8, 8, 8000) == pytest.approx(1e-3 + 6e-3 + 8e-4 + 8e-6, rel=1e-12)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [("seq_s", -1e-3, "seq_s must be"), ("overlap", 1.5, "overlap must be in [0, 1]")],
)
def test_bad_coefficients_are_refused(name: str, value: float, message: str) -> None:
    good = StepCost(1e-3, 1e-6, 1e-9, 5e-3, 1e-7, 1e-8, 1e-5, 1e-8).to_dict()
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        StepCost.from_dict({**good, name: value})


V1_TABLE = {
    "fixed_s": 1e-3,
    "flop_s_per_token": 2e-5,
    "flop_s_per_attn": 1e-10,
    "mem_s_weights": 6e-3,
    "mem_s_per_kv_token": 1e-7,
    "mem_s_per_token": 1e-6,
    "comm_s_fixed": 0.0,
    "comm_s_per_token": 0.0,
}


def test_a_scenario_cost_table_may_leave_out_the_v2_terms() -> None:
    sc = build_scenario({"cost": V1_TABLE, "num_gpu_blocks": 100})
    assert all(getattr(sc.cost, n) == 0.0 for n in V2_COEFFICIENTS)
    v2 = {**V1_TABLE, "seq_s": 4e-4, "flop_tokens_half": 128.0, "overlap": 0.2}
    assert build_scenario({"cost": v2, "num_gpu_blocks": 100}).cost.overlap == 0.2


def test_a_scenario_cost_table_refuses_overlap_above_one() -> None:
    with pytest.raises(ScenarioError, match=r"cost.overlap must be in \[0, 1\], got 1.5"):
        build_scenario({"cost": {**V1_TABLE, "overlap": 1.5}, "num_gpu_blocks": 100})


def test_a_profile_from_a_newer_cost_model_is_refused(tmp_path: Path) -> None:
    data = json.loads((PROFILE_DIR / f"{DEFAULT_PROFILE}.json").read_text())
    data["cost_model_version"] = COST_MODEL_VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match=f"cost_model_version {COST_MODEL_VERSION + 1} is not"):
        load_profile(path)
    data.pop("cost_model_version")  # no version: a v1 profile, loads
    path.write_text(json.dumps(data))
    assert load_profile(path).cost_model_version == 1


def _v2_formula(c: StepCost, p: float, a: float, n: float, d: float, ctx: float) -> float:
    """The v2 step time, written out as docs/cost_model.md gave it before v3."""
    tok = p + d
    if tok <= 0:
        return 0.0
    compute = c.flop_s_per_token * (tok + c.flop_tokens_half) + c.flop_s_per_attn * (a + ctx)
    memory = c.mem_s_weights + c.mem_s_per_kv_token * ctx + c.mem_s_per_token * tok
    v1 = c.fixed_s + max(compute, memory) + c.comm_s_fixed + c.comm_s_per_token * tok
    v2 = v1 + c.seq_s * n + c.overlap * min(compute, memory)
    return v2 + c.prefill_fixed_s if p > 0 else v2


@settings(max_examples=300, deadline=None)
@given(c=v2_costs, base=steps)
def test_v3_with_zero_new_terms_is_the_v2_formula_bit_for_bit(
    c: StepCost, base: tuple[int, ...]
) -> None:
    p, a, n, d, ctx = map(float, base)
    assert c.flop_s_per_seq == 0.0 and c.separate_attention == 0.0
    assert c.step_s(p, a, n, d, ctx) == _v2_formula(c, p, a, n, d, ctx)


def test_v3_terms_by_hand() -> None:
    c = StepCost(
        fixed_s=1e-3,
        flop_s_per_token=1e-5,
        flop_s_per_attn=2e-9,
        mem_s_weights=2e-3,
        mem_s_per_kv_token=1e-7,
        mem_s_per_token=0.0,
        comm_s_fixed=0.0,
        comm_s_per_token=0.0,
        flop_s_per_seq=5e-5,
        separate_attention=1.0,
    )
    # 4 decodes at 1,000 context each: linear layers max(1e-5 * 4 + 4 * 5e-5, 2 ms) = 2 ms,
    # then their attention apart: the KV reads (1e-7 per token) beat the pairs (2e-9)
    assert c.step_s(0, 0, 4, 4, 4000) == pytest.approx(1e-3 + 2e-3 + 4000 * 1e-7)
    # a 1,000-token prefill beside those 4 decodes: compute-bound linear layers, and the
    # decodes' KV reads still cost their time (v2 hid them behind the prefill's compute)
    pairs = 1000 * 1001 / 2
    want = 1e-3 + (1e-5 * 1004 + 5 * 5e-5) + 2e-9 * pairs + 4000 * 1e-7
    assert c.step_s(1000, pairs, 5, 4, 4000) == pytest.approx(want)


def test_the_lm_head_is_charged_per_sequence_not_per_prompt_token() -> None:
    c = StepCost(0.0, 1e-5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, flop_s_per_seq=1e-3)
    # one 1,000-token prompt computes logits for its last token only: one head, not 1,000
    assert c.prefill_step_s(1, 1000) == pytest.approx(1e-5 * 1000 + 1e-3)
    assert c.prefill_step_s(2, 1000) == pytest.approx(1e-5 * 2000 + 2e-3)


def test_separate_attention_above_one_is_refused() -> None:
    good = StepCost(1e-3, 1e-6, 1e-9, 5e-3, 1e-7, 1e-8, 1e-5, 1e-8).to_dict()
    with pytest.raises(ValueError, match=r"separate_attention must be in \[0, 1\]"):
        StepCost.from_dict({**good, "separate_attention": 2.0})
    with pytest.raises(ScenarioError, match=r"cost.separate_attention must be in \[0, 1\]"):
        build_scenario({"cost": {**V1_TABLE, "separate_attention": 1.5}, "num_gpu_blocks": 100})


def older_profile(tmp_path: Path, version: int, *newer: tuple[str, ...]) -> Path:
    """The default profile as a file of cost model ``version``: without the ``newer`` terms."""
    data = json.loads((PROFILE_DIR / f"{DEFAULT_PROFILE}.json").read_text())
    data["cost_model_version"] = version
    for names in newer:
        for name in names:
            data["coefficients"].pop(name)
    path = tmp_path / f"v{version}.json"
    path.write_text(json.dumps(data))
    return path


def test_a_v2_profile_loads_with_the_v3_terms_at_zero(tmp_path: Path) -> None:
    prof = load_profile(older_profile(tmp_path, 2, V3_COEFFICIENTS, V4_COEFFICIENTS))
    assert prof.cost_model_version == 2
    assert all(getattr(prof.cost, n) == 0.0 for n in V3_COEFFICIENTS)
    assert set(OPTIONAL_COEFFICIENTS) == set(V2_COEFFICIENTS) | set(V3_COEFFICIENTS) | set(
        V4_COEFFICIENTS
    )
