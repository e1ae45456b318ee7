"""Which replicas cache each prefix unit: unit key -> bitset of replicas, over all replicas.

The ``prefix_aware`` router reads it to find the replicas that hold the
longest prefix of a request by walking the request's unit keys once, instead
of looking the request up in every replica's cache; ``cache.py`` keeps it
current on every insert and eviction (``index_add``, ``index_remove``).

``(gk, gb, gn)``, the last three arrays of ``kc``: an open-addressing table
(linear probing, deletion by backward shift, as ``cache.py``'s per-replica
tables) of ``gk`` keys, ``gb`` their replica bitsets (``ceil(R / 64)`` words,
bit r of word r // 64) and ``gn`` how many replicas hold them (0: an empty
entry). A key is in the table while some replica caches it. An index with no
entries (``new_index(R, 0)``) is off: adds and removals do nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

_MIX = np.uint64(0xBF58476D1CE4E5B9)

PrefixIndex = tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]


def new_index(num_replicas: int, max_entries: int) -> PrefixIndex:
    """An empty index for up to ``max_entries`` distinct keys cached at once."""
    words = max(1, -(-num_replicas // 64))
    size = 0 if max_entries <= 0 else 1 << max(4, (2 * max_entries - 1).bit_length())
    gk = np.zeros(size, dtype=np.uint64)
    gb = np.zeros((size, words), dtype=np.uint64)
    gn = np.zeros(size, dtype=np.int64)
    return gk, gb, gn


@njit(cache=True, error_model="numpy", inline="always")
def _home(key: np.uint64, mask: int) -> int:
    return np.int64(((key * _MIX) >> np.uint64(31)) & np.uint64(mask))  # type: ignore[return-value]


@njit(cache=True, error_model="numpy")
def find_key(gk: npt.NDArray[np.uint64], gn: npt.NDArray[np.int64], key: np.uint64) -> int:
    """Entry of ``key`` (its row in ``gb``), or -1 when no replica caches it."""
    if gk.shape[0] == 0:
        return -1
    mask = gk.shape[0] - 1
    j = _home(key, mask)
    while gn[j] != 0:
        if gk[j] == key:
            return int(j)
        j = (j + 1) & mask
    return -1


@njit(cache=True, error_model="numpy")
def index_add(
    gk: npt.NDArray[np.uint64],
    gb: npt.NDArray[np.uint64],
    gn: npt.NDArray[np.int64],
    r: int,
    key: np.uint64,
) -> None:
    """Replica r now caches ``key``."""
    if gk.shape[0] == 0:
        return
    mask = gk.shape[0] - 1
    j = _home(key, mask)
    while gn[j] != 0 and gk[j] != key:
        j = (j + 1) & mask
    if gn[j] == 0:
        gk[j] = key
    gb[j, r // 64] |= np.uint64(1) << np.uint64(r % 64)
    gn[j] += 1


@njit(cache=True, error_model="numpy")
def index_remove(
    gk: npt.NDArray[np.uint64],
    gb: npt.NDArray[np.uint64],
    gn: npt.NDArray[np.int64],
    r: int,
    key: np.uint64,
) -> None:
    """Replica r no longer caches ``key`` (it did)."""
    if gk.shape[0] == 0:
        return
    i = find_key(gk, gn, key)
    gb[i, r // 64] &= ~(np.uint64(1) << np.uint64(r % 64))
    gn[i] -= 1
    if gn[i] > 0:
        return
    mask = gk.shape[0] - 1
    j = i
    while True:  # backward shift: move later entries of the probe run into the hole
        j = (j + 1) & mask
        if gn[j] == 0:
            break
        k = _home(gk[j], mask)
        # leave j where it is if its home lies cyclically in (i, j]
        if (i < j and i < k <= j) or (i > j and (k > i or k <= j)):
            continue
        gk[i] = gk[j]
        gn[i] = gn[j]
        gb[i, :] = gb[j, :]
        i = j
    gn[i] = 0
    gb[i, :] = 0
