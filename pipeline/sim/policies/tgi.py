"""TGI v3 (``backends/v3/src/backend.rs`` ``batching_task``, ``queue.rs`` ``next_batch``).

Admission (``Queue::next_batch(min_size, max_size, prefill_budget)``): FCFS
from the front of the queue; nothing if fewer than ``min_size`` wait or
``max_size`` is 0. Each entry's KV is **reserved for its whole life** up
front, ``prompt + max_new_tokens - 1`` tokens (its cached prefix shared, the
rest allocated, evicting unreferenced cached prefixes if needed); if that does
not fit, the entry stays at the front and the batch closes (no preemption,
ever). Its prompt tokens after the cached prefix (a fully cached prompt keeps
one) are charged to the prefill budget; over budget, a chunking model cuts the
entry's prefill to what is left of the budget and closes the batch, a
non-chunking model leaves the entry and closes the batch. A batch of fewer
than ``min_size`` entries is put back. At most ``max_size`` entries.

The loop (``batching_task``), one engine forward per step:

- nothing running: ``next_batch(-, max_batch_size, max_batch_prefill_tokens)``
  and a prefill step of that batch alone;
- while a batch runs, each iteration first tries to add a batch, then decodes:
  - **non-chunking** models: ``min_size = floor(batch size ×
    waiting_served_ratio)``, or none once ``max_waiting_tokens`` decode steps
    passed since a batch was last added; ``max_size = max_batch_size - batch
    size``; budget ``max_batch_prefill_tokens``. A new batch is prefilled in a
    step of its own while the running batch waits, then joins it;
  - **chunking** models (``prefill_chunking``, TGI v3's default where the
    attention backend allows): ``waiting_served_ratio`` and
    ``max_waiting_tokens`` are ignored; the budget is
    ``max_batch_prefill_tokens`` minus the tokens the running batch computes in
    the step, and the new batch's prefill runs in the same forward as the
    running batch;
  - then a decode step of every running request.

Chunked prefills (modelled; the router leaves their later chunks to the
server): a running request whose prompt is not done gets its next chunk in
every step, in running order, within ``max_batch_prefill_tokens`` minus the
step's decodes.

Prefix caching (radix allocator): a request's prefix hit is locked when its
KV is reserved; its prompt is inserted into the cache when it **finishes**
(identical units inserted twice are shared, the second copy freed).
``max_batch_total_tokens`` is the allocator's size (default: the KV cache);
one block is reserved for health checks. ``block_size`` defaults to 1
(flashinfer, TGI's default with prefix caching). ``max_new_tokens`` is taken
to be the request's output length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import PrefixCaches, capacity, hit_blocks, hit_tokens, take, use_hits
from pipeline.sim.kv import release
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    cache_lookup,
    count_lookup,
    in_prefill,
    num_tokens,
    positive,
    start,
)
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_CACHING,
    C_CHUNK,
    C_MAX_BATCH,
    C_MAX_PREFILL,
    C_MAX_SEQS,
    C_MAX_WAIT_TOK,
    CF_SERVED_RATIO,
    P_PHASE,
    P_RUN_N,
    P_STABLE,
    P_WAIT_TOK,
    P_WQ_HEAD,
    P_WQ_LEN,
    R_COMPUTED,
    R_HELD,
    R_OUTPUT,
    R_PROMPT,
    R_SETTLED,
    State,
    cdiv,
    wq_pop_front,
)

CODE = 5

TRY_ADD = 0  # P_PHASE: the next step may add a batch
DECODE = 1  # P_PHASE: the next step is the decode that ends the iteration

NONE = -1  # no min_size / max_size
# why next_batch gave nothing
GOT = 0
EMPTY = 1
FULL = 2
SMALL = 3  # fewer than min_size
NO_MEMORY = 4
NO_BUDGET = 5


@dataclass(frozen=True)
class Params:
    max_batch_prefill_tokens: int = field(
        default=4096, metadata={"help": "prompt tokens one prefill may take"}
    )
    max_batch_total_tokens: int = field(
        default=0,
        metadata={"help": "tokens the KV allocator holds (0 = the whole KV cache)"},
    )
    max_batch_size: int = field(default=0, metadata={"help": "most requests running (0 = none)"})
    waiting_served_ratio: float = field(
        default=0.3,
        metadata={"help": "non-chunking: waiting/running ratio that lets a new batch in"},
    )
    max_waiting_tokens: int = field(
        default=20,
        metadata={"help": "non-chunking: decode steps after which waiting requests go in anyway"},
    )
    prefill_chunking: bool = field(
        default=True, metadata={"help": "chunking model: new prefills join the running batch"}
    )


class TgiPolicy(Policy):
    name = "tgi"
    code = CODE
    summary = (
        "TGI v3: full-lifetime KV reservation, no preemption, waiting_served_ratio and "
        "max_waiting_tokens, prefill chunking, radix prefix cache"
    )
    caches_on_finish = True
    Params = Params
    block_size = 1
    prefix_caching = True
    dedupe = True

    def num_blocks(self, mem: Memory, params: Any = None) -> int:
        blocks = mem.num_gpu_blocks
        if params is not None and params.max_batch_total_tokens > 0:
            blocks = min(blocks, params.max_batch_total_tokens // mem.block_size)
        return blocks - 1  # block 0 answers health checks

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
        positive("max_batch_prefill_tokens", p.max_batch_prefill_tokens)
        positive("max_batch_total_tokens", p.max_batch_total_tokens, zero_ok=True)
        positive("max_batch_size", p.max_batch_size, zero_ok=True)
        positive("max_waiting_tokens", p.max_waiting_tokens, zero_ok=True)
        if p.waiting_served_ratio < 0:
            raise ScenarioError(f"waiting_served_ratio must be >= 0, got {p.waiting_served_ratio}")
        if not p.prefill_chunking and p.max_batch_prefill_tokens < mem.max_model_len - 1:
            raise ScenarioError(
                f"without prefill_chunking max_batch_prefill_tokens ({p.max_batch_prefill_tokens}) "
                f"must be >= the longest prompt, max_model_len - 1 ({mem.max_model_len - 1}), "
                "as TGI's launcher requires; raise it or set prefill_chunking = true"
            )

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        p: Params = params
        return (
            {
                C_MAX_SEQS: 1 << 40,  # chunking models can outgrow max_batch_size
                C_MAX_BATCH: p.max_batch_size if p.max_batch_size > 0 else 1 << 40,
                C_MAX_PREFILL: p.max_batch_prefill_tokens,
                C_CHUNK: int(p.prefill_chunking),
                C_MAX_WAIT_TOK: p.max_waiting_tokens,
            },
            {CF_SERVED_RATIO: p.waiting_served_ratio},
        )


POLICY = TgiPolicy()


@njit(cache=True, error_model="numpy")
def _next_batch(
    s: State, kc: PrefixCaches, r: int, n: int, min_size: int, max_size: int, budget: int
) -> tuple[int, int]:
    """``Queue::next_batch``; appends the new entries to the step: (n, why)."""
    cfg, rq, rp, run, wq, sched_q = s.cfg, s.rq, s.rp, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    if rp[r, P_WQ_LEN] == 0:
        return n, EMPTY
    if min_size != NONE and rp[r, P_WQ_LEN] < min_size:
        return n, SMALL
    if max_size == 0:
        return n, FULL
    bs = cfg[C_BLOCK_SIZE]
    chunking = cfg[C_CHUNK] != 0
    budget = cdiv(max(budget, 0), bs) * bs
    cap = wq.shape[1]
    head = rp[r, P_WQ_HEAD]
    n0 = n
    prefill = 0
    why = GOT
    for j in range(rp[r, P_WQ_LEN]):
        i = int(wq[r, (head + j) % cap])
        h, idle = cache_lookup(cfg, rq, r, i, kc)
        own = cdiv(rq[i, R_PROMPT] + rq[i, R_OUTPUT] - 1, bs) - hit_blocks(rq, i, h)
        if own + idle > capacity(rp, r):
            why = NO_MEMORY
            break
        prefix = hit_tokens(rq, i, h)
        if h > 0:
            use_hits(rq, rp, i, r, h, kc)
            rq[i, R_COMPUTED] = prefix
        take(rp, r, own, kc)
        rq[i, R_HELD] += own
        postfix = num_tokens(rq, i) - prefix
        if prefill + postfix > budget:
            chunk = budget - prefill
            if chunking and chunk > 0:
                n = add_scheduled(sched_q, sched_t, n, i, chunk)
            else:
                release(rq, rp, r, i, kc)
                rq[i, R_COMPUTED] = 0
                why = NO_BUDGET
            break
        prefill += postfix
        n = add_scheduled(sched_q, sched_t, n, i, postfix)
        if n - n0 == max_size:
            break
    got = n - n0
    if got == 0:
        return n, why
    if min_size != NONE and got < min_size:
        for j in range(n0, n):
            release(rq, rp, r, sched_q[j], kc)
            rq[sched_q[j], R_COMPUTED] = 0
        return n0, SMALL
    caching = cfg[C_CACHING] != 0
    for _ in range(got):
        i = wq_pop_front(wq, rp, r)
        if caching:
            count_lookup(rq, rp, r, i, rq[i, R_SETTLED])  # its hits, before it computes
        start(rq, i)
        run[r, rp[r, P_RUN_N]] = i
        rp[r, P_RUN_N] += 1
    return n, GOT


@njit(cache=True, error_model="numpy")
def _running(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    r: int,
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
) -> tuple[int, int]:
    """The running batch's work this step: every decode, then chunks of unfinished prompts."""
    n = 0
    m = rp[r, P_RUN_N]
    for k in range(m):
        i = run[r, k]
        if not in_prefill(rq, i):
            n = add_scheduled(sched_q, sched_t, n, i, 1)
    left = cfg[C_MAX_PREFILL] - n
    tokens = n
    for k in range(m):
        i = run[r, k]
        if in_prefill(rq, i):
            chunk = min(num_tokens(rq, i) - rq[i, R_COMPUTED], left)
            if chunk > 0:
                n = add_scheduled(sched_q, sched_t, n, i, chunk)
                left -= chunk
                tokens += chunk
    return n, tokens


@njit(cache=True, error_model="numpy", inline="always")
def on_decode_run(s: State, r: int, steps: int) -> None:
    """Each decode step of a run is one more waiting token (``waiting_tokens += 1``)."""
    rp = s.rp
    rp[r, P_WAIT_TOK] += steps


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    cfg, cfgf, rq, rp, run, sched_q = s.cfg, s.cfgf, s.rq, s.rp, s.run, s.sched_q
    sched_t = s.sched_t
    rp[r, P_STABLE] = 0
    max_batch = cfg[C_MAX_BATCH]
    chunking = cfg[C_CHUNK] != 0
    size = rp[r, P_RUN_N]
    if size == 0:
        n, _ = _next_batch(s, kc, r, 0, NONE, max_batch, cfg[C_MAX_PREFILL])
        rp[r, P_PHASE] = TRY_ADD
        rp[r, P_WAIT_TOK] = 1
        return n, 0, n
    if rp[r, P_PHASE] == TRY_ADD:
        if chunking:
            n, current = _running(cfg, rq, rp, run, r, sched_q, sched_t)
            n2, why = _next_batch(s, kc, r, n, NONE, NONE, cfg[C_MAX_PREFILL] - current)
        else:
            if rp[r, P_WAIT_TOK] >= cfg[C_MAX_WAIT_TOK]:
                min_size = NONE
            else:
                min_size = int(np.floor(np.float32(size) * np.float32(cfgf[CF_SERVED_RATIO])))
            n2, why = _next_batch(s, kc, r, 0, min_size, max_batch - size, cfg[C_MAX_PREFILL])
            n = 0
        if why == GOT:
            if not chunking:
                rp[r, P_WAIT_TOK] = 1
            rp[r, P_PHASE] = DECODE
            return n2, 0, n2 - n
        if why != SMALL:
            rp[r, P_STABLE] = 1  # nothing to add until something arrives or finishes
    else:
        rp[r, P_PHASE] = TRY_ADD
    n, _ = _running(cfg, rq, rp, run, r, sched_q, sched_t)
    rp[r, P_WAIT_TOK] += 1
    return n, 0, 0
