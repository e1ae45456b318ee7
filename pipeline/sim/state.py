"""Simulator state as struct-of-arrays: one row per request, one row per replica.

The fast loop (``loop.py``) is compiled with numba, so its state is a handful of
plain numpy arrays addressed by the column constants below, not Python objects:

    rq[i, R_*]   int32 state of request i (its lengths, where it is, what it has computed);
                 wide(rq)[i, W_*] its int64 counters, in the same rows
    rqf[i, F_*]  float64 times of request i (seconds from replay start; NaN = not yet)
    rp[r, P_*]   int64 state of replica r (batch size, waiting queue, free KV blocks, ...)
    rpf[r, Q_*]  float64 clock of replica r
    run[r, :]    the running list of replica r, in admission order (rp[r, P_RUN_N] entries)
    wq[r, :]     the waiting queue of replica r: a ring buffer that can also push at the
                 front (FCFS), or a binary heap on (priority, arrival) (vLLM's priority policy);
                 with vLLM's async scheduling also the requests routed but not yet handed
                 to the scheduler (``inbox_push``)
    st, stf      the step timeline: one row per step or run of identical decode steps
    kc           the prefix caches of the replicas and the requests' block keys (``cache.py``)

Requests are indexed in arrival order (ties keep input order), which is also the
order the router sees them in.

# NOTE: the computed-tokens model, as in vLLM V1. A request has
# ``num_tokens = prompt_tokens + generated`` and ``computed`` chases it. A step
# schedules some tokens for it; when ``computed`` reaches ``num_tokens`` the step
# samples a new token (``generated += 1``). The first token therefore comes out
# of the step that computes the last prompt token, and the last token is never
# fed back, so a request computes ``prompt + output - 1`` tokens in total unless
# it is preempted (recompute then starts again from zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit


class State(NamedTuple):
    """The compiled loop's state, one record: every kernel takes it as ``s``.

    numba compiles a ``NamedTuple`` of arrays to a struct whose fields are read
    by name at compile time. ``replay_loop`` builds it once, from borrowed views
    (``borrow.py``); each kernel binds the fields it uses to locals of the same
    names. Binding the record takes a reference to every field (a call each), so
    the small helpers a step calls many times take their few arrays instead.
    """

    cfg: npt.NDArray[np.int64]  # the engine configuration, C_*
    cfgf: npt.NDArray[np.float64]  # ... its float entries, CF_*
    cost: npt.NDArray[np.float64]  # the step-cost model (cost_model.StepCost.as_array())
    rq: npt.NDArray[np.int32]  # per request, R_* (and wide(rq)[:, W_*])
    rqf: npt.NDArray[np.float64]  # per request times, F_*
    rp: npt.NDArray[np.int64]  # per replica, P_*
    rpf: npt.NDArray[np.float64]  # per replica clocks, Q_*
    run: npt.NDArray[np.int64]  # running lists (and, second half, async's finished ones)
    wq: npt.NDArray[np.int32]  # waiting queues (ring or heap) and async input queues
    st: npt.NDArray[np.int64]  # the step timeline, S_*
    stf: npt.NDArray[np.float64]  # ... its float columns, SF_*
    g: npt.NDArray[np.int64]  # the loop's progress, loop.G_*
    sched_q: npt.NDArray[np.int64]  # the step being decided: requests scheduled
    sched_t: npt.NDArray[np.int64]  # ... the tokens each computes
    ev: npt.NDArray[np.int64]  # ... the requests whose first or last token it samples


# --- rq: int32 per request ----------------------------------------------------
# Lengths, counts and positions of one request fit in int32 (``simulate`` checks
# the lengths); what can pass 2**31 lives in the wide columns below.
R_PROMPT = 0  # prompt tokens
R_OUTPUT = 1  # output tokens to generate (after every cap), >= 1
R_REPLICA = 2  # replica it was routed to (-1 before arrival)
R_STATUS = 3  # ST_* below
R_COMPUTED = 4  # tokens whose KV is computed (num_computed_tokens)
R_GENERATED = 5  # output tokens sampled so far
R_HELD = 6  # KV blocks it holds privately (not through a prefix-cache entry)
R_PF_END = 7  # num_tokens when it was last admitted: computed < this means "in prefill"
R_PREEMPT = 8  # times preempted
R_CHUNKS = 9  # steps that computed part of its prompt
R_QDEPTH = 10  # waiting requests on its replica when it arrived
R_SHARED = 11  # KV blocks it holds through prefix-cache entries it references
R_PRIORITY = 12  # scheduling priority (lower first; vLLM's priority policy), as a rank
R_NUNITS = 13  # prefix keys it has: its cache units (prompt, then vLLM's generated ones)
R_UNIT_TOK = 14  # tokens per cache unit (0: no prefix hashes, never looked up)
R_UNIT_BLK = 15  # KV blocks per cache unit
R_SETTLED = 16  # leading units it holds as cache entries (or copies) it references
R_CACHED = 17  # prompt tokens found in the prefix cache at its first lookup
R_LOOKUPS = 18  # prefix-cache lookups made for it (the first, then one per resumption)
R_TAIL = 19  # tokens of its prompt's tail unit, shorter than a unit (0: none; prefix.py)
R_NEXT = 20  # tokens at which its next unit settles (cache.settles); NEVER when none is left
R_SWAPS = 21  # swap preemption (swap.py): times swapped out to host memory (and back in)
# speculative decoding (speculation.py): over its verify steps (redone ones too), 0 when off
R_SPEC_ACC = 22  # draft tokens accepted
R_SPEC_DRAFT = 23  # draft tokens verified (and padded ones, never accepted), as sim_steps'
NRQ = 36  # int32 columns of rq (24 narrow, 6 wide ones of two each)
NEVER = 2**31 - 1  # R_NEXT of a request with no unit left to settle

# --- wide(rq): int64 per request, in rq's last 8 int32 columns ------------------
# ``wide(rq)[i, W_*]`` (a view of the same memory; ``SimResult.rqw`` in Python).
# Cumulative counts can pass 2**31 for a request preempted thousands of times.
W_HOFF = 12  # offset of its prefix keys in kc's key array
W_DISCARDED = 13  # computed tokens thrown away by preemptions (recomputed later)
W_HITS = 14  # tokens found in the cache over all its lookups (KV offloading tiers too)
W_TOTAL = 15  # tokens computed over its life, recomputation included
# KV offloading tiers (kv_tiers.py): tokens loaded from the CPU tier, and from the disk
# tier, over all its lookups (counted in W_HITS too)
W_CPU_HITS = 16
W_DISK_HITS = 17

# --- rqf: float64 per request ----------------------------------------------
F_ARRIVAL = 0
F_FIRST_SCHED = 1  # start of the first step that scheduled it
F_FIRST_TOKEN = 2  # end of the step that sampled its first token
F_FINISH = 3  # end of the step that sampled its last token
NRQF = 4

ST_PENDING = 0  # not arrived yet
ST_WAITING = 1
ST_RUNNING = 2
ST_FINISHED = 3
ST_SWAPPED = 4  # swap preemption (swap.py): waiting, its KV in host memory

# --- rp: int64 per replica ---------------------------------------------------
P_RUN_N = 0  # requests in the running list
P_WQ_HEAD = 1  # ring-buffer head of the waiting queue
P_WQ_LEN = 2  # waiting requests (queue depth)
P_FREE = 3  # free KV blocks
P_STEP = 4  # steps taken so far
P_ROUTED = 5  # requests routed to it
P_DONE = 6  # requests finished
P_LAST_DONE = 7  # requests finished at the end of its latest step (row)
P_EVICTABLE = 8  # KV blocks in cached units nobody references (free for allocation)
P_LRU_HEAD = 9  # least recently released cached unit (-1: none)
P_LRU_TAIL = 10  # most recently released cached unit (-1: none)
P_SLOT_FREE = 11  # first unused cache slot (the number of slots: none; cache.py)
P_NCACHED = 12  # cached units
P_EVICTED = 13  # KV blocks evicted from the prefix cache so far
P_STABLE = 14  # 1: the step's decision holds for repeated decode steps; more bits (below)
STABLE_NO_EVICT = 2  # P_STABLE: ... only while no cached block is evicted
STABLE_UNTIL_STORE = 4  # ... only until a step stores a unit to a KV offloading tier
P_CHUNKED = 15  # sglang / tgi: the request in chunked prefill (-1: none)
P_FULL = 16  # sglang: batch_is_full; transformers: block_new_requests
P_PENDING = 17  # sglang: finished requests not yet filtered out of the running batch
P_PHASE = 18  # tgi: 0 next step may add a batch, 1 next step is the iteration's decode
P_WAIT_TOK = 19  # tgi: waiting_tokens (decode steps since a batch was last added)
P_RNG = 20  # state of the replica's random generator (splitmix64)
P_STEP_QUERY = 21  # prefix-lookup tokens of the step being decided
P_STEP_HIT = 22  # of which found in the cache
P_PEND_K = 23  # a deferred decode run (loop.py, lazy advance): its steps if uncut (0: none)
P_PEND_EV0 = 24  # ... P_EVICTED before its first step
P_PEND_EVICTS = 25  # ... 1 if its later steps evict cached units (prefix_aware must see them)
# vllm async scheduling (policies/vllm.py): the engine core's input queue and the step in flight
P_INBOX = 26  # requests routed here but not yet handed to the scheduler (the input queue)
P_INBOX_OLD = 27  # ... of which queued before the latest decision: a pipelined one takes them
P_PEND_FREE = 28  # requests the latest step finished, in the running list until the next decision
P_PIPE = 29  # 1 while a step is decided with the previous one in flight (its tokens unknown)
P_QUEUED = 30  # waiting requests when the scheduler was called (after taking the input queue)
# swap preemption (swap.py)
P_SWAP_FREE = 31  # free KV blocks of host (swap) memory
P_STEP_SWAP_OUT = 32  # blocks swapped out by the step being decided
P_STEP_SWAP_IN = 33  # blocks swapped in by the step being decided
# KV offloading tiers (kv_tiers.py): tier t = 0 (CPU memory) or 1 (local disk) at P_TIER_* + t
P_TIER_CAP = 34  # KV blocks tier t holds (34, 35; 0: no such tier)
P_TIER_USED = 36  # ... of which holding offloaded blocks (36, 37)
P_TIER_CLOCK = 38  # unused (was the tiers' LRU clock; they keep an LRU list, kv_tiers.py)
P_STEP_TIER_TOK = 39  # tokens the step being decided loads from tier t (39, 40)
P_STEP_TIER_BLK = 41  # ... KV blocks (41, 42)
NRP = 43

Q_CLOCK = 0  # earliest start of its next step (end of the previous one, or an arrival)
Q_LAST_END = 1  # end of its latest step
Q_RATIO = 2  # sglang: new_token_ratio
Q_PEND_CTX = 3  # a deferred decode run: total context of its first step
Q_PEND_LAST = 4  # ... start of its last step if uncut
Q_AHEAD = 5  # vllm async: start of its latest step if after the latest arrival (else -inf)
NRPF = 6

# --- st: int64 per timeline row ----------------------------------------------
S_REPLICA = 0
S_STEP = 1
S_NUM_STEPS = 2
S_RUNNING = 3  # requests scheduled in each step of the row
S_WAITING = 4  # waiting queue length at the start of the row
S_PREFILL = 5  # prefill (and recompute) tokens per step
S_DECODE = 6  # decode tokens per step
S_KV_USED = 7  # KV blocks in use at the end of the row
S_PREEMPT = 8  # requests preempted in the row
S_PQUERY = 9  # prompt tokens looked up in the prefix cache (first lookups)
S_PHIT = 10  # of which found
S_EVICTED = 11  # KV blocks evicted from the prefix cache in the row
S_SWAP_OUT = 12  # swap preemption (swap.py): KV bytes swapped out to host memory in the row
S_SWAP_IN = 13  # ... swapped back in
# speculative decoding (speculation.py): 0 in every row when it is off
S_SPEC_DRAFT = 14  # draft tokens verified in the row
S_SPEC_ACC = 15  # ... of which accepted
# KV offloading tiers (kv_tiers.py): 0 in every row when they are off
S_CPU_HIT = 16  # prompt tokens loaded from the CPU tier in the row (every lookup)
S_DISK_HIT = 17  # ... from the disk tier
S_TIER_LOAD = 18  # KV bytes loaded from the tiers in the row
NST = 19
SF_START = 0
SF_DURATION = 1
SF_ATTN = 2  # the step's prefill attention pairs (A of the cost model)
SF_CTX = 3  # the decode context (C) of the row's first step; a run's step j reads j * D more
# scheduler CPU time (sched_cpu.py): the row's steps' CPU seconds, and those on the critical path
SF_SCHED_CPU = 4
SF_SCHED_EXPOSED = 5
NSTF = 6

# --- cfg: int64 engine configuration handed to the compiled loop -------------
C_POLICY = 0  # policy code (its Policy.code; policies/dispatch.py calls its hooks by it)
C_REPLICAS = 1
C_ROUTER = 2  # routing.ROUTERS code
C_BLOCK_SIZE = 3
C_NUM_BLOCKS = 4  # usable KV blocks per replica
C_MAX_SEQS = 5  # max_num_seqs / max_batch_size
C_BUDGET = 6  # max_num_batched_tokens / chunk_size (0 = none)
C_CHUNKED = 7  # enable_chunked_prefill
C_THRESHOLD = 8  # long_prefill_token_threshold (0 = off)
C_WM_BLOCKS = 9  # watermark in blocks
C_RESERVE = 10  # blocks reserved per request by max-length reservation
C_CACHING = 11  # prefix caching on
C_QUEUE = 12  # waiting-queue discipline: Q_FIFO or Q_PRIORITY
C_ORDER = 13  # sglang schedule_policy (sglang.ORDERS)
C_MAX_PREFILL = 14  # sglang max_prefill_tokens / tgi max_batch_prefill_tokens
C_CHUNK = 15  # sglang chunked_prefill_size (0 = off) / tgi prefill chunking (0/1)
C_MAX_WAIT_TOK = 16  # tgi max_waiting_tokens
C_BAL_ABS = 17  # prefix_aware router: balance_abs_threshold
C_SEED = 18  # seed of the replicas' random generators (sglang schedule_policy random)
C_MAX_BATCH = 19  # tgi max_batch_size (0 = none); C_MAX_SEQS is then only an array bound
C_FULL_ISL = 20  # vllm scheduler_reserve_full_isl: admission needs the whole sequence's blocks
C_ASYNC = 21  # vllm async_scheduling: each step is decided while the previous one runs
# the policy's traits (policies/base.py), packed from its Policy class by Scenario.engine
C_RESERVES_UPFRONT = 22  # a request holds every block it needs from admission
C_APPEND_SLOT = 23  # every decode needs a free block before it
C_CACHES_GENERATED = 24  # full blocks of generated tokens are cached as computed
C_CACHES_ON_FINISH = 25  # a prompt is cached when its request finishes
C_HOOKS = 26  # the optional hooks its module defines (policies/dispatch.py HOOK_*)
C_SWAP_BLOCKS = 27  # swap preemption (swap.py): host KV blocks per replica; 0 = recompute only
C_SWAP_BLOCK_BYTES = 28  # ... bytes of one KV block
# speculative decoding (speculation.py); C_SPEC_K = 0: off
C_SPEC_K = 29  # draft tokens proposed per decode (num_speculative_tokens)
C_SPEC_LOOK = 30  # KV slots reserved past the scheduled tokens (vLLM num_lookahead_tokens)
C_SPEC_SLOTS = 31  # budget slots per scheduled request for drafting (max_num_new_slots_...)
C_SPEC_MAXLEN = 32  # max_model_len (the scheduler's bound on a decode's tokens)
# KV offloading tiers (kv_tiers.py); C_TIER_BLOCKS = 0: off
C_TIER_BLOCKS = 33  # KV blocks of the CPU tier per replica (33), of the disk tier (34)
C_TIER_BLOCK_BYTES = 35  # ... bytes of one KV block
# speculative decoding: C_SPEC_THR + j, draft position j's acceptance as an integer threshold
# on the draw's 53 bits (speculation.thresholds), speculation.MAX_TOKENS positions
C_SPEC_THR = 36
NCFG = C_SPEC_THR + 16
CF_MAX_WAIT_S = 0  # static: longest the oldest request waits for a batch to fill
CF_RATIO_INIT = 1  # sglang: initial new_token_ratio
CF_RATIO_MIN = 2  # sglang: its floor
CF_RATIO_DECAY = 3  # sglang: its decrease per decode step
CF_SERVED_RATIO = 4  # tgi: waiting_served_ratio
CF_CACHE_THRESHOLD = 5  # prefix_aware router: cache_threshold
CF_BAL_REL = 6  # prefix_aware router: balance_rel_threshold
CF_SWAP_BLOCK_S = 7  # swap preemption (swap.py): seconds one KV block takes over the host link
# speculative decoding (speculation.py)
CF_SPEC_DRAFT = 8  # draft cost: share of a decode step per draft token
CF_SPEC_RATE = 9  # CF_SPEC_RATE + j: acceptance of draft position j given j - 1 accepted
# KV offloading tiers (kv_tiers.py): seconds one KV block takes to load from tier t
CF_TIER_BLOCK_S = 9 + 16  # (speculation.MAX_TOKENS positions before it): CPU 25, disk 26
NCFGF = CF_TIER_BLOCK_S + 2

Q_FIFO = 0
Q_PRIORITY = 1


@njit(cache=True, error_model="numpy", inline="always")
def wide(rq: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
    """rq as int64 columns: ``wide(rq)[i, W_*]`` (the same memory)."""
    return rq.view(np.int64)


@njit(cache=True, error_model="numpy", inline="always")
def uindex(i: int) -> int:
    """Index ``i`` (>= 0) as unsigned, for the hottest loops (every request of every step):
    numba then skips the negative-index wraparound it adds to each access by a signed
    index. Index with it only: arithmetic mixing it with signed integers gives floats."""
    return np.uint64(i)  # type: ignore[return-value]


@njit(cache=True, error_model="numpy", inline="always")
def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@njit(cache=True, error_model="numpy", inline="always")
def wq_push_back(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int) -> None:
    cap = wq.shape[1]
    wq[r, (rp[r, P_WQ_HEAD] + rp[r, P_WQ_LEN]) % cap] = i
    rp[r, P_WQ_LEN] += 1


@njit(cache=True, error_model="numpy", inline="always")
def wq_push_front(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int) -> None:
    cap = wq.shape[1]
    head = (rp[r, P_WQ_HEAD] - 1) % cap
    wq[r, head] = i
    rp[r, P_WQ_HEAD] = head
    rp[r, P_WQ_LEN] += 1


@njit(cache=True, error_model="numpy", inline="always")
def wq_peek(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int) -> int:
    return int(wq[r, rp[r, P_WQ_HEAD]])


@njit(cache=True, error_model="numpy", inline="always")
def wq_pop_front(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int) -> int:
    i = int(wq[r, rp[r, P_WQ_HEAD]])
    rp[r, P_WQ_HEAD] = (rp[r, P_WQ_HEAD] + 1) % wq.shape[1]
    rp[r, P_WQ_LEN] -= 1
    return i


@njit(cache=True, error_model="numpy")
def _before(rq: npt.NDArray[np.int32], rqf: npt.NDArray[np.float64], a: int, b: int) -> bool:
    """Priority order: lower priority value first, then earlier arrival, then index."""
    if rq[a, R_PRIORITY] != rq[b, R_PRIORITY]:
        return bool(rq[a, R_PRIORITY] < rq[b, R_PRIORITY])
    if rqf[a, F_ARRIVAL] != rqf[b, F_ARRIVAL]:
        return bool(rqf[a, F_ARRIVAL] < rqf[b, F_ARRIVAL])
    return a < b


@njit(cache=True, error_model="numpy")
def heap_push(
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
    i: int,
) -> None:
    """Push request i on replica r's waiting heap (wq[r, :len], head unused)."""
    k = rp[r, P_WQ_LEN]
    rp[r, P_WQ_LEN] = k + 1
    while k > 0:
        parent = (k - 1) // 2
        p = int(wq[r, parent])
        if not _before(rq, rqf, i, p):
            break
        wq[r, k] = p
        k = parent
    wq[r, k] = i


@njit(cache=True, error_model="numpy")
def heap_pop(
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
) -> int:
    """Pop the first request of replica r's waiting heap."""
    top = int(wq[r, 0])
    n = rp[r, P_WQ_LEN] - 1
    rp[r, P_WQ_LEN] = n
    if n == 0:
        return top
    x = int(wq[r, n])
    k = 0
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and _before(rq, rqf, int(wq[r, c + 1]), int(wq[r, c])):
            c += 1
        if not _before(rq, rqf, int(wq[r, c]), x):
            break
        wq[r, k] = wq[r, c]
        k = c
    wq[r, k] = x
    return top


@njit(cache=True, error_model="numpy", inline="always")
def wait_add(
    cfg: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
    i: int,
) -> None:
    """An arrival joins the waiting queue (the back, or its place in the heap)."""
    if cfg[C_QUEUE] == Q_PRIORITY:
        heap_push(wq, rp, rq, rqf, r, i)
    else:
        wq_push_back(wq, rp, r, i)


@njit(cache=True, error_model="numpy", inline="always")
def wait_requeue(
    cfg: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
    i: int,
) -> None:
    """A preempted request goes back: to the front (FCFS), or into the heap (priority)."""
    if cfg[C_QUEUE] == Q_PRIORITY:
        heap_push(wq, rp, rq, rqf, r, i)
    else:
        wq_push_front(wq, rp, r, i)


@njit(cache=True, error_model="numpy", inline="always")
def wait_head(
    cfg: npt.NDArray[np.int64], wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int
) -> int:
    """The request the queue would give next (the queue must not be empty)."""
    if cfg[C_QUEUE] == Q_PRIORITY:
        return int(wq[r, 0])
    return wq_peek(wq, rp, r)


@njit(cache=True, error_model="numpy", inline="always")
def wait_pop(
    cfg: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
) -> int:
    """Take the request ``wait_head`` names out of the queue."""
    if cfg[C_QUEUE] == Q_PRIORITY:
        return heap_pop(wq, rp, rq, rqf, r)
    return wq_pop_front(wq, rp, r)


@njit(cache=True, error_model="numpy", inline="always")
def drop_finished(
    rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], run: npt.NDArray[np.int64], r: int
) -> None:
    """Take the finished requests out of replica r's running list, keeping its order."""
    m = 0
    for j in range(rp[r, P_RUN_N]):
        i = uindex(run[r, j])
        run[r, m] = i  # without a branch: which requests finished is all but random
        m += int(rq[i, R_STATUS] != ST_FINISHED)
    rp[r, P_RUN_N] = m


@njit(cache=True, error_model="numpy", inline="always")
def inbox_push(
    cfg: npt.NDArray[np.int64], wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int
) -> None:
    """An arrival joins replica r's input queue (vLLM async scheduling), in arrival order.

    It shares ``wq[r]`` with the waiting queue: right behind the FCFS ring, or
    from the row's end down under the priority heap (each request is in one of
    them, so they never meet).
    """
    cap = wq.shape[1]
    m = rp[r, P_INBOX]
    if cfg[C_QUEUE] == Q_PRIORITY:
        wq[r, cap - 1 - m] = i
    else:
        wq[r, (rp[r, P_WQ_HEAD] + rp[r, P_WQ_LEN] + m) % cap] = i
    rp[r, P_INBOX] = m + 1


@njit(cache=True, error_model="numpy")
def inbox_take(
    cfg: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    r: int,
    m: int,
) -> None:
    """Hand the ``m`` oldest requests of replica r's input queue to its waiting queue."""
    if m <= 0:
        return
    left = rp[r, P_INBOX] - m
    rp[r, P_INBOX] = left
    if cfg[C_QUEUE] != Q_PRIORITY:  # they already sit behind the ring, in order
        rp[r, P_WQ_LEN] += m
        return
    cap = wq.shape[1]
    taken = wq[r, cap - m : cap].copy()  # the heap grows into their place
    for j in range(left):  # the rest move up to the row's end
        wq[r, cap - 1 - j] = wq[r, cap - 1 - m - j]
    for j in range(m):  # (the heap's order is total: the order of pushes does not matter)
        heap_push(wq, rp, rq, rqf, r, int(taken[j]))


@dataclass(frozen=True)
class PrefixKeys:
    """Prefix-cache keys of a list of requests (see ``prefix.py``), flattened.

    Request j owns ``keys[offsets[j]:offsets[j + 1]]``: one key per full cache
    unit of its prompt, in order, then (``tail_tokens[j]`` > 0) one for its
    prompt's tail unit, the full engine blocks of what is left of the prompt
    (``prefix.py``); a unit is ``unit_tokens[j]`` tokens (0 when the request has
    no prefix hashes and is never looked up). ``output`` (optional): per
    request, the trace's keys of the units of its prompt and output beyond the
    prompt's full units, as far as the trace has them (``prefix.extend_keys``).
    """

    offsets: npt.NDArray[np.int64]  # [n + 1]
    keys: npt.NDArray[np.uint64]
    unit_tokens: npt.NDArray[np.int64]  # [n]
    tail_tokens: npt.NDArray[np.int64] | None = None  # [n]; None: no tail units
    output: PrefixKeys | None = None  # keys of units beyond the prompt's (None: none)

    def __post_init__(self) -> None:
        assert len(self.offsets) == len(self.unit_tokens) + 1
        assert int(self.offsets[-1]) == len(self.keys)
        assert self.tail_tokens is None or len(self.tail_tokens) == len(self.unit_tokens)
        assert self.output is None or len(self.output) == len(self.unit_tokens)

    def __len__(self) -> int:
        return len(self.unit_tokens)

    @property
    def tails(self) -> npt.NDArray[np.int64]:
        """``tail_tokens``, zeros when there are none."""
        if self.tail_tokens is None:
            return np.zeros(len(self), dtype=np.int64)
        return self.tail_tokens

    def slice(self, lo: int, hi: int) -> PrefixKeys:
        """Requests lo..hi-1."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        return PrefixKeys(
            self.offsets[lo : hi + 1] - a,
            self.keys[a:b],
            self.unit_tokens[lo:hi],
            None if self.tail_tokens is None else self.tail_tokens[lo:hi],
            None if self.output is None else self.output.slice(lo, hi),
        )

    @staticmethod
    def empty(n: int) -> PrefixKeys:
        return PrefixKeys(
            np.zeros(n + 1, dtype=np.int64),
            np.zeros(0, dtype=np.uint64),
            np.zeros(n, dtype=np.int64),
        )


@dataclass(frozen=True)
class SimInput:
    """The requests one scenario replays, sorted by arrival."""

    arrival_s: npt.NDArray[np.float64]  # seconds from replay start, non-decreasing
    prompt_tokens: npt.NDArray[np.int64]  # >= 1
    output_tokens: npt.NDArray[np.int64]  # >= 1, every cap applied
    prefix: PrefixKeys | None = None  # their prefix-cache keys (None: no caching)
    priority: npt.NDArray[np.int64] | None = None  # lower first (None: all 0)
    warmup: PrefixKeys | None = None  # prompts put in every replica's cache before the replay
    # leading prompt tokens whose KV arrives with the request, computed elsewhere (a KV
    # connector's remote prefill, ``disagg.py``): it starts with them computed, in
    # [0, prompt - 1] (None: all 0). vllm policy only: the others ignore what it computed
    remote_tokens: npt.NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        assert len(self.prompt_tokens) == n and len(self.output_tokens) == n
        assert n == 0 or bool((self.arrival_s[1:] >= self.arrival_s[:-1]).all()), (
            "arrivals must be sorted"
        )
        assert self.prefix is None or len(self.prefix) == n
        assert self.priority is None or len(self.priority) == n
        if self.remote_tokens is not None:
            assert len(self.remote_tokens) == n
            assert bool(np.all(self.remote_tokens >= 0)), "remote_tokens must be >= 0"
            assert bool(np.all(self.remote_tokens < self.prompt_tokens)), (
                "remote_tokens must leave a prompt token to compute (vLLM recomputes the last)"
            )

    def __len__(self) -> int:
        return len(self.arrival_s)


def priority_column(priority: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Priorities as ``rq`` holds them: as given if they fit int32, else their ranks
    (only their order matters to the schedulers)."""
    info = np.iinfo(np.int32)
    if len(priority) and (priority.min() < info.min or priority.max() > info.max):
        return np.unique(priority, return_inverse=True)[1].astype(np.int64)
    return priority


def request_state(inp: SimInput, keys: PrefixKeys | None, block_size: int) -> npt.NDArray[np.int32]:
    """``rq`` for the requests of ``inp`` before the replay, with their prefix ``keys``.

    Without keys (no prefix caching) their columns stay 0.

    Raises:
        ValueError: a request's prompt plus output does not fit in int32.
    """
    with_keys = keys is not None
    if keys is None:
        keys = PrefixKeys.empty(0)
    rq, k = _fill_request_state(
        inp.prompt_tokens,
        inp.output_tokens,
        keys.offsets,
        keys.unit_tokens,
        keys.tails,
        block_size,
        with_keys,
    )
    if k >= 0:
        longest = int(inp.prompt_tokens[k]) + int(inp.output_tokens[k])
        raise ValueError(
            f"request {k} has {longest:,} prompt + output tokens, more than the simulator "
            f"holds ({np.iinfo(np.int32).max:,}); cap the lengths (max_model_len) first"
        )
    if inp.priority is not None:
        rq[:, R_PRIORITY] = priority_column(inp.priority)
    if inp.remote_tokens is not None:  # their KV is there on arrival: computed, not in prefill
        rq[:, R_COMPUTED] = inp.remote_tokens
    return rq


# The large per-request and timeline arrays are allocated in compiled code (``empty``
# below), not with numpy: numpy advises the kernel to back every allocation of 4 MB or
# more with transparent huge pages (madvise MADV_HUGEPAGE), and where the kernel's THP
# setting is "madvise" the first touch of such an array can stall in memory compaction
# (rq of 1M requests, 112 MB: 0.006-0.25 s in a fresh process, against a steady 0.04 s
# without the advice). numba allocates with plain malloc, which gives no such advice.
@njit(cache=True, error_model="numpy")
def empty(rows: int, cols: int, dtype: type) -> npt.NDArray[Any]:
    """``np.empty((rows, cols), dtype)`` without numpy's huge-page advice (see above)."""
    return np.empty((rows, cols), dtype)


@njit(cache=True, error_model="numpy")
def _fill_request_state(
    prompt: npt.NDArray[np.int64],
    output: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    unit_tokens: npt.NDArray[np.int64],
    tail_tokens: npt.NDArray[np.int64],
    block_size: int,
    with_keys: bool,
) -> tuple[npt.NDArray[np.int32], int]:
    """(``rq``, -1), or the first request whose prompt + output overflows int32.

    Allocated here (see ``empty``) and filled row by row, every column, in one
    pass over its memory (column by column was 7 strided passes).
    """
    top = np.iinfo(np.int32).max
    n = len(prompt)
    rq = np.empty((n, NRQ), dtype=np.int32)
    rqw = wide(rq)
    for i in range(n):
        for c in range(NRQ):
            rq[i, c] = 0
        if prompt[i] + output[i] > top:
            return rq, i
        rq[i, R_PROMPT] = prompt[i]
        rq[i, R_OUTPUT] = output[i]
        rq[i, R_REPLICA] = -1
        rq[i, R_NEXT] = NEVER
        if with_keys:
            rqw[i, W_HOFF] = offsets[i]
            rq[i, R_NUNITS] = offsets[i + 1] - offsets[i]
            rq[i, R_UNIT_TOK] = unit_tokens[i]
            rq[i, R_UNIT_BLK] = unit_tokens[i] // block_size
            rq[i, R_TAIL] = tail_tokens[i]
            if rq[i, R_NUNITS] > 0:  # where its first unit ends (cache.unit_end)
                first = tail_tokens[i] if 0 < tail_tokens[i] and prompt[i] < unit_tokens[i] else 0
                rq[i, R_NEXT] = first if first > 0 else unit_tokens[i]
    return rq, -1


@njit(cache=True, error_model="numpy")
def request_times(arrival: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``rqf`` before the replay: the arrival times, NaN for the times not reached yet.

    Allocated here (see ``empty``) and filled in one pass.
    """
    n = len(arrival)
    rqf = np.empty((n, NRQF))
    for i in range(n):
        rqf[i, F_ARRIVAL] = arrival[i]
        for c in range(1, NRQF):
            rqf[i, c] = np.nan
    return rqf


@njit(cache=True, error_model="numpy")
def request_totals(rq: npt.NDArray[np.int32]) -> None:
    """``wide(rq)[:, W_TOTAL]`` after the replay, in one pass: every token computed is
    still held (computed), was thrown away by a preemption, or was not computed at all
    because the prefix cache had it."""
    rqw = wide(rq)
    for i in range(rq.shape[0]):
        rqw[i, W_TOTAL] = rq[i, R_COMPUTED] + rqw[i, W_DISCARDED] - rqw[i, W_HITS]


@dataclass(frozen=True)
class EngineConfig:
    """What the loops need of a scenario: the packed engine configuration and step cost."""

    cfg: npt.NDArray[np.int64]  # indexed by C_*
    cfgf: npt.NDArray[np.float64]  # indexed by CF_*
    cost: npt.NDArray[np.float64]  # StepCost.as_array()
    # Frontend.as_array(): what a client sees on top of the engine (the loops never read it)
    frontend: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(3))
    # autoscale.Autoscale.as_array() (empty: a fixed pool of cfg[C_REPLICAS] replicas)
    autoscale: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def get(self, index: int) -> int:
        return int(self.cfg[index])


# SimResult.scale_events: one row per event of the autoscaler (autoscale.py; kinds there)
SCALE_EVENT_DTYPE = np.dtype([("time", np.float64), ("replica", np.int64), ("kind", np.int64)])


@dataclass
class SimResult:
    """What one replay produced: per-request outcomes and the step timeline."""

    rq: npt.NDArray[np.int32]  # [n, NRQ]; wide(rq) = rqw for the W_* columns
    rqf: npt.NDArray[np.float64]  # [n, NRQF]
    st: npt.NDArray[np.int64]  # [rows, NST]
    stf: npt.NDArray[np.float64]  # [rows, NSTF]
    num_kv_blocks: int  # usable blocks per replica
    # Frontend.as_array() of the scenario: client latencies are the engine's plus these
    frontend: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(3))
    # disaggregated prefill and decode (disagg.py): per request [prefill done, KV landed]
    # (NaN where it was served aggregated, in a fleet), and per step row its worker's role
    disagg_times: npt.NDArray[np.float64] | None = None
    step_role: npt.NDArray[np.int8] | None = None
    # the autoscaler's events (SCALE_EVENT_DTYPE, by time; autoscale.scale_events); empty
    # without autoscaling
    scale_events: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=SCALE_EVENT_DTYPE)
    )

    @property
    def rqw(self) -> npt.NDArray[np.int64]:
        """The wide (int64) per-request columns: ``rqw[:, W_*]``."""
        return self.rq.view(np.int64)

    @property
    def num_requests(self) -> int:
        return int(self.rq.shape[0])

    @property
    def num_steps(self) -> int:
        """Engine steps over all replicas (a compressed row counts its steps)."""
        return int(self.st[:, S_NUM_STEPS].sum())
