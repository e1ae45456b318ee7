"""kv_tiers.replay_hits: what each tier adds to the GPU prefix hits."""

from __future__ import annotations

import random

from pipeline.sim.kv_tiers import DiskTier, num_chunks, replay_hits

BT, BPB = 16, 1000


def _prompts(seed: int, n: int) -> list[tuple[list[bytes], int]]:
    rng = random.Random(seed)
    roots = [[f"s{r}b{b}".encode() for b in range(8)] for r in range(5)]
    out = []
    for i in range(n):
        root = rng.choice(roots)[: rng.randrange(1, 9)]
        tail = [f"q{i}b{b}".encode() for b in range(rng.randrange(0, 4))]
        keys = root + tail
        out.append((keys, len(keys) * BT - rng.randrange(BT)))
    return out


def test_no_tiers_leaves_gpu_hits_alone_and_tiers_only_add() -> None:
    for seed in range(5):
        ps = _prompts(seed, 200)
        off = replay_hits(ps, 10, 0, 0, BT, BPB)
        assert off.cpu_tokens == off.disk_tokens == off.load_bytes == 0
        on = replay_hits(ps, 10, 30, 0, BT, BPB)
        assert on.gpu_tokens == off.gpu_tokens  # the GPU cache does not depend on the CPU's
        assert on.cpu_tokens > 0
        assert on.load_bytes == on.cpu_blocks * BPB
        assert on.cpu_tokens <= on.cpu_blocks * BT
        both = replay_hits(ps, 10, 5, 200, BT, BPB)
        assert both.disk_tokens > 0
        assert both.load_bytes == (both.cpu_blocks + both.disk_blocks) * BPB
        total = sum(len(k) for k, _ in ps) * BT
        assert both.gpu_tokens + both.cpu_tokens + both.disk_tokens <= total


def test_big_cpu_tier_hits_every_repeated_prefix() -> None:
    ps = _prompts(1, 300)
    st = replay_hits(ps, 0, 10**6, 0, BT, BPB)  # no GPU cache at all: every hit is the CPU's
    seen: set[bytes] = set()
    want = 0
    for keys, tokens in ps:
        h = 0
        while h < len(keys) and keys[h] in seen:
            h += 1
        want += min(h * BT, tokens)
        seen.update(keys)
    assert st.gpu_tokens == 0 and st.cpu_tokens == want


def test_disk_tier_lru_and_sizes() -> None:
    d = DiskTier(2)
    d.put([b"a", b"b"])
    assert d.hits([b"a"]) == 1  # a is now newer than b
    d.put([b"c"])
    assert d.hits([b"b"]) == 0 and d.hits([b"a", b"c"]) == 2
    assert num_chunks(8, 2**20, 2) == 4096
    assert num_chunks(1, 5000, 1) == 2**30 // 8192  # a chunk rounded up to a 4 KiB page


def test_disk_tier_keeps_what_the_cpu_tier_evicts() -> None:
    # a CPU tier of at least one offer never refuses a store, so with an unbounded disk below
    # it every offered block stays in one of the two: the same hits as an unbounded CPU tier
    for seed in range(3):
        ps = _prompts(seed, 300)
        big = replay_hits(ps, 6, 10**6, 0, BT, BPB, store_batch_blocks=4)
        two = replay_hits(ps, 6, 4, 10**6, BT, BPB, store_batch_blocks=4)
        assert two.disk_tokens > 0
        assert two.gpu_tokens == big.gpu_tokens
        assert two.cpu_tokens + two.disk_tokens == big.cpu_tokens
        none = replay_hits(ps, 6, 4, 0, BT, BPB, store_batch_blocks=4)
        assert none.cpu_tokens < big.cpu_tokens
