"""Arrival times of the replayed requests.

- ``trace``: the trace's own timestamps (seconds from the earliest selected
  request), times ``time_scale``; or, with ``rate``, rescaled so that the last
  of N requests arrives at N / rate (the convention of vLLM's benchmark client).
- ``poisson`` / ``gamma``: inter-arrival times drawn from
  Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) (vLLM's
  ``--burstiness``; 1 is Poisson, < 1 burstier, > 1 smoother; cv = 1/sqrt(b)),
  then rescaled so the last arrival is at N / rate, as vLLM does. Lengths come
  from the trace: its requests in order, or, with ``num_requests``, N requests
  drawn with replacement (the trace's length distribution). ``rate`` defaults
  to the trace's own mean rate.

Every draw comes from the one generator made from the scenario's seed.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipeline.errors import ScenarioError
from pipeline.sim.scenario import ArrivalSpec


def trace_rate(trace_arrival_s: npt.NDArray[np.float64]) -> float | None:
    """Requests per second of a trace (N over the time to its last arrival)."""
    span = float(trace_arrival_s.max() - trace_arrival_s.min()) if len(trace_arrival_s) else 0.0
    return len(trace_arrival_s) / span if span > 0 else None


def make_arrivals(
    spec: ArrivalSpec, trace_arrival_s: npt.NDArray[np.float64], rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Which trace rows to replay and when they arrive.

    Args:
        spec: the scenario's arrival settings.
        trace_arrival_s: arrival of each trace request, seconds from the earliest,
            sorted.
        rng: the scenario's generator.

    Returns:
        (indices into the trace, arrival seconds), sorted by arrival.

    Raises:
        ScenarioError: poisson/gamma without a rate on a trace that has none.
    """
    n = len(trace_arrival_s)
    if spec.process == "trace":
        count = min(n, spec.num_requests or n)
        idx = np.arange(count, dtype=np.int64)
        t = np.subtract(
            trace_arrival_s[:count], trace_arrival_s[0] if count else 0.0, dtype=np.float64
        )
        if spec.time_scale != 1:  # in place: one array of millions, not one per operation
            t *= spec.time_scale
        if spec.rate is not None and count and t[-1] > 0:
            t *= (count / spec.rate) / t[-1]
        return idx, t
    rate = spec.rate if spec.rate is not None else trace_rate(trace_arrival_s)
    if rate is None:
        raise ScenarioError(
            f"arrivals = {spec.process!r} needs a rate: the trace has no time span to take it from"
        )
    if spec.num_requests is not None:
        count = spec.num_requests
        idx = rng.integers(0, n, size=count).astype(np.int64)
    else:
        count = n
        idx = np.arange(n, dtype=np.int64)
    shape = spec.burstiness
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=count)
    t = np.cumsum(gaps)
    if count and t[-1] > 0:
        t *= (count / rate) / t[-1]
    return idx, t
