"""transformers' continuous batching (``transformers/generation/continuous_batching/``, 5.24).

The scheduler of ``model.init_continuous_batching`` as the in-process live engine runs it
(``pipeline/live/inprocess.py``: no block sharing, no CPU offloading, synchronous batches).
Read from ``scheduler.py`` (``FIFOScheduler.schedule_batch``,
``PrefillFirstScheduler.schedule_batch``, ``Scheduler._process_candidates``,
``Scheduler._schedule_request``), ``continuous_api.py``
(``ContinuousBatchProcessor.prepare_next_batch``, ``update_batch``), ``cache.py``
(``PagedAttentionCache.can_store_request_tokens``, ``compute_free_capacity``) and
``offloading_manager.py`` (``OffloadingManager.offload_requests``).

One step (``prepare_next_batch``):

1. Candidates, in order. ``fifo``: active requests that are decoding, then active
   requests part-way through their prompt, then the waiting queue; ``prefill_first``:
   the part-way prompts first, then the decodes, then the waiting queue. Active
   requests keep the order in which they became active. Waiting requests are left out
   while ``block_new_requests`` is set (see 4).
2. Safety margin, once per step: the share of free blocks is compared with
   ``safety_margin`` (default 0.15 for ``fifo``, 0.0 for ``prefill_first``). Under it,
   once something is scheduled, the first candidate that is not a decode ends the step.
3. For each candidate: it asks for 1 token (a decode) or what is left of its prompt,
   cut to the token budget left (``max_batch_tokens``: **chunked prefill**). Its blocks
   grow just in time, ``ceil((computed + tokens) / block_size)``; if the free blocks do
   not cover them it is skipped (**no head-of-line blocking**: the next candidate is
   tried; an active request skipped so is *starved*). Otherwise it is scheduled (a
   waiting one becomes active, at the end of the active order). The step ends when
   the token budget is spent or ``max_requests_per_batch`` requests are scheduled.
4. Starvation (``offload_requests``, after the batch is formed, so the batch itself is
   never touched; also before it when nothing at all could be scheduled, and then the
   scheduling is tried again): while more than one request is active and the starved
   requests, taken in candidate order, would not all fit in the free blocks, the last
   starved request is **soft reset**: its blocks are freed, and it goes to the back of
   the waiting queue to recompute its prompt and the tokens it generated. After a soft
   reset, ``block_new_requests`` holds waiting requests back until a request finishes.

Step cost: the engine's attention (SDPA, or eager, over the packed batch with a dense
mask: ``ContinuousBatchingIOs`` builds one ``[queries, keys]`` mask for the whole step)
computes every query of the step against every key of the step's sequences, so the
attention feature of a step is ``A = (P + D) * K - C`` with ``K`` the KV tokens of all
scheduled sequences after the step (the cost model adds ``C`` back: its attention term
is ``flop_s_per_attn * (A + C)``). It grows with the square of the batch, not with the
per-sequence causal pairs other engines' kernels compute. A pure decode step's cost then
depends on more than its context sum, so runs of decode steps are not compressed
(``P_STABLE`` is 0): each step is taken one by one.

Not modelled: prefix sharing (off in the live engine), CPU offloading (off), the
read-cache budget (``max_tokens_read`` = the whole cache: it cannot bind without
sharing), parallel sampling (``num_return_sequences``), the decode fast path's padding.
transformers 5.17 differs in two places (``Scheduler._allocate_blocks_if_needed``): it
allocates ``(tokens - slack + 1) // block_size + 1`` blocks (one more than needed when
the tokens end a block), and it checks the safety margin before each candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import PrefixCaches
from pipeline.sim.kv import blocks_needed, grow
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    choice,
    in_prefill,
    num_tokens,
    positive,
    retract,
    start,
)
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_BUDGET,
    C_MAX_SEQS,
    C_ORDER,
    C_WM_BLOCKS,
    P_FREE,
    P_FULL,
    P_LAST_DONE,
    P_RUN_N,
    P_STABLE,
    P_WQ_HEAD,
    P_WQ_LEN,
    R_COMPUTED,
    R_STATUS,
    ST_RUNNING,
    State,
)

CODE = 6
SCHEDULERS = ("fifo", "prefill_first")
DEFAULT_MARGIN = {"fifo": 0.15, "prefill_first": 0.0}  # FIFOScheduler / PrefillFirstScheduler


@dataclass(frozen=True)
class Params:
    max_batch_tokens: int = field(
        default=8192, metadata={"help": "token budget of one step (decodes + prompt chunks)"}
    )
    scheduler_type: str = field(default="fifo", metadata={"help": "fifo | prefill_first"})
    max_requests_per_batch: int = field(
        default=1024, metadata={"help": "most requests scheduled in one step"}
    )
    safety_margin: float = field(
        default=-1.0,
        metadata={
            "help": "share of free blocks under which only decodes join a started batch "
            "(-1 = the scheduler's default: fifo 0.15, prefill_first 0)"
        },
    )


def margin_blocks(p: Params, num_blocks: int) -> int:
    """Fewest free blocks that are within the safety margin (free / num_blocks >= margin)."""
    margin = DEFAULT_MARGIN[p.scheduler_type] if p.safety_margin < 0 else p.safety_margin
    for free in range(num_blocks + 1):
        if free / num_blocks >= margin:
            return free
    return num_blocks + 1


class TransformersPolicy(Policy):
    name = "transformers"
    code = CODE
    summary = (
        "transformers continuous batching: fifo or prefill_first, max_batch_tokens, "
        "safety margin, soft reset of starved requests"
    )
    Params = Params
    block_size = 256  # ContinuousBatchingConfig.page_size

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
        choice("scheduler_type", p.scheduler_type, SCHEDULERS)
        positive("max_batch_tokens", p.max_batch_tokens)
        positive("max_requests_per_batch", p.max_requests_per_batch)
        if p.safety_margin > 1:
            raise ScenarioError(f"safety_margin must be in [0, 1] (or -1), got {p.safety_margin}")

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        p: Params = params
        return (
            {
                C_MAX_SEQS: p.max_requests_per_batch,
                C_BUDGET: p.max_batch_tokens,
                C_ORDER: SCHEDULERS.index(p.scheduler_type),
                C_WM_BLOCKS: margin_blocks(p, mem.num_gpu_blocks),
            },
            {},
        )


POLICY = TransformersPolicy()


@njit(cache=True, error_model="numpy")
def attention(p_tok: float, d: float, kv_all: float, ctx: float, pairs: float) -> float:
    """The step's attention feature A over the packed batch (see the module docstring)."""
    return (p_tok + d) * kv_all - ctx


@njit(cache=True, error_model="numpy")
def _candidates(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
    out: npt.NDArray[np.int64],
) -> int:
    """Fill ``out`` with the step's candidates in order; returns how many."""
    m = 0
    first_decodes = cfg[C_ORDER] == 0
    for phase in range(2):
        want_prefill = (phase == 0) != first_decodes
        for k in range(rp[r, P_RUN_N]):
            i = run[r, k]
            if in_prefill(rq, i) == want_prefill:
                out[m] = i
                m += 1
    if rp[r, P_FULL] == 0:
        cap = wq.shape[1]
        for k in range(rp[r, P_WQ_LEN]):
            out[m] = wq[r, (rp[r, P_WQ_HEAD] + k) % cap]
            m += 1
    return m


@njit(cache=True, error_model="numpy")
def _try(
    s: State,
    kc: PrefixCaches,
    r: int,
    cand: npt.NDArray[np.int64],
    starved: npt.NDArray[np.int64],
    starved_len: npt.NDArray[np.int64],
) -> tuple[int, int, bool, int]:
    """One pass of ``_process_candidates``: (scheduled, starved, an allocation failed, admitted)."""
    cfg, rq, rp, run, wq, sched_q = s.cfg, s.rq, s.rp, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    bs = cfg[C_BLOCK_SIZE]
    m = _candidates(cfg, rq, rp, run, wq, r, cand)
    in_margin = rp[r, P_FREE] >= cfg[C_WM_BLOCKS]
    budget = cfg[C_BUDGET]
    requests = cfg[C_MAX_SEQS]
    n = 0
    n_starved = 0
    n_adm = 0
    failed = False
    for c in range(m):
        i = cand[c]
        active = rq[i, R_STATUS] == ST_RUNNING
        if not in_margin and n > 0 and not (active and not in_prefill(rq, i)):
            break
        t = min(num_tokens(rq, i) - rq[i, R_COMPUTED], budget)  # 1 for a decode
        if blocks_needed(rq, i, rq[i, R_COMPUTED] + t, bs) > rp[r, P_FREE]:
            failed = True
            if active:
                starved[n_starved] = i
                starved_len[n_starved] = t
                n_starved += 1
            continue
        grow(rq, rp, r, i, rq[i, R_COMPUTED] + t, bs, 0, kc)
        if not active:
            start(rq, i)
            run[r, rp[r, P_RUN_N]] = i
            rp[r, P_RUN_N] += 1
            n_adm += 1
        n = add_scheduled(sched_q, sched_t, n, i, t)
        budget -= t
        requests -= 1
        if budget == 0 or requests <= 0:
            break
    if n_adm > 0:  # the admitted leave the waiting queue, the others keep their order
        cap = wq.shape[1]
        head = rp[r, P_WQ_HEAD]
        kept = 0
        for k in range(rp[r, P_WQ_LEN]):
            i = wq[r, (head + k) % cap]
            if rq[i, R_STATUS] != ST_RUNNING:
                wq[r, (head + kept) % cap] = i
                kept += 1
        rp[r, P_WQ_LEN] = kept
    return n, n_starved, failed, n_adm


@njit(cache=True, error_model="numpy")
def _offload(
    s: State,
    kc: PrefixCaches,
    r: int,
    starved: npt.NDArray[np.int64],
    starved_len: npt.NDArray[np.int64],
    n_starved: int,
) -> int:
    """``offload_requests``: soft-reset the last starved requests until the rest fit."""
    cfg, rq, rp, run, wq = s.cfg, s.rq, s.rp, s.run, s.wq
    bs = cfg[C_BLOCK_SIZE]
    active = rp[r, P_RUN_N]
    victims = np.empty(n_starved, dtype=np.int64)
    nv = 0
    while n_starved > 0 and active - nv > 1:
        free = rp[r, P_FREE]
        fits = 0
        for j in range(n_starved):  # count_storable_requests
            need = blocks_needed(rq, starved[j], rq[starved[j], R_COMPUTED] + starved_len[j], bs)
            if need > free:
                break
            free -= need
            fits += 1
        if fits == n_starved:
            break
        n_starved -= 1
        i = starved[n_starved]
        victims[nv] = i
        nv += 1
        k = 0  # leaves the active list, which keeps its order
        while run[r, k] != i:
            k += 1
        for j in range(k, rp[r, P_RUN_N] - 1):
            run[r, j] = run[r, j + 1]
        rp[r, P_RUN_N] -= 1
        retract(rq, rp, wq, r, i, kc)  # frees its blocks; back of the queue
    if nv > 0:
        # retract pushed newest first; the engine requeues oldest first: reverse them
        cap = wq.shape[1]
        base = rp[r, P_WQ_HEAD] + rp[r, P_WQ_LEN] - nv
        for k in range(nv):
            wq[r, (base + k) % cap] = victims[nv - 1 - k]
        rp[r, P_FULL] = 1
    return nv


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    rp = s.rp
    rp[r, P_STABLE] = 0  # packed attention: decode runs are not closed-form (see above)
    if rp[r, P_LAST_DONE] > 0:  # update_batch: a finished request lifts block_new_requests
        rp[r, P_FULL] = 0
    size = rp[r, P_RUN_N] + rp[r, P_WQ_LEN]
    cand = np.empty(size, dtype=np.int64)
    starved = np.empty(size, dtype=np.int64)
    starved_len = np.empty(size, dtype=np.int64)
    n_pre = 0
    n_adm = 0
    while True:
        n, n_starved, failed, adm = _try(s, kc, r, cand, starved, starved_len)
        n_adm += adm
        if n > 0 or not failed:
            break
        nv = _offload(s, kc, r, starved, starved_len, n_starved)
        assert nv > 0  # the engine raises "No requests can be scheduled ..." here
        n_pre += nv
    if n_starved > 0:
        n_pre += _offload(s, kc, r, starved, starved_len, n_starved)
    return n, n_pre, n_adm
