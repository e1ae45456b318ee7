"""The step-cost function and its closed-form sum over runs of decode steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sim.cost_model import StepCost, decode_run_s, step_time

coef = st.sampled_from([0.0, 1e-9, 3e-7, 2e-5, 1e-3])


@settings(max_examples=300, deadline=None)
@given(
    c=st.builds(StepCost, coef, coef, coef, coef, coef, coef, coef, coef),
    d=st.integers(1, 512),
    ctx0=st.integers(0, 200_000),
    k=st.integers(0, 400),
)
def test_closed_form_equals_step_by_step(c: StepCost, d: int, ctx0: int, k: int) -> None:
    arr = c.as_array()
    ref = sum(step_time(arr, 0.0, 0.0, float(d), float(ctx0 + j * d)) for j in range(k))
    got = decode_run_s(arr, float(d), float(ctx0), k)
    assert abs(got - ref) <= 1e-9 * abs(ref) + 1e-15


def test_equal_slopes_do_not_divide_by_zero() -> None:
    c = StepCost(1e-3, 1e-6, 0.0, 5e-3, 0.0, 0.0, 0.0, 0.0)
    assert decode_run_s(c.as_array(), 8.0, 100.0, 10) == pytest.approx(10 * (1e-3 + 5e-3))


def test_an_empty_step_costs_nothing() -> None:
    c = StepCost(1e-3, 1e-6, 1e-9, 5e-3, 1e-7, 1e-8, 1e-5, 1e-8)
    assert c.step_s(0, 0, 0, 0) == 0.0
    assert c.step_s(10, 55, 0, 0) > c.fixed_s
