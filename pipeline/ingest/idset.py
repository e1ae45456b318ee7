"""A set of 64-bit id hashes with a vectorised "insert, and tell me which were there".

Dedupe touches every record, so the set is a few sorted numpy arrays (a
log-structured merge: each array at most half the size of the one before it),
looked up with ``searchsorted`` a block of keys at a time: 8 bytes per id (16
while two arrays merge) and tens of nanoseconds per lookup, where a Python set
costs ~70 bytes and a microsecond.

NOTE: it was a numba hash table before; loading that compiled function cost
0.7-1.5 s per ingest process (numba pulls in scipy.linalg on first use), more
than all the lookups of a million-record log.

Two different ids colliding in 64 bits is vanishingly unlikely (about 1 in
3e7 for a billion ids); such a pair would be counted as a duplicate.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class IdSet:
    """Set of uint64 hashes; ``add`` returns which of the given keys were already in it."""

    def __init__(self) -> None:
        self._levels: list[npt.NDArray[np.uint64]] = []  # sorted, sizes decreasing
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Insert ``keys``; True where a key was present before (or earlier in ``keys``)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        n = len(keys)
        if not n:
            return np.zeros(0, dtype=np.bool_)
        order = np.argsort(keys)  # ~6x faster than a stable sort; enough without repeats
        sk = keys[order]
        seen = np.empty(n, dtype=np.bool_)
        seen[0] = False
        np.equal(sk[1:], sk[:-1], out=seen[1:])
        if seen.any():  # repeats within keys: equal keys must keep their order (first one wins)
            order = np.argsort(keys, kind="stable")
            sk = keys[order]
            np.equal(sk[1:], sk[:-1], out=seen[1:])
        for level in self._levels:
            pos = np.searchsorted(level, sk)
            np.minimum(pos, len(level) - 1, out=pos)
            seen |= level[pos] == sk
        present = np.empty(n, dtype=np.bool_)
        present[order] = seen
        new = sk[~seen]
        if len(new):
            self._push(new)
        return present

    def _push(self, new: npt.NDArray[np.uint64]) -> None:
        """Add sorted new keys, merging levels so that each is over twice the size of the next."""
        self._n += len(new)
        levels = self._levels
        levels.append(new)
        while len(levels) > 1 and len(levels[-2]) <= 2 * len(levels[-1]):
            b = levels.pop()
            a = levels.pop()
            merged = np.concatenate([a, b])
            merged.sort(kind="stable")  # two sorted runs: a linear merge
            levels.append(merged)
