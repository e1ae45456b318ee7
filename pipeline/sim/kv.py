"""Paged KV-cache block accounting, shared by every policy of the fast loop.

Each replica has ``num_blocks`` usable blocks of ``block_size`` tokens. A
request holds ``rq[i, R_HELD]`` blocks privately plus ``rq[i, R_SHARED]``
through prefix-cache units it references (``cache.py``); the replica has
``rp[r, P_FREE]`` blocks holding nothing and ``rp[r, P_EVICTABLE]`` in cached
units nobody references, which an allocation may evict. Two ways to use them:

- **just in time** (vLLM V1, Sarathi, SGLang): a request holds
  ``cdiv(tokens, block_size)`` blocks for the tokens whose KV exists (or is being
  computed this step); each step grows it, and a failed grow is what triggers
  a preemption (or a retraction). ``grow`` below.
- **reservation** (Orca, static batching, TGI): a request takes the blocks for
  its maximum length when it is admitted and keeps them to the end, so it never
  needs more and is never preempted. ``reserve`` and ``grow`` below.

Finishing or preempting a request returns its private blocks to the free pool
and its cache units to the LRU queue (``release``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.cache import PrefixCaches, capacity, release_units, take
from pipeline.sim.state import P_FREE, R_HELD, R_SHARED


@njit(cache=True, error_model="numpy", inline="always")
def blocks_needed(rq: npt.NDArray[np.int32], i: int, num_tokens: int, block_size: int) -> int:
    """Blocks request ``i`` must add to cover ``num_tokens`` tokens."""
    short = num_tokens - (rq[i, R_HELD] + rq[i, R_SHARED]) * block_size  # tokens beyond its blocks
    if short <= 0:
        return 0
    return (short + block_size - 1) // block_size


@njit(cache=True, error_model="numpy", inline="always")
def grow(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    r: int,
    i: int,
    num_tokens: int,
    block_size: int,
    keep_free: int,
    kc: PrefixCaches,
) -> bool:
    """Give request ``i`` blocks for ``num_tokens`` tokens if ``keep_free`` blocks stay free."""
    need = blocks_needed(rq, i, num_tokens, block_size)
    if need == 0:
        return True
    if need + keep_free > capacity(rp, r):
        return False
    take(rp, r, need, kc)
    rq[i, R_HELD] += need
    return True


@njit(cache=True, error_model="numpy", inline="always")
def reserve(
    rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int, num_blocks: int
) -> bool:
    """Reserve ``num_blocks`` for request ``i`` up front; False if they are not free."""
    if num_blocks > rp[r, P_FREE]:
        return False
    rp[r, P_FREE] -= num_blocks
    rq[i, R_HELD] += num_blocks
    return True


@njit(cache=True, error_model="numpy", inline="always")
def release(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    r: int,
    i: int,
    kc: PrefixCaches,
) -> None:
    """Return request ``i``'s private blocks to the free pool and its cache units to the LRU."""
    rp[r, P_FREE] += rq[i, R_HELD]
    rq[i, R_HELD] = 0
    release_units(rq, rp, i, r, kc)
