"""vLLM's CPU offloading manager and ``kv_tiers.HostTier``, operation by operation.

Both get the same random sequence of requests storing, completing, looking up,
loading and touching chunk keys (a request's keys are a prefix of one of a few
shared prompts, with their end-token positions, as vLLM's scheduler records
them); after every operation what ``prepare_store`` returned (stored keys,
evicted keys, or no room) and every key's lookup result must be equal.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed: pip install --no-deps vllm==0.33.0 (scripts/test.sh does it)",
        allow_module_level=True,
    )

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from pipeline.sim.kv_tiers import Hit, HostTier, Request

_HIT = {
    LookupResult.MISS: Hit.MISS,
    LookupResult.HIT: Hit.HIT,
    LookupResult.HIT_PENDING: Hit.PENDING,
}
CHUNK_TOKENS = 16


def _prompts(rng: random.Random, n: int, length: int) -> list[list[bytes]]:
    """Chunk keys of ``n`` prompts that share leading chunks with each other."""
    out: list[list[bytes]] = []
    for p in range(n):
        base = out[rng.randrange(len(out))] if out else []
        share = rng.randrange(len(base) + 1)
        keys = base[:share] + [
            make_offload_key(f"p{p}c{c}".encode(), 0) for c in range(share, length)
        ]
        out.append(keys)
    return out


def _run(seed: int, num_chunks: int, ops: int) -> tuple[int, int]:
    rng = random.Random(seed)
    ours, theirs = HostTier(num_chunks), CPUOffloadingManager(num_chunks=num_chunks)
    prompts = _prompts(rng, 6, 12)
    live: list[tuple[Request, ReqContext, list[bytes]]] = []
    pending: list[list[bytes]] = []  # stores in flight
    loading: list[list[bytes]] = []  # loads in flight
    all_keys = sorted({k for p in prompts for k in p})
    stores = evictions = 0
    for step in range(ops):
        op = rng.random()
        if op < 0.15 or not live:
            keys = rng.choice(prompts)[: rng.randrange(1, 13)]
            ctx = ReqContext(req_id=f"r{step}")
            req = Request(rid=f"r{step}")
            for i, k in enumerate(keys):
                ctx.set_offload_key_position(k, (i + 1) * CHUNK_TOKENS)
                req.positions[k] = (i + 1) * CHUNK_TOKENS
            theirs.on_new_request(ctx)
            live.append((req, ctx, keys))
        elif op < 0.5:
            req, ctx, keys = rng.choice(live)
            lo = rng.randrange(len(keys))
            batch = keys[lo : rng.randrange(lo + 1, len(keys) + 1)]
            got = ours.prepare_store(batch, req)
            out = theirs.prepare_store(batch, ctx)
            want = None if out is None else (list(out.keys_to_store), list(out.evicted_keys))
            assert got == want, f"seed {seed} op {step}: prepare_store {got} != vLLM {want}"
            if got is not None and got[0]:
                pending.append(got[0])
                stores += len(got[0])
                evictions += len(got[1])
        elif op < 0.7 and pending:
            batch = pending.pop(rng.randrange(len(pending)))
            ok = rng.random() < 0.9
            ours.complete_store(batch, success=ok)
            theirs.complete_store(batch, ctx, success=ok)
        elif op < 0.85:
            req, ctx, keys = rng.choice(live)
            n = ours.hits(keys)
            if n:
                batch = keys[:n]
                ours.prepare_load(batch, req)
                theirs.prepare_load(batch, ctx)
                loading.append(batch)
        elif op < 0.93 and loading:
            batch = loading.pop(rng.randrange(len(loading)))
            ours.complete_load(batch)
            theirs.complete_load(batch, ctx)
        else:
            req, ctx, keys = rng.choice(live)
            batch = keys[: rng.randrange(1, len(keys) + 1)]
            ours.touch(batch)
            theirs.touch(batch, ctx)
        for k in all_keys:
            assert ours.lookup(k) is _HIT[theirs.lookup(k, ctx)], f"seed {seed} op {step}: {k!r}"
        if rng.random() < 0.05 and len(live) > 1:
            live.pop(0)
    return stores, evictions


@pytest.mark.parametrize("num_chunks", [0, 3, 8, 20])
def test_host_tier_matches_vllm_cpu_offloading_manager(num_chunks: int) -> None:
    runs = [_run(seed, num_chunks, 400) for seed in range(8)]
    if num_chunks:  # the sequences exercised what they are meant to: stores and evictions
        assert sum(s for s, _ in runs) > 0
        assert sum(e for _, e in runs) > 0
