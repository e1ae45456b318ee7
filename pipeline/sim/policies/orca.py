"""Orca: iteration-level scheduling (``sarathi/core/scheduler/orca_scheduler.py``).

One step: every running request decodes one token; then waiting requests are
admitted FCFS while fewer than ``max_num_seqs`` run and the blocks for a whole
``max_model_len`` sequence are free (max-length reservation). An admitted
request computes its whole prompt in this same iteration, beside the decodes.
Memory is reserved for the worst case up front, so there is no preemption;
the price is that far fewer requests fit than with paged, just-in-time KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.cache import PrefixCaches
from pipeline.sim.kv import reserve
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    admit,
    blocks,
    num_tokens,
    positive,
    sort_running,
)
from pipeline.sim.state import (
    C_MAX_SEQS,
    C_RESERVE,
    P_FREE,
    P_RUN_N,
    P_STABLE,
    P_WQ_LEN,
    State,
    wq_peek,
)

CODE = 1


@dataclass(frozen=True)
class Params:
    max_num_seqs: int = field(default=128, metadata={"help": "most requests running at once"})


class OrcaPolicy(Policy):
    name = "orca"
    code = CODE
    summary = "Orca: iteration-level admission, whole prompts, max-length KV reservation"
    reserves_upfront = True
    Params = Params

    def check(self, params: Any, mem: Memory) -> None:
        positive("max_num_seqs", params.max_num_seqs)

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        return (
            {
                C_MAX_SEQS: params.max_num_seqs,
                C_RESERVE: blocks(mem.max_model_len, mem.block_size),
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
        return np.full(len(prompt), blocks(mem.max_model_len, mem.block_size), dtype=np.int64)


POLICY = OrcaPolicy()


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    cfg, rq, rqf, rp, run, wq, sched_q = s.cfg, s.rq, s.rqf, s.rp, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    rp[r, P_STABLE] = 1
    n = 0
    n_adm = 0
    sort_running(rp, run, r)
    for k in range(rp[r, P_RUN_N]):
        n = add_scheduled(sched_q, sched_t, n, run[r, k], 1)
    while rp[r, P_WQ_LEN] > 0:
        if cfg[C_RESERVE] > rp[r, P_FREE]:
            break
        if rp[r, P_RUN_N] + 1 > cfg[C_MAX_SEQS]:
            break
        i = wq_peek(wq, rp, r)
        reserve(rq, rp, r, i, cfg[C_RESERVE])
        admit(cfg, rq, rqf, rp, run, wq, r)
        n = add_scheduled(sched_q, sched_t, n, i, num_tokens(rq, i))
        n_adm += 1
    return n, 0, n_adm
