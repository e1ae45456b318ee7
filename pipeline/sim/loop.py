"""The fast replay loop: compiled, struct-of-arrays, skipping runs of decode steps.

# NOTE: like vLLM V1, there is no prefill phase or decode phase. Each request has
# num_computed_tokens chasing num_tokens (= prompt + tokens generated so far). A
# step hands out tokens; a request whose computed tokens reach num_tokens samples
# a token that step. Chunked prefill is "got fewer tokens than it asked for",
# and recompute after a preemption is a prefill of prompt + generated tokens.

Time and step cost. A step starts when the previous one ends (or when a
request arrives at an idle replica, or when a static batch's timer fires) and
lasts ``cost_model.step_time(P, A, N, D, C)`` where, over the scheduled requests
(the ``transformers`` policy counts A over its packed batch, see its module):

- a request is a **decode** if its prompt (or recompute) is done: it computes
  one token with context ``n + 1`` (n = tokens computed before the step, plus
  the new one): ``D += 1``, ``C += n + 1``, ``N += 1``;
- otherwise it computes a **prefill chunk** of ``t`` tokens on top of ``n``:
  ``P += t``, ``A += t * n + t * (t + 1) / 2``, ``N += 1``.

The reference loop (``reference.py``) uses the same definitions.

A request that arrives at time ``a`` can be scheduled by a step that starts at
``s >= a``. The router sees each replica as simulated up to an arrival (every
step starting before it). Round robin needs no replica but the one the request
goes to; for the other routers ``_loop`` touches only the replicas with a step
or a completion before the arrival, and advances them lazily: a decode run
that reaches past the arrival is deferred (``_defer``) and applied later
(``_resolve``), whole once its last step starts before some arrival, or cut at
an arrival routed to its replica. Until then the replica's outstanding
requests are known without it (no request finishes inside a run), so other
replicas' arrivals never cut a replica's runs.

Skipping. When a step is a pure decode step of every running request, with no
admission and no preemption, the following steps are identical until an
event: an arrival to its replica (the run stops before a step that starts at
or after it), a completion (the run ends with the step that finishes the
first request), or a KV block boundary that cannot be served (the run stops
before the step whose allocations would not fit). Whatever blocked admission
in the first step still blocks it (free blocks only shrink and the batch does
not change). Such a run of k steps is applied in one move: each request gets k
tokens, its blocks grow to cover them, and the time is
``cost_model.decode_run_s`` (the closed-form sum of the k step times). It is
written as one sim_steps row with ``num_steps = k``.

vLLM's async scheduling (``policies/vllm.py``) asks three things of the loop:
an arrival goes into its replica's input queue (``state.inbox_push``), which
the policy hands to the scheduler when the engine core would; a request that
finishes stays in the running list until the policy frees it, after the next
decision (``P_PEND_FREE``); and a decision may start no step (the replica had
only finished requests). Skipping stays exact: a decision that leaves requests
in the input queue (the next one sees them), or that had finished requests
holding blocks while others wait, is not repeated (the policy clears
``P_STABLE``), and the later steps of a run cache a decode's blocks one token
short, as each is decided while the one before runs. A run cut at an
arrival to its replica also takes the first step starting at or after it,
which was decided before it and so cannot see it (``_run_length``, or
``_resolve`` for a deferred run); its start (``Q_AHEAD``) tells ``_loop``
which arrivals the next decision takes. Runs cut for ``prefix_aware``'s view
of the other replicas still stop before the arrival.

numba's on-disk cache does not notice edits to *other* files that a cached
function calls, so ``_invalidate_stale_cache`` below drops this package's
cache when any simulator source changes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.borrow import borrow
from pipeline.sim.cache import cache_sizes, commit, empty_caches, settles, take, warm
from pipeline.sim.cost_model import (
    decode_run_s,
    step_time,
)
from pipeline.sim.kv import blocks_needed, release
from pipeline.sim.policies import orca, sarathi, sglang, static, tgi, transformers, vllm
from pipeline.sim.prefix import extend_keys
from pipeline.sim.prefix_index import find_key
from pipeline.sim.routing import (
    PREFIX_AWARE,
    ROUND_ROBIN,
    imbalanced,
    least_outstanding,
    outstanding,
    prefix_aware,
)
from pipeline.sim.state import (
    C_ASYNC,
    C_BLOCK_SIZE,
    C_CACHING,
    C_MAX_SEQS,
    C_NUM_BLOCKS,
    C_POLICY,
    C_REPLICAS,
    C_ROUTER,
    C_SEED,
    CF_RATIO_INIT,
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    NRP,
    NRPF,
    NST,
    NSTF,
    P_CHUNKED,
    P_DONE,
    P_EVICTABLE,
    P_EVICTED,
    P_FREE,
    P_INBOX,
    P_INBOX_OLD,
    P_LAST_DONE,
    P_LRU_HEAD,
    P_LRU_TAIL,
    P_PEND_EV0,
    P_PEND_EVICTS,
    P_PEND_FREE,
    P_PEND_K,
    P_PENDING,
    P_QUEUED,
    P_RNG,
    P_ROUTED,
    P_RUN_N,
    P_SLOT_FREE,
    P_STABLE,
    P_STEP,
    P_STEP_HIT,
    P_STEP_QUERY,
    P_WAIT_TOK,
    P_WQ_LEN,
    Q_AHEAD,
    Q_CLOCK,
    Q_LAST_END,
    Q_PEND_CTX,
    Q_PEND_LAST,
    Q_RATIO,
    R_CHUNKS,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_NUNITS,
    R_OUTPUT,
    R_PF_END,
    R_PROMPT,
    R_QDEPTH,
    R_REPLICA,
    R_SHARED,
    R_STATUS,
    R_UNIT_TOK,
    S_DECODE,
    S_EVICTED,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    S_STEP,
    S_WAITING,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    SF_START,
    ST_FINISHED,
    ST_WAITING,
    W_HOFF,
    EngineConfig,
    PrefixKeys,
    SimInput,
    SimResult,
    drop_finished,
    empty,
    inbox_push,
    request_state,
    request_times,
    request_totals,
    uindex,
    wait_add,
    wide,
    wq_peek,
)
from pipeline.sim.trees import new_trees, set_load, set_wake

G_NEXT = 0  # next request to arrive
G_ROWS = 1  # timeline rows written
G_LAZY = 2  # 1 while replicas are advanced lazily (decode runs past ``until`` are deferred)
NG = 3

RET_DONE = 0
RET_FULL = 1  # the timeline arrays are full: grow them and call again
RET_YIELD = 2  # processed the arrivals asked for: report progress and call again


def _invalidate_stale_cache() -> None:
    """Drop numba cache files of this package when any compiled source changed
    (``pipeline.jit.compiled_sources``: numba itself checks only each function's own file)."""
    from pipeline import jit

    digest = hashlib.sha1()
    for path in jit.compiled_sources():
        digest.update(path.read_bytes())
    stamp_value = digest.hexdigest()
    here = Path(__file__).resolve().parent
    stamp = here / "__pycache__" / "sim-sources.sha1"
    try:
        if stamp.exists() and stamp.read_text() == stamp_value:
            return
        for folder in jit.JIT_FOLDERS:
            d = jit.PACKAGE / folder / "__pycache__"
            for f in [*d.glob("*.nbi"), *d.glob("*.nbc")]:
                f.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(stamp_value)
    except OSError:  # read-only install: numba caches elsewhere, or not at all
        pass


_invalidate_stale_cache()


@njit(cache=True, error_model="numpy", inline="always")
def _schedule(
    r: int,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    sq: npt.NDArray[np.int64],
    stt: npt.NDArray[np.int64],
    now: float,
    kc: tuple,  # type: ignore[type-arg]
) -> tuple[int, int, int]:
    code = cfg[C_POLICY]
    if code == vllm.CODE:
        return vllm.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    if code == sglang.CODE:
        return sglang.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    if code == tgi.CODE:
        return tgi.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    if code == sarathi.CODE:
        return sarathi.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    if code == transformers.CODE:
        return transformers.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    if code == orca.CODE:
        return orca.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)
    return static.schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, now, kc)


@njit(cache=True, error_model="numpy", inline="always")
def _next_start(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    wq: npt.NDArray[np.int32],
    r: int,
) -> float:
    """Earliest start of replica r's next step, inf when it has nothing to do."""
    if rp[r, P_RUN_N] == 0 and rp[r, P_WQ_LEN] == 0 and rp[r, P_INBOX] == 0:
        return math.inf
    clock = rpf[r, Q_CLOCK]
    if cfg[C_POLICY] == static.CODE and rp[r, P_RUN_N] == 0:
        oldest = rqf[wq_peek(wq, rp, r), F_ARRIVAL]
        return static.ready_at(cfg, cfgf, oldest, rp[r, P_WQ_LEN], clock)
    return clock


@njit(cache=True, error_model="numpy", inline="always")
def _extra_blocks(
    rq: npt.NDArray[np.int32], sq: npt.NDArray[np.int64], n: int, k: int, bs: int
) -> int:
    """Blocks the scheduled decodes add over steps 2..k of a run (step 1 is computed)."""
    extra = 0
    for j in range(n):
        i = sq[j]
        extra += blocks_needed(rq, i, rq[i, R_COMPUTED] + k - 1, bs)
    return extra


@njit(cache=True, error_model="numpy", inline="always")
def _steps_before(
    cost: npt.NDArray[np.float64], start: float, until: float, d: float, ctx: float, k_max: int
) -> int:
    """Steps of a decode run (at most k_max, at least 1) that start before ``until``."""
    # step j (0-based) starts at start + decode_run_s(j) and must start before until
    if until < math.inf and start + decode_run_s(cost, d, ctx, k_max - 1) >= until:
        lo = 1
        hi = k_max
        first = decode_run_s(cost, d, ctx, 1)  # steps only get longer (the context grows)
        if first > 0 and (until - start) / first + 2 < hi:
            hi = int((until - start) / first) + 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if start + decode_run_s(cost, d, ctx, mid - 1) < until:
                lo = mid
            else:
                hi = mid
        return lo
    return k_max


@njit(cache=True, error_model="numpy", inline="always")
def _run_length(
    cfg: npt.NDArray[np.int64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    n: int,
    r: int,
    start: float,
    until: float,
    d: float,
    ctx: float,
    k_max: int,
    ahead: int,
) -> int:
    """Steps the current pure-decode step can be repeated unchanged (>= 1).

    The limits (arrival, completion, KV blocks) are independent and each
    allows a prefix of the steps, so the run with a later ``until`` cut at
    ``until`` is this run: ``_steps_before`` of it. With ``ahead`` (vLLM async
    scheduling), the first step starting at or after ``until`` is in it too:
    it was decided when the step before it started, before the arrival.
    """
    kb = _steps_before(cost, start, until, d, ctx, k_max)  # the next arrival
    k_max = kb + ahead if kb < k_max else kb
    if k_max <= 1:
        return 1
    code = cfg[C_POLICY]
    if code != orca.CODE and code != static.CODE:  # they reserve every block up front
        bs = cfg[C_BLOCK_SIZE]
        cap = rp[r, P_FREE] + rp[r, P_EVICTABLE]  # evictable cached blocks are free too
        if rp[r, P_STABLE] == 2:  # ... unless evicting them could change what was decided
            cap = rp[r, P_FREE]
        if code == sarathi.CODE:
            cap -= 1  # every decode needs a free block before it (can_append_slot)
        if cap < 0:
            return 1
        most = n * ((k_max - 2) // bs + 1)  # no request can need more blocks than this
        if most > cap and bs == 1:
            # token-granular KV (SGLang, TGI): extra(k) = sum max(0, k - slack_i); when
            # every request has the same slack (just-in-time growth), solve it directly
            slack = -1
            same = True
            for j in range(n):
                i = sq[j]
                d = int(rq[i, R_HELD] + rq[i, R_SHARED] - rq[i, R_COMPUTED] + 1)
                if slack < 0:
                    slack = d
                elif d != slack:
                    same = False
                    break
            if same:
                return max(1, min(k_max, slack + cap // n))
        if most > cap and _extra_blocks(rq, sq, n, k_max, bs) > cap:
            lo = 1
            hi = k_max
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _extra_blocks(rq, sq, n, mid, bs) <= cap:
                    lo = mid
                else:
                    hi = mid
            k_max = lo
    return k_max


@njit(cache=True, error_model="numpy", inline="always")
def _step(
    r: int,
    until: float,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    stt: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """One step of replica r (or a run of identical decode steps), starting at its clock."""
    start = rpf[r, Q_CLOCK]
    num_waiting = rp[r, P_WQ_LEN]
    evicted0 = rp[r, P_EVICTED]
    rp[r, P_STEP_QUERY] = 0
    rp[r, P_STEP_HIT] = 0
    rpf[r, Q_AHEAD] = -math.inf
    n, n_pre, n_adm = _schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sq, stt, start, kc)
    if n == 0 and n_pre == 0:  # vLLM async: the last step's finished requests were all it had
        assert cfg[C_ASYNC] != 0 and rp[r, P_RUN_N] + rp[r, P_WQ_LEN] + rp[r, P_INBOX] == 0
        return
    if cfg[C_ASYNC] != 0:  # the queue once the core took its new requests (policies/vllm.py)
        num_waiting = rp[r, P_QUEUED]
    # One pass: the step's cost features (before) and what it computes (after);
    # first and last tokens are listed in ev and timed once the duration is known.
    # integer sums (exact, as the float sums were below 2**53), made floats after the loop
    tok_sum = 0
    attn_sum = 0
    n_pf = 0  # prefill chunks (sequences) in the step; the other n - n_pf are decodes
    ctx_sum = 0
    pf_kv = 0  # KV tokens of the prefill chunks after the step (packed attention)
    min_left = np.iinfo(np.int64).max
    n_ev = 0
    for j in range(n):
        i = uindex(sq[j])
        c0 = rq[i, R_COMPUTED]
        if c0 >= rq[i, R_PF_END]:  # a decode: context c0 + 1, samples a token
            ctx_sum += c0 + 1
            gen = rq[i, R_GENERATED] + 1
            rq[i, R_COMPUTED] = c0 + 1
            rq[i, R_GENERATED] = gen
            left = rq[i, R_OUTPUT] - gen + 1
            if left < min_left:
                min_left = left
            if left <= 1:
                ev[n_ev] = i
                n_ev += 1
        else:  # a prefill (or recompute) chunk
            t = stt[j]
            n_pf += 1
            tok_sum += t
            attn_sum += t * c0 + t * (t + 1) // 2  # causal (query, key) pairs
            pf_kv += c0 + t
            if math.isnan(rqf[i, F_FIRST_SCHED]):
                rqf[i, F_FIRST_SCHED] = start
            if c0 < rq[i, R_PROMPT]:
                rq[i, R_CHUNKS] += 1
            rq[i, R_COMPUTED] = c0 + t
            if c0 + t >= rq[i, R_PROMPT] + rq[i, R_GENERATED]:
                gen = rq[i, R_GENERATED] + 1
                rq[i, R_GENERATED] = gen
                if gen == 1 or gen >= rq[i, R_OUTPUT]:
                    ev[n_ev] = i
                    n_ev += 1
    d = n - n_pf
    p_tok = float(tok_sum)
    ctx = float(ctx_sum)
    p_attn = float(attn_sum)
    if cfg[C_POLICY] == transformers.CODE:  # KV of every scheduled sequence after the step
        p_attn = transformers.packed_attention(p_tok, float(d), float(ctx_sum + pf_kv), ctx)
    k = 1
    if (
        p_tok == 0
        and n_pre == 0
        and n_adm == 0
        and n > 0
        and n == rp[r, P_RUN_N]
        and min_left > 1
        and rp[r, P_STABLE] > 0
    ):
        lazy = g[G_LAZY] != 0
        # vLLM async, advanced eagerly (``until`` is this replica's next arrival): the run
        # may take the step after the arrival, which cannot see it yet
        ahead = 1 if cfg[C_ASYNC] != 0 and not lazy else 0
        k = _run_length(cfg, cost, rq, rp, sq, n, r, start, math.inf if lazy else until, d, ctx,
                        min_left, ahead)  # fmt: skip
        if ahead and k > 1 and until < math.inf:
            last = start + decode_run_s(cost, d, ctx, k - 1)  # start of its last step
            if last >= until:  # arrivals up to it reach the next decision (see _loop)
                rpf[r, Q_AHEAD] = last
        if lazy and k > 1:
            last = start + decode_run_s(cost, d, ctx, k - 1)  # start of its last step
            if last >= until:  # it reaches past the arrival: decide it when it is needed
                if _defer(r, cfg, rq, rp, rpf, run, sq, n, n_ev, ctx, evicted0, last, k):
                    return
                k = _steps_before(cost, start, until, d, ctx, k)
    _finish(r, k, start, n, n_pre, n_ev, p_tok, p_attn, n_pf, d, ctx, num_waiting, evicted0,
            cfg, cfgf, cost, rq, rqf, rp, rpf, run, st, stf, g, sq, ev, kc)  # fmt: skip


@njit(cache=True, error_model="numpy", inline="always")
def _finish(
    r: int,
    k: int,
    start: float,
    n: int,
    n_pre: int,
    n_ev: int,
    p_tok: float,
    p_attn: float,
    n_pf: int,
    d: int,
    ctx: float,
    num_waiting: int,
    evicted0: int,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """The rest of a step ``_step`` decided: repeat it k times, finish requests, write the row."""
    code = cfg[C_POLICY]
    # vLLM async: steps 2..k are decided while the one before runs, so each caches a
    # decode's blocks only up to the token that one is sampling (policies/vllm.py)
    lag = cfg[C_ASYNC]
    if k == 1:
        duration = step_time(cost, p_tok, p_attn, float(n_pf + d), float(d), ctx)
    else:  # steps 2..k: the same decodes again
        duration = decode_run_s(cost, d, ctx, k)
        bs = cfg[C_BLOCK_SIZE]
        commits = code == vllm.CODE and cfg[C_CACHING] != 0  # vLLM caches as it computes
        settle = False  # some request settles a cache unit over steps 2..k
        total = 0
        for j in range(n):
            i = uindex(sq[j])
            c = rq[i, R_COMPUTED] + k - 1
            need = blocks_needed(rq, i, c, bs)
            total += need
            rq[i, R_HELD] += need
            rq[i, R_COMPUTED] = c
            gen = rq[i, R_GENERATED] + k - 1
            rq[i, R_GENERATED] = gen
            if gen >= rq[i, R_OUTPUT]:
                ev[n_ev] = i
                n_ev += 1
            if commits and settles(rq, i, c - lag):
                settle = True
        # evictions depend only on the blocks taken in total: nothing is released meanwhile
        if total <= rp[r, P_FREE]:
            rp[r, P_FREE] -= total
        else:
            take(rp, r, total, kc)
        if settle:  # what steps 2..k commit, once the blocks are taken
            for j in range(n):
                i = sq[j]
                if settles(rq, i, rq[i, R_COMPUTED] - lag):
                    commit(rq, rp, i, r, rq[i, R_COMPUTED] - lag, False, kc)
        if code == sglang.CODE:
            sglang.decay(cfgf, rpf, r, k - 1)
        elif code == tgi.CODE:
            rp[r, P_WAIT_TOK] += k - 1
    end = start + duration
    done = 0
    done_decoding = 0
    caching = cfg[C_CACHING] != 0
    for e in range(n_ev):
        i = ev[e]
        if rq[i, R_GENERATED] == 1 and math.isnan(rqf[i, F_FIRST_TOKEN]):
            rqf[i, F_FIRST_TOKEN] = end
        if rq[i, R_GENERATED] >= rq[i, R_OUTPUT]:
            rqf[i, F_FINISH] = end
            rq[i, R_STATUS] = ST_FINISHED
            if caching and code == tgi.CODE:  # TGI caches a prompt when the request ends
                commit(rq, rp, i, r, rq[i, R_PROMPT], True, kc)
            if lag == 0:
                release(rq, rp, r, i, kc)
            else:  # async: listed, and freed once the next step is decided (policies/vllm.py)
                run[r, run.shape[1] // 2 + rp[r, P_PEND_FREE]] = i
                rp[r, P_PEND_FREE] += 1
            done += 1
            if rq[i, R_COMPUTED] > rq[i, R_PF_END]:  # its last token came from a decode
                done_decoding += 1
    if done > 0 and lag == 0:
        drop_finished(rq, rp, run, r)
        if code == sglang.CODE:  # filtered out of the running batch at the next decode step
            rp[r, P_PENDING] += done_decoding
    row = g[G_ROWS]
    st[row, S_REPLICA] = r
    st[row, S_STEP] = rp[r, P_STEP]
    st[row, S_NUM_STEPS] = k
    st[row, S_RUNNING] = n
    st[row, S_WAITING] = num_waiting
    st[row, S_PREFILL] = int(p_tok)
    st[row, S_DECODE] = d
    st[row, S_KV_USED] = cfg[C_NUM_BLOCKS] - rp[r, P_FREE] - rp[r, P_EVICTABLE]
    st[row, S_PREEMPT] = n_pre
    st[row, S_PQUERY] = rp[r, P_STEP_QUERY]
    st[row, S_PHIT] = rp[r, P_STEP_HIT]
    st[row, S_EVICTED] = rp[r, P_EVICTED] - evicted0
    stf[row, SF_START] = start
    stf[row, SF_DURATION] = duration
    stf[row, SF_ATTN] = p_attn
    stf[row, SF_CTX] = ctx
    g[G_ROWS] = row + 1
    rp[r, P_STEP] += k
    rp[r, P_DONE] += done
    rp[r, P_LAST_DONE] = done
    rpf[r, Q_CLOCK] = end
    rpf[r, Q_LAST_END] = end


@njit(cache=True, error_model="numpy", inline="always")
def _defer(
    r: int,
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    n: int,
    n_ev: int,
    ctx: float,
    evicted0: int,
    last: float,
    k: int,
) -> bool:
    """Leave the decode run just decided (its first step done) to ``_resolve``; False if it can't.

    What ``_resolve`` needs is kept in the replica's row: nothing else happens
    on the replica until then, and the run's requests are its running list.
    """
    if n_ev != 0:
        return False
    for j in range(n):
        if sq[j] != run[r, j]:
            return False
    rp[r, P_PEND_EVICTS] = 0
    if cfg[C_ROUTER] == PREFIX_AWARE and (
        _extra_blocks(rq, sq, n, k, cfg[C_BLOCK_SIZE]) > rp[r, P_FREE]
    ):  # its later steps evict cached units: the router must see them (_settle_holders)
        rp[r, P_PEND_EVICTS] = 1
    rp[r, P_PEND_K] = k
    rp[r, P_PEND_EV0] = evicted0
    rpf[r, Q_PEND_CTX] = ctx
    rpf[r, Q_PEND_LAST] = last
    return True


@njit(cache=True, error_model="numpy")  # called at three places: one compiled copy
def _resolve(
    r: int,
    until: float,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
    ahead: int,
) -> None:
    """Apply replica r's deferred decode run: its steps that start before ``until``.

    With ``ahead`` (vLLM async, cut at an arrival routed to it) also the first
    step starting at or after ``until``, decided before it (see ``_run_length``).
    """
    n = rp[r, P_RUN_N]
    for j in range(n):
        sq[j] = run[r, j]
    start = rpf[r, Q_CLOCK]
    ctx = rpf[r, Q_PEND_CTX]
    k = _steps_before(cost, start, until, n, ctx, rp[r, P_PEND_K])
    if ahead and k < rp[r, P_PEND_K]:
        k += 1
        rpf[r, Q_AHEAD] = start + decode_run_s(cost, n, ctx, k - 1)
    rp[r, P_PEND_K] = 0
    _finish(r, k, start, n, 0, 0, 0.0, 0.0, 0, n, ctx, rp[r, P_WQ_LEN], rp[r, P_PEND_EV0],
            cfg, cfgf, cost, rq, rqf, rp, rpf, run, st, stf, g, sq, ev, kc)  # fmt: skip


@njit(cache=True, error_model="numpy", inline="always")
def _advance(
    r: int,
    until: float,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    stt: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
) -> bool:
    """Run replica r's steps that start before ``until``; False if the timeline is full.

    Lazily (``g[G_LAZY]``), a decode run that starts before ``until`` but
    reaches past it is left deferred (``_defer``) and applied once its last
    step starts before ``until``; otherwise it is cut at ``until``.
    """
    while True:
        if g[G_ROWS] >= st.shape[0]:
            return False
        if rp[r, P_PEND_K] > 0:
            if g[G_LAZY] != 0 and not rpf[r, Q_PEND_LAST] < until:
                return True
            _resolve(r, until, cfg, cfgf, cost, rq, rqf, rp, rpf, run, st, stf, g, sq, ev, kc, 0)
            continue
        s = _next_start(cfg, cfgf, rqf, rp, rpf, wq, r)
        if not s < until:
            return True
        rpf[r, Q_CLOCK] = s
        _step(r, until, cfg, cfgf, cost, rq, rqf, rp, rpf, run, wq, st, stf, g, sq, stt, ev, kc)


@njit(cache=True, error_model="numpy", inline="always")
def _settle_holders(
    i: int,
    t: float,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
    wt: npt.NDArray[np.float64],
    wi: npt.NDArray[np.int64],
) -> bool:
    """Before prefix_aware looks up request i: cut at t the deferred runs that evict.

    Only replicas caching the request's first unit can hold a prefix of it,
    so only their runs matter; a cut run's steps are those before t, as the
    router must see them. False if the timeline is full.
    """
    if rq[i, R_UNIT_TOK] == 0 or rq[i, R_NUNITS] == 0:
        return True
    e = find_key(kc[5], kc[7], kc[3][wide(rq)[i, W_HOFF]])
    if e < 0:
        return True
    held = kc[6][e].copy()  # evictions below may move entries of the index
    for w in range(held.shape[0]):
        m = held[w]
        b = 0
        while m:
            q = 64 * w + b
            if m & np.uint64(1) and rp[q, P_PEND_K] > 0 and rp[q, P_PEND_EVICTS] != 0:
                if g[G_ROWS] >= st.shape[0]:
                    return False
                _resolve(q, t, cfg, cfgf, cost, rq, rqf, rp, rpf, run, st, stf, g, sq, ev, kc, 0)
                set_wake(wt, wi, q, _wake(cfg, cfgf, rqf, rp, rpf, wq, q, t))
            m >>= np.uint64(1)
            b += 1
    return True


@njit(cache=True, error_model="numpy", inline="always")
def _wake(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    wq: npt.NDArray[np.int32],
    r: int,
    t: float,
) -> float:
    """Replica r (advanced to t) needs the loop again at the first arrival later than this.

    That is when a step of it starts before the arrival (its deferred run's
    last one, or its next one), or when its latest step's completions stop
    being outstanding (at their end time: just after the float before it).
    """
    if rp[r, P_PEND_K] > 0:
        return rpf[r, Q_PEND_LAST]
    w = _next_start(cfg, cfgf, rqf, rp, rpf, wq, r)
    if rp[r, P_LAST_DONE] > 0 and rpf[r, Q_LAST_END] > t:
        w = min(w, np.nextafter(rpf[r, Q_LAST_END], -math.inf))
    return w


@njit(cache=True, error_model="numpy")
def _loop(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    sq: npt.NDArray[np.int64],
    stt: npt.NDArray[np.int64],
    ev: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
    trees: tuple,  # type: ignore[type-arg]
    max_arrivals: int,
) -> int:
    """Route arrivals in order and advance replicas between them; resumable.

    Round robin needs nothing of the other replicas: only the one the
    arrival goes to is advanced. The other routers see every replica at the
    arrival time, but only replicas that need it are touched (the wake tree,
    ``trees.py``, keeps them by the time they next do), lazily: a decode run
    that reaches past the arrival is deferred, not cut, so that only the
    arrivals a replica gets break up its runs. The load tree holds each
    replica's outstanding requests at the latest arrival.
    """
    # borrowed views: the calls and bindings below then count no references (borrow.py)
    cfg, cfgf, cost, rq, rqf = borrow(cfg), borrow(cfgf), borrow(cost), borrow(rq), borrow(rqf)
    rp, rpf, run, wq, st = borrow(rp), borrow(rpf), borrow(run), borrow(wq), borrow(st)
    stf, g, sq, stt, ev = borrow(stf), borrow(g), borrow(sq), borrow(stt), borrow(ev)
    kc = (borrow(kc[0]), borrow(kc[1]), borrow(kc[2]), borrow(kc[3]), borrow(kc[4]),
          borrow(kc[5]), borrow(kc[6]), borrow(kc[7]))  # fmt: skip
    trees = (borrow(trees[0]), borrow(trees[1]), borrow(trees[2]), borrow(trees[3]),
             borrow(trees[4]))  # fmt: skip
    n = rq.shape[0]
    num_replicas = cfg[C_REPLICAS]
    rr = cfg[C_ROUTER] == ROUND_ROBIN or num_replicas == 1
    wt, wi, lmin, li, lmax = trees
    arrived = 0
    while True:
        k = g[G_NEXT]
        if k >= n:  # no more arrivals: run every replica dry
            until = math.inf
        elif arrived >= max_arrivals:
            return RET_YIELD
        else:
            until = rqf[k, F_ARRIVAL]
        t = until
        lazy = k < n and not rr
        q = 0  # advance replicas q..last-1, or (lazily) those the wake tree says need it
        last = num_replicas
        if k < n and rr:  # round robin: only the replica it goes to matters now
            q = k % num_replicas
            last = q + 1
        r = q
        while True:
            if lazy:
                if not wt[1] < t:  # no replica has a step (or completions) before the arrival
                    break
                q = wi[1]
            elif q >= last:
                break
            g[G_LAZY] = 1 if lazy else 0
            ok = _advance(q, until, cfg, cfgf, cost, rq, rqf, rp, rpf, run, wq, st, stf, g, sq,
                          stt, ev, kc)  # fmt: skip
            g[G_LAZY] = 0
            if not ok:
                return RET_FULL
            if lazy:
                set_wake(wt, wi, q, _wake(cfg, cfgf, rqf, rp, rpf, wq, q, t))
                set_load(lmin, li, lmax, q, outstanding(rp, rpf, q, t))
            else:
                q += 1
        if k >= n:
            return RET_DONE
        if lazy:
            if cfg[C_ROUTER] == PREFIX_AWARE:
                if not imbalanced(cfg, cfgf, lmin, lmax) and not _settle_holders(
                    k, t, cfg, cfgf, cost, rq, rqf, rp, rpf, run, wq, st, stf, g, sq, ev, kc,
                    wt, wi,
                ):  # fmt: skip
                    return RET_FULL
                r = prefix_aware(cfg, cfgf, rq, k, kc, lmin, li, lmax)
            else:
                r = least_outstanding(lmin, li)
            if rp[r, P_PEND_K] > 0:  # its deferred run stops before the arrival (async: after)
                if g[G_ROWS] >= st.shape[0]:
                    return RET_FULL
                _resolve(r, t, cfg, cfgf, cost, rq, rqf, rp, rpf, run, st, stf, g, sq, ev, kc,
                         cfg[C_ASYNC])  # fmt: skip
        rq[k, R_QDEPTH] = rp[r, P_WQ_LEN] + rp[r, P_INBOX]
        rq[k, R_REPLICA] = r
        rq[k, R_STATUS] = ST_WAITING
        if cfg[C_ASYNC] != 0:  # into the engine's input queue: the scheduler takes it later
            inbox_push(cfg, wq, rp, r, k)
            if rpf[r, Q_AHEAD] >= t:  # its latest step was decided before t but starts after:
                rp[r, P_INBOX_OLD] += 1  # the next decision takes it
        else:
            wait_add(cfg, wq, rp, rq, rqf, r, k)
        rp[r, P_ROUTED] += 1
        if rp[r, P_RUN_N] == 0 and rpf[r, Q_CLOCK] < t:
            rpf[r, Q_CLOCK] = t
        if lazy:
            set_wake(wt, wi, r, _wake(cfg, cfgf, rqf, rp, rpf, wq, r, t))
            set_load(lmin, li, lmax, r, outstanding(rp, rpf, r, t))
        g[G_NEXT] = k + 1
        arrived += 1


@njit(cache=True, error_model="numpy")
def _warm_caches(
    rp: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    keys: npt.NDArray[np.uint64],
    unit_blocks: npt.NDArray[np.int64],
    tail_blocks: npt.NDArray[np.int64],
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """Serve every warm-up prompt on every replica, in order, before the replay."""
    slots = np.zeros(max(len(keys), 1), dtype=np.int64)
    for r in range(rp.shape[0]):
        for j in range(len(unit_blocks)):
            if unit_blocks[j] > 0 and offsets[j + 1] > offsets[j]:
                warm(rp, r, keys[offsets[j] : offsets[j + 1]], unit_blocks[j], tail_blocks[j],
                     slots, kc)  # fmt: skip
        rp[r, P_EVICTED] = 0


StepSink = Callable[[npt.NDArray[np.int64], npt.NDArray[np.float64]], None]


def simulate(
    inp: SimInput,
    eng: EngineConfig,
    *,
    on_progress: Callable[[int], None] | None = None,
    chunk: int = 1 << 16,
    on_steps: StepSink | None = None,
    step_rows: int = 1 << 17,
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

    Returns:
        Per-request outcomes and the (compressed) step timeline.
    """
    n = len(inp)
    num_replicas = eng.get(C_REPLICAS)
    bs = eng.get(C_BLOCK_SIZE)
    num_blocks = eng.get(C_NUM_BLOCKS)
    caching = eng.get(C_CACHING) != 0
    pk = PrefixKeys.empty(0)  # no keys: their columns stay 0, no per-request arrays for them
    if caching:
        pk = inp.prefix if inp.prefix is not None else PrefixKeys.empty(n)
        if eng.get(C_POLICY) == vllm.CODE:  # vLLM caches generated blocks too
            pk = extend_keys(pk, inp.prompt_tokens, inp.output_tokens)
    rq = request_state(inp, pk if caching else None, bs)
    warmup = inp.warmup if caching and inp.warmup is not None else PrefixKeys.empty(0)
    need = int(np.sum(-(-(inp.prompt_tokens + inp.output_tokens) // bs))) + int(
        np.sum(np.diff(warmup.offsets) * (warmup.unit_tokens // bs))
    )
    copies = eng.get(C_POLICY) == vllm.CODE  # vLLM caches a key more than once
    slots, distinct = cache_sizes(num_blocks, [pk, warmup], bs, copies=copies, blocks_needed=need)
    index = 0  # the prefix_aware router's index of which replicas hold each unit
    if eng.get(C_ROUTER) == PREFIX_AWARE and num_replicas > 1:
        index = min(num_replicas * distinct, len(pk.keys) + len(warmup.keys))
    kc = empty_caches(num_replicas, slots, pk.keys, index=index, num_keys=distinct)
    rqf = request_times(np.require(inp.arrival_s, np.float64, "C"))
    del inp  # copied into rq/rqf: a caller that let go of it frees it while the loop runs
    rp = np.zeros((num_replicas, NRP), dtype=np.int64)
    rp[:, P_FREE] = num_blocks
    rp[:, P_LRU_HEAD] = -1
    rp[:, P_LRU_TAIL] = -1
    rp[:, P_SLOT_FREE] = 0
    rp[:, P_CHUNKED] = -1
    rp[:, P_RNG] = eng.get(C_SEED) * 1_000_003 + np.arange(num_replicas)
    rpf = np.zeros((num_replicas, NRPF))
    rpf[:, Q_RATIO] = eng.cfgf[CF_RATIO_INIT]
    rpf[:, Q_AHEAD] = -np.inf
    if len(warmup):
        offsets = np.require(warmup.offsets, np.int64, ["C", "W"])
        keys = np.require(warmup.keys, np.uint64, ["C", "W"])
        _warm_caches(rp, offsets, keys, warmup.unit_tokens // bs, warmup.tails // bs, kc)
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
    sq = np.zeros(max_seqs + 1, dtype=np.int64)
    stt = np.zeros(max_seqs + 1, dtype=np.int64)
    ev = np.zeros(max_seqs + 1, dtype=np.int64)
    while True:
        ret = _loop(
            eng.cfg, eng.cfgf, eng.cost, rq, rqf, rp, rpf, run, wq, st, stf, g, sq, stt, ev, kc,
            trees, chunk,
        )  # fmt: skip
        if ret == RET_FULL:
            if on_steps is not None:  # hand the full chunk out and fill the arrays again
                on_steps(st, stf)
                g[G_ROWS] = 0
            else:  # twice the rows; the new ones stay untouched (no memory until written)
                st2 = np.zeros((2 * len(st), NST), dtype=st.dtype)
                stf2 = np.zeros((2 * len(stf), NSTF), dtype=stf.dtype)
                st2[: len(st)] = st
                stf2[: len(stf)] = stf
                st, stf = st2, stf2
        elif ret == RET_YIELD:
            if on_progress is not None:
                on_progress(int(g[G_NEXT]))
        else:
            break
    if on_progress is not None:
        on_progress(n)
    request_totals(rq)
    rows = int(g[G_ROWS])
    if on_steps is not None:
        if rows:
            on_steps(st[:rows], stf[:rows])
        rows = 0
        st = np.zeros((0, NST), dtype=st.dtype)
        stf = np.zeros((0, NSTF), dtype=stf.dtype)
    return SimResult(
        frontend=eng.frontend,
        rq=rq,
        rqf=rqf,
        st=st[:rows],  # views: the unused tail is never touched, so costs no memory
        stf=stf[:rows],
        num_kv_blocks=num_blocks,
    )


def warm_up(eng: EngineConfig) -> None:
    """Load (or compile) the loop now, so that timing a replay does not include it."""
    tiny = SimInput(np.zeros(2), np.array([4, 4], dtype=np.int64), np.array([2, 2], dtype=np.int64))
    simulate(tiny, eng)
