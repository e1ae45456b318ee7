"""Shortest prompt first: a toy policy, written from the contract in ``policies/base.py``.

It is what a newcomer adds to try a policy: this one file, and one registry
line (``_NAMES`` in ``pipeline/sim/policies/__init__.py``, or, as
``test_toy_policy.py`` does from outside the package, ``policies.register``).
Iteration-level batching: every step decodes the running requests and admits
the waiting request with the shortest prompt (the oldest of equals) while
``max_num_seqs`` and the KV blocks allow; an admitted request computes its
whole prompt in its first step and holds the blocks of its whole sequence
from then on (so it never needs more, and nothing is preempted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.cache import PrefixCaches
from pipeline.sim.kv import reserve
from pipeline.sim.policies.base import Memory, Policy, add_scheduled, admit, positive
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_MAX_SEQS,
    P_FREE,
    P_RUN_N,
    P_STABLE,
    P_WQ_HEAD,
    P_WQ_LEN,
    R_GENERATED,
    R_OUTPUT,
    R_PROMPT,
    State,
    cdiv,
)

CODE = 100  # unique among the registered policies


@dataclass(frozen=True)
class Params:
    max_num_seqs: int = field(default=64, metadata={"help": "most requests running at once"})


class ShortestPromptFirst(Policy):
    name = "spf"
    code = CODE
    summary = "toy: admits the shortest waiting prompt first, whole-sequence KV reservation"
    Params = Params
    reserves_upfront = True  # the loop's decode runs need no block check

    def check(self, params: Any, mem: Memory) -> None:
        positive("max_num_seqs", params.max_num_seqs)

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        return {C_MAX_SEQS: params.max_num_seqs}, {}

    def blocks_alone(
        self,
        params: Any,
        mem: Memory,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        return -(-(prompt + output) // mem.block_size)  # the whole sequence, reserved


POLICY = ShortestPromptFirst()


@njit(error_model="numpy")
def _to_front(s: State, r: int) -> None:
    """Move the waiting request with the shortest prompt to the queue's head, keeping the
    order of the others (the queue is a ring: ``state.wq_*``)."""
    rq, rp, wq = s.rq, s.rp, s.wq
    cap = wq.shape[1]
    head = rp[r, P_WQ_HEAD]
    best = 0
    for k in range(1, rp[r, P_WQ_LEN]):
        if rq[wq[r, (head + k) % cap], R_PROMPT] < rq[wq[r, (head + best) % cap], R_PROMPT]:
            best = k
    chosen = wq[r, (head + best) % cap]
    for k in range(best, 0, -1):
        wq[r, (head + k) % cap] = wq[r, (head + k - 1) % cap]
    wq[r, head] = chosen


@njit(error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    cfg, rq, rp, run, wq = s.cfg, s.rq, s.rp, s.run, s.wq
    rp[r, P_STABLE] = 1  # pure decode steps decide the same until something arrives or ends
    n = 0
    for k in range(rp[r, P_RUN_N]):  # the running requests decode
        n = add_scheduled(s.sched_q, s.sched_t, n, run[r, k], 1)
    n_adm = 0
    while rp[r, P_WQ_LEN] > 0 and rp[r, P_RUN_N] < cfg[C_MAX_SEQS]:
        _to_front(s, r)
        i = wq[r, rp[r, P_WQ_HEAD]]
        need = cdiv(rq[i, R_PROMPT] + rq[i, R_OUTPUT], cfg[C_BLOCK_SIZE])
        if need > rp[r, P_FREE]:
            break  # it waits until enough requests finish
        reserve(rq, rp, r, i, need)
        admit(cfg, rq, s.rqf, rp, run, wq, r)
        n = add_scheduled(s.sched_q, s.sched_t, n, i, rq[i, R_PROMPT] + rq[i, R_GENERATED])
        n_adm += 1
    return n, 0, n_adm
