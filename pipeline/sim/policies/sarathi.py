"""Sarathi-Serve stall-free batching (``sarathi/core/scheduler/sarathi_scheduler.py``).

One step (the running list is first sorted by arrival, FCFS):

1. every running request whose prompt is done decodes one token. Before each,
   the block manager must have a free block (``can_append_slot``); if it has
   none, the last not-yet-visited running request is preempted (recompute, to
   the front of the waiting queue), or the request itself when none is left;
2. running requests with an unfinished prompt get the next chunk,
   ``min(remaining, chunk_size - tokens already batched)``;
3. waiting requests are admitted FCFS while their whole prompt's blocks fit
   with ``watermark * num_gpu_blocks`` blocks to spare (``can_allocate``),
   fewer than ``max_num_seqs`` are running, and the chunk left is > 0.
   The blocks of the whole prompt are taken at admission.

Unlike vLLM V1, admission continues in a step that preempted, and decodes are
never starved by prefills (they go first); the budget is ``chunk_size`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import PrefixCaches
from pipeline.sim.kv import grow
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    fraction,
    in_prefill,
    num_tokens,
    positive,
    preempt,
    sort_running,
    take_waiting,
)
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_BUDGET,
    C_MAX_SEQS,
    C_WM_BLOCKS,
    P_FREE,
    P_RUN_N,
    P_STABLE,
    P_WQ_LEN,
    R_COMPUTED,
    State,
    cdiv,
    wq_peek,
)

CODE = 3


@dataclass(frozen=True)
class Params:
    chunk_size: int = field(
        default=512, metadata={"help": "token budget of one iteration (decodes + prefill chunks)"}
    )
    max_num_seqs: int = field(default=128, metadata={"help": "most requests running at once"})
    watermark: float = field(
        default=0.01, metadata={"help": "fraction of blocks kept free when admitting"}
    )


class SarathiPolicy(Policy):
    name = "sarathi"
    code = CODE
    summary = "Sarathi-Serve: decodes first, then prefill chunks within chunk_size (stall-free)"
    append_slot = True
    Params = Params

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
        positive("chunk_size", p.chunk_size)
        positive("max_num_seqs", p.max_num_seqs)
        fraction("watermark", p.watermark)
        if p.chunk_size < p.max_num_seqs:
            raise ScenarioError(
                f"chunk_size ({p.chunk_size}) must be >= max_num_seqs ({p.max_num_seqs}) so "
                "that the decodes of a full batch fit in one iteration"
            )

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        p: Params = params
        return (
            {
                C_MAX_SEQS: p.max_num_seqs,
                C_BUDGET: p.chunk_size,
                C_WM_BLOCKS: int(p.watermark * mem.num_gpu_blocks),
            },
            {},
        )

    def blocks_alone(
        self,
        params: Any,
        mem: Memory,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        # admission keeps the watermark free, and a decode needs one free block
        spare = max(int(params.watermark * mem.num_gpu_blocks), 1)
        return super().blocks_alone(params, mem, prompt, output) + spare


POLICY = SarathiPolicy()


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    cfg, rq, rqf, rp, run, wq, sched_q = s.cfg, s.rq, s.rqf, s.rp, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    rp[r, P_STABLE] = 1
    bs = cfg[C_BLOCK_SIZE]
    chunk_size = cfg[C_BUDGET]
    n = 0
    n_pre = 0
    n_adm = 0
    batched = 0
    sort_running(rp, run, r)
    old = run[r, : rp[r, P_RUN_N]].copy()
    end = old.shape[0]
    prefills = np.empty(end, dtype=np.int64)
    n_pf = 0
    nn = 0  # the new running list is rebuilt in run[r, :nn]
    pos = 0
    # 1. decodes, preempting from the end of the unvisited part
    while pos < end:
        i = int(old[pos])
        pos += 1
        if in_prefill(rq, i):
            prefills[n_pf] = i
            n_pf += 1
            continue
        preempted_self = False
        while rp[r, P_FREE] <= 0:
            if pos < end:
                end -= 1
                preempt(cfg, rq, rqf, rp, wq, r, int(old[end]), kc)
            else:
                preempt(cfg, rq, rqf, rp, wq, r, i, kc)
                preempted_self = True
            n_pre += 1
            if preempted_self:
                break
        if preempted_self:
            continue
        grow(rq, rp, r, i, rq[i, R_COMPUTED] + 1, bs, 0, kc)  # at most one block, one is free
        run[r, nn] = i
        nn += 1
        n = add_scheduled(sched_q, sched_t, n, i, 1)
        batched += 1
    # 2. ongoing prefills
    for j in range(n_pf):
        i = prefills[j]
        run[r, nn] = i
        nn += 1
        chunk = min(num_tokens(rq, i) - rq[i, R_COMPUTED], chunk_size - batched)
        if chunk > 0:
            n = add_scheduled(sched_q, sched_t, n, i, chunk)
            batched += chunk
    rp[r, P_RUN_N] = nn
    # 3. new prefills
    while rp[r, P_WQ_LEN] > 0:
        i = wq_peek(wq, rp, r)
        need = cdiv(num_tokens(rq, i), bs)
        if rp[r, P_FREE] - need < cfg[C_WM_BLOCKS]:
            break
        if rp[r, P_RUN_N] >= cfg[C_MAX_SEQS]:
            break
        chunk = min(num_tokens(rq, i) - rq[i, R_COMPUTED], chunk_size - batched)
        if chunk <= 0:
            break
        take_waiting(cfg, rq, rqf, rp, wq, r)
        grow(rq, rp, r, i, num_tokens(rq, i), bs, 0, kc)
        run[r, rp[r, P_RUN_N]] = i
        rp[r, P_RUN_N] += 1
        n = add_scheduled(sched_q, sched_t, n, i, chunk)
        batched += chunk
        n_adm += 1
    return n, n_pre, n_adm
