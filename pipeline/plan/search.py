"""Bisection for capacity searches: where does "meets every SLO" flip along one knob?

Each search assumes a shape of the verdict along the knob, finds the flip by
doubling (galloping) and then bisecting, and afterwards checks every probe it
made against the assumed shape:

- ``highest_int`` (concurrency cap): fails at small caps (requests queue),
  meets from some cap on, may fail again at large caps (bigger batches slow
  every step; KV pressure preempts). Shape F* T+ F*. Doubles from ``lo``
  until a cap meets and then until one fails, and bisects between the last
  cap that met and the first that failed. Answer: the highest cap that meets.
- ``highest_float`` (request rate): meets at low rates, fails at high ones.
  Shape T* F*. Doubles up (or halves down) from a start rate until the
  verdict flips, then bisects to a relative tolerance. Answer: the highest
  rate that meets.
- ``lowest_int`` (replicas): fails with too few, meets with enough. Shape
  F* T*. Doubles from ``lo`` until it meets, then bisects. Answer: the fewest
  that meet.

The measured verdicts need not follow the shape: preemption can make a larger
cap or a lower rate worse. After the bisection each search makes one check
probe beyond the boundary (twice the first failing value; twice the answer
for replicas) that should agree with it, unless an earlier probe out there
already does. Bisection still returns a boundary,
but when any probe breaks the shape the result says the curve is not
monotone and names two probes that show it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Measure = Callable[[float], bool]  # knob value -> every SLO met


@dataclass(frozen=True)
class SearchResult:
    """Where the verdict flips, and every probe on the way (in probe order)."""

    answer: float | None  # None: nothing probed meets
    probes: list[tuple[float, bool]]  # (value, met) in the order they were measured
    monotone: bool  # every probe agrees with the assumed shape
    at_range_end: bool  # highest_*: the answer is the top of the range (more may meet)
    violation: tuple[float, float] | None = None  # two probes that break the shape


class _Probes:
    """Memoized measurements in probe order."""

    def __init__(self, measure: Measure, max_probes: int) -> None:
        self._measure = measure
        self._max = max_probes
        self.seen: dict[float, bool] = {}

    def __call__(self, value: float) -> bool:
        if value not in self.seen:
            if len(self.seen) >= self._max:
                raise _ProbesExhaustedError
            self.seen[value] = bool(self._measure(value))
        return self.seen[value]

    def result(self, answer: float | None, shape: str, at_range_end: bool) -> SearchResult:
        probes = list(self.seen.items())
        violation = find_violation(probes, shape)
        return SearchResult(answer, probes, violation is None, at_range_end, violation)


class _ProbesExhaustedError(Exception):
    """The search used its probe budget; it answers with what it has."""


def find_violation(probes: list[tuple[float, bool]], shape: str) -> tuple[float, float] | None:
    """Two probes (lower value first) that break ``shape``, or None.

    Shapes, reading the verdicts from low to high values: ``"T*F*"`` (meets,
    then fails), ``"F*T*"`` (fails, then meets), ``"F*T*F*"`` (one run of meets).
    """
    ordered = sorted(probes)
    if shape == "T*F*":
        fails = [v for v, met in ordered if not met]
        for v, met in ordered:
            if met and fails and fails[0] < v:
                return (fails[0], v)
        return None
    if shape == "F*T*":
        meets = [v for v, met in ordered if met]
        for v, met in ordered:
            if not met and meets and meets[0] < v:
                return (meets[0], v)
        return None
    if shape == "F*T*F*":
        state, fail_after = "before", 0.0
        for v, met in ordered:
            if state == "before" and met:
                state = "in"
            elif state == "in" and not met:
                state, fail_after = "after", v
            elif state == "after" and met:
                return (fail_after, v)
        return None
    raise ValueError(f"unknown shape {shape!r}")


def find_violations(probes: list[tuple[float, bool]], shape: str) -> list[tuple[float, float]]:
    """Every pair of probes that breaks ``shape``, as (the one that fails, the one that meets),
    lower value first within each kind of break.

    ``"T*F*"``: a fail below a meet; ``"F*T*"``: a meet below a fail; ``"F*T*F*"``: a
    fail between two meets (paired with the later meet).
    """
    ordered = sorted(probes)
    fails = [v for v, met in ordered if not met]
    meets = [v for v, met in ordered if met]
    if shape == "T*F*":
        return [(f, m) for f in fails for m in meets if f < m]
    if shape == "F*T*":
        return [(f, m) for m in meets for f in fails if m < f]
    if shape == "F*T*F*":
        return [(f, m) for f in fails for m in meets if f < m and meets[0] < f]
    raise ValueError(f"unknown shape {shape!r}")


def highest_int(measure: Measure, lo: int, hi: int, *, max_probes: int = 64) -> SearchResult:
    """The highest integer in [lo, hi] that meets, assuming shape F* T+ F*."""
    if not 1 <= lo <= hi:
        raise ValueError(f"need 1 <= lo <= hi, got {lo}, {hi}")
    probe = _Probes(measure, max_probes)
    last_meet: int | None = None
    first_fail: int | None = None
    v = lo
    try:
        while True:
            if probe(v):
                last_meet = v
            elif last_meet is not None:
                first_fail = v
                break
            if v == hi:
                break
            v = min(2 * v, hi)
        if last_meet is not None and first_fail is not None:
            a, b = last_meet, first_fail
            while b - a > 1:
                mid = (a + b) // 2
                if probe(mid):
                    a = mid
                else:
                    b = mid
            last_meet = a
            probe(min(2 * first_fail, hi))  # the check: further up should fail too
    except _ProbesExhaustedError:
        pass
    at_end = last_meet == hi
    return probe.result(last_meet, "F*T*F*", at_end)


def lowest_int(measure: Measure, lo: int, hi: int, *, max_probes: int = 64) -> SearchResult:
    """The lowest integer in [lo, hi] that meets, assuming shape F* T*."""
    if not 1 <= lo <= hi:
        raise ValueError(f"need 1 <= lo <= hi, got {lo}, {hi}")
    probe = _Probes(measure, max_probes)
    last_fail: int | None = None
    first_meet: int | None = None
    v = lo
    try:
        while True:
            if probe(v):
                first_meet = v
                break
            last_fail = v
            if v == hi:
                break
            v = min(2 * v, hi)
        if first_meet is not None and last_fail is not None:
            a, b = last_fail, first_meet
            while b - a > 1:
                mid = (a + b) // 2
                if probe(mid):
                    b = mid
                else:
                    a = mid
            first_meet = b
        if first_meet is not None:
            check = min(2 * first_meet, hi)
            if not any(v >= check and met for v, met in probe.seen.items()):
                probe(check)  # the check: more should meet too
    except _ProbesExhaustedError:
        pass
    return probe.result(first_meet, "F*T*", False)


def highest_float(
    measure: Measure,
    start: float,
    lo: float,
    hi: float,
    *,
    rel_tol: float = 0.02,
    max_probes: int = 40,
) -> SearchResult:
    """The highest value in [lo, hi] that meets, to within ``rel_tol``, assuming T* F*.

    Starts at ``start``; doubles while it meets, halves while it fails, then
    bisects until the last meeting and first failing values are within
    ``rel_tol`` of each other. The answer is the last value that met.
    """
    if not 0 < lo <= hi or not rel_tol > 0:
        raise ValueError(f"need 0 < lo <= hi and rel_tol > 0, got {lo}, {hi}, {rel_tol}")
    probe = _Probes(measure, max_probes)
    v = min(max(round_probe(start), lo), hi)
    meet: float | None = None
    fail: float | None = None
    at_end = False
    try:
        if probe(v):
            meet = v
            while fail is None:
                if v >= hi:
                    at_end = True
                    break
                v = min(2 * v, hi)
                if probe(v):
                    meet = v
                else:
                    fail = v
        else:
            fail = v
            while meet is None:
                if v <= lo:
                    break
                v = max(v / 2, lo)
                if probe(v):
                    meet = v
                else:
                    fail = v
        if meet is not None and fail is not None:
            while (fail - meet) > rel_tol * meet:
                mid = round_probe((meet + fail) / 2)
                if mid in (meet, fail):
                    break
                if probe(mid):
                    meet = mid
                else:
                    fail = mid
        if meet is not None and fail is not None:
            first_fail = min(v for v, met in probe.seen.items() if not met and v > meet)
            check = round_probe(min(2 * first_fail, hi))
            if not any(v >= check and not met for v, met in probe.seen.items()):
                probe(check)  # the check: further up should fail too
    except _ProbesExhaustedError:
        pass
    return probe.result(meet, "T*F*", at_end)


def round_probe(x: float) -> float:
    """Round to 4 significant digits, so that probe values print and name cleanly."""
    if x <= 0:
        return x
    digits = 3 - int(math.floor(math.log10(x)))
    return round(x, digits)
