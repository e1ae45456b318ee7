"""The figures printed per scenario (and stored as the scenarios table's summary_json).

Definitions (as in vLLM's benchmark client; percentiles interpolate linearly,
numpy's default and DuckDB's quantile_cont):

- TTFT = first token - arrival; E2E = last token - arrival;
  TPOT = (E2E - TTFT) / (output tokens - 1), only for requests with > 1 token;
  queue time = start of the first step that scheduled it - arrival.
- Throughput is over the replay's span, from the first arrival to the last
  completion: completed requests, output tokens, and prompt + output tokens
  per second.
- Queue depth is the waiting-queue length of a replica at the start of each
  step: its maximum, and its mean weighted by step duration.
- KV peak usage: the most blocks in use on one replica at the end of a step,
  over the replica's usable blocks. Cached blocks that no running request
  references count as free (vLLM's ``kv_cache_usage_perc``).
- Prefix cache (every request of a trace with prefix hashes, prompts shorter
  than one cache unit included; a request's first lookup, like vLLM's
  ``prefix_cache_queries`` / ``prefix_cache_hits`` counters, which count every
  request and every prompt token; the lookups of resumed preempted requests
  are counted apart): token hit rate = hit tokens / prompt tokens looked up,
  summed over every replica (weighted by tokens, never an average of rates);
  request hit rate = share of those requests with at least one token found;
  evictions = KV blocks evicted from the cache over the replay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CACHED,
    R_LOOKUPS,
    R_OUTPUT,
    R_PREEMPT,
    R_PROMPT,
    R_UNIT_TOK,
    S_EVICTED,
    S_KV_USED,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_WAITING,
    SF_DURATION,
    W_HITS,
    SimResult,
)


def _pct(x: npt.NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def request_metrics(res: SimResult) -> dict[str, npt.NDArray[np.float64]]:
    """Per-request ttft_s, tpot_s (NaN for <= 1 token), e2e_s and queue_s."""
    arrival = res.rqf[:, F_ARRIVAL]
    ttft = res.rqf[:, F_FIRST_TOKEN] - arrival
    e2e = res.rqf[:, F_FINISH] - arrival
    out = res.rq[:, R_OUTPUT]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "queue_s": res.rqf[:, F_FIRST_SCHED] - arrival,
    }


def summarize(res: SimResult) -> dict[str, Any]:
    """The summary figures of one replayed scenario (JSON-able)."""
    m = request_metrics(res)
    done = ~np.isnan(res.rqf[:, F_FINISH])
    completed = int(done.sum())
    ttft = m["ttft_s"][done]
    tpot = m["tpot_s"][done]
    tpot = tpot[~np.isnan(tpot)]
    if completed:
        span = float(res.rqf[done, F_FINISH].max() - res.rqf[:, F_ARRIVAL].min())
    else:
        span = 0.0
    out_tokens = int(res.rq[done, R_OUTPUT].sum())
    in_tokens = int(res.rq[done, R_PROMPT].sum())
    dur = res.stf[:, SF_DURATION]
    waiting = res.st[:, S_WAITING]
    busy = float(dur.sum())

    def per_s(x: float) -> float | None:
        return x / span if span > 0 else None

    return {
        "num_requests": res.num_requests,
        "completed": completed,
        "duration_s": span,
        "request_throughput": per_s(completed),
        "output_token_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p99_s": _pct(tpot, 99),
        "e2e_p50_s": _pct(m["e2e_s"][done], 50),
        "e2e_p99_s": _pct(m["e2e_s"][done], 99),
        "queue_p99_s": _pct(m["queue_s"][done], 99),
        "max_queue_depth": int(waiting.max()) if len(waiting) else 0,
        "mean_queue_depth": float((waiting * dur).sum() / busy) if busy > 0 else 0.0,
        "num_preemptions": int(res.st[:, S_PREEMPT].sum()),
        "num_preempted_requests": int((res.rq[:, R_PREEMPT] > 0).sum()),
        "kv_peak_usage": float(res.st[:, S_KV_USED].max() / res.num_kv_blocks)
        if len(res.st)
        else 0.0,
        "kv_peak_blocks": int(res.st[:, S_KV_USED].max()) if len(res.st) else 0,
        "num_kv_blocks": res.num_kv_blocks,
        "num_steps": res.num_steps,
        "num_step_rows": int(len(res.st)),
        **prefix_summary(res),
    }


def prefix_summary(res: SimResult) -> dict[str, Any]:
    """Prefix-cache figures: token and request hit rates, resumed hits, evictions."""
    looked = (res.rq[:, R_UNIT_TOK] > 0) & (res.rq[:, R_LOOKUPS] > 0)
    query = int(res.st[:, S_PQUERY].sum())
    hit = int(res.st[:, S_PHIT].sum())
    return {
        "prefix_query_tokens": query,
        "prefix_hit_tokens": hit,
        "prefix_token_hit_rate": hit / query if query else None,
        "prefix_request_hit_rate": float((res.rq[looked, R_CACHED] > 0).mean())
        if looked.any()
        else None,
        "prefix_resumed_hit_tokens": int((res.rqw[:, W_HITS] - res.rq[:, R_CACHED]).sum()),
        "prefix_evicted_blocks": int(res.st[:, S_EVICTED].sum()),
    }
