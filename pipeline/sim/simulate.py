"""The Python side of a replay: pack the requests and a scenario into the loop's state, run it.

``simulate`` builds the arrays of ``state.State`` and the prefix caches
(``cache.PrefixCaches``) for one scenario, calls the compiled loop
(``loop.replay_loop``) in chunks of arrivals, grows or hands out the step timeline
as it fills, and returns the per-request outcomes. The loop itself, and what
one step does, is ``loop.py``.

A ``LeadInput`` replays its first ``lead`` requests (a busiest window's warm-up) like
any other, then leaves them out of the result: its requests are the others, its step
rows those that start at or after the first of them arrives, and every time is counted
from that arrival.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.sim import autoscale
from pipeline.sim.cache import cache_sizes, empty_caches, warm_all
from pipeline.sim.kv_tiers import tier_slots
from pipeline.sim.loop import G_NEXT, G_ROWS, NG, RET_FULL, RET_SCALE_FULL, RET_YIELD, replay_loop
from pipeline.sim.policies import by_code
from pipeline.sim.prefix import extend_keys
from pipeline.sim.routing import PREFIX_AWARE
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_CACHING,
    C_MAX_SEQS,
    C_NUM_BLOCKS,
    C_POLICY,
    C_REPLICAS,
    C_ROUTER,
    C_SEED,
    C_SPEC_K,
    C_SPEC_MAXLEN,
    C_SWAP_BLOCKS,
    C_TIER_BLOCKS,
    CF_RATIO_INIT,
    NRP,
    NRPF,
    NST,
    NSTF,
    P_CHUNKED,
    P_FREE,
    P_LRU_HEAD,
    P_LRU_TAIL,
    P_RNG,
    P_SLOT_FREE,
    P_SWAP_FREE,
    P_TIER_CAP,
    Q_AHEAD,
    Q_RATIO,
    SF_START,
    W_TOTAL,
    EngineConfig,
    PrefixKeys,
    SimInput,
    SimResult,
    State,
    empty,
    request_state,
    request_times,
    request_totals,
    wide,
)
from pipeline.sim.trees import new_trees, set_off

StepSink = Callable[[npt.NDArray[np.int64], npt.NDArray[np.float64]], None]


@dataclass(frozen=True)
class LeadInput(SimInput):
    """Requests whose first ``lead`` are replayed but left out of the result (see the
    module docstring)."""

    lead: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        assert 0 <= self.lead < max(len(self), 1), "lead must leave a request to measure"


def _lead_of(inp: SimInput) -> tuple[int, float]:
    """The requests that lead in, and the arrival the result's times count from."""
    lead = inp.lead if isinstance(inp, LeadInput) else 0
    return lead, float(inp.arrival_s[lead]) if lead else 0.0


def _trimmed_sink(sink: StepSink, t0: float) -> StepSink:
    """``sink`` handed the rows that start at or after ``t0``, their starts from ``t0``."""

    def trimmed(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        st, stf = _steps_from(st, stf, t0)
        if len(st):
            sink(st, stf)

    return trimmed


def _steps_from(
    st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64], t0: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The step rows that start at or after ``t0`` (copies), their starts from ``t0``."""
    keep = stf[:, SF_START] >= t0
    st, stf = st[keep], stf[keep]
    stf[:, SF_START] -= t0
    return st, stf


def _check_spec_lengths(inp: SimInput, max_model_len: int) -> None:
    """Speculative decoding bounds a request's tokens by max_model_len (vLLM's scheduler:
    ``speculation.py``), so a request must fit it as ``Scenario.cap_lengths`` leaves it:
    a prompt shorter than max_model_len, prompt + output within it. Past that a decode
    would be scheduled no tokens, or fewer than none, step after step.

    Raises:
        ValueError: the first request that does not fit, in one line.
    """
    prompt, output = inp.prompt_tokens, inp.output_tokens
    bad = np.flatnonzero((prompt >= max_model_len) | (prompt + output > max_model_len))
    if len(bad):
        k = int(bad[0])
        raise ValueError(
            f"request {k} has {int(prompt[k]):,} prompt + {int(output[k]):,} output tokens, "
            f"more than max_model_len ({max_model_len:,}) allows with speculative decoding "
            "(a prompt under it, prompt + output within it); cap the lengths first "
            "(Scenario.cap_lengths) or raise max_model_len"
        )


def simulate(
    inp: SimInput,
    eng: EngineConfig,
    *,
    on_progress: Callable[[int], None] | None = None,
    chunk: int = 1 << 16,
    on_steps: StepSink | None = None,
    step_rows: int = 1 << 17,
    replica_ids: npt.NDArray[np.int64] | None = None,
) -> SimResult:
    """Replay ``inp`` through the engine configuration with the compiled loop.

    Args:
        inp: requests sorted by arrival (their prefix keys are used only when
            the engine has prefix caching on). Copied into the loop's state
            first: a caller that holds no reference to it lets it be freed then.
        eng: packed configuration (see ``scenario.Scenario.engine``).
        on_progress: called with the number of requests routed so far, every
            ``chunk`` arrivals.
        chunk: arrivals per call of the compiled loop.
        on_steps: takes the step timeline in chunks of ``step_rows`` rows (the
            last one shorter), in order, as ``(st, stf)`` views that are
            overwritten once it returns: convert or copy what it keeps. The
            timeline then never lives whole, and the result's ``st``/``stf``
            are empty (add the chunks up with ``summary.StepTotals``).
            Without it the timeline is kept whole and returned.
        step_rows: rows per chunk handed to ``on_steps``.
        replica_ids: each replica's index in a larger replay this one is a shard of
            (``shard.py``): it seeds that replica's random generator as the whole
            replay would. Default: 0, 1, ...

    Returns:
        Per-request outcomes and the (compressed) step timeline; of a ``LeadInput``,
        those of the requests after its lead.

    Raises:
        ValueError: a request's lengths do not fit the simulator (``request_state``) or,
            with speculative decoding, max_model_len (``_check_spec_lengths``).
    """
    if eng.get(C_SPEC_K) > 0:
        _check_spec_lengths(inp, eng.get(C_SPEC_MAXLEN))
    lead, t0 = _lead_of(inp)
    if lead and on_steps is not None:
        on_steps = _trimmed_sink(on_steps, t0)
    n = len(inp)
    num_replicas = eng.get(C_REPLICAS)
    bs = eng.get(C_BLOCK_SIZE)
    num_blocks = eng.get(C_NUM_BLOCKS)
    caching = eng.get(C_CACHING) != 0
    policy = by_code(eng.get(C_POLICY))
    pk = PrefixKeys.empty(0)  # no keys: their columns stay 0, no per-request arrays for them
    if caching:
        pk = inp.prefix if inp.prefix is not None else PrefixKeys.empty(n)
        if policy.caches_generated:  # the keys of generated blocks too (vLLM)
            pk = extend_keys(pk, inp.prompt_tokens, inp.output_tokens)
    rq = request_state(inp, pk if caching else None, bs)
    warmup = inp.warmup if caching and inp.warmup is not None else PrefixKeys.empty(0)
    need = int(np.sum(-(-(inp.prompt_tokens + inp.output_tokens) // bs))) + int(
        np.sum(np.diff(warmup.offsets) * (warmup.unit_tokens // bs))
    )
    copies = not policy.dedupe  # a key may be cached more than once (vLLM)
    slots, distinct = cache_sizes(num_blocks, [pk, warmup], bs, copies=copies, blocks_needed=need)
    index = 0  # the prefix_aware router's index of which replicas hold each unit
    if eng.get(C_ROUTER) == PREFIX_AWARE and num_replicas > 1:
        index = min(num_replicas * distinct, len(pk.keys) + len(warmup.keys))
    tiers = tier_slots(eng.cfg, len(pk.keys))  # KV offloading tiers (kv_tiers.py; 0: off)
    kc = empty_caches(
        num_replicas, slots, pk.keys, index=index, num_keys=distinct, tier_slots=tiers
    )
    rqf = request_times(np.require(inp.arrival_s, np.float64, "C"))
    remote = inp.remote_tokens  # tokens it starts with but did not compute here
    del inp  # copied into rq/rqf: a caller that let go of it frees it while the loop runs
    rp = np.zeros((num_replicas, NRP), dtype=np.int64)
    rp[:, P_FREE] = num_blocks
    rp[:, P_LRU_HEAD] = -1
    rp[:, P_LRU_TAIL] = -1
    rp[:, P_SLOT_FREE] = 0
    rp[:, P_CHUNKED] = -1
    rp[:, P_SWAP_FREE] = eng.get(C_SWAP_BLOCKS)  # swap preemption's host blocks (swap.py)
    rp[:, P_TIER_CAP] = eng.get(C_TIER_BLOCKS)  # KV offloading tiers' blocks (kv_tiers.py)
    rp[:, P_TIER_CAP + 1] = eng.get(C_TIER_BLOCKS + 1)
    ids = np.arange(num_replicas) if replica_ids is None else np.asarray(replica_ids, np.int64)
    assert len(ids) == num_replicas, "replica_ids: one per replica"
    rp[:, P_RNG] = eng.get(C_SEED) * 1_000_003 + ids
    rpf = np.zeros((num_replicas, NRPF))
    rpf[:, Q_RATIO] = eng.cfgf[CF_RATIO_INIT]
    rpf[:, Q_AHEAD] = -np.inf
    if len(warmup):
        offsets = np.require(warmup.offsets, np.int64, ["C", "W"])
        keys = np.require(warmup.keys, np.uint64, ["C", "W"])
        warm_all(rp, offsets, keys, warmup.unit_tokens // bs, warmup.tails // bs, kc)
    max_seqs = min(eng.get(C_MAX_SEQS), max(n, 1))
    # the running list, and in the second half (vLLM async) the finished requests to free
    run = np.zeros((num_replicas, 2 * (max_seqs + 1)), dtype=np.int64)
    wq = empty(num_replicas, max(n, 1), np.int32)  # a slot is read only once written
    assert step_rows >= 1, "step_rows must be >= 1"
    rows = step_rows if on_steps is not None else 2 * n + 1024
    st = empty(rows, NST, np.int64)  # a row is read only once written (below G_ROWS)
    stf = empty(rows, NSTF, np.float64)
    g = np.zeros(NG, dtype=np.int64)
    trees = new_trees(num_replicas)
    scaling = autoscale.new_scaling(eng.autoscale)
    for r in range(len(scaling.rs)):  # the replicas not started yet take no requests
        if scaling.rs[r] != autoscale.ACTIVE:
            set_off(trees.lmin, trees.li, trees.lmax, r)
    sched_q = np.zeros(max_seqs + 1, dtype=np.int64)
    sched_t = np.zeros(max_seqs + 1, dtype=np.int64)
    ev = np.zeros(max_seqs + 1, dtype=np.int64)
    s = State(
        eng.cfg, eng.cfgf, eng.cost, rq, rqf, rp, rpf, run, wq, st, stf, g, sched_q, sched_t, ev
    )
    while True:
        ret = replay_loop(s, kc, trees, chunk, scaling)
        if ret == RET_SCALE_FULL:
            scaling = autoscale.grow_events(scaling)
        elif ret == RET_FULL:
            if on_steps is not None:  # hand the full chunk out and fill the arrays again
                on_steps(st, stf)
                g[G_ROWS] = 0
            else:  # twice the rows; the new ones stay untouched (no memory until written)
                st2 = np.zeros((2 * len(st), NST), dtype=st.dtype)
                stf2 = np.zeros((2 * len(stf), NSTF), dtype=stf.dtype)
                st2[: len(st)] = st
                stf2[: len(stf)] = stf
                st, stf = st2, stf2
                s = s._replace(st=st, stf=stf)
        elif ret == RET_YIELD:
            if on_progress is not None:
                on_progress(int(g[G_NEXT]))
        else:
            break
    if on_progress is not None:
        on_progress(n)
    request_totals(rq)
    if remote is not None:
        wide(rq)[:, W_TOTAL] -= remote
    rows = int(g[G_ROWS])
    if on_steps is not None:
        if rows:
            on_steps(st[:rows], stf[:rows])
        rows = 0
        st = np.zeros((0, NST), dtype=st.dtype)
        stf = np.zeros((0, NSTF), dtype=stf.dtype)
    st, stf = st[:rows], stf[:rows]  # views: the unused tail is never touched
    nev = int(scaling.gi[autoscale.GI_NEV]) if len(scaling.gi) else 0
    changes = [
        (float(scaling.evf[j]), int(scaling.ev[j, 0]), int(scaling.ev[j, 1])) for j in range(nev)
    ]
    events = autoscale.scale_events(eng.autoscale, changes, rq, rqf)
    if lead:
        rq, rqf = rq[lead:], rqf[lead:] - t0  # NaN (never reached) stays NaN
        st, stf = _steps_from(st, stf, t0)
        events["time"] -= t0  # (the lead-in's events come out before 0)
    return SimResult(
        frontend=eng.frontend,
        rq=rq,
        rqf=rqf,
        st=st,
        stf=stf,
        num_kv_blocks=num_blocks,
        scale_events=events,
    )


def warm_up(eng: EngineConfig) -> None:
    """Load (or compile) the loop now, so that timing a replay does not include it."""
    tiny = SimInput(np.zeros(2), np.array([4, 4], dtype=np.int64), np.array([2, 2], dtype=np.int64))
    simulate(tiny, eng)
