"""Intervals on one replayed scenario's summary: TTFT, TPOT and E2E at p50, p90, p99.

Two sources, one interval each, added side by side in quadrature
(``intervals.combine``):

- **arrivals**: a block bootstrap over windows of consecutive arrivals of the
  replayed requests (``intervals.py``), no new replay;
- **profile**: the scenario replayed twice more with every step cost scaled by
  exp(-z sd) and exp(+z sd) (``cost_uncertainty.py``; z = 1.645 for 90%): where
  the statistic rises with the step cost, as latencies do, those two replays
  are exactly its 5th and 95th percentiles under the profile's error. Skipped
  when the sd is 0. Where a core is free they run in forked children while the
  main replay runs (``forked.py``; the same statistics either way).

What the summary stores, under ``intervals`` (JSON): the level, the windows and
resamples, the sd and its source, and per statistic its interval (``lo``,
``hi``), the arrivals' part (``arrivals``) and the statistic at the low and high
cost (``at_cost``), from which ``compare`` builds the interval of a change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.sim import forked
from pipeline.sim import intervals as iv
from pipeline.sim.cost_uncertainty import cost_factors, scaled_cost
from pipeline.sim.disagg import simulate_disaggregated
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import F_FINISH, SimInput, SimResult
from pipeline.sim.summary import request_metric

METRICS = ("ttft_s", "tpot_s", "e2e_s")
QUANTILES = (50, 90, 99)
SEED_SALT = 0x5EED_B007  # the bootstrap's generator: (scenario seed, this)
# with at most this many windows holding the slowest 1%, the p99 rests on a few bursts
FEW_BURSTS = 3
# the window length is found on at most this many points (group means beyond it)
MAX_SERIES = 100_000


def stat_key(metric: str, q: int) -> str:
    """``ttft_p99_s``: the summary's key of a statistic."""
    return f"{metric.removesuffix('_s')}_p{q}_s"


def _drop(st: Any, stf: Any) -> None:
    """A step sink that keeps nothing: the profile replays need the requests only."""


def _done(res: SimResult) -> npt.NDArray[np.bool_]:
    return ~np.isnan(res.rqf[:, F_FINISH])


def statistics(res: SimResult) -> dict[str, float | None]:
    """Every statistic of ``METRICS`` x ``QUANTILES`` of the completed requests."""
    done = _done(res)
    out: dict[str, float | None] = {}
    for metric in METRICS:
        v = request_metric(res, metric)[done]
        v = v[~np.isnan(v)]
        for q in QUANTILES:
            out[stat_key(metric, q)] = float(np.percentile(v, q)) if len(v) else None
    return out


AtCost = tuple[dict[str, float | None], dict[str, float | None]]  # at the low, the high cost


def profile_statistics(sc: Scenario, inp: SimInput) -> AtCost | None:
    """The statistics replayed at the low and at the high step cost of the profile term,
    or None when the scenario's sd is 0."""
    return start_profile_statistics(sc, inp, jobs=1)()


def start_profile_statistics(
    sc: Scenario, inp: SimInput, *, jobs: int | None = None
) -> Callable[[], AtCost | None]:
    """``profile_statistics``, started now: the call it returns gives the result. With a
    core to spare (``jobs``, default every core) and a replay long enough to pay for it
    (``forked.worth_forking``), the two replays run in forked children while the caller
    runs its own replay; otherwise they run here, now. Either way the same statistics.
    The returned call holds ``inp`` until it is called (a child that died is replayed
    here then)."""
    sd = sc.cost_uncertainty.log_sd
    if sd <= 0:
        return lambda: None
    factors = cost_factors(sd, iv.Z)
    if not forked.worth_forking(len(inp), len(factors), jobs):
        low, high = (_at_factor(sc, inp, f) for f in factors)
        return lambda: (low, high)
    children = [forked.start(_at_factor, sc, inp, f) for f in factors]
    return lambda: (children[0].result(), children[1].result())


def _at_factor(sc: Scenario, inp: SimInput, factor: float) -> dict[str, float | None]:
    """The statistics of ``sc`` replayed with every step cost scaled by ``factor``."""
    scaled = dataclasses.replace(sc, cost=scaled_cost(sc.cost, factor))
    if scaled.disagg is not None:  # both sides at the scaled cost
        return statistics(simulate_disaggregated(inp, scaled).result)
    return statistics(simulate(inp, scaled.engine(), on_steps=_drop))


def _thinned(x: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], int]:
    """``x``, or the means of consecutive groups of it when longer than MAX_SERIES, and
    the group length (the windows are long there anyway: at least 1/MAX_WINDOWS).

    Grouped, the values are first taken on a log scale around their median, so that the
    heavy tail does not decide alone (as the ranks do for short series), with no sort.
    """
    group = -(-len(x) // MAX_SERIES)
    if group <= 1:
        return x, 1
    scale = float(np.median(x)) or 1.0
    squeezed = np.log1p(np.maximum(x, 0.0) / abs(scale))
    usable = len(x) - len(x) % group
    return squeezed[:usable].reshape(-1, group).mean(axis=1), group


def windows_for(series: list[npt.NDArray[np.float64]], n: int, seed: int) -> iv.Windows:
    """The bootstrap windows of ``n`` requests from their latency ``series`` (arrival order)."""
    rng = np.random.default_rng([seed, SEED_SALT])
    if n > MAX_SERIES:
        lengths = []
        for s in series:
            thin, group = _thinned(s)
            lengths.append(iv.block_length(thin) * group)
        wanted = max(1, int(n / max(max(lengths), 1.0)))
        num = min(max(wanted, iv.MIN_WINDOWS), iv.MAX_WINDOWS)
        w = iv.make_windows(n, [], rng, num=num)
        return dataclasses.replace(w, capped=wanted < iv.MIN_WINDOWS)
    return iv.make_windows(n, series, rng)


def summary_intervals(
    sc: Scenario,
    res: SimResult,
    at_cost: AtCost | None,
) -> dict[str, Any]:
    """The ``intervals`` entry of a scenario's summary (see the module docstring).

    Args:
        sc: the scenario (its seed drives the bootstrap, its sd the profile term).
        res: its replay.
        at_cost: ``profile_statistics`` of it (None: no profile term).
    """
    done = _done(res)
    return intervals_of(sc, {m: request_metric(res, m)[done] for m in METRICS}, at_cost)


def intervals_of(
    sc: Scenario, values: dict[str, npt.NDArray[np.float64]], at_cost: AtCost | None
) -> dict[str, Any]:
    """``summary_intervals`` from the completed requests' ``METRICS`` (``values``, in
    arrival order; TPOT NaN for one token), as a replay in parts has them."""
    unc = sc.cost_uncertainty
    out: dict[str, Any] = {
        "level": iv.LEVEL,
        "method": "block bootstrap over windows of arrivals; profile replays at exp(-+z sd)",
        "cost_log_sd": unc.log_sd,
        "cost_sd_source": unc.source,
        "cost_sd_default": unc.is_default,
        "notes": [],
        "stats": {},
    }
    n = len(values["ttft_s"])
    if n < iv.MIN_REQUESTS:
        out["notes"].append(f"{n} completed requests: too few for an interval")
        return out
    # NOTE: TPOT too: it follows the batch a request decodes in, which changes more
    # slowly than the queue that TTFT sees (one-token requests count as 0 here)
    series = [values["ttft_s"], np.nan_to_num(values["tpot_s"]), values["e2e_s"]]
    windows = windows_for(series, n, sc.seed)
    out.update(
        resamples=iv.RESAMPLES,
        num_windows=windows.num,
        window_requests=windows.size,
        windows_capped=windows.capped,
    )
    if windows.capped:
        out["notes"].append(
            f"latencies stay correlated over more than 1/{iv.MIN_WINDOWS} of the replay (the "
            "traffic's rate drifts, or a queue grows through it): the interval likely "
            "understates the uncertainty"
        )
    for metric in METRICS:
        v = values[metric]
        ok = ~np.isnan(v)
        v, win = v[ok], windows.index[ok]
        for q in QUANTILES:
            key = stat_key(metric, q)
            if not len(v):
                continue
            point = float(np.percentile(v, q))
            arrivals = iv.percentile_interval(iv.resampled_quantile(v, win, windows, q / 100))
            costs = [c for c in (s.get(key) for s in at_cost or ()) if c is not None]
            lo, hi = iv.combine(point, arrivals, costs)
            out["stats"][key] = {
                "lo": lo,
                "hi": hi,
                "arrivals": list(arrivals) if arrivals else None,
                "at_cost": costs if at_cost else None,
            }
    tail = values["ttft_s"] > np.percentile(values["ttft_s"], 99)
    bursts = len(np.unique(windows.index[tail]))
    if tail.any() and bursts <= FEW_BURSTS:
        out["notes"].append(
            f"the slowest 1% of TTFTs fall in {bursts} of {windows.num} windows: p99 rests on "
            "a few bursts, and other traffic like this may hold a longer one (the interval "
            "describes bursts like these only; `capacity` replays new arrivals)"
        )
    return out


def format_interval(stats: dict[str, Any], key: str, scale: float, digits: int) -> str:
    """``0.118-0.129`` for one statistic of an ``intervals`` entry ('' when it has none)."""
    s = stats.get(key)
    if not s:
        return ""
    return f"{s['lo'] * scale:,.{digits}f}-{s['hi'] * scale:,.{digits}f}"
