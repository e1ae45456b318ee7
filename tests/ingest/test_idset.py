"""The dedupe id set against a Python set (the slow reference), block after block."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.idset import IdSet

_KEYS = st.lists(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 40), max_size=60), max_size=12)


def _reference(blocks: list[list[int]]) -> list[list[bool]]:
    seen: set[int] = set()
    out = []
    for block in blocks:
        flags = []
        for k in block:
            flags.append(k in seen)
            seen.add(k)
        out.append(flags)
    return out


@settings(max_examples=200, deadline=None)
@given(_KEYS)
def test_add_reports_what_was_there_like_a_python_set(blocks: list[list[int]]) -> None:
    s = IdSet()
    got = [s.add(np.asarray(b, dtype=np.uint64)).tolist() for b in blocks]
    assert got == _reference(blocks)
    assert len(s) == len({k for b in blocks for k in b})


def test_many_blocks_merge_levels_and_keep_every_key() -> None:
    rng = np.random.default_rng(7)
    s = IdSet()
    all_keys = rng.integers(0, 2**63, size=200_000, dtype=np.uint64)
    for part in np.array_split(all_keys, 37):
        assert not s.add(part).any()
    assert len(s) == len(np.unique(all_keys))
    again = s.add(all_keys[::1000])
    assert again.all()
    zero = s.add(np.asarray([0, 0, 2**64 - 1], dtype=np.uint64))
    assert zero.tolist() == [False, True, False]


def test_repeats_across_blocks_while_the_filter_grows() -> None:
    """Ids seen blocks ago, in a set whose bit filter is rebuilt larger several times."""
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 2**64 - 1, size=150_000, dtype=np.uint64, endpoint=True)
    blocks = [pool[rng.integers(0, len(pool), size=5_000)] for _ in range(50)]
    s = IdSet()
    s.REBUILD_KEYS = 777  # the rebuild marks the keys in many slices
    got = [s.add(b).tolist() for b in blocks]
    assert got == _reference([b.tolist() for b in blocks])
    assert s._bits > IdSet.MIN_FILTER_BITS
