"""The scheduler's CPU time per step (cost model v4), fitted from a synchronous and an
asynchronous run of the same steps, or given.

One run's step times cannot tell the scheduler's CPU time from the GPU's fixed and
per-sequence costs (``fixed_s``, ``seq_s``): a synchronous engine pays both every step,
and an asynchronous one hides the CPU time behind the GPU's. Two runs of the same step
shapes (the same phase, batch size, prompt and context tokens), one synchronous
(vLLM ``--no-async-scheduling``, SGLang ``--disable-overlap-schedule``) and one
asynchronous, do: where the GPU step is the longer, the asynchronous step takes the GPU
time and the synchronous one that plus the CPU time, so the difference per step is

    sync - async = sched_cpu_s + sched_cpu_per_seq_s * N

(N = the step's batch size), fitted here by non-negative least squares over the step
shapes both files measured (the median of repeated rows first). The other
coefficients are then fitted as usual to the asynchronous run (its times are the GPU's).
A vendor's figure (a profile of the scheduler's CPU time) can be given instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.measurements import Measurements
from pipeline.sim.cost_model import V4_COEFFICIENTS


@dataclass(frozen=True)
class SchedCpuFit:
    """The fitted CPU time per step and what it rests on."""

    sched_cpu_s: float
    sched_cpu_per_seq_s: float
    shapes: int  # step shapes both runs measured
    batch_sizes: int  # distinct batch sizes among them (2 or more pin the per-sequence part)

    def coefficients(self) -> dict[str, float]:
        return {"sched_cpu_s": self.sched_cpu_s, "sched_cpu_per_seq_s": self.sched_cpu_per_seq_s}


def _medians(m: Measurements) -> dict[tuple[bool, float, float, float], float]:
    rows: dict[tuple[bool, float, float, float], list[float]] = {}
    for i in range(len(m)):
        key = (
            bool(m.is_prefill[i]),
            float(m.batch_size[i]),
            float(m.prompt_tokens[i]),
            float(m.context_tokens[i]),
        )
        rows.setdefault(key, []).append(float(m.time_s[i]))
    return {k: float(np.median(v)) for k, v in rows.items()}


def fit_sched_cpu(sync: Measurements, overlapped: Measurements) -> SchedCpuFit:
    """``sched_cpu_s`` and ``sched_cpu_per_seq_s`` from a synchronous and an asynchronous
    run's step times (see the module docstring).

    Raises:
        ValueError: the two files have no step shape in common.
    """
    a, b = _medians(sync), _medians(overlapped)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(
            "the synchronous and asynchronous measurements have no step (phase, batch_size, "
            "prompt_tokens, context_tokens) in common; measure the same steps in both runs"
        )
    n = np.array([k[1] for k in common])
    diff = np.array([a[k] - b[k] for k in common])
    fixed, per_seq = _nonnegative_line(n, diff)
    return SchedCpuFit(fixed, per_seq, len(common), len(set(n.tolist())))


def _nonnegative_line(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
) -> tuple[float, float]:
    """(c0, c1) >= 0 minimising sum (c0 + c1 x - y)^2 (c1 = 0 with one distinct x)."""
    best = (max(float(y.mean()), 0.0), 0.0)  # the constant alone
    if len(set(x.tolist())) > 1:
        c1, c0 = np.polyfit(x, y, 1)
        if c0 >= 0 and c1 >= 0:
            return float(c0), float(c1)
        through_zero = max(float((x * y).sum() / (x * x).sum()), 0.0) if (x * x).sum() else 0.0
        options = [best, (0.0, through_zero)]
        return min(options, key=lambda c: float(((c[0] + c[1] * x - y) ** 2).sum()))
    return best


def with_sched_cpu(profile: dict[str, Any], given: dict[str, float]) -> dict[str, Any]:
    """``profile`` with the scheduler's CPU terms set (given or fitted)."""
    unknown = sorted(set(given) - set(V4_COEFFICIENTS))
    if unknown:
        raise ValueError(f"not scheduler CPU coefficients: {', '.join(unknown)}")
    for key, v in given.items():
        if not np.isfinite(v) or v < 0:
            raise ValueError(f"{key} must be a finite number of seconds >= 0, got {v}")
    return {**profile, "coefficients": {**profile["coefficients"], **given}}
