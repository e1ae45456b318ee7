"""The scheduler's CPU time per step: on the critical path (synchronous) or hidden (async).

Every engine step has CPU work besides the GPU's: the scheduler decides the batch,
prepares its inputs, and processes the last step's outputs. The profile's
``sched_cpu_s`` and ``sched_cpu_per_seq_s`` (cost model v4) say how long, a fixed part
and a part per scheduled sequence: ``cpu = sched_cpu_s + sched_cpu_per_seq_s * N``.

- A **synchronous** engine schedules, runs the step, then processes its output: the
  step's wall time is ``gpu + cpu``.
- An **asynchronous** one (vLLM's ``async_scheduling``, SGLang's overlap scheduler)
  prepares step n + 1 while the GPU runs step n, so consecutive steps are spaced by the
  larger of the two: ``max(gpu, cpu)``. The CPU time charged is the step's own (its N):
  within a decode run N is fixed, and elsewhere the batch the scheduler decides next
  differs from this one only by the requests that arrive or finish.

``cost_model.step_time`` and ``decode_run_s`` apply it (the flag rides in the cost
array, ``StepCost.as_array(sched_overlap)``), so the fast loop, the reference loop and
every caller of the cost model see the same step times; ``row`` says, per timeline row,
how much CPU time the row's steps had and how much of it was on the critical path.

Which engines overlap (``OVERLAP_KEYS``): ``vllm`` with ``async_scheduling`` (default
true), ``sglang`` with ``overlap_schedule`` (default true, SGLang's
``--disable-overlap-schedule`` turns it off); the others (static, orca, sarathi, tgi,
transformers) are synchronous.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import (
    SCHED_CPU,
    SCHED_CPU_SEQ,
    SCHED_OVERLAP,
    V4_COEFFICIENTS,
    StepCost,
    decode_gpu_s,
    gpu_step_time,
)

# policy -> its boolean parameter that says whether the scheduler overlaps the GPU step;
# a policy not listed is synchronous
OVERLAP_KEYS = {"vllm": "async_scheduling", "sglang": "overlap_schedule"}


def overlaps(policy: str, params: Any) -> bool:
    """Whether the engine of ``policy`` with ``params`` schedules while the GPU runs."""
    key = OVERLAP_KEYS.get(policy)
    return key is not None and bool(getattr(params, key))


@njit(cache=True, error_model="numpy")
def row(
    c: npt.NDArray[np.float64],
    k: int,
    duration: float,
    p: float,
    a: float,
    n: float,
    d: float,
    ctx: float,
) -> tuple[float, float]:
    """(scheduler CPU seconds of a timeline row's k steps, the part on the critical path).

    ``duration`` is the row's time as ``step_time`` (k = 1) or ``decode_run_s`` gave it;
    the features are the row's (its first step's context). (0, 0) without CPU terms.
    """
    cpu = c[SCHED_CPU] + c[SCHED_CPU_SEQ] * n
    if cpu <= 0 or duration <= 0:
        return 0.0, 0.0
    total = k * cpu
    if c[SCHED_OVERLAP] == 0:
        return total, total
    gpu = gpu_step_time(c, p, a, n, d, ctx) if k == 1 else decode_gpu_s(c, d, ctx, k)
    return total, max(duration - gpu, 0.0)


def summary(cpu_s: float, exposed_s: float) -> dict[str, Any]:
    """The summary's figures (empty when the profile has no scheduler CPU time)."""
    if cpu_s <= 0:
        return {}
    return {
        "sched_cpu_s": cpu_s,
        "sched_cpu_exposed_s": exposed_s,
        "sched_cpu_hidden_s": max(cpu_s - exposed_s, 0.0),
    }


def with_overrides(cost: StepCost, got: dict[str, Any], where: str) -> StepCost:
    """``cost`` with the scenario's ``sched_cpu_s`` / ``sched_cpu_per_seq_s`` where given."""
    given = {k: float(got[k]) for k in V4_COEFFICIENTS if got.get(k) is not None}
    try:
        return replace(cost, **given) if given else cost
    except ValueError as exc:  # (scenario.FLOAT_RANGES has checked them already)
        raise ScenarioError(f"{where}: {exc}") from None
