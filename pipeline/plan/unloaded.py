"""The floor under an SLO: what a latency statistic is with no load at all.

When a capacity search finds no cap, rate or replica count that meets an SLO,
the planner needs to know whether load is the problem at all. Here every
request is served alone on an idle replica: its TTFT is the prefill of its own
prompt (in the scenario's prefill chunks, one step each, with the KV of the
chunks before it), its TPOT one single-sequence decode step at its mid-output
context, its E2E the two together; queue time is zero. The statistic of those
per-request values (same percentile definition as the SLO) is the floor no
setting can beat: if it is above the limit, only a faster GPU, a smaller model,
more tensor parallelism or shorter prompts help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from pipeline.plan.slo import Slo, format_seconds
from pipeline.sim.cost_model import StepCost
from pipeline.sim.scenario import Scenario


@dataclass(frozen=True)
class Floor:
    """One SLO's unloaded value and the requests that set it."""

    slo: Slo
    value_s: float  # the statistic with every request alone on an idle replica
    prompt_tokens: float | None  # ttft/e2e: the prompt length at that percentile
    explanation: str

    @property
    def reachable(self) -> bool:
        return self.value_s <= self.slo.limit_s


def prefill_chunk(scenario: Scenario) -> int | None:
    """Tokens one prefill step takes for a lone request (None: the whole prompt)."""
    p = scenario.params
    if getattr(p, "enable_chunked_prefill", False):
        return int(p.max_num_batched_tokens)
    for name in ("chunk_size", "chunked_prefill_size"):
        value = getattr(p, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def unloaded_ttft_s(cost: StepCost, prompt_tokens: int, chunk: int | None) -> float:
    """The prefill of one prompt alone: one step per chunk, each attending to the ones before."""
    total = max(int(prompt_tokens), 1)
    step = chunk or total
    done, seconds = 0, 0.0
    while done < total:
        t = min(step, total - done)
        seconds += cost.prefill_step_s(1, t, done)
        done += t
    return seconds


def _per_request(scenario: Scenario, frame: pl.DataFrame, metric: str) -> np.ndarray:
    prompts = frame["prompt_tokens"].to_numpy().astype(np.int64)
    outputs = frame["output_tokens"].to_numpy().astype(np.int64)
    if scenario.max_output_tokens is not None:
        outputs = np.minimum(outputs, scenario.max_output_tokens)
    chunk = prefill_chunk(scenario)
    cost = scenario.cost
    if metric == "queue":
        return np.zeros(len(prompts))
    ttft_of = {int(p): unloaded_ttft_s(cost, int(p), chunk) for p in np.unique(prompts)}
    ttft = np.array([ttft_of[int(p)] for p in prompts])
    mid = prompts + np.maximum(outputs, 1) // 2
    tpot = np.array([cost.decode_step_s(1, int(c)) for c in mid])
    tpot = np.where(outputs > 1, tpot, 0.0)
    if metric == "ttft":
        return ttft
    if metric == "tpot":
        return tpot
    return ttft + np.maximum(outputs - 1, 0) * tpot  # e2e


def floor(scenario: Scenario, frame: pl.DataFrame, slo: Slo) -> Floor:
    """``slo``'s statistic over ``frame``'s requests (those in its scope), each served alone
    under ``scenario``."""
    if slo.scope is not None:
        cols = [c for c in ("tenant", "model", "prompt_tokens") if c in frame.columns]
        groups: dict[str, Any] = {c: frame[c].to_numpy() for c in cols}
        frame = frame.filter(pl.Series(slo.applies(groups, frame.height)))
        if frame.is_empty():
            return Floor(slo, 0.0, None, f"no request is in the scope of {slo.key}")
    values = _per_request(scenario, frame, slo.metric)
    q = slo.quantile
    value = float(np.mean(values)) if q is None else float(np.quantile(values, q / 100.0))
    prompt = None
    if slo.metric in ("ttft", "e2e") and q is not None:
        prompt = float(np.quantile(frame["prompt_tokens"].to_numpy(), q / 100.0))
    verdict = "above" if value > slo.limit_s else "within"
    text = (
        f"even unloaded, {slo.key} is {format_seconds(_round(value))} ({verdict} the "
        f"{format_seconds(slo.limit_s)} limit)"
    )
    if value <= slo.limit_s:
        return Floor(slo, value, prompt, text + "; the load, not the hardware, breaks it")
    if slo.metric == "ttft" and prompt is not None:
        share = 100.0 - q if q is not None else 0.0
        alone = unloaded_ttft_s(scenario.cost, int(round(prompt)), prefill_chunk(scenario))
        text += (
            f": the prefill of the longest {share:g}% of prompts ({prompt:,.0f}+ tokens, "
            f"~{format_seconds(_round(alone))} each alone on {scenario.profile}) sets it"
        )
    elif slo.metric == "tpot":
        text += f": one sequence's decode step on {scenario.profile} sets it"
    elif slo.metric == "e2e" and prompt is not None:
        text += ": the prefill and the decode steps of the longest requests set it"
    return Floor(slo, value, prompt, text)


def _round(x: float) -> float:
    """Three significant digits, so messages read 1.12s, not 1.1234567s."""
    return float(f"{x:.3g}")


def explain_none(scenario: Scenario, frame: pl.DataFrame, failing: list[Slo]) -> str:
    """Why no setting meets ``failing``: each one's unloaded floor and what sets it."""
    return "; ".join(floor(scenario, frame, s).explanation for s in failing)


__all__ = ["Floor", "explain_none", "floor", "prefill_chunk", "unloaded_ttft_s"]
