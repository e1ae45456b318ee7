"""Static (request-level) batching, FasterTransformer / Triton dynamic batcher style.

A batch starts when ``max_batch_size`` requests wait, or when the oldest has
waited ``max_wait_s`` (Triton's ``max_queue_delay``), and only when the
previous batch has completely finished. It takes up to ``max_batch_size``
waiting requests FCFS, as many as have a whole ``max_model_len`` sequence of
KV blocks free (max-length reservation). The first iteration computes every
prompt; then the batch decodes until its last request is done. Requests that
finish early leave, but nothing joins until the batch is empty
(``sarathi/core/scheduler/faster_transformer_scheduler.py``).
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
)
from pipeline.sim.state import (
    C_MAX_SEQS,
    C_RESERVE,
    CF_MAX_WAIT_S,
    F_ARRIVAL,
    P_FREE,
    P_RUN_N,
    P_STABLE,
    P_WQ_LEN,
    State,
    wq_peek,
)

CODE = 0


@dataclass(frozen=True)
class Params:
    max_batch_size: int = field(default=256, metadata={"help": "most requests in one batch"})
    max_wait_s: float = field(
        default=0.0,
        metadata={"help": "longest the oldest request waits for a fuller batch (0 = none)"},
    )


class StaticPolicy(Policy):
    name = "static"
    code = CODE
    summary = "static batching: a batch starts when full or after max_wait_s, runs to the end"
    reserves_upfront = True
    Params = Params

    def check(self, params: Any, mem: Memory) -> None:
        positive("max_batch_size", params.max_batch_size)
        positive("max_wait_s", params.max_wait_s, zero_ok=True)

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        return (
            {
                C_MAX_SEQS: params.max_batch_size,
                C_RESERVE: blocks(mem.max_model_len, mem.block_size),
            },
            {CF_MAX_WAIT_S: float(params.max_wait_s)},
        )

    def blocks_alone(
        self,
        params: Any,
        mem: Memory,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        return np.full(len(prompt), blocks(mem.max_model_len, mem.block_size), dtype=np.int64)


POLICY = StaticPolicy()


@njit(cache=True, error_model="numpy")
def ready_at(s: State, r: int, clock: float) -> float:
    """When an idle replica starts its next batch: full, or the oldest waited max_wait_s."""
    cfg, cfgf, rqf, rp, wq = s.cfg, s.cfgf, s.rqf, s.rp, s.wq
    if rp[r, P_WQ_LEN] >= cfg[C_MAX_SEQS]:
        return clock
    return max(clock, rqf[wq_peek(wq, rp, r), F_ARRIVAL] + cfgf[CF_MAX_WAIT_S])


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    cfg, rq, rqf, rp, run, wq, sched_q = s.cfg, s.rq, s.rqf, s.rp, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    rp[r, P_STABLE] = 1
    n = 0
    if rp[r, P_RUN_N] > 0:
        for k in range(rp[r, P_RUN_N]):
            n = add_scheduled(sched_q, sched_t, n, run[r, k], 1)
        return n, 0, 0
    while rp[r, P_WQ_LEN] > 0 and rp[r, P_RUN_N] < cfg[C_MAX_SEQS]:
        if cfg[C_RESERVE] > rp[r, P_FREE]:
            break
        i = wq_peek(wq, rp, r)
        reserve(rq, rp, r, i, cfg[C_RESERVE])
        admit(cfg, rq, rqf, rp, run, wq, r)
        n = add_scheduled(sched_q, sched_t, n, i, num_tokens(rq, i))
    return n, 0, n
