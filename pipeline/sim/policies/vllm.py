"""vLLM V1 (``vllm/v1/core/sched/scheduler.py``, FCFS policy).

One step:

1. ``token_budget = max_num_batched_tokens``.
2. RUNNING loop, in running-list (admission) order, while budget is left: a
   request asks for ``num_tokens - num_computed`` tokens (1 for a decode, the
   rest of the prompt for a request in chunked prefill), capped at
   ``long_prefill_token_threshold`` (if > 0) and at the budget. Its KV blocks
   are grown just in time for the tokens of this step. If the pool is short,
   the **last** request of the running list is preempted (recompute: its blocks
   are freed, its progress forgotten, it goes to the **front** of the waiting
   queue) until the allocation fits; if the victim is the request itself, the
   RUNNING loop stops there.
3. WAITING loop, only if nothing was preempted this step: FCFS while
   ``len(running) < max_num_seqs`` and budget is left. The head's tokens are
   capped at the threshold; without chunked prefill a head that does not fit
   the remaining budget stops the loop, with it the chunk is cut to the budget.
   Its blocks must fit, plus ``watermark * num_gpu_blocks`` blocks when
   something is already scheduled this step; otherwise the loop stops:
   **head-of-line blocking**, nothing behind it is tried.

One block of the pool is vLLM's null block, so ``num_gpu_blocks - 1`` are usable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.kv import grow
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    admit,
    fraction,
    num_tokens,
    positive,
    preempt,
)
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_BUDGET,
    C_CHUNKED,
    C_MAX_SEQS,
    C_THRESHOLD,
    C_WM_BLOCKS,
    P_RUN_N,
    P_WQ_LEN,
    R_COMPUTED,
    wq_peek,
)

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


class VllmPolicy(Policy):
    name = "vllm"
    code = CODE
    summary = "vLLM V1: token budget, chunked prefill, just-in-time paged KV, recompute preemption"
    Params = Params

    def num_blocks(self, mem: Memory) -> int:
        return mem.num_gpu_blocks - 1  # the null block

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
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
            },
            {},
        )


POLICY = VllmPolicy()


@njit(cache=True, error_model="numpy")
def schedule(
    r: int,
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int64],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    sched_q: npt.NDArray[np.int64],
    sched_t: npt.NDArray[np.int64],
    now: float,
) -> tuple[int, int, int]:
    bs = cfg[C_BLOCK_SIZE]
    threshold = cfg[C_THRESHOLD]
    budget = cfg[C_BUDGET]
    n = 0
    n_pre = 0
    n_adm = 0
    # RUNNING
    k = 0
    while k < rp[r, P_RUN_N] and budget > 0:
        i = run[r, k]
        new = num_tokens(rq, i) - rq[i, R_COMPUTED]
        if 0 < threshold < new:
            new = threshold
        if new > budget:
            new = budget
        scheduled = True
        while not grow(rq, rp, r, i, rq[i, R_COMPUTED] + new, bs, 0):
            rp[r, P_RUN_N] -= 1
            victim = run[r, rp[r, P_RUN_N]]
            preempt(rq, rp, wq, r, victim)
            n_pre += 1
            if victim == i:
                scheduled = False
                break
        if not scheduled:
            break
        n = add_scheduled(sched_q, sched_t, n, i, new)
        budget -= new
        k += 1
    if n_pre > 0:
        return n, n_pre, n_adm
    # WAITING
    while rp[r, P_WQ_LEN] > 0 and budget > 0:
        if rp[r, P_RUN_N] >= cfg[C_MAX_SEQS]:
            break
        i = wq_peek(wq, rp, r)
        new = num_tokens(rq, i) - rq[i, R_COMPUTED]
        if 0 < threshold < new:
            new = threshold
        if cfg[C_CHUNKED] == 0 and new > budget:
            break
        if new > budget:
            new = budget
        keep_free = cfg[C_WM_BLOCKS] if n > 0 else 0
        if not grow(rq, rp, r, i, rq[i, R_COMPUTED] + new, bs, keep_free):
            break
        admit(rq, rp, run, wq, r)
        n = add_scheduled(sched_q, sched_t, n, i, new)
        budget -= new
        n_adm += 1
    return n, n_pre, n_adm
