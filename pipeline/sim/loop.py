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
goes to; for the other routers ``replay_loop`` touches only the replicas with a step
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
``_resolve`` for a deferred run); its start (``Q_AHEAD``) tells ``replay_loop``
which arrivals the next decision takes. Runs cut for ``prefix_aware``'s view
of the other replicas still stop before the arrival.

The policies' rules reach the loop through their traits (``cfg[C_RESERVES_UPFRONT]``
and the like) and their hooks (``policies/dispatch.py``); no branch here names a
policy (the contract: ``policies/base.py``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim import autoscale, sched_cpu
from pipeline.sim.autoscale import Scaling
from pipeline.sim.borrow import borrow
from pipeline.sim.cache import PrefixCaches, commit, flush, settles, take, tier_commit_run
from pipeline.sim.cost_model import (
    SCHED_CPU,
    SCHED_CPU_SEQ,
    decode_run_s,
    step_time,
)
from pipeline.sim.kv import blocks_needed, release
from pipeline.sim.policies import dispatch
from pipeline.sim.policies.dispatch import HOOK_DECODE_RUN, HOOK_FINISHED, HOOK_READY_AT
from pipeline.sim.prefix_index import find_key
from pipeline.sim.routing import (
    PREFIX_AWARE,
    ROUND_ROBIN,
    imbalanced,
    least_outstanding,
    outstanding,
    prefix_aware,
)
from pipeline.sim.speculation import accepted, draft_s
from pipeline.sim.state import (
    C_APPEND_SLOT,
    C_ASYNC,
    C_BLOCK_SIZE,
    C_CACHES_GENERATED,
    C_CACHES_ON_FINISH,
    C_CACHING,
    C_HOOKS,
    C_NUM_BLOCKS,
    C_POLICY,
    C_REPLICAS,
    C_RESERVES_UPFRONT,
    C_ROUTER,
    C_SEED,
    C_SPEC_K,
    C_SWAP_BLOCK_BYTES,
    C_SWAP_BLOCKS,
    C_TIER_BLOCK_BYTES,
    C_TIER_BLOCKS,
    CF_SPEC_DRAFT,
    CF_SWAP_BLOCK_S,
    CF_TIER_BLOCK_S,
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    P_DONE,
    P_EVICTABLE,
    P_EVICTED,
    P_FREE,
    P_INBOX,
    P_INBOX_OLD,
    P_LAST_DONE,
    P_PEND_EV0,
    P_PEND_EVICTS,
    P_PEND_FREE,
    P_PEND_K,
    P_QUEUED,
    P_ROUTED,
    P_RUN_N,
    P_STABLE,
    P_STEP,
    P_STEP_HIT,
    P_STEP_QUERY,
    P_STEP_SWAP_IN,
    P_STEP_SWAP_OUT,
    P_STEP_TIER_BLK,
    P_STEP_TIER_TOK,
    P_WQ_LEN,
    Q_AHEAD,
    Q_CLOCK,
    Q_LAST_END,
    Q_PEND_CTX,
    Q_PEND_LAST,
    R_CHUNKS,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_NEXT,
    R_NUNITS,
    R_OUTPUT,
    R_PF_END,
    R_PROMPT,
    R_QDEPTH,
    R_REPLICA,
    R_SHARED,
    R_SPEC_ACC,
    R_SPEC_DRAFT,
    R_STATUS,
    R_UNIT_TOK,
    S_CPU_HIT,
    S_DECODE,
    S_DISK_HIT,
    S_EVICTED,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    S_SPEC_ACC,
    S_SPEC_DRAFT,
    S_STEP,
    S_SWAP_IN,
    S_SWAP_OUT,
    S_TIER_LOAD,
    S_WAITING,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    SF_SCHED_CPU,
    SF_SCHED_EXPOSED,
    SF_START,
    ST_FINISHED,
    ST_WAITING,
    STABLE_NO_EVICT,
    STABLE_UNTIL_STORE,
    W_HOFF,
    State,
    drop_finished,
    inbox_push,
    uindex,
    wait_add,
    wide,
)
from pipeline.sim.trees import Trees, set_load, set_off, set_wake

G_NEXT = 0  # next request to arrive
G_ROWS = 1  # timeline rows written
G_LAZY = 2  # 1 while replicas are advanced lazily (decode runs past ``until`` are deferred)
NG = 3

RET_DONE = 0
RET_FULL = 1  # the timeline arrays are full: grow them and call again
RET_YIELD = 2  # processed the arrivals asked for: report progress and call again
RET_SCALE_FULL = 3  # the autoscaler's event arrays are full: grow them and call again


class Step(NamedTuple):
    """What ``_step`` decided and computed for one step, handed to ``_finish``."""

    start: float  # its start
    n: int  # requests scheduled (s.sched_q[:n])
    n_pre: int  # requests preempted
    n_ev: int  # requests listed in s.ev: their first or last token comes out of it
    p_tok: float  # prefill (and recompute) tokens: P of the cost model
    p_attn: float  # attention feature: A
    n_pf: int  # prefill chunks
    d: int  # decodes: D
    ctx: float  # decode context: C
    num_waiting: int  # waiting requests at its start
    evicted0: int  # P_EVICTED before it
    draft_s: float  # speculative decoding: the drafter's time (speculation.py), else 0
    drafted: int  # ... draft tokens verified
    acc: int  # ... of which accepted


@njit(cache=True, error_model="numpy", inline="always")
def _next_start(rp: npt.NDArray[np.int64], rpf: npt.NDArray[np.float64], r: int) -> float:
    """Earliest start of replica r's next step, inf when it has nothing to do (before the
    policy's ``ready_at``, see ``_asks_policy``)."""
    if rp[r, P_RUN_N] == 0 and rp[r, P_WQ_LEN] == 0 and rp[r, P_INBOX] == 0:
        return math.inf
    return rpf[r, Q_CLOCK]  # type: ignore[no-any-return]


@njit(cache=True, error_model="numpy", inline="always")
def _asks_policy(cfg: npt.NDArray[np.int64], rp: npt.NDArray[np.int64], r: int) -> bool:
    """Idle with requests waiting, under a policy that decides when it starts (``ready_at``)."""
    return bool(cfg[C_HOOKS] & HOOK_READY_AT != 0 and rp[r, P_RUN_N] == 0 and rp[r, P_WQ_LEN] > 0)


@njit(cache=True, error_model="numpy", inline="always")
def _extra_blocks(
    rq: npt.NDArray[np.int32], sched_q: npt.NDArray[np.int64], n: int, k: int, bs: int
) -> int:
    """Blocks the scheduled decodes add over steps 2..k of a run (step 1 is computed)."""
    extra = 0
    for j in range(n):
        i = sched_q[j]
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
    sched_q: npt.NDArray[np.int64],
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
    if rp[r, P_STABLE] & STABLE_UNTIL_STORE:
        # a waiting request's admission read the KV offloading tiers: the run stops before
        # the first of its steps 2..k that settles a unit (and so stores it to the tier,
        # which could evict what the request found). Step s commits a decode up to
        # R_COMPUTED - lag + s - 1 (see _finish), so it settles R_NEXT at s = R_NEXT -
        # R_COMPUTED + lag + 1 (>= 2: step 1 settled what ends up to its commit point).
        lag = cfg[C_ASYNC]
        for j in range(n):
            i = sched_q[j]
            k_max = min(k_max, max(1, rq[i, R_NEXT] - rq[i, R_COMPUTED] + lag))
    if k_max <= 1:
        return 1
    if cfg[C_RESERVES_UPFRONT] == 0:  # else every block a request needs is held already
        bs = cfg[C_BLOCK_SIZE]
        cap = rp[r, P_FREE] + rp[r, P_EVICTABLE]  # evictable cached blocks are free too
        if rp[r, P_STABLE] & STABLE_NO_EVICT:  # ... unless evicting them could change it
            cap = rp[r, P_FREE]
        if cfg[C_APPEND_SLOT] != 0:
            cap -= 1  # every decode needs a free block before it (Sarathi's can_append_slot)
        if cap < 0:
            return 1
        most = n * ((k_max - 2) // bs + 1)  # no request can need more blocks than this
        if most > cap and bs == 1:
            # token-granular KV (SGLang, TGI): extra(k) = sum max(0, k - slack_i); when
            # every request has the same slack (just-in-time growth), solve it directly
            slack = -1
            same = True
            for j in range(n):
                i = sched_q[j]
                d = int(rq[i, R_HELD] + rq[i, R_SHARED] - rq[i, R_COMPUTED] + 1)
                if slack < 0:
                    slack = d
                elif d != slack:
                    same = False
                    break
            if same:
                return max(1, min(k_max, slack + cap // n))
        if most > cap and _extra_blocks(rq, sched_q, n, k_max, bs) > cap:
            lo = 1
            hi = k_max
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _extra_blocks(rq, sched_q, n, mid, bs) <= cap:
                    lo = mid
                else:
                    hi = mid
            k_max = lo
    return k_max


@njit(cache=True, error_model="numpy", inline="always")
def _step(s: State, kc: PrefixCaches, r: int, until: float) -> None:
    """One step of replica r (or a run of identical decode steps), starting at its clock."""
    start = s.rpf[r, Q_CLOCK]
    num_waiting = s.rp[r, P_WQ_LEN]
    evicted0 = s.rp[r, P_EVICTED]
    s.rp[r, P_STEP_QUERY] = 0
    s.rp[r, P_STEP_HIT] = 0
    s.rpf[r, Q_AHEAD] = -math.inf
    n, n_pre, n_adm = dispatch.schedule(s, kc, r, start)
    if n == 0 and n_pre == 0:  # vLLM async: the last step's finished requests were all it had
        assert s.cfg[C_ASYNC] != 0 and s.rp[r, P_RUN_N] + s.rp[r, P_WQ_LEN] + s.rp[r, P_INBOX] == 0
        return
    if s.cfg[C_ASYNC] != 0:  # the queue once the core took its new requests (policies/vllm.py)
        num_waiting = s.rp[r, P_QUEUED]
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
    spec = s.cfg[C_SPEC_K]  # speculative decoding (0: off)
    spec_rows = 0  # ... the verified drafts: query rows past each decode's one
    drafted = 0
    acc = 0
    m_spec = 0  # ... decodes that verify drafts, and their context as plain decodes
    plain_ctx = 0
    for j in range(n):
        i = uindex(s.sched_q[j])
        c0 = s.rq[i, R_COMPUTED]
        if spec != 0 and c0 >= s.rq[i, R_PF_END]:  # a decode verifying t - 1 drafts
            t = s.sched_t[j]
            g0 = s.rq[i, R_GENERATED]
            a = accepted(s.cfg, s.cfg[C_SEED], i, g0, t - 1)
            ctx_sum += c0 + t  # its KV, read once by the t queries
            attn_sum += (t - 1) * c0 + t * (t - 1) // 2  # their (query, key) pairs past that
            spec_rows += t - 1
            drafted += t - 1
            acc += a
            s.rq[i, R_SPEC_ACC] += a
            s.rq[i, R_SPEC_DRAFT] += t - 1
            m_spec += 1
            plain_ctx += c0 + 1
            gen = min(g0 + 1 + a, s.rq[i, R_OUTPUT])  # accepted + the bonus token
            s.rq[i, R_GENERATED] = gen
            c = s.rq[i, R_PROMPT] + gen - 1  # rejected drafts roll back num_computed_tokens
            s.rq[i, R_COMPUTED] = c  # (to c0 + 1 + a; a request capped at its output ends)
            if s.cfg[C_CACHING] != 0 and settles(s.rq, i, c):  # update_from_output
                commit(s.rq, s.rp, i, r, c, False, kc)
            if gen >= s.rq[i, R_OUTPUT]:
                s.ev[n_ev] = i
                n_ev += 1
            min_left = 0  # (no decode runs)
        elif c0 >= s.rq[i, R_PF_END]:  # a decode: context c0 + 1, samples a token
            ctx_sum += c0 + 1
            gen = s.rq[i, R_GENERATED] + 1
            s.rq[i, R_COMPUTED] = c0 + 1
            s.rq[i, R_GENERATED] = gen
            left = s.rq[i, R_OUTPUT] - gen + 1
            if left < min_left:
                min_left = left
            if left <= 1:
                s.ev[n_ev] = i
                n_ev += 1
        else:  # a prefill (or recompute) chunk
            t = s.sched_t[j]
            n_pf += 1
            tok_sum += t
            attn_sum += t * c0 + t * (t + 1) // 2  # causal (query, key) pairs
            pf_kv += c0 + t
            if math.isnan(s.rqf[i, F_FIRST_SCHED]):
                s.rqf[i, F_FIRST_SCHED] = start
            if c0 < s.rq[i, R_PROMPT]:
                s.rq[i, R_CHUNKS] += 1
            s.rq[i, R_COMPUTED] = c0 + t
            if spec != 0 and c0 + t > s.rq[i, R_PROMPT] + s.rq[i, R_GENERATED]:
                pad = c0 + t - s.rq[i, R_PROMPT] - s.rq[i, R_GENERATED]  # padded drafts,
                drafted += pad
                s.rq[i, R_SPEC_DRAFT] += pad
                s.rq[i, R_COMPUTED] = s.rq[i, R_PROMPT] + s.rq[i, R_GENERATED]  # all rejected
            if c0 + t >= s.rq[i, R_PROMPT] + s.rq[i, R_GENERATED]:
                gen = s.rq[i, R_GENERATED] + 1
                s.rq[i, R_GENERATED] = gen
                if gen == 1 or gen >= s.rq[i, R_OUTPUT]:
                    s.ev[n_ev] = i
                    n_ev += 1
    d = n - n_pf + spec_rows
    dr_s = 0.0
    if spec != 0:
        dr_s = draft_s(s.cost, s.cfgf[CF_SPEC_DRAFT], spec, m_spec, float(plain_ctx))
    p_tok = float(tok_sum)
    ctx = float(ctx_sum)
    # the policy's attention feature; pf_kv + ctx_sum: KV of every sequence after the step
    p_attn = dispatch.attention(
        s.cfg[C_POLICY], p_tok, float(d), float(ctx_sum + pf_kv), ctx, float(attn_sum)
    )
    k = 1
    if (
        p_tok == 0
        and n_pre == 0
        and n_adm == 0
        and n > 0
        and n == s.rp[r, P_RUN_N]
        and min_left > 1
        and s.rp[r, P_STABLE] > 0
    ):
        lazy = s.g[G_LAZY] != 0
        # vLLM async, advanced eagerly (``until`` is this replica's next arrival): the run
        # may take the step after the arrival, which cannot see it yet
        ahead = 1 if s.cfg[C_ASYNC] != 0 and not lazy else 0
        k = _run_length(
            s.cfg,
            s.cost,
            s.rq,
            s.rp,
            s.sched_q,
            n,
            r,
            start,
            math.inf if lazy else until,
            d,
            ctx,
            min_left,
            ahead,
        )
        if ahead and k > 1 and until < math.inf:
            last = start + decode_run_s(s.cost, d, ctx, k - 1)  # start of its last step
            if last >= until:  # arrivals up to it reach the next decision (see replay_loop)
                s.rpf[r, Q_AHEAD] = last
        if lazy and k > 1:
            last = start + decode_run_s(s.cost, d, ctx, k - 1)  # start of its last step
            if last >= until:  # it reaches past the arrival: decide it when it is needed
                if _defer(
                    r, s.cfg, s.rq, s.rp, s.rpf, s.run, s.sched_q, n, n_ev, ctx, evicted0, last, k
                ):
                    return
                k = _steps_before(s.cost, start, until, d, ctx, k)
    step = Step(
        start,
        n,
        n_pre,
        n_ev,
        p_tok,
        p_attn,
        n_pf,
        d,
        ctx,
        num_waiting,
        evicted0,
        dr_s,
        drafted,
        acc,
    )
    _finish(s, kc, r, k, step)


@njit(cache=True, error_model="numpy", inline="always")
def _finish(s: State, kc: PrefixCaches, r: int, k: int, step: Step) -> None:
    """The rest of a step ``_step`` decided: repeat it k times, finish requests, write the row."""
    start, n, n_pre, n_ev = step.start, step.n, step.n_pre, step.n_ev
    p_tok, p_attn, n_pf, d, ctx = step.p_tok, step.p_attn, step.n_pf, step.d, step.ctx
    num_waiting, evicted0 = step.num_waiting, step.evicted0
    # vLLM async: steps 2..k are decided while the one before runs, so each caches a
    # decode's blocks only up to the token that one is sampling (policies/vllm.py)
    lag = s.cfg[C_ASYNC]
    load_s = 0.0  # KV offloading: the step's wait for its loads
    if k == 1:
        duration = step_time(s.cost, p_tok, p_attn, float(n_pf + d), float(d), ctx)
        if s.cfg[C_SWAP_BLOCKS] != 0:  # swap preemption: the step waits for its copies
            moved = s.rp[r, P_STEP_SWAP_OUT] + s.rp[r, P_STEP_SWAP_IN]
            duration += moved * s.cfgf[CF_SWAP_BLOCK_S]
        if s.cfg[C_TIER_BLOCKS] != 0:  # KV offloading: the step waits for its loads
            cpu_blk, disk_blk = s.rp[r, P_STEP_TIER_BLK], s.rp[r, P_STEP_TIER_BLK + 1]
            load_s = cpu_blk * s.cfgf[CF_TIER_BLOCK_S] + disk_blk * s.cfgf[CF_TIER_BLOCK_S + 1]
            duration += load_s
        duration += step.draft_s
    else:  # steps 2..k: the same decodes again
        duration = decode_run_s(s.cost, d, ctx, k)
        bs = s.cfg[C_BLOCK_SIZE]
        # a policy that caches generated blocks commits them as they are computed (vLLM)
        commits = s.cfg[C_CACHES_GENERATED] != 0 and s.cfg[C_CACHING] != 0
        settle = False  # some request settles a cache unit over steps 2..k
        total = 0
        for j in range(n):
            i = uindex(s.sched_q[j])
            c = s.rq[i, R_COMPUTED] + k - 1
            need = blocks_needed(s.rq, i, c, bs)
            total += need
            s.rq[i, R_HELD] += need
            s.rq[i, R_COMPUTED] = c
            gen = s.rq[i, R_GENERATED] + k - 1
            s.rq[i, R_GENERATED] = gen
            if gen >= s.rq[i, R_OUTPUT]:
                s.ev[n_ev] = i
                n_ev += 1
            if commits and settles(s.rq, i, c - lag):
                settle = True
        # evictions depend only on the blocks taken in total: nothing is released meanwhile
        if total <= s.rp[r, P_FREE]:
            s.rp[r, P_FREE] -= total
        else:
            take(s.rp, r, total, kc)
        if settle and s.cfg[C_TIER_BLOCKS] != 0:  # KV offloading: stored as computed too
            tier_commit_run(s.rq, s.rp, r, s.sched_q, n, k - 1, lag, kc)
        elif settle:  # what steps 2..k commit, once the blocks are taken
            for j in range(n):
                i = s.sched_q[j]
                if settles(s.rq, i, s.rq[i, R_COMPUTED] - lag):
                    commit(s.rq, s.rp, i, r, s.rq[i, R_COMPUTED] - lag, False, kc)
        if s.cfg[C_HOOKS] & HOOK_DECODE_RUN:  # the policy keeps per-step counts
            dispatch.on_decode_run(s, r, k - 1)
    end = start + duration
    done = 0
    done_decoding = 0
    on_finish = s.cfg[C_CACHING] != 0 and s.cfg[C_CACHES_ON_FINISH] != 0
    for e in range(n_ev):
        i = s.ev[e]
        if s.rq[i, R_GENERATED] == 1 and math.isnan(s.rqf[i, F_FIRST_TOKEN]):
            s.rqf[i, F_FIRST_TOKEN] = end
        if s.rq[i, R_GENERATED] >= s.rq[i, R_OUTPUT]:
            s.rqf[i, F_FINISH] = end
            s.rq[i, R_STATUS] = ST_FINISHED
            if on_finish:  # the policy caches a prompt when its request ends (TGI)
                commit(s.rq, s.rp, i, r, s.rq[i, R_PROMPT], True, kc)
            if lag == 0:
                release(s.rq, s.rp, r, i, kc)
            else:  # async: listed, and freed once the next step is decided (policies/vllm.py)
                s.run[r, s.run.shape[1] // 2 + s.rp[r, P_PEND_FREE]] = i
                s.rp[r, P_PEND_FREE] += 1
            done += 1
            if s.rq[i, R_COMPUTED] > s.rq[i, R_PF_END]:  # its last token came from a decode
                done_decoding += 1
    if done > 0 and lag == 0:
        drop_finished(s.rq, s.rp, s.run, r)
        if s.cfg[C_HOOKS] & HOOK_FINISHED:
            dispatch.on_finished(s, r, done, done_decoding)
    row = s.g[G_ROWS]
    s.st[row, S_REPLICA] = r
    s.st[row, S_STEP] = s.rp[r, P_STEP]
    s.st[row, S_NUM_STEPS] = k
    s.st[row, S_RUNNING] = n
    s.st[row, S_WAITING] = num_waiting
    s.st[row, S_PREFILL] = int(p_tok)
    s.st[row, S_DECODE] = d
    s.st[row, S_KV_USED] = s.cfg[C_NUM_BLOCKS] - s.rp[r, P_FREE] - s.rp[r, P_EVICTABLE]
    s.st[row, S_PREEMPT] = n_pre
    s.st[row, S_PQUERY] = s.rp[r, P_STEP_QUERY]
    s.st[row, S_PHIT] = s.rp[r, P_STEP_HIT]
    s.st[row, S_EVICTED] = s.rp[r, P_EVICTED] - evicted0
    swap_bytes = s.cfg[C_SWAP_BLOCK_BYTES]  # 0 unless swapping (and no swaps in runs)
    s.st[row, S_SWAP_OUT] = s.rp[r, P_STEP_SWAP_OUT] * swap_bytes
    s.st[row, S_SWAP_IN] = s.rp[r, P_STEP_SWAP_IN] * swap_bytes
    s.st[row, S_SPEC_DRAFT] = step.drafted
    s.st[row, S_SPEC_ACC] = step.acc
    # KV offloading tiers: 0 unless on (and no loads in runs: a run admits nobody)
    s.st[row, S_CPU_HIT] = s.rp[r, P_STEP_TIER_TOK]
    s.st[row, S_DISK_HIT] = s.rp[r, P_STEP_TIER_TOK + 1]
    tier_blocks = s.rp[r, P_STEP_TIER_BLK] + s.rp[r, P_STEP_TIER_BLK + 1]
    s.st[row, S_TIER_LOAD] = tier_blocks * s.cfg[C_TIER_BLOCK_BYTES]
    s.stf[row, SF_START] = start
    s.stf[row, SF_DURATION] = duration
    s.stf[row, SF_ATTN] = p_attn
    s.stf[row, SF_CTX] = ctx
    cpu_s = exposed = 0.0  # the scheduler's CPU time (sched_cpu.py), when the profile has it
    if s.cost[SCHED_CPU] + s.cost[SCHED_CPU_SEQ] > 0:
        # (a load from the offloading tiers is no scheduler time the GPU failed to hide)
        busy = duration - load_s
        cpu_s, exposed = sched_cpu.row(s.cost, k, busy, p_tok, p_attn, float(n_pf + d), d, ctx)
    s.stf[row, SF_SCHED_CPU] = cpu_s
    s.stf[row, SF_SCHED_EXPOSED] = exposed
    s.g[G_ROWS] = row + 1
    s.rp[r, P_STEP] += k
    s.rp[r, P_DONE] += done
    s.rp[r, P_LAST_DONE] = done
    s.rpf[r, Q_CLOCK] = end
    s.rpf[r, Q_LAST_END] = end


@njit(cache=True, error_model="numpy", inline="always")
def _defer(
    r: int,
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    run: npt.NDArray[np.int64],
    sched_q: npt.NDArray[np.int64],
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
        if sched_q[j] != run[r, j]:
            return False
    rp[r, P_PEND_EVICTS] = 0
    if cfg[C_ROUTER] == PREFIX_AWARE and (
        _extra_blocks(rq, sched_q, n, k, cfg[C_BLOCK_SIZE]) > rp[r, P_FREE]
    ):  # its later steps evict cached units: the router must see them (_settle_holders)
        rp[r, P_PEND_EVICTS] = 1
    rp[r, P_PEND_K] = k
    rp[r, P_PEND_EV0] = evicted0
    rpf[r, Q_PEND_CTX] = ctx
    rpf[r, Q_PEND_LAST] = last
    return True


@njit(cache=True, error_model="numpy")  # called at three places: one compiled copy
def _resolve(s: State, kc: PrefixCaches, r: int, until: float, ahead: int) -> None:
    """Apply replica r's deferred decode run: its steps that start before ``until``.

    With ``ahead`` (vLLM async, cut at an arrival routed to it) also the first
    step starting at or after ``until``, decided before it (see ``_run_length``).
    """
    cost, rp, rpf, run, sched_q = s.cost, s.rp, s.rpf, s.run, s.sched_q
    n = rp[r, P_RUN_N]
    for j in range(n):
        sched_q[j] = run[r, j]
    start = rpf[r, Q_CLOCK]
    ctx = rpf[r, Q_PEND_CTX]
    k = _steps_before(cost, start, until, n, ctx, rp[r, P_PEND_K])
    if ahead and k < rp[r, P_PEND_K]:
        k += 1
        rpf[r, Q_AHEAD] = start + decode_run_s(cost, n, ctx, k - 1)
    rp[r, P_PEND_K] = 0
    step = Step(start, n, 0, 0, 0.0, 0.0, 0, n, ctx, rp[r, P_WQ_LEN], rp[r, P_PEND_EV0], 0.0, 0, 0)
    _finish(s, kc, r, k, step)


@njit(cache=True, error_model="numpy", inline="always")
def _advance(s: State, kc: PrefixCaches, r: int, until: float) -> bool:
    """Run replica r's steps that start before ``until``; False if the timeline is full.

    Lazily (``g[G_LAZY]``), a decode run that starts before ``until`` but
    reaches past it is left deferred (``_defer``) and applied once its last
    step starts before ``until``; otherwise it is cut at ``until``.
    """
    while True:
        if s.g[G_ROWS] >= s.st.shape[0]:
            return False
        if s.rp[r, P_PEND_K] > 0:
            if s.g[G_LAZY] != 0 and not s.rpf[r, Q_PEND_LAST] < until:
                return True
            _resolve(s, kc, r, until, 0)
            continue
        at = _next_start(s.rp, s.rpf, r)
        if _asks_policy(s.cfg, s.rp, r):
            at = dispatch.ready_at(s, r, at)
        if not at < until:
            return True
        s.rpf[r, Q_CLOCK] = at
        _step(s, kc, r, until)


@njit(cache=True, error_model="numpy", inline="always")
def _settle_holders(
    s: State,
    kc: PrefixCaches,
    i: int,
    t: float,
    wt: npt.NDArray[np.float64],
    wi: npt.NDArray[np.int64],
) -> bool:
    """Before prefix_aware looks up request i: cut at t the deferred runs that evict.

    Only replicas caching the request's first unit can hold a prefix of it,
    so only their runs matter; a cut run's steps are those before t, as the
    router must see them. False if the timeline is full.
    """
    rq, rp, st, g = s.rq, s.rp, s.st, s.g
    if rq[i, R_UNIT_TOK] == 0 or rq[i, R_NUNITS] == 0:
        return True
    e = find_key(kc.gk, kc.gn, kc.ukey[wide(rq)[i, W_HOFF]])
    if e < 0:
        return True
    held = kc.gb[e].copy()  # evictions below may move entries of the index
    for w in range(held.shape[0]):
        m = held[w]
        b = 0
        while m:
            q = 64 * w + b
            if m & np.uint64(1) and rp[q, P_PEND_K] > 0 and rp[q, P_PEND_EVICTS] != 0:
                if g[G_ROWS] >= st.shape[0]:
                    return False
                _resolve(s, kc, q, t, 0)
                set_wake(wt, wi, q, _wake(s, q, t))
            m >>= np.uint64(1)
            b += 1
    return True


@njit(cache=True, error_model="numpy", inline="always")
def _wake(s: State, r: int, t: float) -> float:
    """Replica r (advanced to t) needs the loop again at the first arrival later than this.

    That is when a step of it starts before the arrival (its deferred run's
    last one, or its next one), or when its latest step's completions stop
    being outstanding (at their end time: just after the float before it).
    """
    cfg, rp, rpf = s.cfg, s.rp, s.rpf
    if rp[r, P_PEND_K] > 0:
        return rpf[r, Q_PEND_LAST]
    w = _next_start(rp, rpf, r)
    if _asks_policy(cfg, rp, r):
        w = dispatch.ready_at(s, r, w)
    if rp[r, P_LAST_DONE] > 0 and rpf[r, Q_LAST_END] > t:
        w = min(w, np.nextafter(rpf[r, Q_LAST_END], -math.inf))
    return w


@njit(cache=True, error_model="numpy", inline="always")
def _put_load(
    s: State,
    sc: Scaling,
    lmin: npt.NDArray[np.int64],
    li: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
    r: int,
    t: float,
) -> None:
    """Replica r's outstanding requests at t into the load tree, unless the autoscaler
    keeps requests from it (then its leaf never wins: ``trees.set_off``)."""
    if sc.rs.shape[0] > 0 and sc.rs[r] != autoscale.ACTIVE:
        set_off(lmin, li, lmax, r)
    else:
        set_load(lmin, li, lmax, r, outstanding(s.rp, s.rpf, r, t))


@njit(cache=True, error_model="numpy")
def _control(
    s: State,
    kc: PrefixCaches,
    sc: Scaling,
    lmin: npt.NDArray[np.int64],
    li: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
    t: float,
) -> None:
    """The autoscaler's control tick at t, every replica already advanced to it (the loop
    advances them as for an arrival, which changes no replica's steps, so that their
    outstanding requests at the tick are known): promote, decide, load the tree."""
    m = sc.rs.shape[0]
    autoscale.promote(sc, t)
    for r in range(m):
        sc.out[r] = outstanding(s.rp, s.rpf, r, t)
    nev = sc.gi[autoscale.GI_NEV]
    autoscale.control(sc, t)
    if s.cfg[C_CACHING] != 0:  # a replica that starts comes up with an empty cache
        for j in range(nev, sc.gi[autoscale.GI_NEV]):
            if sc.ev[j, 1] == autoscale.START:
                flush(kc, s.rp, sc.ev[j, 0])
    autoscale.promote(sc, t)  # (startup_s = 0)
    for r in range(m):
        _put_load(s, sc, lmin, li, lmax, r, t)
    sc.gi[autoscale.GI_TICK] += 1


@njit(cache=True, error_model="numpy", nogil=True)
def replay_loop(
    s: State, kc: PrefixCaches, trees: Trees, max_arrivals: int, scaling: Scaling
) -> int:
    """Route arrivals in order and advance replicas between them; resumable.

    Round robin needs nothing of the other replicas: only the one the
    arrival goes to is advanced. The other routers see every replica at the
    arrival time, but only replicas that need it are touched (the wake tree,
    ``trees.py``, keeps them by the time they next do), lazily: a decode run
    that reaches past the arrival is deferred, not cut, so that only the
    arrivals a replica gets break up its runs. The load tree holds each
    replica's outstanding requests at the latest arrival.

    With autoscaling (``scaling``'s arrays not empty, ``autoscale.py``) the
    control ticks up to each arrival run before it is routed (each a pass of the
    loop that advances the replicas to the tick, then ``_control``), every
    router takes the lazy path and skips the replicas that are not routable
    (round robin: the next routable one after the latest used).
    """
    # borrowed views: the calls and bindings below then count no references (borrow.py)
    s = State(
        borrow(s.cfg),
        borrow(s.cfgf),
        borrow(s.cost),
        borrow(s.rq),
        borrow(s.rqf),
        borrow(s.rp),
        borrow(s.rpf),
        borrow(s.run),
        borrow(s.wq),
        borrow(s.st),
        borrow(s.stf),
        borrow(s.g),
        borrow(s.sched_q),
        borrow(s.sched_t),
        borrow(s.ev),
    )
    kc = PrefixCaches(
        borrow(kc.ck),
        borrow(kc.cs),
        borrow(kc.ht),
        borrow(kc.ukey),
        borrow(kc.uslot),
        borrow(kc.gk),
        borrow(kc.gb),
        borrow(kc.gn),
    )
    wt, wi = borrow(trees.wt), borrow(trees.wi)
    lmin, li, lmax = borrow(trees.lmin), borrow(trees.li), borrow(trees.lmax)
    sc = Scaling(
        borrow(scaling.par),
        borrow(scaling.rs),
        borrow(scaling.up),
        borrow(scaling.out),
        borrow(scaling.mask),
        borrow(scaling.gi),
        borrow(scaling.gf),
        borrow(scaling.ev),
        borrow(scaling.evf),
    )
    scales = sc.rs.shape[0] > 0
    cfg, cfgf, rq, rqf, rp, rpf, wq, st = s.cfg, s.cfgf, s.rq, s.rqf, s.rp, s.rpf, s.wq, s.st
    g = s.g
    n = rq.shape[0]
    num_replicas = cfg[C_REPLICAS]
    rr = (cfg[C_ROUTER] == ROUND_ROBIN or num_replicas == 1) and not scales
    arrived = 0
    while True:
        k = g[G_NEXT]
        tick = False  # this pass advances the replicas to a control tick, not an arrival
        if k >= n:  # no more arrivals: run every replica dry
            until = math.inf
        elif arrived >= max_arrivals:
            return RET_YIELD
        else:
            until = rqf[k, F_ARRIVAL]
            if scales:  # the control ticks up to the arrival run before it is routed
                tt = autoscale.next_tick(sc.par, sc.gi)
                if tt <= until:
                    if not autoscale.room(sc):
                        return RET_SCALE_FULL
                    until = tt
                    tick = True
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
            ok = _advance(s, kc, q, until)
            g[G_LAZY] = 0
            if not ok:
                return RET_FULL
            if lazy:
                set_wake(wt, wi, q, _wake(s, q, t))
                _put_load(s, sc, lmin, li, lmax, q, t)
            else:
                q += 1
        if tick:
            _control(s, kc, sc, lmin, li, lmax, t)
            continue
        if k >= n:
            return RET_DONE
        if scales and autoscale.promote(sc, t):  # replicas routable by the arrival
            for j in range(sc.rs.shape[0]):
                _put_load(s, sc, lmin, li, lmax, j, t)
        if lazy:
            if cfg[C_ROUTER] == PREFIX_AWARE:
                if not imbalanced(cfg, cfgf, lmin, lmax) and not _settle_holders(
                    s,
                    kc,
                    k,
                    t,
                    wt,
                    wi,
                ):
                    return RET_FULL
                r = prefix_aware(cfg, cfgf, rq, k, kc, lmin, li, lmax, sc.mask)
            elif scales and cfg[C_ROUTER] == ROUND_ROBIN:
                r = autoscale.next_routable(sc)
            else:
                r = least_outstanding(lmin, li)
            if rp[r, P_PEND_K] > 0:  # its deferred run stops before the arrival (async: after)
                if g[G_ROWS] >= st.shape[0]:
                    return RET_FULL
                _resolve(s, kc, r, t, cfg[C_ASYNC])
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
            set_wake(wt, wi, r, _wake(s, r, t))
            _put_load(s, sc, lmin, li, lmax, r, t)
        g[G_NEXT] = k + 1
        arrived += 1
