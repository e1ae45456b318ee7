"""Chained prefix block hashes: vLLM's layout, full blocks only, chaining, salts."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.hashing import (
    block_digests,
    digests_to_uint64,
    none_hash,
    prefix_hashes,
)

TOKENS = list(range(1000, 1100))


def test_full_blocks_only() -> None:
    assert len(prefix_hashes(TOKENS[:15], 16)) == 0
    assert len(prefix_hashes(TOKENS[:16], 16)) == 1
    assert len(prefix_hashes(TOKENS[:47], 16)) == 2
    assert len(prefix_hashes(TOKENS[:48], 16)) == 3
    assert len(prefix_hashes([], 16)) == 0
    h = prefix_hashes(TOKENS, 16)
    assert h.dtype == np.uint64 and len(h) == 100 // 16


def test_trailing_partial_block_does_not_matter() -> None:
    a = prefix_hashes(TOKENS[:40], 16)
    b = prefix_hashes(TOKENS[:32] + [7, 7, 7], 16)
    assert a.tolist() == b.tolist()


def test_chaining_change_in_block_i_changes_i_and_after_only() -> None:
    base = prefix_hashes(TOKENS, 16).tolist()
    for block in range(len(base)):
        changed = list(TOKENS)
        changed[block * 16 + 5] += 1
        h = prefix_hashes(changed, 16).tolist()
        assert h[:block] == base[:block]
        assert all(x != y for x, y in zip(h[block:], base[block:], strict=True))


def test_same_block_at_another_position_hashes_differently() -> None:
    block = TOKENS[:16]
    h = prefix_hashes(block + block, 16).tolist()
    assert h[0] != h[1]


def test_salts_change_every_hash_and_only_touch_the_first_block() -> None:
    plain = prefix_hashes(TOKENS, 16).tolist()
    for kw in ({"hash_salt": "s3cret"}, {"cache_salt": "tenant-a"}):
        salted = prefix_hashes(TOKENS, 16, **kw).tolist()
        assert all(x != y for x, y in zip(salted, plain, strict=True))
    # an empty salt is no salt (vLLM skips a falsy cache_salt)
    assert prefix_hashes(TOKENS, 16, cache_salt="", hash_salt="").tolist() == plain
    # the salt is an extra key of block 0 only: blocks after it just chain
    d = block_digests(TOKENS, 16, hash_salt="x")
    second = hashlib.sha256(pickle.dumps((d[0], tuple(TOKENS[16:32]), None), protocol=5))
    assert d[1] == second.digest()
    # different salts give different hashes
    assert (
        prefix_hashes(TOKENS, 16, hash_salt="a").tolist()
        != prefix_hashes(TOKENS, 16, hash_salt="b").tolist()
    )


def test_deterministic_and_pinned() -> None:
    assert prefix_hashes(TOKENS, 16).tolist() == prefix_hashes(list(TOKENS), 16).tolist()
    # pinned: a change here means every stored prefix hash changes meaning
    assert [hex(x) for x in prefix_hashes(list(range(32)), 16).tolist()] == [
        "0x6ec84ae048faaaa6",
        "0xafe70601eeca92c8",
    ]


def test_matches_vllm_sha256_layout() -> None:
    """sha256(pickle((parent, block, extra_keys))), NONE_HASH as with PYTHONHASHSEED=0."""
    seed_hash = hashlib.sha256(pickle.dumps("0", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert none_hash() == seed_hash
    parent = seed_hash
    expected = []
    for b in range(3):
        block = tuple(TOKENS[b * 16 : (b + 1) * 16])
        extra = ("salt",) if b == 0 else None
        parent = hashlib.sha256(
            pickle.dumps((parent, block, extra), protocol=pickle.HIGHEST_PROTOCOL)
        ).digest()
        expected.append(parent)
    assert block_digests(TOKENS[:48], 16, cache_salt="salt") == expected
    # the uint64 is vLLM's int conversion for KV events: low 64 bits of the big-endian int
    assert prefix_hashes(TOKENS[:48], 16, cache_salt="salt").tolist() == [
        int.from_bytes(d, "big") & (2**64 - 1) for d in expected
    ]


def test_numpy_input_hashes_like_python_ints() -> None:
    arr = np.asarray(TOKENS, dtype=np.int64)
    assert prefix_hashes(arr, 16).tolist() == prefix_hashes(TOKENS, 16).tolist()


def test_block_size_changes_the_blocks() -> None:
    assert len(prefix_hashes(TOKENS, 32)) == 3
    assert prefix_hashes(TOKENS, 32)[0] != prefix_hashes(TOKENS, 16)[0]


def test_digests_to_uint64_empty() -> None:
    assert digests_to_uint64([]).dtype == np.uint64


@settings(max_examples=60, deadline=None)
@given(
    common=st.lists(st.integers(0, 50_000), max_size=80),
    tail_a=st.lists(st.integers(0, 50_000), max_size=40),
    tail_b=st.lists(st.integers(0, 50_000), max_size=40),
    bs=st.sampled_from([1, 4, 16]),
)
def test_equal_leading_hashes_iff_equal_prefix(
    common: list[int], tail_a: list[int], tail_b: list[int], bs: int
) -> None:
    a, b = common + tail_a, common + tail_b
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    ha, hb = prefix_hashes(a, bs).tolist(), prefix_hashes(b, bs).tolist()
    equal = 0
    while equal < min(len(ha), len(hb)) and ha[equal] == hb[equal]:
        equal += 1
    assert equal == min(shared // bs, len(ha), len(hb))
