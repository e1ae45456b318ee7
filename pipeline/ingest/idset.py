"""A set of 64-bit id hashes with a vectorised "insert, and tell me which were there".

Dedupe touches every record, so the set is a few sorted numpy arrays (a
log-structured merge: each array at most half the size of the one before it),
looked up with ``searchsorted`` a block of keys at a time: 8 bytes per id (16
while two arrays merge) and tens of nanoseconds per lookup, where a Python set
costs ~70 bytes and a microsecond.

A bit filter in front of the arrays (a one-hash Bloom filter, 16-32 bits an id)
answers "certainly new" for almost every key of a fresh id, so ``searchsorted``
(cache misses in arrays of millions) runs for the few keys whose bit is set:
0.10 -> 0.06 s of CPU for 1M ids in blocks of 24k, 1.2 -> 0.5 s for 5M, for 2-4 more
bytes an id (peak RSS of a 5M ingest +19 MB; the filter is rebuilt larger a slice
of keys at a time, as marking all at once cost ~100 MB of temporaries).

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

    MIN_FILTER_BITS = 16  # log2 of the filter's size in bits, at the start
    BITS_PER_KEY = 16  # the filter grows to keep at least this many bits per key
    REBUILD_KEYS = 1 << 18  # keys marked at a time when the filter is rebuilt larger

    def __init__(self) -> None:
        self._levels: list[npt.NDArray[np.uint64]] = []  # sorted, sizes decreasing
        self._n = 0
        self._bits = self.MIN_FILTER_BITS
        self._filter = np.zeros(1 << (self._bits - 3), dtype=np.uint8)

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
        byte, bit = self._slots(sk)
        if self._levels:
            maybe = np.flatnonzero(self._filter[byte] & bit)  # the others are certainly new
            if len(maybe):
                cand = sk[maybe]
                hit = np.zeros(len(cand), dtype=np.bool_)
                for level in self._levels:
                    pos = np.searchsorted(level, cand)
                    np.minimum(pos, len(level) - 1, out=pos)
                    hit |= level[pos] == cand
                seen[maybe] |= hit
        present = np.empty(n, dtype=np.bool_)
        present[order] = seen
        fresh = ~seen
        if fresh.any():
            self._push(sk[fresh], byte[fresh], bit[fresh])
        return present

    def _slots(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint8]]:
        """Byte and bit of each key in the filter: the key's top bits (hashes are uniform)."""
        pos = keys >> np.uint64(64 - self._bits)
        return (pos >> np.uint64(3)).astype(np.intp), np.left_shift(
            np.uint8(1), (pos & np.uint64(7)).astype(np.uint8)
        )

    def _mark(self, byte: npt.NDArray[np.intp], bit: npt.NDArray[np.uint8]) -> None:
        """Set the bits of sorted keys (the bits of one byte ORed together first)."""
        first = np.flatnonzero(np.diff(byte, prepend=-1))
        self._filter[byte[first]] |= np.bitwise_or.reduceat(bit, first)

    def _push(
        self, new: npt.NDArray[np.uint64], byte: npt.NDArray[np.intp], bit: npt.NDArray[np.uint8]
    ) -> None:
        """Add sorted new keys (``byte`` and ``bit``: their filter slots), merging levels so
        that each is over twice the size of the next."""
        self._n += len(new)
        if self._n * self.BITS_PER_KEY > 1 << self._bits:  # grow: rebuild from every key
            self._bits = (self._n * self.BITS_PER_KEY).bit_length()
            self._filter = np.zeros(1 << (self._bits - 3), dtype=np.uint8)
            for level in self._levels:
                for part in range(0, len(level), self.REBUILD_KEYS):  # bounded temporaries
                    self._mark(*self._slots(level[part : part + self.REBUILD_KEYS]))
            byte, bit = self._slots(new)
        self._mark(byte, bit)
        levels = self._levels
        levels.append(new)
        while len(levels) > 1 and len(levels[-2]) <= 2 * len(levels[-1]):
            b = levels.pop()
            a = levels.pop()
            merged = np.concatenate([a, b])
            merged.sort(kind="stable")  # two sorted runs: a linear merge
            levels.append(merged)
