"""The policy contract: what a policy module provides, and the compiled helpers they share.

A policy is one module in this package, listed once in the registry
(``MODULES`` in ``policies/__init__.py``). The module holds:

- ``Params``: a frozen dataclass of its parameters, named as the engine names
  them, each with a default and a ``help`` text (the scenario loader and the
  CLI read them from here, so a parameter exists in one place);
- ``POLICY``, an instance of a ``Policy`` subclass: its name, its dispatch
  ``code`` (unique in the registry), its **traits** (class attributes below:
  what the loop must know of its rules), validation of its parameters against
  the memory configuration, packing them into the int/float arrays the
  compiled loop reads (``state.C_*``, ``CF_*``), and how many blocks one
  request needs on its own;
- its **hooks**: numba kernels the loop calls at fixed points of a step. Only
  ``schedule`` is required; a module that does not define a hook gets the
  default below (``policies/dispatch.py`` builds the calls from the registry).

Traits (``Policy`` class attributes; ``Scenario.engine`` packs them into ``cfg``):

- ``reserves_upfront``: a request holds every block it will need from
  admission (Orca's and static batching's max-length reservation), so a run
  of decode steps never runs out of blocks;
- ``append_slot``: every decode needs a free block before it, even one that
  does not start a new block (Sarathi's ``can_append_slot``);
- ``caches_generated``: the prefix cache also holds full blocks of generated
  tokens, committed as they are computed (vLLM); otherwise prompts only;
- ``caches_on_finish``: a prompt is cached when its request finishes (TGI),
  not as it is computed;
- ``dedupe``: a unit cached twice is shared (SGLang, TGI), not kept as a
  second copy (vLLM);
- ``prefix_caching``, ``block_size``: the engine's defaults.

Hooks (every kernel takes the loop's state record ``s`` (``state.State``),
the prefix caches ``kc`` (``cache.PrefixCaches``) where it needs them, and
the replica ``r``)::

    schedule(s, kc, r, now) -> (num_scheduled, num_preempted, num_admitted)

decides one step for one replica. It fills ``s.sched_q[:num_scheduled]``
with request indices and ``s.sched_t`` with the tokens each computes this
step (``add_scheduled``), allocates their KV blocks, looks admitted requests
up in the prefix cache (``rp[r, P_STEP_QUERY]`` and ``P_STEP_HIT`` count the
tokens) and commits their computed units to it, moves admitted requests from
the waiting queue to the running list and preempted ones back to the waiting
queue. It must schedule at most ``max_num_seqs`` requests and (where the
policy has one) stay within the token budget. It sets ``rp[r, P_STABLE]`` to
1 when a step of pure decodes would decide the same again while nothing
arrives or finishes (the loop then skips ahead, see ``loop.py``), or'ed with
``STABLE_NO_EVICT`` when that holds only as long as no cached block is
evicted and ``STABLE_UNTIL_STORE`` when it holds only until a step stores a
unit to a KV offloading tier, and to 0 otherwise.
The loop does the rest: step time, token sampling, completions, the timeline.

    ready_at(s, r, clock) -> float

when an idle replica (nothing running, requests waiting) starts its next step;
default ``clock`` (at once). Static batching waits for a full batch or a timer.

    on_decode_run(s, r, steps) -> None

after the loop applied ``steps`` more identical decode steps in one move
(``schedule`` decided the first): per-step bookkeeping the policy keeps
(SGLang's new_token_ratio decay, TGI's waiting tokens); default nothing.

    on_finished(s, r, done, done_decoding) -> None

after a step finished ``done`` requests (``done_decoding`` of them with a
decode) and the loop released them; default nothing.

    attention(p_tok, d, kv_all, ctx, pairs) -> float

the step's attention feature A for the cost model, given its prefill tokens,
decodes, the KV of every scheduled sequence after the step, the decode
context, and the causal pairs of its prefill chunks (the default: ``pairs``).
The ``transformers`` policy counts A over its packed batch.

A policy needs nothing else of the loop: no branch of ``loop.py`` names one.
``tests/sim/test_toy_policy.py`` adds a policy (shortest prompt first) in
one file and registers it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import PrefixCaches, hit_tokens, lookup, units_within
from pipeline.sim.kv import release
from pipeline.sim.state import (
    C_APPEND_SLOT,
    C_CACHES_GENERATED,
    C_CACHES_ON_FINISH,
    C_CACHING,
    C_RESERVES_UPFRONT,
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
    State,
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
    # traits (the module docstring): what the loop must know of the policy's rules
    reserves_upfront: ClassVar[bool] = False  # every block a request needs, from admission
    append_slot: ClassVar[bool] = False  # each decode needs a free block before it
    caches_generated: ClassVar[bool] = False  # generated tokens' full blocks are cached too
    caches_on_finish: ClassVar[bool] = False  # a prompt is cached when its request ends

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
        need = prompt + output  # one temporary, worked in place (millions of requests)
        need += mem.block_size - 2  # prompt + output - 1 tokens' KV is ever computed (>= 1)
        need //= mem.block_size  # their blocks, rounded up
        return need

    def traits(self) -> dict[int, int]:
        """The traits as entries of the compiled loop's cfg array."""
        return {
            C_RESERVES_UPFRONT: int(self.reserves_upfront),
            C_APPEND_SLOT: int(self.append_slot),
            C_CACHES_GENERATED: int(self.caches_generated),
            C_CACHES_ON_FINISH: int(self.caches_on_finish),
        }


# --- the default hooks (the module docstring) ------------------------------------


@njit(cache=True, error_model="numpy", inline="always")
def ready_at(s: State, r: int, clock: float) -> float:
    """An idle replica with requests waiting starts its next step at once."""
    return clock


@njit(cache=True, error_model="numpy", inline="always")
def on_decode_run(s: State, r: int, steps: int) -> None:
    """Nothing to keep per decode step."""


@njit(cache=True, error_model="numpy", inline="always")
def on_finished(s: State, r: int, done: int, done_decoding: int) -> None:
    """Nothing to do when requests finish."""


@njit(cache=True, error_model="numpy", inline="always")
def attention(p_tok: float, d: float, kv_all: float, ctx: float, pairs: float) -> float:
    """Attention counts the causal (query, key) pairs of the prefill chunks."""
    return pairs


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
    kc: PrefixCaches,
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
    kc: PrefixCaches,
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
    kc: PrefixCaches,
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
    kc: PrefixCaches,
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
