"""The bisection searches: exact on monotone curves, bounded in probes, honest when not."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pipeline.plan.search import find_violation, highest_float, highest_int, lowest_int


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(1, 4096))
def test_highest_int_finds_the_top_of_the_meeting_window(first: int, last: int, hi: int) -> None:
    lo_meet, hi_meet = min(first, last), max(first, last)
    calls: list[float] = []

    def measure(v: float) -> bool:
        calls.append(v)
        return lo_meet <= v <= hi_meet

    r = highest_int(measure, 1, hi)
    # doubling finds the window when a power of two lands in it
    powers = [2**k for k in range(13) if 2**k <= hi] + [hi]
    if any(lo_meet <= p <= hi_meet for p in powers):
        assert r.answer == min(hi_meet, hi)
        assert r.at_range_end == (r.answer == hi)
    else:
        assert r.answer is None
    assert r.monotone
    assert len(calls) == len(set(calls)) <= 2 * math.ceil(math.log2(hi)) + 3


@given(st.integers(1, 512), st.integers(1, 512))
def test_lowest_int_finds_the_first_that_meets(need: int, hi: int) -> None:
    r = lowest_int(lambda v: v >= need, 1, hi)
    assert r.answer == (need if need <= hi else None)
    assert r.monotone and len(r.probes) <= 2 * math.ceil(math.log2(max(hi, 2))) + 2


@given(
    st.floats(0.01, 1000.0),
    st.floats(0.01, 1000.0),
    st.sampled_from([0.001, 0.02, 0.1]),
)
def test_highest_float_brackets_the_capacity_within_tolerance(
    capacity: float, start: float, tol: float
) -> None:
    r = highest_float(lambda v: v <= capacity, start, 0.001, 5000.0, rel_tol=tol, max_probes=80)
    assert r.answer is not None and r.answer <= capacity and r.monotone
    fails = [v for v, met in r.probes if not met]
    if fails:  # the nearest failing probe is within the tolerance (plus rounding)
        assert min(f for f in fails if f > r.answer) <= r.answer * (1 + tol) * 1.001 + 1e-9


def test_highest_float_range_ends() -> None:
    top = highest_float(lambda v: True, 1.0, 0.5, 8.0)
    assert top.answer == 8.0 and top.at_range_end
    none = highest_float(lambda v: False, 1.0, 0.25, 8.0)
    assert none.answer is None and [v for v, _ in none.probes] == [1.0, 0.5, 0.25]


def test_a_curve_that_is_not_monotone_is_reported() -> None:
    # meets from 8 to 99, fails from 100 to 199 (preemption), meets again from 200
    r = highest_int(lambda v: 8 <= v < 100 or v >= 200, 1, 1024)
    assert r.answer == 99 and not r.monotone
    assert r.violation == (100, 256)  # the check probe above the first failure meets
    # a rate curve that dips: fails from 3 to 6, meets again above
    f = highest_float(lambda v: v <= 3.0 or v >= 6.0, 1.0, 0.1, 100.0, rel_tol=0.05)
    assert f.answer is not None and f.answer <= 3.0 and not f.monotone
    # more replicas that fail again
    g = lowest_int(lambda v: v in (3, 4, 5), 1, 64)
    assert g.answer == 3 and not g.monotone


def test_find_violation_shapes() -> None:
    assert find_violation([(1, True), (2, True), (3, False)], "T*F*") is None
    assert find_violation([(1, True), (2, False), (3, True)], "T*F*") == (2, 3)
    assert find_violation([(1, False), (2, True), (3, False)], "F*T*") == (2, 3)
    assert find_violation([(1, False), (2, True), (4, False)], "F*T*F*") is None
    assert find_violation([(1, True), (2, False), (4, True)], "F*T*F*") == (2, 4)


def test_probe_budget_stops_the_search() -> None:
    r = highest_float(lambda v: v <= 3.0, 1.0, 0.001, 1e6, rel_tol=1e-9, max_probes=5)
    assert len(r.probes) == 5 and r.answer is not None and r.answer <= 3.0
