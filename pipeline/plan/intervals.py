"""Intervals on capacity answers: how sure "highest rate 11.6 req/s" is.

A search finds where "meets every SLO" flips along its knob. Near that point a
statistic's estimate moves with the traffic it happened to see and with the
profile's error, and the answer moves with it. Each SLO's statistic at each
probe gets a ``LEVEL`` (90%) interval from two sources, on a log scale, their
half-widths added in quadrature (``Spread``):

- **Arrivals.** At the answer the load is replayed on ``REPLICATES`` replicates
  of its arrivals (``replicates.py``: new seeds, or the trace resampled in
  windows): the half-width is Student's t at 95% (as many degrees of freedom
  as replicates) times the sd of the log statistic over the answer and its
  replicates, and at least the half-width of the block bootstrap of the
  answer's own replay (``slo_bootstrap``; it sees only the bursts that replay
  holds, which near saturation, where a capacity answer sits, can be far too
  little, but it guards against six replicates that happen to agree). The
  same relative half-width holds at every probe of the search: near the
  answer the load, and so how much the statistic moves, changes slowly, and
  far from it the verdicts are clear anyway.
- **Profile.** The statistic replayed with every step cost scaled by exp(-z sd)
  and exp(+z sd) (``cost_uncertainty.py``): each side's log distance to it. It
  is measured at the answer and at each end of the answer's interval, and a
  probe takes the one measured nearest it (on a log scale of the knob).

**The answer's interval** is where the pessimistic verdict (every SLO's upper
bound within its limit) and the optimistic one (every lower bound) flip, found
from the answer outward over the same memoized probes plus the few new ones it
needs (``find_end``); the profile term is then measured at each end found and
the ends are found again with it. For a "highest" search the pessimistic end is
the low one: the highest value that meets even at its upper bounds (the answer
"safe at 90%"); for "fewest replicas" the other way round. The answer is
**safe** when it meets even at its own upper bounds.

**Reversals.** A probe that meets where the assumed shape says it should fail
(a higher rate meeting above a lower one that fails) is *beyond the interval*
when the failing probe fails even at its lower bound and the meeting one meets
even at its upper bound, counting the arrivals only: the profile's error moves
every probe of one search the same way, so it cannot turn one verdict against
another. Within the interval the pair is noise of the kind the interval
describes.

Not covered: arrivals that are not stationary (a daily cycle: a replicate's
windows mix its hours), errors of the scheduler model itself, and a profile
error that differs between step shapes (one factor scales every step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.plan.search import find_violations, round_probe
from pipeline.plan.slo import Slo
from pipeline.sim import intervals as iv
from pipeline.sim.cost_uncertainty import CostUncertainty
from pipeline.sim.uncertainty import windows_for

Measured = Mapping[str, float | None]  # SLO key -> statistic at one probe (None: no request)
SHAPES = {"concurrency": "F*T*F*", "rate": "T*F*", "replicas": "F*T*", "swap_space": "F*T*",
          "kv_offloading": "F*T*"}  # fmt: skip
# searches for the least that meets (the others: the most)
FEWEST = ("replicas", "swap_space", "kv_offloading")
END_TOLERANCE = 0.05  # the interval's ends to within 5% (the rate search: or its tolerance)
MAX_END_PROBES = 3  # new probes one end's narrowing may make


def slo_bootstrap(
    slos: list[Slo],
    metrics: Mapping[str, np.ndarray],
    groups: Mapping[str, Any],
    seed: int,
) -> dict[str, tuple[float, float] | None]:
    """The bootstrap interval of each SLO's statistic over one replay's completed requests
    (``metrics`` and ``groups`` as ``slo.evaluate`` takes them, in arrival order)."""
    n = len(next(iter(metrics.values()))) if metrics else 0
    out: dict[str, tuple[float, float] | None] = {s.key: None for s in slos}
    if n < iv.MIN_REQUESTS:
        return out
    series = [metrics["ttft_s"], np.nan_to_num(metrics["tpot_s"]), metrics["e2e_s"]]
    windows = windows_for(series, n, seed)
    for s in slos:
        values = np.asarray(metrics[f"{s.metric}_s"], dtype=np.float64)
        keep = s.applies(groups, n) & ~np.isnan(values)
        v, win = values[keep], windows.index[keep]
        q = s.quantile
        boot = (
            iv.resampled_mean(v, win, windows)
            if q is None
            else iv.resampled_quantile(v, win, windows, q / 100)
        )
        out[s.key] = iv.percentile_interval(boot)
    return out


def _log_halfwidths(value: float | None, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """(log(value / low), log(high / value)), each >= 0; 0 without a positive value."""
    if value is None or value <= 0 or bounds is None:
        return 0.0, 0.0
    lo, hi = bounds
    down = math.log(value / lo) if lo > 0 else 0.0
    up = math.log(hi / value) if hi > 0 else 0.0
    return max(0.0, down), max(0.0, up)


@dataclass(frozen=True)
class Spread:
    """One SLO's statistic at one probe: its interval's half-widths on a log scale."""

    arrivals: float  # the arrivals' half-width (both sides)
    profile_lo: float  # log(statistic / the lower of it at the low and high step cost)
    profile_hi: float  # log(the higher of those / statistic)

    @property
    def lo(self) -> float:
        return math.hypot(self.arrivals, self.profile_lo)

    @property
    def hi(self) -> float:
        return math.hypot(self.arrivals, self.profile_hi)

    def bounds(self, value: float) -> tuple[float, float]:
        """The interval of a statistic measured at ``value`` (both sources)."""
        return value * math.exp(-self.lo), value * math.exp(self.hi)


def arrivals_halfwidth(
    main: float | None, replicates: list[float | None], bootstrap: tuple[float, float] | None
) -> float:
    """The arrivals' log half-width at the answer: t * sd of the log statistic over the
    answer and its replicates, and at least the answer's bootstrap half-width."""
    logs = [math.log(v) for v in [main, *replicates] if v is not None and v > 0]
    spread = 0.0
    if len(logs) >= 3:
        spread = iv.t_quantile(len(logs) - 1) * float(np.std(logs, ddof=1))
    return max(spread, *_log_halfwidths(main, bootstrap))


def profile_halfwidths(main: float | None, at_cost: list[float | None]) -> tuple[float, float]:
    """Each side's log distance from the statistic to it at the low and the high step cost."""
    if main is None or main <= 0:
        return 0.0, 0.0
    logs = [math.log(v / main) for v in at_cost if v is not None and v > 0]
    return max([0.0, *(-x for x in logs)]), max([0.0, *logs])


@dataclass
class SpreadModel:
    """How wide each probe's intervals are: the arrivals' half-width of the answer, and the
    profile term measured nearest the probe."""

    arrivals: dict[str, float]  # per SLO key
    profile: dict[float, dict[str, tuple[float, float]]]  # knob value -> SLO key -> (lo, hi)

    def at(self, value: float) -> dict[str, Spread]:
        """The spread of every SLO's statistic at the probe ``value``."""
        near = min(self.profile, key=lambda m: abs(math.log(m / value)))
        return {key: Spread(a, *self.profile[near][key]) for key, a in self.arrivals.items()}


Probe = tuple[Measured, dict[str, Spread]]  # a probe's statistics and their spreads


def pessimistic(probe: Probe, slos: list[Slo]) -> bool:
    """Every SLO met even at the upper bound of its statistic."""
    return margin(probe, slos, upper=True) <= 0


def margin(probe: Probe, slos: list[Slo], *, upper: bool) -> float:
    """log(bound / limit) of the worst SLO at the upper (or lower) bounds: <= 0 where every
    SLO meets there (-inf: no SLO has a statistic)."""
    measured, spreads = probe
    worst = -math.inf
    for s in slos:
        v = measured.get(s.key)
        if v is not None and v > 0:
            shift = spreads[s.key].hi if upper else -spreads[s.key].lo
            worst = max(worst, math.log(v / s.limit_s) + shift)
    return worst


def _arrivals_margin(probe: Probe, slos: list[Slo], sign: float) -> list[float]:
    """Per SLO with a statistic: log(statistic / limit) shifted by the arrivals' half-width
    (up for ``sign`` > 0, down otherwise)."""
    measured, spreads = probe
    return [
        math.log(v / s.limit_s) + sign * spreads[s.key].arrivals
        for s in slos
        if (v := measured.get(s.key)) is not None and v > 0
    ]


@dataclass(frozen=True)
class Reversal:
    """Two probes whose verdicts break the search's assumed shape."""

    fails: float  # the knob value that fails
    meets: float  # the one that meets where it should fail (or fails where it should meet)
    beyond: bool  # beyond what the arrivals' interval explains


def reversals(
    kind: str, probes: Mapping[float, Probe], met: Mapping[float, bool], slos: list[Slo]
) -> list[Reversal]:
    """Every verdict pair of ``probes`` that breaks the shape of search ``kind``; those
    beyond the interval first (lowest values first within each group)."""
    out = []
    for f, m in find_violations([(v, met[v]) for v in probes], SHAPES[kind]):
        surely_fails = any(x > 0 for x in _arrivals_margin(probes[f], slos, -1.0))
        surely_meets = all(x <= 0 for x in _arrivals_margin(probes[m], slos, +1.0))
        out.append(Reversal(f, m, surely_fails and surely_meets))
    return sorted(out, key=lambda r: (not r.beyond, r.fails, r.meets))


@dataclass
class AnswerInterval:
    """The interval of one search's answer, and what it rests on."""

    lo: float | None  # low end of the answer's range (None: none in the range)
    hi: float | None  # high end (None: none in the range)
    safe: bool  # the answer meets every SLO even at its statistics' upper bounds
    model: SpreadModel
    spread_at: Callable[[float], dict[str, Spread]]  # knob value -> per SLO key
    replicates: dict[str, list[float | None]]  # per SLO key: the statistic on each replicate
    at_cost: dict[str, list[float | None]]  # per SLO key: at the low and the high step cost
    uncertainty: CostUncertainty
    arrivals: str  # how the replicates' arrivals were made, for the output
    reversals: list[Reversal] = field(default_factory=list)

    @property
    def num_replicates(self) -> int:
        return max((len(v) for v in self.replicates.values()), default=0)

    @property
    def num_profile_replays(self) -> int:
        """Replays of the profile term: two at each point it was measured."""
        return 2 * len(self.model.profile) if self.uncertainty.log_sd > 0 else 0

    @property
    def reversal(self) -> Reversal | None:
        """The reversal to report: the first beyond the interval, else the first within."""
        return self.reversals[0] if self.reversals else None


@dataclass(frozen=True)
class Knob:
    """The search's knob: its range, how fine an end must be, how values round."""

    lo: float
    hi: float
    tolerance: float  # relative width at which an end is found
    integer: bool

    def between(self, a: float, b: float, at: float) -> float | None:
        """A probe value inside (a, b) near ``at`` (at least a tenth of the way in, on a log
        scale), rounded as the knob's values are; None when none is left between them."""
        la, lb = math.log(a), math.log(b)
        t = min(max((math.log(at) - la) / (lb - la), 0.1), 0.9) if at > 0 else 0.5
        v = math.exp(la + t * (lb - la))
        v = float(round(v)) if self.integer else round_probe(v)
        if self.integer and not min(a, b) < v < max(a, b):
            v = float((int(a) + int(b)) // 2)
        return v if min(a, b) < v < max(a, b) else None


def find_end(
    answer: float,
    meets_below: bool,
    margin_at: Callable[[float], float],
    known: Callable[[], list[float]],
    knob: Knob,
) -> float | None:
    """The value that meets next to where a verdict flips, near ``answer``.

    ``margin_at(v)`` <= 0 where the verdict meets (it replays v if needed); it meets
    below the flip and fails above it (``meets_below``, a highest-value search), or the
    other way round (fewest replicas). ``known()`` lists the values probed so far.

    From the answer, the bracket (a value that meets, one that fails) is taken from the
    probes already made, doubling or halving past them when none lies beyond, then
    narrowed by interpolating the margin on a log scale (regula falsi, each step at
    least a tenth into the bracket) until it is within the knob's tolerance or
    ``MAX_END_PROBES`` new probes are spent. Returns the value that meets (the end of the
    range when it meets there; None when none does).
    """
    if margin_at(answer) <= 0:
        good, bad, away = answer, None, meets_below  # look for a fail further on
    else:
        good, bad, away = None, answer, not meets_below  # look back for a meet
    # the probes already made, nearest first, on the side to look at
    side = sorted((v for v in known() if (v > answer) == away and v != answer), reverse=not away)
    for v in side:
        if margin_at(v) <= 0:
            if bad is not None:
                good = v
                break
            good = v
        else:
            bad = v
            if good is not None:
                break
    while good is None or bad is None:  # gallop past the probes made, from the furthest
        edge: float = bad if good is None else good  # type: ignore[assignment]
        nxt = edge * 2.0 if away else edge / 2.0
        # within the tolerance of a range end, the end itself (probed as it is, not rounded)
        if nxt <= knob.lo * (1.0 + knob.tolerance):
            nxt = knob.lo
        elif nxt >= knob.hi / (1.0 + knob.tolerance):
            nxt = knob.hi
        else:
            nxt = float(round(nxt)) if knob.integer else round_probe(nxt)
        if nxt == edge or (edge in (knob.lo, knob.hi) and (nxt > edge) == away):
            return good  # the range ends here
        if margin_at(nxt) <= 0:
            good = nxt
        else:
            bad = nxt
    for _ in range(MAX_END_PROBES):
        if abs(bad - good) <= knob.tolerance * min(good, bad):
            break
        g_good, g_bad = margin_at(good), margin_at(bad)
        share = g_good / (g_good - g_bad) if math.isfinite(g_good) and g_bad > g_good else 0.5
        at = math.exp(math.log(good) + share * (math.log(bad) - math.log(good)))
        mid = knob.between(good, bad, at)
        if mid is None:
            break
        if margin_at(mid) <= 0:
            good = mid
        else:
            bad = mid
    return good


def answer_ends(
    kind: str,
    answer: float,
    probe: Callable[[float], Probe],
    known: Callable[[], list[float]],
    knob: Knob,
    slos: list[Slo],
) -> tuple[float | None, float | None]:
    """(low, high) end of the answer's interval: where the pessimistic verdict (every upper
    bound within its limit) and the optimistic one (every lower bound) flip, found from
    the answer (``find_end``) over ``probe`` (memoized). None: the pessimistic verdict
    meets nowhere near (no value is safe at the interval's level)."""

    def sure(v: float) -> float:
        return margin(probe(v), slos, upper=True)

    def maybe(v: float) -> float:
        return margin(probe(v), slos, upper=False)

    if kind in FEWEST:  # fewest that meet: the optimistic end is the low one
        low = find_end(answer, False, maybe, known, knob)
        high = find_end(answer, False, sure, known, knob)
        return (answer if low is None else min(low, answer)), (
            None if high is None else max(high, answer)
        )
    low = find_end(answer, True, sure, known, knob)
    high = find_end(answer, True, maybe, known, knob)
    return (None if low is None else min(low, answer)), (
        answer if high is None else max(high, answer)
    )
