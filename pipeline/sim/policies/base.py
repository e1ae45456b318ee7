"""What every policy module provides, and the compiled helpers they share.

A policy module holds three things:

- ``Params``: a frozen dataclass of its parameters, named as the engine names
  them, each with a default and a ``help`` text (the scenario loader and the
  CLI read them from here, so a parameter exists in one place);
- a ``Policy`` subclass: validation of those parameters against the memory
  configuration, packing them into the int/float arrays the compiled loop
  reads (``state.C_*``), and how many blocks one request needs on its own;
- ``schedule``: a numba kernel that decides one step for one replica.

The kernel contract (fast loop)::

    schedule(r, cfg, cfgf, rq, rqf, rp, rpf, run, wq, sched_q, sched_t, now, kc)
        -> (num_scheduled, num_preempted, num_admitted)

It fills ``sched_q[:num_scheduled]`` with request indices and ``sched_t`` with
the tokens each computes this step (``add_scheduled``), allocates their KV
blocks, looks admitted requests up in the prefix cache (``rp[r, P_STEP_QUERY]``
and ``P_STEP_HIT`` count the tokens) and commits their computed units to it,
moves admitted requests from the waiting queue to the running list and
preempted ones back to the waiting queue. It must schedule at most
``max_num_seqs`` requests and (where the policy has one) stay within the token
budget. It sets ``rp[r, P_STABLE]`` to 1 when a step of pure decodes would
decide the same again while nothing arrives or finishes (the loop then skips
ahead, see ``loop.py``), to 2 when that holds only as long as no cached block
is evicted, and to 0 otherwise. The loop does the rest: step time, token sampling,
completions, the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import hit_tokens, lookup, units_within
from pipeline.sim.kv import release
from pipeline.sim.state import (
    C_CACHING,
    P_RUN_N,
    P_STEP_HIT,
    P_STEP_QUERY,
    R_CACHED,
    R_COMPUTED,
    R_GENERATED,
    R_LOOKUPS,
    R_PF_END,
    R_PREEMPT,
    R_PROMPT,
    R_STATUS,
    R_UNIT_TOK,
    ST_RUNNING,
    ST_WAITING,
    W_DISCARDED,
    W_HITS,
    cdiv,
    wait_pop,
    wait_requeue,
    wide,
    wq_push_back,
)


@dataclass(frozen=True)
class Memory:
    """The KV-cache configuration of one replica, resolved."""

    block_size: int  # tokens per KV block
    num_gpu_blocks: int  # blocks the engine allocates (given, or derived from GPU memory)
    max_model_len: int  # longest sequence (prompt + output) a request may have


class Policy:
    """Base of the policy descriptions in ``POLICIES``."""

    name: ClassVar[str]
    code: ClassVar[int]  # dispatch code of its kernel in the compiled loop
    summary: ClassVar[str]  # one line for --help and the docs
    Params: ClassVar[type]  # frozen dataclass of its parameters
    block_size: ClassVar[int] = 16  # default tokens per KV block (page size)
    prefix_caching: ClassVar[bool | None] = None  # default; None: not modelled
    dedupe: ClassVar[bool] = False  # a unit cached twice is shared (SGLang, TGI), not kept

    def param_help(self) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(self.Params)}

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in fields(self.Params)}

    def num_blocks(self, mem: Memory, params: Any = None) -> int:
        """Blocks a request can actually use."""
        return mem.num_gpu_blocks

    def queue(self, params: Any) -> int:
        """Waiting-queue discipline (state.Q_FIFO or Q_PRIORITY)."""
        return 0

    def check(self, params: Any, mem: Memory) -> None:
        """Raise ScenarioError if the parameters cannot run (names the key)."""

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        """Entries of the compiled loop's cfg / cfgf arrays (state.C_* / CF_*)."""
        raise NotImplementedError

    def blocks_alone(
        self,
        params: Any,
        mem: Memory,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """Blocks each request needs to run to completion with the replica to itself.

        A request needing more than ``num_blocks`` can never finish: the scenario
        is rejected before it runs.
        """
        total = prompt + output - 1  # tokens whose KV is ever computed
        return -(-total // mem.block_size)


def positive(name: str, value: float, *, zero_ok: bool = False) -> None:
    """Raise ScenarioError unless ``value`` > 0 (or >= 0)."""
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ScenarioError(f"{name} must be {bound}, got {value}")


def fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ScenarioError(f"{name} must be in [0, 1), got {value}")


@njit(cache=True, error_model="numpy", inline="always")
def add_scheduled(
    sched_q: npt.NDArray[np.int64], sched_t: npt.NDArray[np.int64], n: int, i: int, tokens: int
) -> int:
    """Schedule ``tokens`` of request ``i`` as entry n of the step; returns n + 1."""
    sched_q[n] = i
    sched_t[n] = tokens
    return n + 1


@njit(cache=True, error_model="numpy", inline="always")
def num_tokens(rq: npt.NDArray[np.int32], i: int) -> int:
    """Prompt plus tokens generated so far."""
    return int(rq[i, R_PROMPT] + rq[i, R_GENERATED])


@njit(cache=True, error_model="numpy", inline="always")
def in_prefill(rq: npt.NDArray[np.int32], i: int) -> bool:
    """Still computing its prompt (or recomputing after a preemption)."""
    return bool(rq[i, R_COMPUTED] < rq[i, R_PF_END])


@njit(cache=True, error_model="numpy", inline="always")
def start(rq: npt.NDArray[np.int32], i: int) -> None:
    """Mark request i running: it computes up to prompt + generated before it decodes."""
    rq[i, R_STATUS] = ST_RUNNING
    rq[i, R_PF_END] = rq[i, R_PROMPT] + rq[i, R_GENERATED]


@njit(cache=True, error_model="numpy", inline="always")
def take_waiting(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
) -> int:
    """Pop the head of the waiting queue and mark it running (the caller lists it)."""
    i = wait_pop(cfg, wq, rp, rq, rqf, r)
    start(rq, i)
    return i


@njit(cache=True, error_model="numpy", inline="always")
def admit(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
) -> int:
    """Move the head of the waiting queue to the end of the running list."""
    i = take_waiting(cfg, rq, rqf, rp, wq, r)
    run[r, rp[r, P_RUN_N]] = i
    rp[r, P_RUN_N] += 1
    return i


@njit(cache=True, error_model="numpy")
def cache_lookup(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    r: int,
    i: int,
    kc: tuple,  # type: ignore[type-arg]
) -> tuple[int, int]:
    """(cached leading units, their unreferenced blocks) for a request computing from zero.

    At most ``num_tokens - 1`` tokens may hit: the last prompt token is always
    computed, to get the logits (a fully cached, unit-aligned prompt recomputes
    its last unit).
    """
    u = rq[i, R_UNIT_TOK]
    if cfg[C_CACHING] == 0 or u == 0:
        return 0, 0
    return lookup(rq, i, r, units_within(rq, i, num_tokens(rq, i) - 1), kc)


@njit(cache=True, error_model="numpy")
def count_lookup(
    rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int, h: int
) -> None:
    """Record a lookup of request i that found h units (first lookups go to the step's counts)."""
    if rq[i, R_UNIT_TOK] == 0:
        return
    hit = hit_tokens(rq, i, h)
    if rq[i, R_LOOKUPS] == 0:
        rq[i, R_CACHED] = hit
        rp[r, P_STEP_QUERY] += num_tokens(rq, i)
        rp[r, P_STEP_HIT] += hit
    rq[i, R_LOOKUPS] += 1
    wide(rq)[i, W_HITS] += hit


@njit(cache=True, error_model="numpy")
def sort_running(rp: npt.NDArray[np.int64], run: npt.NDArray[np.int64], r: int) -> None:
    """Order the running list by arrival (request index); it is nearly sorted already."""
    for a in range(1, rp[r, P_RUN_N]):
        x = run[r, a]
        b = a - 1
        while b >= 0 and run[r, b] > x:
            run[r, b + 1] = run[r, b]
            b -= 1
        run[r, b + 1] = x


@njit(cache=True, error_model="numpy")
def drop(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    r: int,
    i: int,
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """Recompute preemption of request i: drop its KV and forget its progress."""
    release(rq, rp, r, i, kc)
    wide(rq)[i, W_DISCARDED] += rq[i, R_COMPUTED]
    rq[i, R_COMPUTED] = 0
    rq[i, R_STATUS] = ST_WAITING
    rq[i, R_PREEMPT] += 1


@njit(cache=True, error_model="numpy")
def preempt(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
    rp: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
    i: int,
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """Recompute preemption, back first in line (FCFS) or into the priority heap.

    The caller has already taken ``i`` out of the running list.
    """
    drop(rq, rp, r, i, kc)
    wait_requeue(cfg, wq, rp, rq, rqf, r, i)


@njit(cache=True, error_model="numpy")
def retract(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
    i: int,
    kc: tuple,  # type: ignore[type-arg]
) -> None:
    """SGLang's retraction: a recompute preemption that goes to the back of the queue."""
    drop(rq, rp, r, i, kc)
    wq_push_back(wq, rp, r, i)


def blocks(tokens: int, block_size: int) -> int:
    return int(cdiv(tokens, block_size))


def choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ScenarioError unless ``value`` is one of ``allowed`` (listing them)."""
    if value not in allowed:
        raise ScenarioError(f"unknown {name} {value!r}; allowed: {', '.join(allowed)}")
