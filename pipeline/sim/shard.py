"""A replay cut into shards that run one after the other (or elsewhere) and merge into one.

A replay holds every request's state at once (about 200 bytes a request): a fleet's
day of 100M requests does not fit. Two ways to cut it:

- **By replica group** (exact). Under ``round_robin`` the k-th request goes to replica
  k mod N whatever the replicas are doing, so the replicas are independent: with G
  groups (G dividing N), group g holds replicas g, g + G, g + 2G, ... and the requests
  k = g mod G, in their order; its j-th request goes to its replica j mod N/G, which is
  the global replica g + G * (j mod N/G) = k mod N. Each group is an ordinary replay of
  N/G replicas (their random generators seeded with their global indices); merged, the
  requests and step rows are those the whole replay makes, bit for bit.
- **By time** (approximate). A router that reads the replicas' state
  (``least_outstanding``, ``prefix_aware``) couples them: no subset of replicas sees
  a request stream of its own. The arrivals are cut into consecutive windows; each
  window is replayed after a warm-up, the requests of the ``warmup_s`` seconds before
  it replayed but not counted, so that its replicas start loaded rather than empty.
  A shard's step rows are those that start in its window. The error is that of the
  warm-up (a request queued longer than the warm-up, or caches warmer than it can
  fill, are missed at each cut): measured against the unsharded replay in
  ``tests/sim/test_shard.py`` (loose bound) and ``bench/day_scale.py`` (figures).

A fleet (pools), disaggregated prefill and decode, and autoscaling are not sharded:
``check_shardable`` says why in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ScenarioError
from pipeline.sim.disagg import take_keys
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import LeadInput, StepSink, simulate
from pipeline.sim.state import (
    NRQ,
    NRQF,
    NST,
    NSTF,
    R_REPLICA,
    S_REPLICA,
    S_STEP,
    SF_START,
    SimInput,
    SimResult,
)
from pipeline.sim.summary import StepTotals

# routers whose choice does not depend on the replicas' state: replica groups are exact
INDEPENDENT_ROUTERS = ("round_robin",)
DEFAULT_WARMUP_S = 60.0


@dataclass(frozen=True)
class ShardPlan:
    """How a replay is cut: ``by`` "replicas" (exact) or "time" (with a warm-up)."""

    by: str
    shards: int
    warmup_s: float = 0.0

    def describe(self) -> str:
        if self.by == "replicas":
            return f"{self.shards} replica groups (exact: the router is independent of load)"
        return f"{self.shards} time windows, {self.warmup_s:g} s warm-up each (approximate)"


def check_shardable(sc: Scenario) -> None:
    """Raise ScenarioError (one line) if ``sc`` cannot be sharded at all."""
    if sc.pools:
        raise ScenarioError(
            f"scenario {sc.name!r}: a fleet's pools are not sharded; "
            "replay each pool as a scenario of its own to shard it"
        )
    if sc.disagg is not None:
        raise ScenarioError(
            f"scenario {sc.name!r}: disaggregated prefill and decode couple their workers "
            "over the KV link and are not sharded; replay it without --shards"
        )
    if sc.autoscale is not None:
        raise ScenarioError(
            f"scenario {sc.name!r}: autoscaling sizes the whole fleet from its load and is "
            "not sharded; replay it without --shards"
        )


def plan_shards(sc: Scenario, shards: int, *, warmup_s: float | None = None) -> ShardPlan:
    """Replica groups where the router allows (the most groups <= ``shards`` dividing the
    replicas), else time windows with ``warmup_s`` of warm-up.

    ``warmup_s`` given for a scenario whose router is independent asks for time shards.

    Raises:
        ScenarioError: the scenario cannot be sharded, or ``shards`` < 1.
    """
    if shards < 1:
        raise ScenarioError(f"shards must be >= 1, got {shards}")
    check_shardable(sc)
    if sc.router in INDEPENDENT_ROUTERS and warmup_s is None:
        g = max(d for d in range(1, min(shards, sc.replicas) + 1) if sc.replicas % d == 0)
        return ShardPlan("replicas", g)
    w = DEFAULT_WARMUP_S if warmup_s is None else warmup_s
    if w < 0:
        raise ScenarioError(f"warm-up must be >= 0 s, got {w:g}")
    return ShardPlan("time", shards, w)


def sharding_record(sc: Scenario, plan: ShardPlan) -> dict[str, object]:
    """What a sharded replay's summary says of its cut (``sharding``)."""
    return {
        "by": plan.by,
        "shards": plan.shards,
        "warmup_s": plan.warmup_s,
        "exact": plan.by == "replicas",
        "description": plan.describe(),
        "coupling": coupling_note(sc),
    }


def coupling_note(sc: Scenario) -> str | None:
    """Why ``sc``'s replicas cannot be cut into groups exactly (None: they can)."""
    if sc.router in INDEPENDENT_ROUTERS:
        return None
    return (
        f"router {sc.router!r} reads the replicas' load"
        + (" and caches" if sc.router == "prefix_aware" else "")
        + ": they are coupled, so the replay is cut by time"
    )


def take(inp: SimInput, rows: npt.NDArray[np.int64]) -> SimInput:
    """The requests ``rows`` of ``inp`` (in that order, sorted by arrival) as an input of
    their own."""

    def opt(a: npt.NDArray[np.int64] | None) -> npt.NDArray[np.int64] | None:
        return None if a is None else a[rows]

    return SimInput(
        inp.arrival_s[rows],
        inp.prompt_tokens[rows],
        inp.output_tokens[rows],
        prefix=None if inp.prefix is None else take_keys(inp.prefix, rows),
        priority=opt(inp.priority),
        warmup=inp.warmup,
        remote_tokens=opt(inp.remote_tokens),
    )


@dataclass
class Shard:
    """One shard's outcome, on the whole replay's clock and replica numbering."""

    rows: npt.NDArray[np.int64]  # its requests' indices among the measured requests
    result: SimResult  # its timeline empty when a step sink took it
    steps: StepTotals


def _lead_of(inp: SimInput) -> tuple[int, float]:
    lead = inp.lead if isinstance(inp, LeadInput) else 0
    return lead, float(inp.arrival_s[lead]) if lead else 0.0


def run_shards(
    inp: SimInput,
    sc: Scenario,
    plan: ShardPlan,
    *,
    on_steps: StepSink | None = None,
    step_rows: int = 1 << 17,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[Shard]:
    """Replay the shards of ``plan`` one after the other, yielding each when it ends.

    Only one shard's loop state exists at once. ``on_steps`` takes each shard's step
    rows as ``simulate``'s does, already on the whole replay's clock and replica
    numbering (a shard's rows are in time order; the shards' are not interleaved).
    """
    lead, _ = _lead_of(inp)
    done = 0
    for shard in _replay_cuts(sc, cuts(inp, sc, plan), on_steps, step_rows, on_progress):
        done += len(shard.rows)
        yield shard
    assert done == len(inp) - lead, "every measured request is in exactly one shard"


def run_windows(
    windows: Iterable[SimInput],
    sc: Scenario,
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    on_steps: StepSink | None = None,
    step_rows: int = 1 << 17,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[Shard]:
    """Replay a stream of consecutive time windows of requests, one window at a time.

    ``windows`` yields each window's requests (plain inputs on one clock, each sorted,
    each window's first arrival at or after the last one's last): a source that reads
    or makes them a window at a time, so that a day of requests never lives whole. Each
    window is replayed after the requests of the ``warmup_s`` seconds before it (from
    the window before: a longer warm-up is cut there), which are not counted; its step
    rows are those that start before the next window's first arrival. Shards' ``rows``
    number the requests from 0 across the windows. Approximate, as time shards are.

    Raises:
        ScenarioError: the scenario cannot be sharded, a window holds prefix keys or
            priorities (not streamed), or the windows are out of order.
    """
    check_shardable(sc)
    if warmup_s < 0:
        raise ScenarioError(f"warm-up must be >= 0 s, got {warmup_s:g}")
    yield from _replay_cuts(
        sc, _window_cuts(windows, warmup_s, sc.replicas), on_steps, step_rows, on_progress
    )


@dataclass
class Cut:
    """One shard to replay: what ``replay_cut`` needs, and nothing of the other shards
    (so that it can be replayed in another process, or on another machine)."""

    rows: npt.NDArray[np.int64]  # its measured requests' indices in the whole replay
    inp: SimInput  # its input: the requests it does not measure first
    lead: int  # how many of its first requests are not measured
    ids: npt.NDArray[np.int64]  # its replicas' global indices
    lo_t: float  # its step rows are those that start in [lo_t, hi_t) ...
    hi_t: float
    t0: float = 0.0  # ... on the whole replay's clock, which starts at this arrival
    request_ids: Any = None  # its measured requests' ids (a pyarrow array), if its reader has them
    # its measured requests' tenant and model classes (``classes.ClassLabels`` by kind),
    # if its reader has them: for scoped SLOs
    labels: Any = None
    # added to its step rows' step index: a time window k's are k * STEP_BASE + its own
    # (counted from its warm-up's start), so that (replica, step) stays unique and in time
    # order across the windows; replica groups keep the whole replay's (0)
    step_base: int = 0


STEP_BASE = 1 << 32  # steps of one window's replay are far fewer (2**32 at 1 us a step: 71 min)


def cuts(inp: SimInput, sc: Scenario, plan: ShardPlan) -> Iterator[Cut]:
    """The shards of ``plan``, one at a time (each input taken from ``inp`` when asked)."""
    return _cuts(inp, sc, plan, _lead_of(inp)[0])


def _replay_cuts(
    sc: Scenario,
    cuts: Iterator[Cut],
    on_steps: StepSink | None,
    step_rows: int,
    on_progress: Callable[[int], None] | None,
) -> Iterator[Shard]:
    """Replay each cut in turn."""
    done = 0
    for cut in cuts:
        shard = replay_cut(sc, cut, on_steps=on_steps, step_rows=step_rows)
        del cut  # (its input, once replayed)
        done += len(shard.rows)
        if on_progress is not None:
            on_progress(done)
        yield shard


def replay_cut(
    sc: Scenario, cut: Cut, *, on_steps: StepSink | None = None, step_rows: int = 1 << 17
) -> Shard:
    """Replay one shard: its requests and step rows on the whole replay's clock and
    replica numbering (``on_steps`` takes the step rows as ``simulate``'s does)."""
    steps = StepTotals()
    ids, t0 = cut.ids, cut.t0

    def sink(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        st, stf = st.copy(), stf.copy()
        st[:, S_REPLICA] = ids[st[:, S_REPLICA]]
        if cut.step_base:
            st[:, S_STEP] += cut.step_base
        stf[:, SF_START] -= t0
        keep = (stf[:, SF_START] >= cut.lo_t) & (stf[:, SF_START] < cut.hi_t)
        if not keep.all():
            st, stf = st[keep], stf[keep]
        if len(st):
            steps.add(st, stf)
            if on_steps is not None:
                on_steps(st, stf)

    eng = dataclasses.replace(sc, replicas=len(ids)).engine()
    # a plain input: its lead-in (the replay's, or the window's warm-up) is cut here,
    # against the replay's first measured arrival, not the shard's
    res = simulate(cut.inp, eng, on_steps=sink, step_rows=step_rows, replica_ids=ids)
    rq, rqf = res.rq[cut.lead :], res.rqf[cut.lead :]
    rq[:, R_REPLICA] = ids[rq[:, R_REPLICA]]
    if t0:
        rqf = rqf - t0  # NaN (never reached) stays NaN
    return Shard(cut.rows, dataclasses.replace(res, rq=rq, rqf=rqf), steps)


def _concat(a: SimInput, b: SimInput) -> SimInput:
    """The requests of ``a`` then those of ``b`` (no prefix keys, no priorities)."""
    return SimInput(
        np.concatenate([a.arrival_s, b.arrival_s]),
        np.concatenate([a.prompt_tokens, b.prompt_tokens]),
        np.concatenate([a.output_tokens, b.output_tokens]),
    )


def _window_cuts(windows: Iterable[SimInput], warmup_s: float, replicas: int) -> Iterator[Cut]:
    """``_cuts`` of a stream of windows: each one's rows, its input behind its warm-up
    (from the window before), and its step rows' window [its first arrival, the next's)."""
    ids = np.arange(replicas, dtype=np.int64)
    it = iter(windows)
    cur = next(it, None)
    prev: SimInput | None = None
    offset = 0
    k = 0
    while cur is not None:
        nxt = next(it, None)  # one window ahead: where this one's step rows end
        if cur.prefix is not None or cur.priority is not None or cur.remote_tokens is not None:
            raise ScenarioError(
                f"window {k}: streamed windows carry arrivals and lengths only "
                "(no prefix keys, priorities or remote prefill); replay it whole"
            )
        if len(cur):
            a0 = float(cur.arrival_s[0])
            if prev is not None and a0 < float(prev.arrival_s[-1]):
                raise ScenarioError(
                    f"window {k}: its first arrival {a0:g} s is before the last one of the "
                    f"window before ({float(prev.arrival_s[-1]):g} s); yield windows in time order"
                )
            sub, lead = cur, 0
            if prev is not None and warmup_s > 0:
                w0 = int(np.searchsorted(prev.arrival_s, a0 - warmup_s, side="left"))
                sub = _concat(take(prev, np.arange(w0, len(prev), dtype=np.int64)), cur)
                lead = len(prev) - w0
            lo_t = a0 if prev is not None else -np.inf
            hi_t = np.inf
            if nxt is not None and len(nxt):
                hi_t = float(nxt.arrival_s[0])
            rows = np.arange(offset, offset + len(cur), dtype=np.int64)
            yield Cut(rows, sub, lead, ids, lo_t, hi_t, step_base=k * STEP_BASE)
            del sub
            offset += len(cur)
            prev = cur
        cur = nxt
        k += 1


def _cuts(inp: SimInput, sc: Scenario, plan: ShardPlan, lead: int) -> Iterator[Cut]:
    """Per shard (``Cut``): its measured rows (from 0 at the first measured request), its
    input and how many of its first requests are not measured, its replicas' global
    indices, and the window [lo, hi) its step rows are kept in (on the whole replay's
    clock, from the first measured arrival)."""
    n = len(inp)
    t0 = float(inp.arrival_s[lead]) if lead else 0.0
    if plan.by == "replicas":
        g = plan.shards
        per = sc.replicas // g
        lo_t = 0.0 if lead else -np.inf
        for k in range(g):
            every = np.arange(k, n, g, dtype=np.int64)  # arrival index = k mod g
            sub_lead = int(np.searchsorted(every, lead))  # of those, the lead-in
            if sub_lead >= len(every):
                continue  # (more groups than measured requests: none here)
            ids = k + g * np.arange(per, dtype=np.int64)
            sub = take(inp, every)
            yield Cut(every[sub_lead:] - lead, sub, sub_lead, ids, lo_t, np.inf, t0)
        return
    arrival = inp.arrival_s
    first = float(arrival[lead])
    span = float(arrival[-1]) - first
    edges = first + span * np.arange(plan.shards + 1) / plan.shards
    starts = np.searchsorted(arrival, edges, side="left")
    starts[0] = lead
    starts[-1] = n
    ids = np.arange(sc.replicas, dtype=np.int64)
    for k in range(plan.shards):
        a, b = int(starts[k]), int(starts[k + 1])
        if a >= b:
            continue
        w0 = int(np.searchsorted(arrival, arrival[a] - plan.warmup_s, side="left"))
        w0 = max(0, w0) if k else 0  # the first shard keeps the replay's own lead-in
        sub = take(inp, np.arange(w0, b, dtype=np.int64))
        lo_t = float(arrival[a]) - t0 if k else (0.0 if lead else -np.inf)
        hi_t = float(arrival[b]) - t0 if b < n else np.inf
        rows = np.arange(a, b, dtype=np.int64) - lead
        yield Cut(rows, sub, a - w0, ids, lo_t, hi_t, t0, step_base=k * STEP_BASE)


def simulate_sharded(
    inp: SimInput,
    sc: Scenario,
    plan: ShardPlan,
    *,
    on_steps: StepSink | None = None,
    step_rows: int = 1 << 17,
) -> tuple[SimResult, StepTotals]:
    """The shards of ``plan`` replayed and merged into one result, as ``simulate`` of
    ``inp`` returns (requests in arrival order; the timeline empty when ``on_steps``
    takes it, else the shards' rows in shard order) and the timeline's totals."""
    lead, _ = _lead_of(inp)
    m = len(inp) - lead
    rq = np.zeros((m, NRQ), dtype=np.int32)
    rqf = np.zeros((m, NRQF))
    sts: list[npt.NDArray[np.int64]] = []
    stfs: list[npt.NDArray[np.float64]] = []

    def keep(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        sts.append(st)
        stfs.append(stf)

    totals = StepTotals()
    blocks = 0
    for sh in run_shards(inp, sc, plan, on_steps=on_steps or keep, step_rows=step_rows):
        rq[sh.rows] = sh.result.rq
        rqf[sh.rows] = sh.result.rqf
        totals.merge(sh.steps)
        blocks = sh.result.num_kv_blocks
    st = np.concatenate(sts) if sts else np.zeros((0, NST), dtype=np.int64)
    stf = np.concatenate(stfs) if stfs else np.zeros((0, NSTF))
    res = SimResult(
        rq=rq, rqf=rqf, st=st, stf=stf, num_kv_blocks=blocks, frontend=sc.frontend.as_array()
    )
    return res, totals
