"""The figures printed per scenario (and stored as the scenarios table's summary_json).

Definitions (as in vLLM's benchmark client; percentiles interpolate linearly,
numpy's default and DuckDB's quantile_cont):

- TTFT = first token - arrival; E2E = last token - arrival;
  TPOT = (E2E - TTFT) / (output tokens - 1), only for requests with > 1 token;
  queue time = start of the first step that scheduled it - arrival.
- TTFT, TPOT and E2E are what a client sees: the engine's times plus the scenario's
  front end (``frontend.py``; all 0 for a profile without one, then both are the
  same). ``engine_ttft_s`` etc. are the engine core's alone; ``latency_basis`` says
  which the plain figures are ("client" when the front end is not 0, else "engine").
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
- Swap preemption (``swap.py``; only when something was swapped): ``swap`` holds the
  swaps (each a swap-out and its later swap-in), the requests swapped, and the bytes
  each way over the host link.
- KV offloading tiers (``kv_tiers.py``; only when something was loaded from them):
  ``kv_tiers`` holds the tokens loaded from the CPU tier and from the disk tier past
  the GPU prefix hits (every lookup, resumptions too), and the KV bytes those loads
  moved. The prefix figures above stay the GPU cache's (vLLM's ``prefix_cache_*``
  counters; its connector's hits are counted apart), and the resumed hit tokens
  leave the tiers' out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pipeline.sim import sched_cpu
from pipeline.sim.frontend import e2e_offset, ttft_offset
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
    R_SWAPS,
    R_UNIT_TOK,
    S_CPU_HIT,
    S_DISK_HIT,
    S_EVICTED,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_SPEC_ACC,
    S_SPEC_DRAFT,
    S_SWAP_IN,
    S_SWAP_OUT,
    S_TIER_LOAD,
    S_WAITING,
    SF_DURATION,
    SF_SCHED_CPU,
    SF_SCHED_EXPOSED,
    W_HITS,
    SimResult,
)

if TYPE_CHECKING:
    from pipeline.sim.classes import ClassLabels, Slo

# every finite float64 is a whole number of 2**-_UNIT_EXP; exact sums are kept in that unit
_UNIT_EXP = 1126
_SUM_BLOCK = 1 << 22  # rows per pass of the exact sum: its float partial sums stay exact


def _exact_sum(total: int, x: npt.NDArray[np.float64]) -> int:
    """``total + sum(x)`` exactly, in units of 2**-1126 (x finite).

    A float sum depends on the order it adds in; this one does not, so the
    timeline's figures come out the same whether it arrives whole or in chunks.
    Each x = m * 2**(e - 53) with an integer mantissa m (53 bits), split in two
    halves of 26 and 27 bits whose per-exponent sums stay below 2**53, exact
    in float64 ``bincount``; the few exponent groups are then added as integers.
    """
    for a in range(0, len(x), _SUM_BLOCK):
        frac, exp = np.frexp(x[a : a + _SUM_BLOCK])
        m = (frac * 2.0**53).astype(np.int64)
        low = int(exp.min())
        k = exp - low
        hi = np.bincount(k, weights=m >> 26)
        lo = np.bincount(k, weights=m & ((1 << 26) - 1))
        for j in np.flatnonzero((hi != 0) | (lo != 0)):
            part = (int(hi[j]) << 26) + int(lo[j])
            total += part << (int(j) + low - 53 + _UNIT_EXP)
    return total


@dataclass
class StepTotals:
    """What the summary needs of the step timeline, added up chunk by chunk.

    ``simulate(..., on_steps=...)`` hands the timeline out in chunks that are
    written and dropped; ``add`` each chunk here. Integer figures are exact
    sums and maxima; the two float sums are exact too (``_exact_sum``), so the
    totals do not depend on where the chunks were cut.
    """

    rows: int = 0
    steps: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    evicted_blocks: int = 0
    max_waiting: int = 0
    max_kv_used: int = 0
    swap_out_bytes: int = 0  # swap preemption (swap.py)
    swap_in_bytes: int = 0
    cpu_hit_tokens: int = 0  # KV offloading tiers (kv_tiers.py)
    disk_hit_tokens: int = 0
    tier_load_bytes: int = 0
    draft_tokens: int = 0  # speculative decoding: drafts verified
    accepted_tokens: int = 0  # ... of which accepted
    _busy: int = 0  # sum of durations, units of 2**-1126 s
    _waiting_s: int = 0  # sum of waiting * duration, same unit
    _sched_cpu: int = 0  # scheduler CPU seconds (sched_cpu.py), same unit
    _sched_exposed: int = 0  # ... of which on the critical path

    @classmethod
    def of(cls, st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> StepTotals:
        totals = cls()
        totals.add(st, stf)
        return totals

    def add(self, st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        """Add one chunk of timeline rows (``st``/``stf`` as the loop writes them)."""
        if len(st) == 0:
            return
        dur = stf[:, SF_DURATION]
        waiting = st[:, S_WAITING]
        self.rows += len(st)
        self.steps += int(st[:, S_NUM_STEPS].sum())
        self.preemptions += int(st[:, S_PREEMPT].sum())
        self.prefix_query_tokens += int(st[:, S_PQUERY].sum())
        self.prefix_hit_tokens += int(st[:, S_PHIT].sum())
        self.evicted_blocks += int(st[:, S_EVICTED].sum())
        self.draft_tokens += int(st[:, S_SPEC_DRAFT].sum())
        self.accepted_tokens += int(st[:, S_SPEC_ACC].sum())
        self.max_waiting = max(self.max_waiting, int(waiting.max()))
        self.max_kv_used = max(self.max_kv_used, int(st[:, S_KV_USED].max()))
        self.swap_out_bytes += int(st[:, S_SWAP_OUT].sum())
        self.swap_in_bytes += int(st[:, S_SWAP_IN].sum())
        self.cpu_hit_tokens += int(st[:, S_CPU_HIT].sum())
        self.disk_hit_tokens += int(st[:, S_DISK_HIT].sum())
        self.tier_load_bytes += int(st[:, S_TIER_LOAD].sum())
        self._busy = _exact_sum(self._busy, dur)
        self._waiting_s = _exact_sum(self._waiting_s, waiting * dur)
        if stf[:, SF_SCHED_CPU].any():
            self._sched_cpu = _exact_sum(self._sched_cpu, stf[:, SF_SCHED_CPU])
            self._sched_exposed = _exact_sum(self._sched_exposed, stf[:, SF_SCHED_EXPOSED])

    def merge(self, other: StepTotals) -> None:
        """Add another timeline's totals (another pool's, in a fleet)."""
        self.rows += other.rows
        self.steps += other.steps
        self.preemptions += other.preemptions
        self.prefix_query_tokens += other.prefix_query_tokens
        self.prefix_hit_tokens += other.prefix_hit_tokens
        self.evicted_blocks += other.evicted_blocks
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        self.max_waiting = max(self.max_waiting, other.max_waiting)
        self.max_kv_used = max(self.max_kv_used, other.max_kv_used)
        self.swap_out_bytes += other.swap_out_bytes
        self.swap_in_bytes += other.swap_in_bytes
        self.cpu_hit_tokens += other.cpu_hit_tokens
        self.disk_hit_tokens += other.disk_hit_tokens
        self.tier_load_bytes += other.tier_load_bytes
        self._busy += other._busy
        self._waiting_s += other._waiting_s
        self._sched_cpu += other._sched_cpu
        self._sched_exposed += other._sched_exposed

    def sched_cpu(self) -> dict[str, float]:
        """The scheduler's CPU time: total, on the critical path, hidden (empty: none)."""
        return sched_cpu.summary(
            self._sched_cpu / (1 << _UNIT_EXP), self._sched_exposed / (1 << _UNIT_EXP)
        )

    @property
    def mean_waiting(self) -> float:
        """Waiting requests at the start of each step, weighted by step duration."""
        return self._waiting_s / self._busy if self._busy > 0 else 0.0


METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
ENGINE_METRICS = ("engine_ttft_s", "engine_tpot_s", "engine_e2e_s")


def latency_basis(res: SimResult) -> str:
    """'client' when the scenario has a front end (its TTFT etc. include it), else 'engine'."""
    return "client" if bool(np.any(res.frontend != 0)) else "engine"


def request_metric(res: SimResult, name: str, rows: slice = slice(None)) -> npt.NDArray[np.float64]:
    """One of ``METRICS`` or ``ENGINE_METRICS`` per request (of ``rows``): ttft_s, tpot_s
    (NaN for <= 1 token), e2e_s (as a client sees them: with the front end), queue_s, or
    the engine core's engine_ttft_s, engine_tpot_s, engine_e2e_s."""
    rqf = res.rqf[rows]
    arrival = rqf[:, F_ARRIVAL]
    engine = name.startswith("engine_")
    base = name.removeprefix("engine_")
    fe = res.frontend
    client = not engine and bool(np.any(fe != 0))
    if base == "ttft_s":
        ttft = rqf[:, F_FIRST_TOKEN] - arrival
        if client:
            ttft += ttft_offset(fe, res.rq[rows, R_PROMPT])
        return ttft
    if base == "e2e_s":
        e2e = rqf[:, F_FINISH] - arrival
        if client:
            e2e += e2e_offset(fe, res.rq[rows, R_PROMPT], res.rq[rows, R_OUTPUT])
        return e2e
    if name == "queue_s":
        return rqf[:, F_FIRST_SCHED] - arrival
    assert base == "tpot_s", name
    # (e2e - ttft) / max(output - 1, 1), NaN for <= 1 token; in place, two temporaries
    tpot = rqf[:, F_FINISH] - arrival
    tpot -= rqf[:, F_FIRST_TOKEN] - arrival
    out = res.rq[rows, R_OUTPUT]
    steps = out - 1
    np.maximum(steps, 1, out=steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot /= steps
    if client:
        tpot += fe[2]  # the stream's per-token delay
    tpot[out <= 1] = np.nan
    return tpot


def request_metrics(
    res: SimResult, rows: slice = slice(None), *, engine: bool = False
) -> dict[str, npt.NDArray[np.float64]]:
    """Per request (of ``rows``): ttft_s, tpot_s (NaN for <= 1 token), e2e_s and queue_s;
    with ``engine`` also the engine core's engine_ttft_s, engine_tpot_s, engine_e2e_s."""
    names = METRICS + (ENGINE_METRICS if engine else ())
    return {name: request_metric(res, name, rows) for name in names}


@dataclass
class RequestTotals:
    """What the summary needs of the per-request state, added up part by part.

    A sharded replay (``shard.py``) ends one shard at a time and drops each shard's
    state: ``add`` each shard's result here. Counts are exact sums; the latency
    percentiles are taken over every completed request's metric, kept per part as
    ``dtype`` (float32 halves what a fleet's day of 100M requests holds, 20 bytes a
    request, at a relative error of 6e-8; float64 gives ``summarize``'s own figures).
    """

    dtype: type[np.floating[Any]] = np.float64
    num_requests: int = 0
    completed: int = 0
    first_arrival: float = np.inf
    last_finish: float = -np.inf  # of the completed requests
    out_tokens: int = 0  # of the completed requests
    in_tokens: int = 0
    preempted_requests: int = 0
    looked_up: int = 0  # requests with prefix keys looked up at least once
    looked_up_hit: int = 0  # ... of which found at least one token at the first lookup
    all_hit_tokens: int = 0  # prefix hits of every lookup, the tiers' loads included
    first_hit_tokens: int = 0  # ... of the first lookups
    swaps: int = 0
    swapped_requests: int = 0
    num_kv_blocks: int = 0
    basis: str = "engine"
    disagg: dict[str, Any] | None = None
    # SLOs: each part counts its completed requests that meet every one (``num_good``);
    # a whole-traffic SLO's statistic comes from the metrics below, a scoped one's from the
    # values of the requests in its scope, kept per part (``_scoped``, by SLO key)
    slos: tuple[Slo, ...] = ()
    num_good: int = 0
    # per metric, each part's completed requests' values (TPOT: NaN for one token)
    _metrics: dict[str, list[npt.NDArray[np.floating[Any]]]] = field(default_factory=dict)
    _scoped: dict[str, list[npt.NDArray[np.floating[Any]]]] = field(default_factory=dict)
    # per-class figures: each part's completed flags and, by kind, its requests' classes
    # (kept where the parts come with their classes: 1 byte a request, 4 a kind)
    _done: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    _labels: dict[str, list[ClassLabels]] = field(default_factory=dict)
    # intervals: each part's completed requests' indices in the whole replay (8 bytes a
    # request, kept where the parts come with them), to put the metrics in arrival order
    _rows: list[npt.NDArray[np.int64]] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        res: SimResult,
        slos: Sequence[Slo] = (),
        labels: Mapping[str, ClassLabels] | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> RequestTotals:
        totals = cls(slos=tuple(slos))
        totals.add(res, labels=labels, rows=rows)
        return totals

    def add(
        self,
        res: SimResult,
        *,
        metrics: bool = True,
        labels: Mapping[str, ClassLabels] | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Add one part's requests (a whole replay's, or one shard's); ``metrics``: keep
        their latency metrics too (``summarize`` takes them from ``res`` one at a time);
        ``labels``: their tenant and model classes (for scoped SLOs and, with
        ``metrics``, the per-class figures); ``rows``: their indices in the whole replay
        (with ``metrics``, for ``in_arrival_order``)."""
        rq, rqf = res.rq, res.rqf
        done = ~np.isnan(rqf[:, F_FINISH])
        completed = int(done.sum())
        self.num_requests += res.num_requests
        self.completed += completed
        if len(rqf):
            self.first_arrival = min(self.first_arrival, float(rqf[:, F_ARRIVAL].min()))
        if completed:
            self.last_finish = max(self.last_finish, float(rqf[done, F_FINISH].max()))
        self.out_tokens += int(rq[done, R_OUTPUT].sum())
        self.in_tokens += int(rq[done, R_PROMPT].sum())
        self.preempted_requests += int((rq[:, R_PREEMPT] > 0).sum())
        looked = (rq[:, R_UNIT_TOK] > 0) & (rq[:, R_LOOKUPS] > 0)
        self.looked_up += int(looked.sum())
        self.looked_up_hit += int((rq[looked, R_CACHED] > 0).sum())
        self.all_hit_tokens += int(res.rqw[:, W_HITS].sum())
        self.first_hit_tokens += int(rq[:, R_CACHED].sum())
        self.swaps += int(rq[:, R_SWAPS].sum())
        self.swapped_requests += int((rq[:, R_SWAPS] > 0).sum())
        self.num_kv_blocks = res.num_kv_blocks
        self.basis = latency_basis(res)
        if res.disagg_times is not None:
            self.disagg = _disagg(res)
        for name in _SUMMARY_METRICS if metrics else ():
            self._metrics.setdefault(name, []).append(
                request_metric(res, name)[done].astype(self.dtype, copy=False)
            )
        if metrics and rows is not None:
            self._rows.append(np.asarray(rows, dtype=np.int64)[done])
        if metrics and labels is not None:
            self._done.append(done)
            for kind, lab in labels.items():
                self._labels.setdefault(kind, []).append(lab)
        if self.slos:
            self._judge(res, done, labels)

    def _judge(
        self,
        res: SimResult,
        done: npt.NDArray[np.bool_],
        labels: Mapping[str, ClassLabels] | None,
    ) -> None:
        """Count the part's good requests; keep its scoped SLOs' values (as
        ``classes.whole_traffic_slos`` judges a whole replay)."""
        from pipeline.sim.classes import judged_requests  # (classes imports this module)

        if labels is None and any(s.scope is not None for s in self.slos):
            raise ValueError("scoped SLOs need the part's request classes")
        good, judged = judged_requests(res, done, labels or {}, self.slos)
        for slo in self.slos:
            if slo.scope is not None:
                self._scoped.setdefault(slo.key, []).append(
                    judged[slo.key].astype(self.dtype, copy=False)
                )
        self.num_good += int(good.sum())

    def merge(self, other: RequestTotals) -> None:
        """Add another part's totals (a shard replayed elsewhere)."""
        self.num_requests += other.num_requests
        self.completed += other.completed
        self.first_arrival = min(self.first_arrival, other.first_arrival)
        self.last_finish = max(self.last_finish, other.last_finish)
        self.out_tokens += other.out_tokens
        self.in_tokens += other.in_tokens
        self.preempted_requests += other.preempted_requests
        self.looked_up += other.looked_up
        self.looked_up_hit += other.looked_up_hit
        self.all_hit_tokens += other.all_hit_tokens
        self.first_hit_tokens += other.first_hit_tokens
        self.swaps += other.swaps
        self.swapped_requests += other.swapped_requests
        self.num_kv_blocks = other.num_kv_blocks
        self.basis = other.basis
        self.disagg = other.disagg if other.disagg is not None else self.disagg
        self.num_good += other.num_good
        for name, parts in other._metrics.items():
            self._metrics.setdefault(name, []).extend(
                p.astype(self.dtype, copy=False) for p in parts
            )
        for key, parts in other._scoped.items():
            self._scoped.setdefault(key, []).extend(parts)
        self._done.extend(other._done)
        self._rows.extend(other._rows)
        for kind, labs in other._labels.items():
            self._labels.setdefault(kind, []).extend(labs)

    def metric(self, name: str) -> npt.NDArray[np.floating[Any]]:
        """One of the summary's metrics over every completed request of every part (TPOT:
        of those with more than one token). Takes the values out of these totals: each
        part is let go once copied, so the whole metric and one part live at once."""
        parts = self._metrics.pop(name, [])
        if name == "tpot_s":  # a one-token request has no TPOT
            parts = [p[~np.isnan(p)] for p in parts]
        out = np.empty(sum(len(p) for p in parts), self.dtype)
        at = 0
        parts.reverse()
        while parts:
            p = parts.pop()
            out[at : at + len(p)] = p
            at += len(p)
            del p
        return out

    def in_arrival_order(self, names: Sequence[str]) -> dict[str, npt.NDArray[np.float64]]:
        """Each metric of ``names`` over every part's completed requests, in the whole
        replay's arrival order (by the parts' ``rows``), as float64 copies: the metrics
        stay for the summary. TPOT: NaN for one-token requests."""
        rows = np.concatenate(self._rows) if self._rows else np.empty(0, np.int64)
        order = np.argsort(rows, kind="stable")
        out = {}
        for name in names:
            values = np.concatenate(self._metrics.get(name) or [np.empty(0)])
            assert len(values) == len(order), "every part came with its rows"
            out[name] = values.astype(np.float64)[order]
        return out

    def class_figures(self, duration_s: float | None) -> dict[str, Any] | None:
        """The per-class figures of every part's requests (``classes.summarize_classes``,
        as a whole replay's summary has them), against ``slos``; None where the parts came
        without their classes. Leaves the metrics in place (the summary takes them next)."""
        from pipeline.sim.classes import ClassLabels, summarize_classes  # (imports this)

        if not self._done:
            return None
        done = np.concatenate(self._done)
        kinds = {}
        for kind, labs in self._labels.items():
            if len(labs) != len(self._done):  # (a kind some parts lack: not aligned)
                continue
            names = sorted({n for lab in labs for n in lab.names})
            index = {n: i for i, n in enumerate(names)}
            codes = [np.array([index[n] for n in lab.names], np.int32)[lab.codes] for lab in labs]
            kinds[kind] = ClassLabels(tuple(names), np.concatenate(codes).astype(np.int32))

        def metric(name: str) -> npt.NDArray[np.float64]:
            out = np.full(len(done), np.nan)
            out[done] = np.concatenate(self._metrics.get(name) or [np.empty(0)])
            return out

        return summarize_classes(metric, done, kinds, self.slos, duration_s)


_SUMMARY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s", "engine_ttft_s")


def _completed_metric(
    res: SimResult, name: str, done: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """``name`` of the completed requests (TPOT: of those with more than one token)."""
    x = request_metric(res, name)[done]
    return x[~np.isnan(x)] if name == "tpot_s" else x


def summarize(res: SimResult, steps: StepTotals | None = None) -> dict[str, Any]:
    """The summary figures of one replayed scenario (JSON-able).

    ``steps``: the timeline's totals when it was handed out in chunks (then
    ``res.st`` is empty); by default they are taken from ``res.st``/``res.stf``.
    """
    if steps is None:
        steps = StepTotals.of(res.st, res.stf)
    rt = RequestTotals()
    rt.add(res, metrics=False)
    done = ~np.isnan(res.rqf[:, F_FINISH])
    # one metric at a time, dropped once its percentiles are taken (10M requests: 80 MB each)
    return summarize_totals(rt, steps, lambda name: _completed_metric(res, name, done))


def summarize_totals(
    rt: RequestTotals,
    steps: StepTotals,
    metric: Callable[[str], npt.NDArray[np.floating[Any]]] | None = None,
) -> dict[str, Any]:
    """``summarize``'s figures from the requests' and the timeline's totals (of a whole
    replay, or of every shard of one: ``shard.py``). The metrics' values are ``rt``'s
    (taken out of it as they are used: one at a time lives), or ``metric``'s (a fresh
    array each call: the percentiles are taken in it, in place)."""
    span = rt.last_finish - rt.first_arrival if rt.completed else 0.0
    classes = rt.class_figures(span)  # (before the percentiles below take the metrics)

    def per_s(x: float) -> float | None:
        return x / span if span > 0 else None

    measured: dict[str, float | None] = {}  # the SLOs' statistics (``rt.slos``)

    def pct(name: str, qs: tuple[float, ...] = (50, 90, 99)) -> dict[float, float | None]:
        x = metric(name) if metric is not None else rt.metric(name)
        slos = [s for s in rt.slos if f"{s.metric}_s" == name]
        for s in slos:  # the means first: the percentiles below reorder the values
            if s.quantile is None:
                measured[s.key] = float(x.mean(dtype=np.float64)) if len(x) else None
        every = tuple(sorted({*qs, *(s.quantile for s in slos if s.quantile is not None)}))
        if not len(x):
            got = dict.fromkeys(every)
        else:  # the values are this call's own: partitioned in place, not copied
            values = np.percentile(x, every, overwrite_input=True)
            got = {q: float(v) for q, v in zip(every, values, strict=True)}
        for s in slos:
            if s.quantile is not None:
                measured[s.key] = got[s.quantile]
        return got

    ttft_pct = pct("ttft_s")
    tpot_pct = pct("tpot_s")
    e2e_pct = pct("e2e_s")
    queue_p99 = pct("queue_s", (99,))[99]
    engine_ttft_pct = pct("engine_ttft_s", (50, 99))
    if any(s.scope is not None for s in rt.slos):
        from pipeline.sim.classes import slo_stat  # (classes imports this module)

        for s in rt.slos:  # a scoped SLO's statistic: over its requests' values of every part
            if s.scope is not None:
                x = np.concatenate(rt._scoped.pop(s.key, []) or [np.empty(0)])
                measured[s.key] = slo_stat(x.astype(np.float64, copy=False), s)
    return {
        **_slo_figures(rt, measured, span),
        "num_requests": rt.num_requests,
        "completed": rt.completed,
        "duration_s": span,
        "request_throughput": per_s(rt.completed),
        "output_token_throughput": per_s(rt.out_tokens),
        "total_token_throughput": per_s(rt.out_tokens + rt.in_tokens),
        "ttft_p50_s": ttft_pct[50],
        "ttft_p90_s": ttft_pct[90],
        "ttft_p99_s": ttft_pct[99],
        "tpot_p50_s": tpot_pct[50],
        "tpot_p90_s": tpot_pct[90],
        "tpot_p99_s": tpot_pct[99],
        "e2e_p50_s": e2e_pct[50],
        "e2e_p90_s": e2e_pct[90],
        "e2e_p99_s": e2e_pct[99],
        "queue_p99_s": queue_p99,
        "latency_basis": rt.basis,
        "engine_ttft_p50_s": engine_ttft_pct[50],
        "engine_ttft_p99_s": engine_ttft_pct[99],
        "max_queue_depth": steps.max_waiting,
        "mean_queue_depth": steps.mean_waiting,
        "num_preemptions": steps.preemptions,
        "num_preempted_requests": rt.preempted_requests,
        "kv_peak_usage": steps.max_kv_used / rt.num_kv_blocks if steps.rows else 0.0,
        "kv_peak_blocks": steps.max_kv_used,
        "num_kv_blocks": rt.num_kv_blocks,
        "num_steps": steps.steps,
        "num_step_rows": steps.rows,
        **_prefix_figures(rt, steps),
        **steps.sched_cpu(),
        **({"disagg": rt.disagg} if rt.disagg is not None else {}),
        **({"swap": _swap_figures(rt, steps)} if steps.swap_out_bytes else {}),
        **({"kv_tiers": tier_summary(steps)} if steps.tier_load_bytes else {}),
        **({"classes": classes} if classes is not None else {}),
        **speculation_summary(steps),
    }


def _slo_figures(
    rt: RequestTotals, measured: dict[str, float | None], span: float
) -> dict[str, Any]:
    """The whole traffic against ``rt.slos`` (``classes.slo_fields``, as a whole replay's
    summary has them); nothing without SLOs."""
    if not rt.slos:
        return {}
    from pipeline.sim.classes import slo_fields  # (classes imports this module)

    return slo_fields(rt.slos, measured, rt.num_good, span)


def _swap_figures(rt: RequestTotals, steps: StepTotals) -> dict[str, Any]:
    """Swap preemption's figures (swap.py): swaps (each a swap-out and, later, its swap-in:
    a replay runs until every request is done), the requests swapped, and the bytes moved
    each way over the host link."""
    return {
        "num_swaps": rt.swaps,  # each out, and back in later
        "num_swapped_requests": rt.swapped_requests,
        "swap_out_bytes": steps.swap_out_bytes,
        "swap_in_bytes": steps.swap_in_bytes,
    }


def tier_summary(steps: StepTotals) -> dict[str, Any]:
    """The KV offloading tiers' figures (kv_tiers.py): tokens loaded from each, bytes moved."""
    return {
        "cpu_hit_tokens": steps.cpu_hit_tokens,
        "disk_hit_tokens": steps.disk_hit_tokens,
        "tier_load_bytes": steps.tier_load_bytes,
    }


def _disagg(res: SimResult) -> dict[str, Any]:
    from pipeline.sim.disagg import disagg_summary  # (disagg imports the loop's modules)

    return disagg_summary(res)


def speculation_summary(steps: StepTotals | None) -> dict[str, Any]:
    """Speculative decoding's figures (empty when no draft was verified): drafts verified,
    accepted, and the acceptance rate; mean acceptance length = 1 + rate * num_tokens."""
    if steps is None or steps.draft_tokens == 0:
        return {}
    return {
        "spec_draft_tokens": steps.draft_tokens,
        "spec_accepted_tokens": steps.accepted_tokens,
        "spec_acceptance_rate": steps.accepted_tokens / steps.draft_tokens,
    }


def _prefix_figures(rt: RequestTotals, steps: StepTotals) -> dict[str, Any]:
    query = steps.prefix_query_tokens
    hit = steps.prefix_hit_tokens
    return {
        "prefix_query_tokens": query,
        "prefix_hit_tokens": hit,
        "prefix_token_hit_rate": hit / query if query else None,
        "prefix_request_hit_rate": rt.looked_up_hit / rt.looked_up if rt.looked_up else None,
        "prefix_resumed_hit_tokens": rt.all_hit_tokens
        - rt.first_hit_tokens
        - steps.cpu_hit_tokens  # (W_HITS counts the offloading tiers' loads too)
        - steps.disk_hit_tokens,
        "prefix_evicted_blocks": steps.evicted_blocks,
    }
