"""Simulator state as struct-of-arrays: one row per request, one row per replica.

The fast loop (``loop.py``) is compiled with numba, so its state is a handful of
plain numpy arrays addressed by the column constants below, not Python objects:

    rq[i, R_*]   int64 state of request i (its lengths, where it is, what it has computed)
    rqf[i, F_*]  float64 times of request i (seconds from replay start; NaN = not yet)
    rp[r, P_*]   int64 state of replica r (batch size, waiting queue, free KV blocks, ...)
    rpf[r, Q_*]  float64 clock of replica r
    run[r, :]    the running list of replica r, in admission order (rp[r, P_RUN_N] entries)
    wq[r, :]     the waiting queue of replica r, a ring buffer that can also push at the front
    st, stf      the step timeline: one row per step or run of identical decode steps

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

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

# --- rq: int64 per request -------------------------------------------------
R_PROMPT = 0  # prompt tokens
R_OUTPUT = 1  # output tokens to generate (after every cap), >= 1
R_REPLICA = 2  # replica it was routed to (-1 before arrival)
R_STATUS = 3  # ST_* below
R_COMPUTED = 4  # tokens whose KV is computed (num_computed_tokens)
R_GENERATED = 5  # output tokens sampled so far
R_HELD = 6  # KV blocks it holds
R_PF_END = 7  # num_tokens when it was last admitted: computed < this means "in prefill"
R_PREEMPT = 8  # times preempted
R_CHUNKS = 9  # steps that computed part of its prompt
R_QDEPTH = 10  # waiting requests on its replica when it arrived
R_TOTAL = 11  # tokens computed over its life, recomputation included
R_DISCARDED = 12  # computed tokens thrown away by preemptions (recomputed later)
NRQ = 13

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

# --- rp: int64 per replica ---------------------------------------------------
P_RUN_N = 0  # requests in the running list
P_WQ_HEAD = 1  # ring-buffer head of the waiting queue
P_WQ_LEN = 2  # waiting requests (queue depth)
P_FREE = 3  # free KV blocks
P_STEP = 4  # steps taken so far
P_ROUTED = 5  # requests routed to it
P_DONE = 6  # requests finished
P_LAST_DONE = 7  # requests finished at the end of its latest step (row)
NRP = 8

Q_CLOCK = 0  # earliest start of its next step (end of the previous one, or an arrival)
Q_LAST_END = 1  # end of its latest step
NRPF = 2

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
NST = 9
SF_START = 0
SF_DURATION = 1
NSTF = 2

# --- cfg: int64 engine configuration handed to the compiled loop -------------
C_POLICY = 0  # policy code (policies/*.py CODE)
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
NCFG = 11
CF_MAX_WAIT_S = 0  # static: longest the oldest request waits for a batch to fill
NCFGF = 1


@njit(cache=True, error_model="numpy")
def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@njit(cache=True, error_model="numpy")
def wq_push_back(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int) -> None:
    cap = wq.shape[1]
    wq[r, (rp[r, P_WQ_HEAD] + rp[r, P_WQ_LEN]) % cap] = i
    rp[r, P_WQ_LEN] += 1


@njit(cache=True, error_model="numpy")
def wq_push_front(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int) -> None:
    cap = wq.shape[1]
    head = (rp[r, P_WQ_HEAD] - 1) % cap
    wq[r, head] = i
    rp[r, P_WQ_HEAD] = head
    rp[r, P_WQ_LEN] += 1


@njit(cache=True, error_model="numpy")
def wq_peek(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int) -> int:
    return int(wq[r, rp[r, P_WQ_HEAD]])


@njit(cache=True, error_model="numpy")
def wq_pop_front(wq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int) -> int:
    i = int(wq[r, rp[r, P_WQ_HEAD]])
    rp[r, P_WQ_HEAD] = (rp[r, P_WQ_HEAD] + 1) % wq.shape[1]
    rp[r, P_WQ_LEN] -= 1
    return i


@dataclass(frozen=True)
class SimInput:
    """The requests one scenario replays, sorted by arrival."""

    arrival_s: npt.NDArray[np.float64]  # seconds from replay start, non-decreasing
    prompt_tokens: npt.NDArray[np.int64]  # >= 1
    output_tokens: npt.NDArray[np.int64]  # >= 1, every cap applied

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        assert len(self.prompt_tokens) == n and len(self.output_tokens) == n
        assert n == 0 or bool(np.all(np.diff(self.arrival_s) >= 0)), "arrivals must be sorted"

    def __len__(self) -> int:
        return len(self.arrival_s)


@dataclass(frozen=True)
class EngineConfig:
    """What the loops need of a scenario: the packed engine configuration and step cost."""

    cfg: npt.NDArray[np.int64]  # indexed by C_*
    cfgf: npt.NDArray[np.float64]  # indexed by CF_*
    cost: npt.NDArray[np.float64]  # StepCost.as_array()

    def get(self, index: int) -> int:
        return int(self.cfg[index])


@dataclass
class SimResult:
    """What one replay produced: per-request outcomes and the step timeline."""

    rq: npt.NDArray[np.int64]  # [n, NRQ]
    rqf: npt.NDArray[np.float64]  # [n, NRQF]
    st: npt.NDArray[np.int64]  # [rows, NST]
    stf: npt.NDArray[np.float64]  # [rows, NSTF]
    num_kv_blocks: int  # usable blocks per replica

    @property
    def num_requests(self) -> int:
        return int(self.rq.shape[0])

    @property
    def num_steps(self) -> int:
        """Engine steps over all replicas (a compressed row counts its steps)."""
        return int(self.st[:, S_NUM_STEPS].sum())
