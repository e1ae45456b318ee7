"""Paged KV-cache block accounting, shared by every policy of the fast loop.

Each replica has ``num_blocks`` usable blocks of ``block_size`` tokens
(``rp[r, P_FREE]`` of them free); each request holds ``rq[i, R_HELD]``.
Two ways to use them:

- **just in time** (vLLM V1, Sarathi): a request holds
  ``cdiv(tokens, block_size)`` blocks for the tokens whose KV exists (or is being
  computed this step); each step grows it, and a failed grow is what triggers
  a preemption. ``grow`` below.
- **reservation** (Orca, static batching): a request takes the blocks for its
  maximum length when it is admitted and keeps them to the end, so it never
  needs more and is never preempted. ``reserve`` below.

Finishing or preempting a request returns all its blocks (``release``).

# NOTE: prefix caching (blocks shared between requests through chained hashes,
# evictable cached blocks counted as free) will live here too; the policies
# already go through these functions so it can be added without touching them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.state import P_FREE, R_HELD


@njit(cache=True, error_model="numpy")
def blocks_needed(rq: npt.NDArray[np.int64], i: int, num_tokens: int, block_size: int) -> int:
    """Blocks request ``i`` must add to cover ``num_tokens`` tokens."""
    short = num_tokens - rq[i, R_HELD] * block_size  # tokens beyond its blocks
    if short <= 0:
        return 0
    return (short + block_size - 1) // block_size


@njit(cache=True, error_model="numpy")
def grow(
    rq: npt.NDArray[np.int64],
    rp: npt.NDArray[np.int64],
    r: int,
    i: int,
    num_tokens: int,
    block_size: int,
    keep_free: int,
) -> bool:
    """Give request ``i`` blocks for ``num_tokens`` tokens if ``keep_free`` blocks stay free."""
    need = blocks_needed(rq, i, num_tokens, block_size)
    if need + keep_free > rp[r, P_FREE]:
        return False
    rp[r, P_FREE] -= need
    rq[i, R_HELD] += need
    return True


@njit(cache=True, error_model="numpy")
def reserve(
    rq: npt.NDArray[np.int64], rp: npt.NDArray[np.int64], r: int, i: int, num_blocks: int
) -> bool:
    """Reserve ``num_blocks`` for request ``i`` up front; False if they are not free."""
    if num_blocks > rp[r, P_FREE]:
        return False
    rp[r, P_FREE] -= num_blocks
    rq[i, R_HELD] += num_blocks
    return True


@njit(cache=True, error_model="numpy")
def release(rq: npt.NDArray[np.int64], rp: npt.NDArray[np.int64], r: int, i: int) -> None:
    """Return every block of request ``i`` to the free pool."""
    rp[r, P_FREE] += rq[i, R_HELD]
    rq[i, R_HELD] = 0
