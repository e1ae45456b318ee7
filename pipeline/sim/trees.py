"""Segment trees over replicas: O(log R) to change one replica's value, O(1) to read the best.

The multi-replica loop (``loop.py``) and the routers (``routing.py``) use two:

- the **wake tree**: per replica the time it next needs the loop's attention;
  the root holds the smallest time and its replica;
- the **load tree**: per replica its outstanding requests; the root holds the
  smallest count and its replica (lowest index on a tie, as the routers
  break ties) and the largest count.

Both are implicit binary trees in arrays of ``2P`` nodes (P: the power of two
>= R): node 1 is the root, node j has children 2j and 2j + 1, and replica r is
the leaf ``P + r``. Padding leaves hold a time of +inf and a count that never
wins a minimum or a maximum.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit

_NEVER = np.iinfo(np.int64).max // 2  # a padding leaf's count: never the least loaded


class Trees(NamedTuple):
    """Both trees, as the compiled loop takes them."""

    wt: npt.NDArray[np.float64]  # wake tree: times
    wi: npt.NDArray[np.int64]  # wake tree: replica of each node's smallest time
    lmin: npt.NDArray[np.int64]  # load tree: smallest count
    li: npt.NDArray[np.int64]  # load tree: replica of each node's smallest count
    lmax: npt.NDArray[np.int64]  # load tree: largest count


def new_trees(num_replicas: int) -> Trees:
    """Both trees for idle replicas: every time +inf, every count 0."""
    p = 1
    while p < num_replicas:
        p *= 2
    wt = np.full(2 * p, np.inf)
    wi = np.zeros(2 * p, dtype=np.int64)
    lmin = np.full(2 * p, _NEVER, dtype=np.int64)
    li = np.zeros(2 * p, dtype=np.int64)
    lmax = np.full(2 * p, -_NEVER, dtype=np.int64)
    wi[p:] = np.arange(p)
    li[p:] = np.arange(p)
    lmin[p : p + num_replicas] = 0
    lmax[p : p + num_replicas] = 0
    for j in range(p - 1, 0, -1):  # children are equal: the left one (lower index) wins
        wi[j] = wi[2 * j]
        li[j] = li[2 * j]
        lmin[j] = min(lmin[2 * j], lmin[2 * j + 1])
        lmax[j] = max(lmax[2 * j], lmax[2 * j + 1])
    return Trees(wt, wi, lmin, li, lmax)


@njit(cache=True, error_model="numpy", inline="always")
def set_wake(wt: npt.NDArray[np.float64], wi: npt.NDArray[np.int64], r: int, t: float) -> None:
    """Replica r next needs attention at time t."""
    j = wt.shape[0] // 2 + r
    wt[j] = t
    j //= 2
    while j >= 1:
        a = 2 * j
        b = a + 1
        if wt[b] < wt[a]:
            wt[j] = wt[b]
            wi[j] = wi[b]
        else:
            wt[j] = wt[a]
            wi[j] = wi[a]
        j //= 2


@njit(cache=True, error_model="numpy", inline="always")
def set_load(
    lmin: npt.NDArray[np.int64],
    li: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
    r: int,
    n: int,
) -> None:
    """Replica r has n outstanding requests."""
    _set_leaf(lmin, li, lmax, r, n, n)


@njit(cache=True, error_model="numpy", inline="always")
def set_off(
    lmin: npt.NDArray[np.int64], li: npt.NDArray[np.int64], lmax: npt.NDArray[np.int64], r: int
) -> None:
    """Replica r takes no requests (autoscale.py): its leaf is a padding leaf's, which
    never wins a minimum or a maximum, until ``set_load`` gives it a count again."""
    _set_leaf(lmin, li, lmax, r, _NEVER, -_NEVER)


@njit(cache=True, error_model="numpy", inline="always")
def _set_leaf(
    lmin: npt.NDArray[np.int64],
    li: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
    r: int,
    lo: int,
    hi: int,
) -> None:
    """Replica r's leaf holds ``lo`` for the minimum and ``hi`` for the maximum; the
    path to the root is brought up to date."""
    j = lmin.shape[0] // 2 + r
    if lmin[j] == lo and lmax[j] == hi:
        return
    lmin[j] = lo
    lmax[j] = hi
    j //= 2
    while j >= 1:
        a = 2 * j
        b = a + 1
        if lmin[b] < lmin[a]:  # strictly: on a tie the left child, the lower index, wins
            lmin[j] = lmin[b]
            li[j] = li[b]
        else:
            lmin[j] = lmin[a]
            li[j] = li[a]
        lmax[j] = max(lmax[a], lmax[b])
        j //= 2


@njit(cache=True, error_model="numpy", inline="always")
def load_of(lmin: npt.NDArray[np.int64], r: int) -> int:
    """Replica r's count as last set."""
    return int(lmin[lmin.shape[0] // 2 + r])
