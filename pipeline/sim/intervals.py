"""Intervals on replay figures: how far a percentile could move with other traffic like this.

A replay's p99 TTFT is one number from one stretch of traffic. Another hour like
it would give another number; this module says how far apart, as a two-sided
``LEVEL`` (90%) interval, without replaying anything again. (The other source of
uncertainty, the step-cost profile, needs replays: ``pipeline.sim.uncertainty``.)

**Block bootstrap over windows of arrivals.** The replayed requests, in arrival
order, are cut into windows of consecutive arrivals. A resample draws as many
windows as there are, with replacement, and takes the statistic of the requests
in the drawn windows (a window drawn twice counts twice): the non-overlapping
block bootstrap. ``RESAMPLES`` resamples; the interval is the 5th to the 95th
percentile of the resampled statistic. Windows keep what is correlated in time
(a burst, the queue it builds, the slow requests behind it) together, which a
bootstrap of single requests would tear apart and so understate the spread.

**How long a window.** From the replay's own autocorrelation: the Politis-White
(2004) automatic block length (with the Patton-Politis-White 2009 correction) of
the rank series of TTFT, TPOT and E2E in arrival order, the longest of the three
(ranks, so that the heavy tail does not decide alone; TPOT because the batch a
request decodes in changes more slowly than the queue TTFT sees). It grows with the
dependence: near saturation latencies are correlated over many requests and the
windows get long. The number of windows is then held between ``MIN_WINDOWS``
and ``MAX_WINDOWS``: fewer than 20 leave the bootstrap too few pieces to
resample (``Windows.capped`` says so: the latencies are correlated over more
than a twentieth of the replay, e.g. a queue that grows through it, and the
interval then understates the uncertainty); more than 200 only cost time.

**Fast.** A resample's quantile is found from per-window counts: the values far
below the point estimate only count per window, and only the values near it are
sorted and counted per window, so a resample costs O(windows x values near the
quantile), one matrix product for all of them, not O(requests). Where more than
``MAX_EXACT`` values lie near it (medians of large replays), they are grouped in
runs of consecutive values and a resample's quantile is interpolated inside one
run; the point estimate is always exact.

Everything is deterministic given the generator passed in (made from the
scenario's seed by the callers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

LEVEL = 0.90  # two-sided coverage of every interval tracereplay prints
Z = 1.6448536269514722  # standard normal quantile at (1 + LEVEL) / 2
RESAMPLES = 400  # bootstrap resamples per figure
MIN_WINDOWS = 20  # fewer pieces cannot describe a spread
MAX_WINDOWS = 200  # more add time, not information
MIN_REQUESTS = 40  # below this no interval is given
MAX_EXACT = 1024  # values near a quantile weighted one by one; above, in runs
_SPREAD = 4.5  # values within this many bootstrap sds of the quantile's CDF are "near"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Windows:
    """Windows of consecutive arrivals over ``n`` requests, and the resampling weights."""

    index: IntArray  # per request, in arrival order: its window, 0 .. num - 1
    num: int  # windows
    weights: FloatArray  # (RESAMPLES, num): how often each resample draws each window
    capped: bool  # the dependence asked for fewer than MIN_WINDOWS windows

    @property
    def size(self) -> int:
        """Requests per window (the windows differ by at most one)."""
        return round(len(self.index) / self.num) if self.num else 0


def _flat_top(t: FloatArray) -> FloatArray:
    """Politis and Romano's trapezoid lag window: 1 up to 1/2, falling to 0 at 1."""
    a = np.abs(t)
    return np.where(a <= 0.5, 1.0, np.where(a <= 1.0, 2.0 * (1.0 - a), 0.0))


def block_length(x: FloatArray) -> float:
    """The Politis-White automatic block length of the series ``x`` (in observations).

    The correlogram is cut at the first lag after which ``K`` consecutive
    autocorrelations are insignificant (below 2 sqrt(log10(n) / n)), a
    flat-top lag window of twice that lag estimates the spectral density at 0
    and its derivative, and the block length that minimises the bootstrap's
    mean squared error follows (the circular-bootstrap constant, 4/3).
    """
    n = len(x)
    if n < 8:
        return 1.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(x, kind="stable")] = np.arange(n, dtype=np.float64)
    ranks -= ranks.mean()
    size = 1 << int(math.ceil(math.log2(2 * n)))
    spec = np.fft.rfft(ranks, size)
    acov = np.fft.irfft(spec * np.conj(spec), size)[:n] / n
    if not acov[0] > 0:
        return 1.0
    rho = acov / acov[0]
    k_n = max(5, int(math.ceil(math.sqrt(math.log10(n)))))
    thresh = 2.0 * math.sqrt(math.log10(n) / n)
    small = (np.abs(rho[1:]) < thresh).astype(np.int64)
    # runs[m] = how many of rho[m + 1 .. m + k_n] are insignificant
    runs = np.convolve(small, np.ones(k_n, dtype=np.int64), mode="valid")
    quiet = np.flatnonzero(runs == k_n)
    m_hat = int(quiet[0]) if len(quiet) else len(rho) - 1
    big_m = max(1, min(2 * m_hat, len(rho) - 1))
    lags = np.arange(-big_m, big_m + 1)
    lam = _flat_top(lags / big_m)
    r = acov[np.abs(lags)]
    g = float(np.sum(lam * np.abs(lags) * r))
    g0 = float(np.sum(lam * r))
    d = 4.0 / 3.0 * g0 * g0
    if not d > 0 or g == 0:
        return 1.0
    return float((2.0 * g * g / d) ** (1.0 / 3.0) * n ** (1.0 / 3.0))


def make_windows(
    n: int, series: Sequence[FloatArray], rng: np.random.Generator, *, num: int | None = None
) -> Windows:
    """Windows over ``n`` requests in arrival order, sized from the ``series`` (each of length
    ``n``, or empty) by ``block_length`` (the longest), or ``num`` of them if given."""
    capped = False
    if num is None:
        longest = max([block_length(s) for s in series if len(s) >= 8] or [1.0])
        wanted = max(1, int(n / max(longest, 1.0)))
        capped = wanted < MIN_WINDOWS
        num = min(max(wanted, MIN_WINDOWS), MAX_WINDOWS)
    num = max(1, min(num, n))
    index = (np.arange(n, dtype=np.int64) * num) // max(n, 1)
    draws = rng.integers(0, num, size=(RESAMPLES, num))
    rows = np.repeat(np.arange(RESAMPLES, dtype=np.int64) * num, num)
    weights = np.bincount(rows + draws.ravel(), minlength=RESAMPLES * num)
    # NOTE: whole counts held as floats, so that the products with per-window counts run
    # as BLAS matrix products (numpy's integer matmul is a plain loop)
    return Windows(index, num, weights.reshape(RESAMPLES, num).astype(np.float64), capped)


def _counts(win: IntArray, num: int) -> FloatArray:
    """Values per window, as floats (for the matrix products with the weights)."""
    return np.bincount(win, minlength=num).astype(np.float64)


def _nth(
    values: FloatArray, win: IntArray, w: FloatArray, js: Sequence[FloatArray]
) -> list[FloatArray]:
    """Per resample b and each j of ``js``: the ``j[b]``-th (0-based) of the sorted ``values``
    counted with the resample's multiplicity (``w[b, win[i]]`` copies of value i).

    Up to MAX_EXACT values, exactly: each value's copies per resample, added up along
    the values. Beyond, the values are taken in runs of consecutive ones: each window's
    running count over the runs, times the weights, is each resample's running count
    (one matrix product, no running sum over resamples x values), and the value is
    interpolated inside the run where the count passes j.
    """
    m = len(values)
    rows = np.arange(w.shape[0])
    if m <= MAX_EXACT:
        copies = np.cumsum(w[:, win], axis=1)
        return [values[np.minimum((copies <= j[:, None]).sum(axis=1), m - 1)] for j in js]
    step = -(-m // MAX_EXACT)
    run = np.arange(m) // step
    num_runs = int(run[-1]) + 1
    counts = np.bincount(win * num_runs + run, minlength=w.shape[1] * num_runs)
    counts = counts.reshape(w.shape[1], num_runs).astype(np.float64)
    cum = w @ np.cumsum(counts, axis=1)  # (B, runs): copies up to and with each run
    out = []
    for j in js:
        at = np.minimum((cum <= j[:, None]).sum(axis=1), num_runs - 1)
        before = np.where(at > 0, cum[rows, at - 1], 0.0)
        inside = cum[rows, at] - before
        share = (j - before + 0.5) / np.maximum(inside, 1.0)
        start = at * step
        length = np.minimum(start + step, m) - start
        pos = start + np.clip(share * length - 0.5, 0.0, length - 1.0)
        out.append(np.interp(pos, np.arange(m, dtype=np.float64), values))
    return out


def resampled_quantile(
    values: FloatArray, win: IntArray, windows: Windows, q: float
) -> FloatArray | None:
    """The ``q`` quantile (0..1, linear interpolation as numpy's) of ``values`` in every
    resample of ``windows``; ``win`` is each value's window. None without values."""
    n = len(values)
    if n == 0:
        return None
    w = windows.weights
    n_b = w @ _counts(win, windows.num)
    h = (np.maximum(n_b, 1.0) - 1.0) * q
    k0 = np.floor(h)
    frac = h - k0
    k1 = np.minimum(k0 + 1.0, np.maximum(n_b, 1.0) - 1.0)
    # how far the resampled CDF at the point estimate spreads: the range of ranks to sort
    point = float(np.percentile(values, q * 100.0))
    cdf_b = (w @ _counts(win[values <= point], windows.num)) / np.maximum(n_b, 1.0)
    delta = _SPREAD * float(cdf_b.std()) + 4.0 / n
    while True:
        r_lo = max(0, int(math.floor((q - delta) * n)))
        r_hi = min(n - 1, int(math.ceil((q + delta) * n)))
        lo_v, hi_v = np.partition(values, [r_lo, r_hi])[[r_lo, r_hi]]
        below = values < lo_v if r_lo > 0 else np.zeros(n, dtype=bool)
        above = values > hi_v if r_hi < n - 1 else np.zeros(n, dtype=bool)
        near = ~(below | above)
        below_b = w @ _counts(win[below], windows.num)
        above_b = w @ _counts(win[above], windows.num)
        j0, j1 = k0 - below_b, k1 - below_b
        inside = n_b - below_b - above_b
        if (j0.min() >= 0 and (j1 < inside).all()) or (r_lo == 0 and r_hi == n - 1):
            break
        delta *= 2.0
    order = np.argsort(values[near], kind="stable")
    near_v = values[near][order]
    near_w = win[near][order]
    j0 = np.clip(j0, 0.0, None)
    x0, x1 = _nth(near_v, near_w, w, [j0, np.maximum(j1, j0)])
    return np.asarray(x0 + frac * (x1 - x0), dtype=np.float64)


def resampled_mean(values: FloatArray, win: IntArray, windows: Windows) -> FloatArray | None:
    """The mean of ``values`` in every resample of ``windows``. None without values."""
    if len(values) == 0:
        return None
    w = windows.weights
    sums = w @ np.bincount(win, weights=values, minlength=windows.num)
    return np.asarray(sums / np.maximum(w @ _counts(win, windows.num), 1.0), dtype=np.float64)


def percentile_interval(samples: FloatArray | None) -> tuple[float, float] | None:
    """The ``LEVEL`` interval of a bootstrap distribution (its 5th to 95th percentile)."""
    if samples is None or not len(samples):
        return None
    lo, hi = np.quantile(samples, [(1.0 - LEVEL) / 2.0, (1.0 + LEVEL) / 2.0])
    return float(lo), float(hi)


def t_quantile(df: int) -> float:
    """Student's t quantile at (1 + LEVEL) / 2 with ``df`` degrees of freedom (df >= 2).

    The Cornish-Fisher expansion in 1/df around the normal quantile (Abramowitz and
    Stegun 26.7.5): within 0.3% at df 2, 1e-5 from df 6 on.
    """
    z, n = Z, float(max(df, 1))
    return (
        z
        + (z**3 + z) / (4 * n)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * n**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * n**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * n**4)
    )


def combine(
    point: float, arrivals: tuple[float, float] | None, profile: Sequence[float] = ()
) -> tuple[float, float]:
    """One interval from the arrivals' (a bootstrap interval) and the profile's (the statistic
    replayed at the low and high step cost): each side's half-widths added in quadrature
    (independent errors), around ``point``.

    On a log scale where every value is positive (latencies: both errors act as factors,
    and a skewed side stays skewed without running below 0); on a linear one otherwise,
    never below 0.
    """
    values = [point, *(arrivals or ()), *profile]
    if all(v > 0 for v in values):
        lp = math.log(point)
        a_lo = lp - math.log(arrivals[0]) if arrivals else 0.0
        a_hi = math.log(arrivals[1]) - lp if arrivals else 0.0
        logs = [math.log(v) - lp for v in profile]
        p_lo, p_hi = max([0.0, *(-x for x in logs)]), max([0.0, *logs])
        down, up = math.hypot(max(a_lo, 0.0), p_lo), math.hypot(max(a_hi, 0.0), p_hi)
        lo = arrivals[0] if arrivals and not p_lo and a_lo > 0 else point * math.exp(-down)
        hi = arrivals[1] if arrivals and not p_hi and a_hi > 0 else point * math.exp(up)
        return lo, hi  # one source alone: its own bound, exactly
    a_lo = max(0.0, point - arrivals[0]) if arrivals else 0.0
    a_hi = max(0.0, arrivals[1] - point) if arrivals else 0.0
    p_lo = max([0.0, *(point - v for v in profile)])
    p_hi = max([0.0, *(v - point for v in profile)])
    return max(0.0, point - math.hypot(a_lo, p_lo)), point + math.hypot(a_hi, p_hi)
