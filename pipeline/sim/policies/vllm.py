"""vLLM V1 (``vllm/v1/core/sched/scheduler.py``), FCFS and priority policies.

One step:

1. ``token_budget = max_num_batched_tokens``.
2. RUNNING loop, in running-list (admission) order, while budget is left: a
   request asks for ``num_tokens - num_computed`` tokens (1 for a decode, the
   rest of the prompt for a request in chunked prefill), capped at
   ``long_prefill_token_threshold`` (if > 0, and only when more than one
   request is running or waiting at the start of the step: a lone request
   starves nobody) and at the budget. Its KV blocks
   are grown just in time for the tokens of this step. If the pool is short,
   a victim is preempted (recompute: its blocks are freed, its progress
   forgotten) until the allocation fits: under ``fcfs`` the **last** request of
   the running list, back to the **front** of the waiting queue; under
   ``priority`` the running request with the largest (priority, arrival), back
   into the priority queue (if it was already scheduled this step, its tokens
   go back into the budget). If the victim is the request itself, the RUNNING
   loop stops there under ``fcfs``; under ``priority`` it goes on with the
   next running request (they have higher priority and may still fit).
3. WAITING loop, only if nothing was preempted this step, while
   ``len(running) < max_num_seqs`` and budget is left, taking the head of the
   waiting queue: FCFS, or under ``priority`` the smallest (priority, arrival)
   (lower value first). A request computing from zero is first looked up in the
   prefix cache (see below); its tokens (``num_tokens - hit tokens``) are
   capped at the threshold; without chunked prefill a head that does not fit
   the remaining budget stops the loop, with it the chunk is cut to the budget.
   Its new blocks, plus the blocks of its hits that sat unreferenced in the
   cache, must fit in the free and evictable blocks; with
   ``scheduler_reserve_full_isl`` (the default since vLLM 0.33) its new blocks
   are those of its whole ``num_tokens`` (prompt, plus what it generated
   before a preemption), not only of this step's chunk; with
   ``watermark * num_gpu_blocks`` to spare when something is already scheduled
   this step; otherwise the loop stops: **head-of-line blocking**, nothing
   behind it is tried. No preemption is made for a higher-priority arrival.

Prefix caching (``enable_prefix_caching``, on by default as in the engine):
the lookup walks the request's cache units left to right and stops at the
first miss, at most ``num_tokens - 1`` tokens (a fully cached, unit-aligned
prompt recomputes its last unit); hit tokens count as computed, so they are
neither charged to the budget nor computed. Full units are committed to the
cache when they are **scheduled** (so a later request of the same step can
hit them); an identical unit computed by two requests is cached twice, a
copy each (``cache.py``). Blocks of generated tokens are cached too, as vLLM
does: keyed by their tokens where the trace has their hashes
(``requests.output_hashes``), so a later prompt quoting the answer hits them,
otherwise by keys unique to the request (``prefix.extend_keys``), which only
the request itself hits when it is resumed; either way they take their place
in the eviction order. A preempted request looks up again when it is resumed.

One block of the pool is vLLM's null block, so ``num_gpu_blocks - 1`` are usable.

Async scheduling (``async_scheduling``, on by default as vLLM resolves it:
``SchedulerConfig.async_scheduling`` is None unless given, and ``VllmConfig``
turns it on unless something is incompatible, such as a pooling model, or
pipeline parallelism on the V1 model runner). The engine core then keeps a
batch queue of two (``EngineCore.step_with_batch_queue``,
``VllmConfig.max_concurrent_batches``): right after submitting a step it
schedules and submits the next one, and only then waits for the first one's
output and processes it (``Scheduler.update_from_output``); new requests are
taken from its input queue between those calls (``EngineCore.run_busy_loop``).
So a step that starts when the previous one ends was decided when the previous
one started:

- it sees the requests taken by then: a request that arrives while step n runs
  reaches the scheduler when step n ends and is first scheduled by step n + 2,
  one step later than in the synchronous loop. A replica with nothing in
  flight decides at once, as before;
- step n's output is not processed yet. A request step n finishes is still in
  the running list: it is not scheduled (``AsyncScheduler`` counts an output
  placeholder for the token in flight, and ``Scheduler.schedule`` skips a
  request whose step in flight reaches its ``max_tokens``), but it keeps its
  KV blocks and its slot (``max_num_seqs``, the threshold's count of running
  requests, the watermark's "something is running"), and it can be the
  preemption victim: it is then counted as preempted, its blocks are freed,
  and it still finishes with step n. Otherwise it is freed once step n + 1 is
  decided, its blocks cached up to its last token first;
- a decode's input token is the one step n samples, not known yet, so the
  block it completes is cached one step later (``allocate_slots`` caches up to
  ``request.num_tokens``, which leaves out the placeholder);
- if this decision schedules nothing (only finishing requests run, and nothing
  waiting fits beside them), the core waits for step n, processes it, takes
  every new request and decides again, as the synchronous loop would (an empty
  batch takes no time). What the empty decision preempted stays preempted.

Every other running request was in step n (the RUNNING loop never runs out of
budget before one: the requests ahead of it ask for no more than when it was
admitted), so every decode is of a token in flight. A request preempted with
a token in flight gets that token all the same (vLLM delivers the stale
output), so it resumes with the tokens the synchronous loop would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import (
    PrefixCaches,
    commit,
    hit_blocks,
    hit_tokens,
    settles,
    tier_commit,
    tier_load,
    tier_lookup,
    use_hits,
)
from pipeline.sim.kv import blocks_needed, grow, release
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    admit,
    cache_lookup,
    choice,
    count_lookup,
    fraction,
    num_tokens,
    positive,
    preempt,
)
from pipeline.sim.state import (
    C_ASYNC,
    C_BLOCK_SIZE,
    C_BUDGET,
    C_CACHING,
    C_CHUNKED,
    C_FULL_ISL,
    C_MAX_SEQS,
    C_QUEUE,
    C_SPEC_K,
    C_SPEC_LOOK,
    C_SPEC_MAXLEN,
    C_SPEC_SLOTS,
    C_SWAP_BLOCKS,
    C_THRESHOLD,
    C_TIER_BLOCKS,
    C_WM_BLOCKS,
    F_ARRIVAL,
    P_EVICTABLE,
    P_FREE,
    P_INBOX,
    P_INBOX_OLD,
    P_PEND_FREE,
    P_PIPE,
    P_QUEUED,
    P_RUN_N,
    P_STABLE,
    P_STEP,
    P_STEP_SWAP_IN,
    P_STEP_SWAP_OUT,
    P_STEP_TIER_BLK,
    P_STEP_TIER_TOK,
    P_WQ_LEN,
    Q_FIFO,
    Q_LAST_END,
    Q_PRIORITY,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_PF_END,
    R_PREEMPT,
    R_PRIORITY,
    R_PROMPT,
    R_SETTLED,
    R_SHARED,
    R_STATUS,
    R_UNIT_TOK,
    ST_FINISHED,
    ST_SWAPPED,
    STABLE_NO_EVICT,
    STABLE_UNTIL_STORE,
    W_HITS,
    State,
    cdiv,
    drop_finished,
    inbox_take,
    uindex,
    wait_head,
    wait_requeue,
    wide,
)
from pipeline.sim.swap import swap_in, swap_out

CODE = 2


@dataclass(frozen=True)
class Params:
    max_num_batched_tokens: int = field(
        default=8192,
        metadata={"help": "token budget of one step, shared by decodes and prefill chunks"},
    )
    max_num_seqs: int = field(default=256, metadata={"help": "most requests in the running list"})
    enable_chunked_prefill: bool = field(
        default=True, metadata={"help": "split prompts that do not fit the step's budget"}
    )
    long_prefill_token_threshold: int = field(
        default=0, metadata={"help": "cap on one request's tokens per step (0 = none)"}
    )
    watermark: float = field(
        default=0.0,
        metadata={"help": "fraction of blocks kept free when admitting (0 = off, vLLM default)"},
    )
    scheduling_policy: str = field(
        default="fcfs",
        metadata={"help": "fcfs | priority (lower value first, arrival breaks ties)"},
    )
    scheduler_reserve_full_isl: bool = field(
        default=True,
        metadata={
            "help": "admit a waiting request only if the blocks of its whole sequence fit "
            "(vLLM >= 0.33 default); false: only those of its first chunk"
        },
    )
    async_scheduling: bool = field(
        default=True,
        metadata={
            "help": "decide each step while the previous one runs (vLLM's default since it "
            "turned async scheduling on); false: the synchronous engine loop"
        },
    )
    # swap preemption (swap.py): vLLM V0's --preemption-mode / --swap-space
    preemption_mode: str = field(
        default="recompute",
        metadata={
            "help": "recompute (V1, the only mode it has) | swap (V0: the victim's KV goes to "
            "host memory over PCIe and comes back; needs async_scheduling = false)"
        },
    )
    swap_space_gb: float = field(
        default=4.0,
        metadata={"help": "swap: GiB of host memory per GPU for swapped KV (V0 --swap-space)"},
    )
    swap_link_gb_s: float = field(
        default=0.0,
        metadata={
            "help": "swap: GB/s one way per GPU; 0 = V0's measured copy rate "
            "(3.11 GB/s, at most the GPU's PCIe line rate)"
        },
    )
    swap_kv_bytes_per_token: int = field(
        default=0,
        metadata={"help": "swap: KV bytes per token moved; 0 = the profile's"},
    )
    # KV offloading tiers (kv_tiers.py): vLLM's offloading connector, --kv-offloading-size
    kv_offloading_size_gb: float = field(
        default=0.0,
        metadata={
            "help": "GiB of CPU memory per replica for offloaded KV blocks (vLLM "
            "--kv-offloading-size; 0 = off); needs enable_prefix_caching"
        },
    )
    kv_disk_size_gb: float = field(
        default=0.0,
        metadata={"help": "GiB of local disk below the CPU tier, taking its evictions (0 = none)"},
    )
    kv_offloading_link_gb_s: float = field(
        default=0.0,
        metadata={"help": "CPU tier: host link GB/s one way per GPU; 0 = the GPU's PCIe line rate"},
    )
    kv_disk_read_gb_s: float = field(
        default=0.0,
        metadata={"help": "disk tier: read GB/s; 0 = 13 (a PCIe 5.0 NVMe drive)"},
    )
    kv_offloading_kv_bytes_per_token: int = field(
        default=0,
        metadata={"help": "KV offloading: KV bytes per token moved; 0 = the profile's"},
    )


SCHEDULING_POLICIES = ("fcfs", "priority")


class VllmPolicy(Policy):
    name = "vllm"
    code = CODE
    summary = (
        "vLLM V1: token budget, chunked prefill, just-in-time paged KV, recompute preemption, "
        "prefix caching, fcfs or priority"
    )
    caches_generated = True
    Params = Params
    prefix_caching = True

    def num_blocks(self, mem: Memory, params: Any = None) -> int:
        return mem.num_gpu_blocks - 1  # the null block

    def queue(self, params: Any) -> int:
        return Q_PRIORITY if params.scheduling_policy == "priority" else Q_FIFO

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
        choice("scheduling_policy", p.scheduling_policy, SCHEDULING_POLICIES)
        positive("max_num_batched_tokens", p.max_num_batched_tokens)
        positive("max_num_seqs", p.max_num_seqs)
        positive("long_prefill_token_threshold", p.long_prefill_token_threshold, zero_ok=True)
        fraction("watermark", p.watermark)
        if p.max_num_batched_tokens < p.max_num_seqs:
            raise ScenarioError(
                f"max_num_batched_tokens ({p.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({p.max_num_seqs}), as vLLM requires"
            )
        if not p.enable_chunked_prefill and p.max_num_batched_tokens < mem.max_model_len:
            raise ScenarioError(
                f"without chunked prefill max_num_batched_tokens ({p.max_num_batched_tokens}) "
                f"must be >= max_model_len ({mem.max_model_len}), as vLLM requires; "
                "set enable_chunked_prefill = true or raise max_num_batched_tokens"
            )

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        p: Params = params
        return (
            {
                C_MAX_SEQS: p.max_num_seqs,
                C_BUDGET: p.max_num_batched_tokens,
                C_CHUNKED: int(p.enable_chunked_prefill),
                C_THRESHOLD: p.long_prefill_token_threshold,
                C_WM_BLOCKS: int(p.watermark * mem.num_gpu_blocks),
                C_FULL_ISL: int(p.scheduler_reserve_full_isl),
                C_ASYNC: int(p.async_scheduling),
            },
            {},
        )


POLICY = VllmPolicy()


@njit(cache=True, error_model="numpy")
def _victim(
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    r: int,
) -> int:
    """Position in the running list of max(running, key=(priority, arrival)), first on ties."""
    best = 0
    b = run[r, 0]
    for k in range(1, rp[r, P_RUN_N]):
        i = run[r, k]
        if rq[i, R_PRIORITY] > rq[b, R_PRIORITY] or (
            rq[i, R_PRIORITY] == rq[b, R_PRIORITY] and rqf[i, F_ARRIVAL] > rqf[b, F_ARRIVAL]
        ):
            best = k
            b = i
    return best


@njit(cache=True, error_model="numpy")
def _unlist_finished(rp: npt.NDArray[np.int64], run: npt.NDArray[np.int64], r: int, i: int) -> None:
    """Take request i off the list of finished requests to free (``_processed``), in order."""
    done = run.shape[1] // 2
    f = rp[r, P_PEND_FREE]
    e = 0
    while run[r, done + e] != i:
        e += 1
    for x in range(e, f - 1):
        run[r, done + x] = run[r, done + x + 1]
    rp[r, P_PEND_FREE] = f - 1


@njit(cache=True, error_model="numpy")
def _make_room(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
    r: int,
    i: int,
    tokens: int,
    k: int,
    n: int,
    budget: int,
    kc: PrefixCaches,
) -> tuple[bool, int, int, int, int]:
    """Preempt until running request i (position k) gets blocks for ``tokens`` tokens.

    The caller tried to grow it and failed.

    Returns (scheduled, k, n, budget, preempted): scheduled is False when i itself
    was preempted; k, n and budget change when a victim was already scheduled.
    """
    bs = cfg[C_BLOCK_SIZE]
    by_priority = cfg[C_QUEUE] == Q_PRIORITY
    n_pre = 0
    while True:
        if by_priority:
            v = _victim(rq, rqf, rp, run, r)
            victim = run[r, v]
            for j in range(v, rp[r, P_RUN_N] - 1):
                run[r, j] = run[r, j + 1]
            rp[r, P_RUN_N] -= 1
            if v < k:  # scheduled already this step: unschedule it
                for j in range(n):
                    if sched_q[j] == victim:
                        budget += sched_t[j]
                        for jj in range(j, n - 1):
                            sched_q[jj] = sched_q[jj + 1]
                            sched_t[jj] = sched_t[jj + 1]
                        n -= 1
                        break
                k -= 1
        else:
            rp[r, P_RUN_N] -= 1
            victim = run[r, rp[r, P_RUN_N]]
        if rq[victim, R_STATUS] == ST_FINISHED:  # async: its last token is still in flight
            release(rq, rp, r, victim, kc)  # it is preempted, and finishes with that step
            rq[victim, R_PREEMPT] += 1
            _unlist_finished(rp, run, r, victim)
        elif cfg[C_SWAP_BLOCKS] != 0 and swap_out(cfg, rq, rp, r, victim):
            wait_requeue(cfg, wq, rp, rq, rqf, r, victim)  # swapped: back first in line
        else:
            preempt(cfg, rq, rqf, rp, wq, r, victim, kc)
        n_pre += 1
        if victim == i:
            return False, k, n, budget, n_pre
        if grow(rq, rp, r, i, tokens, bs, 0, kc):
            return True, k, n, budget, n_pre


@njit(cache=True, error_model="numpy", inline="always")
def _decodes(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
    r: int,
    k: int,
    n: int,
    budget: int,
    lag: int,
) -> tuple[int, int, int]:
    """The RUNNING loop's common case, in a tight loop of its own: (k, n, budget) after it.

    Schedules running requests from position k on while each is a decode (one
    token, which the budget always has room for and the threshold never caps)
    whose new block, if it needs one, is free (no eviction, no preemption) and
    that settles no cache unit (up to ``lag`` tokens short of the step's end for a
    decode, at its end for a prefill's last token: see ``_schedule_once``); stops
    before the first that is not, or that is finishing (async), which the general
    loop takes. Decides as that loop would, with fewer loads.
    """
    bs = cfg[C_BLOCK_SIZE]
    caching = cfg[C_CACHING] != 0
    n_run = rp[r, P_RUN_N]
    free = rp[r, P_FREE]
    while k < n_run and budget > 0:
        i = uindex(run[r, uindex(k)])
        c = rq[i, R_COMPUTED] + 1  # tokens after this step
        if rq[i, R_PROMPT] + rq[i, R_GENERATED] != c or rq[i, R_STATUS] == ST_FINISHED:
            break
        if caching:  # a decode's input token is in flight (lag); a prefill's last one is not
            known = c - lag if rq[i, R_COMPUTED] >= rq[i, R_PF_END] else c
            if settles(rq, i, known):
                break
        held = rq[i, R_HELD]
        blocks = held
        if caching:  # without the cache nothing is shared
            blocks += rq[i, R_SHARED]
        short = c - blocks * bs  # tokens beyond its blocks (blocks_needed, inline)
        if short > bs:  # more than one new block: the general loop
            break
        # 0 or 1 without a branch: which requests cross a block boundary is all but random
        need = 1 if short > 0 else 0
        if need > free:
            break
        free -= need
        rq[i, R_HELD] = held + need
        sched_q[uindex(n)] = i
        sched_t[uindex(n)] = 1
        n += 1
        budget -= 1
        k += 1
    rp[r, P_FREE] = free
    return k, n, budget


@njit(cache=True, error_model="numpy", inline="always")
def _verify_decodes(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
    r: int,
    k: int,
    n: int,
    budget: int,
    threshold: int,
) -> tuple[int, int, int]:
    """Speculative decoding's common case (``_decodes`` for verify steps): (k, n, budget).

    Schedules running requests from position k on while each is a decode that
    verifies all k drafts (``speculative_tokens`` caps none: the budget after the
    drafting slots, ``max_model_len`` and the threshold all have room for 1 + k)
    whose new blocks, if any, are free (no eviction, no preemption) and that
    settles no cache unit; stops before the first that is not (or when the
    budget is down to the drafting slots), which the general loop takes.
    Synchronous only (speculation refuses async scheduling): nothing is in flight.
    """
    bs = cfg[C_BLOCK_SIZE]
    caching = cfg[C_CACHING] != 0
    new = 1 + cfg[C_SPEC_K]
    look = cfg[C_SPEC_LOOK]
    maxlen = cfg[C_SPEC_MAXLEN]
    slots = cfg[C_SPEC_SLOTS]
    if 0 < threshold < new:
        return k, n, budget
    n_run = rp[r, P_RUN_N]
    free = rp[r, P_FREE]
    while k < n_run:
        if budget - slots * (n + 1) < new:  # (the general loop breaks at <= slots * (n + 1))
            break
        i = uindex(run[r, uindex(k)])
        c0 = rq[i, R_COMPUTED]
        if c0 < rq[i, R_PF_END] or rq[i, R_PROMPT] + rq[i, R_GENERATED] != c0 + 1:
            break
        if c0 + new > maxlen - 1 or rq[i, R_STATUS] == ST_FINISHED:
            break
        if caching and settles(rq, i, c0 + 1):  # known: its tokens, drafts are not cached
            break
        end = min(c0 + new + look, maxlen)
        held = rq[i, R_HELD]
        short = end - (held + rq[i, R_SHARED]) * bs  # tokens beyond its blocks
        need = 0
        if short > 0:
            need = (short + bs - 1) // bs
            if need > free:
                break
            free -= need
            rq[i, R_HELD] = held + need
        sched_q[uindex(n)] = i
        sched_t[uindex(n)] = new
        n += 1
        budget -= new
        k += 1
    rp[r, P_FREE] = free
    return k, n, budget


@njit(cache=True, error_model="numpy", inline="always")  # one call site, once per decode
def speculative_tokens(
    cfg: npt.NDArray[np.int64], rq: npt.NDArray[np.int32], i: int, new: int, room: int
) -> int:
    """Speculative decoding: the tokens running request i asks for (``new``: its known
    ones), before the threshold and budget caps (the caller's).

    vLLM's RUNNING loop asks for ``num_tokens_with_spec - num_computed_tokens``: a decode
    has the drafter's k drafts on top of its one token (``speculation.py``: a request
    gets drafts after every step that samples a token of it; none after a prefill chunk
    that does not, ``update_draft_token_ids``). Capped at the input budget less the
    drafting slots (``room``) and at ``max_model_len - num_computed_tokens - 1``.
    """
    c = rq[i, R_COMPUTED]
    if c >= rq[i, R_PF_END]:
        new += cfg[C_SPEC_K]
    if new > room:
        new = room
    bound = cfg[C_SPEC_MAXLEN] - c - 1
    if new > bound:
        new = bound
    return new


@njit(cache=True, error_model="numpy")
def padded_tokens(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    sched_q: npt.NDArray[np.int64],
    n_running: int,
    c: int,
) -> int:
    """Speculative decoding: the tokens of a waiting request with one token left to compute
    (c computed, hits included): vLLM pads it to 1 + k with placeholder drafts (never
    accepted) when no running request scheduled this step is in prefill and some running
    request was scheduled or it computed some tokens, if 1 + k + 1 tokens fit max_model_len.
    """
    if n_running == 0 and c == 0:
        return 1
    for j in range(n_running):
        q = sched_q[j]
        if rq[q, R_COMPUTED] < rq[q, R_PF_END]:  # prefill_scheduled
            return 1
    pad = 1 + cfg[C_SPEC_K]
    if c + pad + 1 > cfg[C_SPEC_MAXLEN]:
        return 1
    return pad


@njit(cache=True, error_model="numpy", inline="always")  # one call site: no call per step
def _schedule_once(
    r: int,
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
    kc: PrefixCaches,
) -> tuple[int, int, int]:
    """One call of vLLM's ``Scheduler.schedule`` (the module docstring's rules)."""
    bs = cfg[C_BLOCK_SIZE]
    threshold = cfg[C_THRESHOLD]
    if rp[r, P_RUN_N] + rp[r, P_WQ_LEN] <= 1:  # a lone request: nobody to starve
        threshold = 0
    budget = cfg[C_BUDGET]
    caching = cfg[C_CACHING] != 0
    tiers = cfg[C_TIER_BLOCKS] != 0  # KV offloading tiers (kv_tiers.py; vLLM only)
    by_priority = cfg[C_QUEUE] == Q_PRIORITY
    lag = rp[r, P_PIPE]  # async: the step in flight is still sampling its decodes' next token
    rp[r, P_STABLE] = 1
    n = 0
    n_pre = 0
    n_adm = 0
    spec = cfg[C_SPEC_K]  # speculative decoding: draft tokens of every decode (0: off)
    slots = cfg[C_SPEC_SLOTS]  # ... budget slots each scheduled request takes for drafting
    # RUNNING
    k = 0
    while k < rp[r, P_RUN_N] and budget > 0:
        if spec == 0:
            k, n, budget = _decodes(cfg, rq, rp, run, sched_q, sched_t, r, k, n, budget, lag)
            if k >= rp[r, P_RUN_N] or budget <= 0:
                break
        else:  # speculative decoding: its verify decodes, the same way
            k, n, budget = _verify_decodes(
                cfg, rq, rp, run, sched_q, sched_t, r, k, n, budget, threshold
            )
            if k >= rp[r, P_RUN_N] or budget <= slots * (n + 1):  # vLLM: input_budget <= slots
                break
        i = run[r, k]
        if rq[i, R_STATUS] == ST_FINISHED:  # async: its last token is in flight: not scheduled
            k += 1
            continue
        new = num_tokens(rq, i) - rq[i, R_COMPUTED]
        if spec > 0:
            new = speculative_tokens(cfg, rq, i, new, budget - slots * (n + 1))
        if 0 < threshold < new:
            new = threshold
        if new > budget:
            new = budget
        scheduled = True
        end = rq[i, R_COMPUTED] + new  # the tokens its KV slots must cover
        if spec > 0:  # with the drafter's lookahead slots, within max_model_len
            end = min(end + cfg[C_SPEC_LOOK], cfg[C_SPEC_MAXLEN])
        need = blocks_needed(rq, i, end, bs)
        if 0 < need <= rp[r, P_FREE]:  # the common case, inline: free blocks, no eviction
            rp[r, P_FREE] -= need
            rq[i, R_HELD] += need
            need = 0
        if need > 0 and not grow(rq, rp, r, i, end, bs, 0, kc):
            # the pool is short: preempt (a call, out of this loop's hot path)
            scheduled, k, n, budget, pre = _make_room(
                cfg,
                rq,
                rqf,
                rp,
                run,
                wq,
                sched_q,
                sched_t,
                r,
                i,
                end,
                k,
                n,
                budget,
                kc,
            )
            n_pre += pre
        if not scheduled:
            if by_priority:  # it left the list; the requests after it may still fit
                continue
            break
        known = rq[i, R_COMPUTED] + new  # blocks are cached up to the tokens known
        if lag != 0 and rq[i, R_COMPUTED] >= rq[i, R_PF_END]:
            known -= 1  # a decode of the token the step in flight samples (it was in it)
        if spec > 0 and known > num_tokens(rq, i):
            known = num_tokens(rq, i)  # draft tokens are not cached (allocate_slots)
        if caching and settles(rq, i, known):  # prompt and generated blocks
            k0 = rq[i, R_SETTLED]
            commit(rq, rp, i, r, known, False, kc)
            if tiers:  # KV offloading: stored as computed (kv_tiers.py)
                tier_commit(rq, rp, i, r, k0, kc)
        n = add_scheduled(sched_q, sched_t, n, i, new)
        budget -= new
        k += 1
    if n_pre > 0:
        return n, n_pre, n_adm
    # WAITING
    n_running = n  # running requests scheduled (the padding rule below)
    while rp[r, P_WQ_LEN] > 0 and budget > 0:
        if rp[r, P_RUN_N] >= cfg[C_MAX_SEQS]:
            break
        if spec > 0 and budget <= slots * (n + 1):  # vLLM: input_budget <= draft_slots
            break
        i = wait_head(cfg, wq, rp, r)
        h = 0
        idle = 0
        looked = caching and rq[i, R_COMPUTED] == 0 and rq[i, R_UNIT_TOK] > 0
        if looked:
            h, idle = cache_lookup(cfg, rq, r, i, kc)
        hit = hit_tokens(rq, i, h)
        c = d = loaded = 0  # KV offloading tiers (kv_tiers.py): units and tokens loaded
        if looked and tiers:
            c, d = tier_lookup(rq, rp, i, r, h, kc)
            loaded = hit_tokens(rq, i, h + c + d) - hit
            # what it finds decides its chunk and so whether it fits: a decode run must
            # stop before its steps store a unit to the tier (which could evict one found)
            rp[r, P_STABLE] |= STABLE_UNTIL_STORE
        new = num_tokens(rq, i) - rq[i, R_COMPUTED] - hit - loaded
        room = budget if spec == 0 else budget - slots * (n + 1)  # request_token_budget
        if spec > 0 and new == 1:
            pad = padded_tokens(cfg, rq, sched_q, n_running, rq[i, R_COMPUTED] + hit)
            if pad > room:
                break  # vLLM: "prefer to not schedule than schedule un-padded"
            new = pad
        if 0 < threshold < new:
            new = threshold
        if cfg[C_CHUNKED] == 0 and new > room:
            break
        if new > room:
            new = room
        keep_free = cfg[C_WM_BLOCKS] if rp[r, P_RUN_N] > 0 else 0  # (bool(self.running))
        shared = hit_blocks(rq, i, h)
        slot_end = rq[i, R_COMPUTED] + hit + loaded + new
        if spec > 0:  # the drafter's lookahead slots, within max_model_len
            slot_end = min(slot_end + cfg[C_SPEC_LOOK], cfg[C_SPEC_MAXLEN])
        need = cdiv(slot_end, bs) - shared
        gate = need  # blocks that must fit for it to be admitted
        if cfg[C_FULL_ISL] != 0:  # the whole sequence, not only this chunk
            gate = cdiv(num_tokens(rq, i), bs) - shared
            if spec > 0 and need > gate:  # ... and then this chunk with its lookahead
                gate = need
        if gate + idle + keep_free > rp[r, P_FREE] + rp[r, P_EVICTABLE]:
            if idle > 0:  # evicting its idle hits could let it in: decode runs must not evict
                rp[r, P_STABLE] |= STABLE_NO_EVICT
            break
        if h > 0:
            use_hits(rq, rp, i, r, h, kc)
            rq[i, R_COMPUTED] = hit
        if loaded > 0:  # loaded into blocks of its own (below), then committed as computed
            tier_load(rq, rp, i, r, h, c, d, kc)
            rq[i, R_COMPUTED] = hit + loaded
        if need <= rp[r, P_FREE]:
            rp[r, P_FREE] -= need
            rq[i, R_HELD] += need
        else:
            grow(rq, rp, r, i, slot_end, bs, 0, kc)
        known = rq[i, R_COMPUTED] + new
        if spec > 0 and known > num_tokens(rq, i):
            known = num_tokens(rq, i)  # padded draft slots are not cached
        k0 = rq[i, R_SETTLED]
        if looked:
            count_lookup(rq, rp, r, i, h)
            if loaded > 0:
                wide(rq)[i, W_HITS] += loaded
            commit(rq, rp, i, r, known, False, kc)
        elif caching and rq[i, R_COMPUTED] > 0:  # its KV came with it (remote prefill):
            commit(rq, rp, i, r, known, False, kc)  # cached on receipt
        if tiers:  # KV offloading: stored as computed (kv_tiers.py)
            tier_commit(rq, rp, i, r, k0, kc)
        if rq[i, R_STATUS] == ST_SWAPPED:  # swap preemption: it resumes where it stopped
            pf_end = rq[i, R_PF_END]
            admit(cfg, rq, rqf, rp, run, wq, r)
            rq[i, R_PF_END] = pf_end
            swap_in(cfg, rq, rp, r, i)
        else:
            admit(cfg, rq, rqf, rp, run, wq, r)
        n = add_scheduled(sched_q, sched_t, n, i, new)
        budget -= new
        n_adm += 1
    return n, n_pre, n_adm


@njit(cache=True, error_model="numpy", inline="always")  # one call site
def _processed(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    r: int,
    kc: PrefixCaches,
) -> None:
    """Async: the output of the step in flight is processed, after the next was decided.

    The requests it finished (listed by ``loop._finish`` in the second half of
    the running list's row, in the step's order, as vLLM frees them) have their
    blocks cached up to their last token, are freed, and leave the running list.
    """
    caching = cfg[C_CACHING] != 0
    done = run.shape[1] // 2
    for e in range(rp[r, P_PEND_FREE]):
        i = run[r, done + e]
        if caching and settles(rq, i, rq[i, R_COMPUTED]):
            k0 = rq[i, R_SETTLED]
            commit(rq, rp, i, r, rq[i, R_COMPUTED], False, kc)
            if cfg[C_TIER_BLOCKS] != 0:  # KV offloading: stored as computed
                tier_commit(rq, rp, i, r, k0, kc)
        release(rq, rp, r, i, kc)
    drop_finished(rq, rp, run, r)
    rp[r, P_PEND_FREE] = 0


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    """One step as the engine core decides it: synchronously, or with async scheduling.

    Async (see the module docstring): a step that starts when the previous one
    ends was decided while that one ran, on what the scheduler knew then: the
    requests taken from the input queue at the previous step's start, and the
    previous step's outputs not yet processed. If that decides nothing, the
    core waits for the previous step, processes it, takes every request queued
    and decides again, as the synchronous loop would (the step still starts at
    ``now``: an empty batch takes no time).
    """
    cfg, rq, rqf, rp, rpf, run, wq = s.cfg, s.rq, s.rqf, s.rp, s.rpf, s.run, s.wq
    sched_q, sched_t = s.sched_q, s.sched_t
    is_async = cfg[C_ASYNC] != 0
    pipelined = is_async and rp[r, P_STEP] > 0 and rpf[r, Q_LAST_END] == now
    pending = rp[r, P_PEND_FREE] > 0
    n_pre0 = 0
    if cfg[C_SWAP_BLOCKS] != 0:  # swap preemption (synchronous only): this step's traffic
        rp[r, P_STEP_SWAP_OUT] = 0
        rp[r, P_STEP_SWAP_IN] = 0
    tiers = cfg[C_TIER_BLOCKS] != 0  # KV offloading (kv_tiers.py): this step's loads
    if tiers:
        for t in range(2):
            rp[r, P_STEP_TIER_TOK + t] = 0
            rp[r, P_STEP_TIER_BLK + t] = 0
    while True:
        if is_async:  # the requests the core has taken from its input queue by now
            take = rp[r, P_INBOX_OLD] if pipelined else rp[r, P_INBOX]
            if take > 0:
                inbox_take(cfg, wq, rp, rq, rqf, r, take)
            rp[r, P_PIPE] = 1 if pipelined else 0
            rp[r, P_QUEUED] = rp[r, P_WQ_LEN]  # the step's queue depth
        n, n_pre, n_adm = _schedule_once(r, cfg, rq, rqf, rp, run, wq, sched_q, sched_t, kc)
        if not is_async:
            if cfg[C_SPEC_K] > 0:  # speculative: the steps differ (accepted counts): no runs
                rp[r, P_STABLE] = 0
            return n, n_pre, n_adm
        rp[r, P_PIPE] = 0
        if rp[r, P_PEND_FREE] > 0:
            _processed(cfg, rq, rp, run, r, kc)
        if n > 0 or not pipelined:
            break
        pipelined = False  # nothing to run: wait for the step in flight, then decide again
        n_pre0 = n_pre  # (what the empty decision preempted stays preempted)
    rp[r, P_INBOX_OLD] = rp[r, P_INBOX]  # the next decision takes these
    # the next decision sees them, or the blocks and slots just freed: no decode run
    if rp[r, P_INBOX] > 0 or (pipelined and pending and rp[r, P_WQ_LEN] > 0):
        rp[r, P_STABLE] = 0
    return n, n_pre + n_pre0, n_adm
