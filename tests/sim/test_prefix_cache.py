"""Prefix caching, block-size bridging, priority and prefix-aware routing on hand-checked cases.

Every step costs 1 s (``UNIT_COST``) unless said otherwise; prompts share
prefixes through explicit hash lists (one hash per full trace block).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contracts import REQUESTS
from pipeline.errors import ScenarioError
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.sim.prefix import build_keys, extend_keys
from pipeline.sim.reference import simulate_reference
from pipeline.sim.reference_kv import PrefixCache
from pipeline.sim.replay_input import prepare, read_requests
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CACHED,
    R_LOOKUPS,
    R_PREEMPT,
    R_REPLICA,
    S_EVICTED,
    S_KV_USED,
    S_PHIT,
    S_PQUERY,
    S_PREFILL,
    W_HITS,
    PrefixKeys,
    SimInput,
    SimResult,
)
from pipeline.sim.summary import summarize
from pipeline.warehouse import Warehouse
from tests.helpers import chain, make_input, make_scenario, with_prefix


def run_both(inp: SimInput, sc: Scenario) -> SimResult:
    fast = simulate(inp, sc.engine())
    ref = simulate_reference(inp, sc)
    assert np.array_equal(fast.rq, ref.rq)
    assert np.allclose(fast.rqf, ref.rqf, rtol=1e-9, atol=1e-12, equal_nan=True)
    return fast


@pytest.mark.parametrize(("prompt", "hit"), [(1000, 992), (1024, 1008)])
def test_vllm_worked_example_a_full_hit_recomputes_the_last_block(prompt: int, hit: int) -> None:
    # SCHEDULERS.md 1.4: L = 1000 hits 62 blocks; L = 1024 hits 63 and recomputes 16 tokens
    sc = make_scenario("vllm", max_model_len=2048, num_gpu_blocks=1000)
    hashes = [chain(*range(prompt // 16))] * 2
    inp = with_prefix(make_input([0.0, 10.0], [prompt, prompt], [2, 2]), hashes, 16, 16)
    res = run_both(inp, sc)
    assert res.rq[:, R_CACHED].tolist() == [0, hit]
    assert res.st[res.st[:, S_PREFILL] > 0, S_PREFILL].tolist() == [prompt, prompt - hit]


def test_vllm_commits_at_schedule_time_so_the_same_step_can_hit() -> None:
    sc = make_scenario("vllm", max_num_batched_tokens=1024, num_gpu_blocks=1000)
    inp = with_prefix(make_input([0.0, 0.0], [160, 160], [2, 2]), [chain(*range(10))] * 2, 16, 16)
    res = run_both(inp, sc)
    assert res.rq[:, R_CACHED].tolist() == [0, 144]  # 9 of its 10 blocks: the last is computed
    assert res.rqf[:, F_FIRST_TOKEN].tolist() == [1.0, 1.0]
    assert res.st[0, S_PREFILL] == 160 + 16  # hits are not charged to the budget
    assert (res.st[0, S_PQUERY], res.st[0, S_PHIT]) == (320, 144)


@pytest.mark.parametrize(("policy", "hit"), [("vllm", 144), ("sglang", 0), ("tgi", 0)])
def test_when_a_request_can_hit_what_another_computes(policy: str, hit: int) -> None:
    # vLLM commits at schedule time; SGLang inserts after the step; TGI at the end
    params = {"vllm": {"max_num_batched_tokens": 1024}, "sglang": {}, "tgi": {}}[policy]
    sc = make_scenario(policy, block_size=16, num_gpu_blocks=1000, **params)
    inp = with_prefix(make_input([0.0, 0.0], [160, 160], [3, 3]), [chain(*range(10))] * 2, 16, 16)
    assert run_both(inp, sc).rq[1, R_CACHED] == hit


def test_lru_evicts_the_oldest_release_tail_first() -> None:
    # 11 usable blocks of 16: A (4 blocks of prompt) finishes; B (different, 8 blocks)
    # then needs room and evicts A's deepest blocks first; C (A's prompt) hits what is left
    sc = make_scenario("vllm", num_gpu_blocks=12, max_model_len=200)
    a = chain(1, 2, 3, 4)
    b = chain(9, 8, 7, 6, 5, 4, 3, 2)
    inp = with_prefix(make_input([0.0, 5.0, 10.0], [65, 130, 65], [1, 1, 1]), [a, b, a], 16, 16)
    res = run_both(inp, sc)
    # A leaves 4 cached blocks and 7 free; B needs 9: A's two deepest blocks go
    assert res.st[1, S_EVICTED] == 2
    assert res.rq[2, R_CACHED] == 2 * 16


def test_cached_blocks_nobody_uses_count_as_free() -> None:
    # synchronous: the request is freed when its step ends (async: once the next is decided)
    sc = make_scenario("vllm", num_gpu_blocks=100, async_scheduling=False)
    inp = with_prefix(make_input([0.0], [160], [1]), [chain(*range(10))], 16, 16)
    res = run_both(inp, sc)
    assert res.st[-1, S_KV_USED] == 0  # its 10 cached blocks are evictable, hence free


def test_a_resumed_request_looks_up_again() -> None:
    # B is preempted by A's growth; its released prompt blocks are still cached when it
    # resumes, so its second lookup finds all three
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
    )
    hashes = [chain(1, 2), chain(5, 6, 7)]
    inp = with_prefix(make_input([0.0, 0.0], [8, 12], [24, 16]), hashes, 4, 4)
    res = run_both(inp, sc)
    assert res.rq[1, R_PREEMPT] == 1 and res.rq[1, R_LOOKUPS] == 2
    assert (res.rq[1, R_CACHED], res.rqw[1, W_HITS]) == (0, 12)
    assert summarize(res)["prefix_resumed_hit_tokens"] == 12


def test_bridging_counts_hits_in_whole_trace_blocks() -> None:
    # trace blocks of 64 tokens, engine blocks of 16: two prompts share 2.5 trace blocks
    prompt = np.array([200, 200])
    hashes = pa.array([chain(1, 2, 3), chain(1, 2, 4)], pa.list_(pa.uint64()))
    keys = build_keys(prompt, np.array([64, 64]), hashes, 16)
    assert keys.unit_tokens.tolist() == [64, 64]
    assert np.diff(keys.offsets).tolist() == [3, 3]
    sc = make_scenario("vllm", num_gpu_blocks=100)
    inp = SimInput(np.array([0.0, 5.0]), prompt, np.array([1, 1]), prefix=keys)
    assert run_both(inp, sc).rq[1, R_CACHED] == 128  # 2 whole 64-token units


def test_finer_trace_blocks_rechunk_exactly() -> None:
    # 16-token hashes, 32-token engine blocks: a unit is one engine block, keyed by the
    # hash of its second trace block
    prompt = np.array([100])
    keys = build_keys(prompt, np.array([16]), pa.array([chain(*range(6))]), 32)
    assert (keys.unit_tokens.tolist(), len(keys.keys)) == ([32], 3)
    unchained = pa.array([[1, 2, 3, 4, 5, 6]], pa.list_(pa.uint64()))
    picked = build_keys(prompt, np.array([16]), unchained, 32).keys ^ np.uint64(
        (32 * 0x9E3779B97F4A7C15) % 2**64
    )
    assert picked.tolist() == [2, 4, 6]


@pytest.mark.parametrize(
    ("partial", "tails", "units"),
    [(True, [64, 0, 288, 0], [3, 2, 1, 2]), (False, [0, 0, 0, 0], [2, 2, 0, 2])],
)
def test_mooncake_partial_last_block_makes_a_tail_unit(
    partial: bool, tails: list[int], units: list[int]
) -> None:
    # Mooncake lists a hash for the partial last block: the 16-token blocks inside it, as far
    # as num_tokens - 1 reaches, are one more unit (1100 = 2 x 512 + 76: 64 tokens); a prompt
    # of whole blocks has none; one shorter than a block has only its tail; a list without
    # the partial block's hash gives none
    prompt = np.array([1100, 1024, 300, 1100])
    hashes = pa.array([[7, 8, 9], [7, 8], [5], [7, 8]], pa.list_(pa.uint64()))
    keys = build_keys(prompt, np.full(4, 512), hashes, 16, partial_blocks=partial)
    assert keys.tails.tolist() == tails
    assert np.diff(keys.offsets).tolist() == units
    if partial:  # the tail's key is its trace block's hash, mixed with the unit and its length
        golden = np.uint64((512 * 0x9E3779B97F4A7C15) % 2**64)
        assert (
            keys.keys[2] != np.uint64(9) ^ golden
            and keys.keys[:2].tolist() == (np.array([7, 8], dtype=np.uint64) ^ golden).tolist()
        )


@pytest.mark.parametrize("partial", [True, False])
def test_a_repeated_prompt_hits_the_blocks_of_its_partial_last_trace_block(partial: bool) -> None:
    # two identical 1,100-token prompts with Mooncake's 512-token hashes, and two of 300: vLLM
    # hits (L - 1) // 16 blocks of each repeat, 1,088 and 288 tokens; whole units only: 1,024, 0
    sc = make_scenario("vllm", max_model_len=4096, num_gpu_blocks=1000,
                       prefix_partial_blocks=partial)  # fmt: skip
    hashes = [[7, 8, 9], [7, 8, 9], [5], [5]]
    inp = with_prefix(make_input([0.0, 5.0, 10.0, 15.0], [1100, 1100, 300, 300], [3, 3, 3, 3]),
                      hashes, 512, 16, partial_blocks=partial)  # fmt: skip
    res = run_both(inp, sc)
    assert res.rq[:, R_CACHED].tolist() == ([0, 1088, 0, 288] if partial else [0, 1024, 0, 0])
    assert res.st[res.st[:, S_PREFILL] > 0, S_PREFILL].tolist() == (
        [1100, 12, 300, 12] if partial else [1100, 76, 300, 300]
    )


def test_prefix_partial_blocks_needs_caching() -> None:
    with pytest.raises(ScenarioError, match="prefix_partial_blocks needs enable_prefix_caching"):
        make_scenario("vllm", enable_prefix_caching=False, prefix_partial_blocks=False)
    with pytest.raises(ScenarioError, match="prefix_partial_blocks must be true or false"):
        make_scenario("vllm", prefix_partial_blocks="sometimes")


def test_warm_cache_hits_from_the_first_request() -> None:
    sc = make_scenario("vllm", num_gpu_blocks=100)
    hashes = [chain(*range(10))] * 2
    inp = with_prefix(make_input([0.0, 0.0], [160, 160], [1, 1]), hashes, 16, 16, warmup=1)
    assert run_both(inp, sc).rq[0, R_CACHED] == 144


def test_priority_orders_waiting_and_picks_the_victim() -> None:
    # one request runs at a time; C (priority 0) overtakes B (priority 1)
    sc = make_scenario("vllm", max_num_seqs=1, scheduling_policy="priority")
    inp = make_input([0.0, 0.1, 0.2], [10, 10, 10], [3, 3, 3])
    inp = SimInput(
        inp.arrival_s, inp.prompt_tokens, inp.output_tokens, priority=np.array([5, 1, 0])
    )
    res = run_both(inp, sc)
    assert res.rqf[:, F_FIRST_SCHED].tolist() == [0.0, 6.0, 3.0]
    # under memory pressure the lowest priority, latest arrival is preempted
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=9,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        scheduling_policy="priority",
    )
    inp = make_input([0.0, 0.0, 0.0], [8, 8, 8], [8, 8, 8])
    inp = SimInput(
        inp.arrival_s, inp.prompt_tokens, inp.output_tokens, priority=np.array([1, 0, 1])
    )
    res = run_both(inp, sc)
    assert res.rq[:, R_PREEMPT].tolist()[1] == 0
    assert res.rqf[1, F_FINISH] <= res.rqf[[0, 2], F_FINISH].min()


def test_tenant_priority_maps_tenants() -> None:
    import polars as pl

    from pipeline.sim.replay_input import _priorities

    frame = pl.DataFrame({"priority": [3, None, None], "tenant": ["a", "b", "c"]})
    prio = _priorities(frame, np.arange(3), {"b": 7})
    assert prio.tolist() == [3, 7, 0]


def test_prefix_aware_router_follows_the_cache_unless_imbalanced() -> None:
    # two conversations, four turns each, interleaved: the router keeps each on one replica
    sc = make_scenario("vllm", replicas=2, router="prefix_aware", num_gpu_blocks=1000)
    convs = [chain(1, 2, 3, 4, 5, 6), chain(9, 8, 7, 6, 5, 4)]
    hashes = [convs[k % 2] for k in range(8)]
    inp = with_prefix(make_input([5.0 * k for k in range(8)], [100] * 8, [2] * 8), hashes, 16, 16)
    res = run_both(inp, sc)
    replica = res.rq[:, R_REPLICA]
    assert len(set(replica[0::2])) == 1 and len(set(replica[1::2])) == 1
    assert summarize(res)["prefix_token_hit_rate"] > 0.5
    rr = run_both(inp, make_scenario("vllm", replicas=2, router="round_robin"))
    assert rr.rq[:, R_REPLICA].tolist() == [0, 1] * 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"policy": "sarathi", "enable_prefix_caching": True}, "allowed with: sglang, tgi, vllm"),
        ({"scheduling_policy": "lottery"}, "unknown scheduling_policy 'lottery'; allowed: fcfs"),
        (
            {"policy": "sglang", "schedule_policy": "sjf"},
            "unknown schedule_policy 'sjf'; allowed: fcfs, lpm, dfs-weight, lof, random",
        ),
        ({"cache_threshold": 0.5}, "applies to router = 'prefix_aware'"),
        (
            {"router": "prefix_aware", "enable_prefix_caching": False},
            "prefix_aware needs enable_prefix_caching",
        ),
        ({"router": "nearest"}, "allowed: least_outstanding, prefix_aware, round_robin"),
        ({"tenant_priority": {"a": 1}}, "tenant_priority applies to .*priority"),
        ({"prefix_warmup_requests": 5, "enable_prefix_caching": False}, "needs enable_prefix"),
        ({"policy": "tgi", "waiting_served_ratio": -1}, "waiting_served_ratio must be >= 0"),
        (
            {"policy": "tgi", "prefill_chunking": False, "max_batch_prefill_tokens": 100},
            "without prefill_chunking",
        ),
        ({"policy": "sglang", "chunked_prefill_size": 0}, "chunked_prefill_size must be -1"),
        ({"policy": "sglang", "max_num_seqs": 8}, "max_num_seqs is a parameter of"),
    ],
)
def test_bad_cache_and_engine_keys_list_the_allowed_values(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ScenarioError, match=message):
        build_scenario({"cost": make_scenario("vllm").cost.to_dict(), "num_gpu_blocks": 100,
                        **values})  # fmt: skip


def test_vllm_caches_generated_blocks_and_evicts_them_in_lru_order() -> None:
    # 20 usable 4-token blocks. X (2 prompt blocks) finishes first: its blocks go to the LRU.
    # A computes 2 prompt and 2 generated blocks: vLLM caches all 4, so they sit in the LRU
    # behind X's instead of being free. C then needs 15 blocks: 14 are free, so X's deepest
    # block is evicted and Y, sharing X's prompt, finds only X's first block (with hashless
    # generated blocks 16 would be free and Y would find both). C's 15 blocks are cached too
    # (keys unique to it), so Y's 2 new blocks are evicted from the LRU as well.
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=21,
        max_num_batched_tokens=256,
        max_num_seqs=4,
        max_model_len=64,
    )
    hashes = [chain(9, 9), chain(1, 2), [], chain(9, 9, 5)]
    inp = with_prefix(
        make_input([0.0, 10.0, 30.0, 50.0], [8, 8, 60, 12], [1, 9, 1, 1]), hashes, 4, 4
    )
    res = run_both(inp, sc)
    assert res.st[:, S_EVICTED].tolist() == [0, 0, 0, 1, 2]  # X, A (2 rows), C, Y
    assert res.rq[3, R_CACHED] == 4


def test_vllm_a_resumed_request_hits_its_own_generated_blocks() -> None:
    # B (one prompt block) is preempted after it generated several full blocks; they stay
    # cached (unique to it), and its lookup on resumption finds them with its prompt block
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=11,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
    )
    hashes = [chain(1, 2), chain(3)]
    inp = with_prefix(make_input([0.0, 0.0], [8, 4], [20, 20]), hashes, 4, 4)
    res = run_both(inp, sc)
    assert res.rq[1, R_PREEMPT] >= 1
    assert res.rqw[1, W_HITS] - res.rq[1, R_CACHED] > 4  # more than its prompt's block


def test_request_hit_rate_counts_prompts_shorter_than_a_unit() -> None:
    # 64-token units: the 40-token prompt has no unit, is looked up and never hits; it counts
    # in both hit rates (as vLLM's prefix_cache_queries / hits do)
    keys = build_keys(
        np.array([200, 200, 40]),
        np.array([64, 64, 64]),
        pa.array([chain(1, 2, 3), chain(1, 2, 3), []], pa.list_(pa.uint64())),
        16,
    )
    assert keys.unit_tokens.tolist() == [64, 64, 64]
    sc = make_scenario("vllm", num_gpu_blocks=100)
    inp = SimInput(np.array([0.0, 5.0, 10.0]), np.array([200, 200, 40]), np.array([1, 1, 1]),
                   prefix=keys)  # fmt: skip
    s = summarize(run_both(inp, sc))
    assert s["prefix_request_hit_rate"] == pytest.approx(1 / 3)
    assert (s["prefix_query_tokens"], s["prefix_hit_tokens"]) == (440, 192)


def test_generated_block_keys_are_the_request_s_own() -> None:
    # two identical prompts: the same prompt keys, then keys for the blocks of the prompt's
    # tail and output that no other request has (and a prompt without units gets them too)
    prompt = np.array([40, 40, 10])
    hashes = pa.array([chain(1, 2), chain(1, 2), []], pa.list_(pa.uint64()))
    keys = build_keys(prompt, np.array([16, 16, 16]), hashes, 16)
    ext = extend_keys(keys, prompt, np.array([30, 30, 7]))
    assert np.diff(ext.offsets).tolist() == [4, 4, 1]  # (40 + 30 - 1) // 16, (10 + 7 - 1) // 16
    own = [ext.keys[ext.offsets[j] : ext.offsets[j + 1]].tolist() for j in range(3)]
    assert own[0][:2] == own[1][:2] == keys.keys[:2].tolist()
    tails = own[0][2:] + own[1][2:] + own[2]
    assert len(set(tails)) == 5 and not set(tails) & set(keys.keys.tolist())


def test_generated_block_keys_follow_the_splitmix_chain() -> None:
    # the compiled key builder against the rule written out in Python integers
    m64 = (1 << 64) - 1
    golden, mix1, mix2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def chain_key(seed: int, step: int) -> int:
        x = (seed + step * golden) & m64
        x = ((x ^ (x >> 30)) * mix1) & m64
        x = ((x ^ (x >> 27)) * mix2) & m64
        return x ^ (x >> 31)

    prompt = np.array([40, 10, 33])
    hashes = pa.array([chain(7, 8), [], chain(9, 10)], pa.list_(pa.uint64()))
    keys = build_keys(prompt, np.array([16, 16, 16]), hashes, 16)
    ext = extend_keys(keys, prompt, np.array([30, 7, 1]))
    for j in range(3):
        own = ext.keys[ext.offsets[j] : ext.offsets[j + 1]].tolist()
        mine = keys.keys[keys.offsets[j] : keys.offsets[j + 1]].tolist()
        seed = (mine[-1] if mine else j * golden & m64) ^ ((j + 1) * mix1 & m64)
        tail = [chain_key(seed, s + 1) for s in range(len(own) - len(mine))]
        assert own == mine + tail
    assert np.diff(ext.offsets).tolist() == [4, 1, 2]


def test_vllm_a_block_computed_twice_is_cached_twice() -> None:
    # 9 usable 4-token blocks, 4 tokens a step per request. A and B (the same 4-block prompt)
    # compute in lockstep: B hits A's first block, then each block is computed by B first and
    # by A one step later, so A caches a second copy of blocks 1-3 (vLLM keeps both). When
    # both are done, all 7 blocks are cached and free: LRU B3 B2 B1 A3 A2 A1 A0 (B finished
    # first, each request deepest first). C (6 other blocks) takes the 2 free ones and evicts
    # 4 copies, B3 B2 B1 A3: every key but 3 keeps a copy, so D (A's prompt) finds 3 blocks,
    # block 1 through A's copy, and evicts one of C's for its last. Keeping A's copies
    # private would have left 5 free, and C would have evicted 1.
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=10,
        long_prefill_token_threshold=4,
        max_model_len=64,
        async_scheduling=False,  # freed when its step ends (async: once the next is decided)
    )
    a = chain(1, 2, 3, 4)
    hashes = [a, a, chain(9, 8, 7, 6, 5, 4), a]
    inp = with_prefix(make_input([0.0, 0.0, 10.0, 20.0], [16, 16, 24, 16], [1, 1, 1, 1]),
                      hashes, 4, 4)  # fmt: skip
    res = run_both(inp, sc)
    assert res.rq[:, R_CACHED].tolist() == [0, 4, 0, 12]
    assert res.st[:, S_PREFILL].tolist() == [8, 8, 8, 4, 24, 4]
    assert res.st[:, S_EVICTED].tolist() == [0, 0, 0, 0, 4, 1]
    assert res.st[3, S_KV_USED] == 0  # the copies nobody references count as free


def test_reference_cache_keeps_every_copy_and_lookups_get_the_oldest() -> None:
    cache = PrefixCache(10)
    first, second = cache.insert(7, 2), cache.insert(7, 2)
    cache.take(4)
    assert cache.lookup([7], 1)[0] == [first]
    cache.unref(first)
    cache.unref(second)
    assert (cache.capacity, cache.evictable) == (10, 4)
    cache.make_free(8)  # evicts the copy released first; the key stays cached
    assert cache.lookup([7], 1)[0] == [second] and cache.evicted == 2
    cache.make_free(10)
    assert cache.lookup([7], 1) == ([], 0)


@pytest.mark.parametrize("traced", [True, False])
def test_vllm_a_later_prompt_that_quotes_an_answer_hits_its_generated_blocks(
    traced: bool,
) -> None:
    # A: 32 prompt tokens, 40 generated; its chain over prompt + output has 4 full blocks,
    # 2 of them generated (and computed: 71 tokens). B quotes A's prompt and answer and asks
    # more: with the trace's hashes of A's generated blocks it hits all 4 (64 tokens), as
    # vLLM does; without them A's generated blocks are A's own and B hits the prompt's 2
    whole = chain(*range(6))  # prompt + answer + question: 6 blocks
    a, b = whole[:2], whole
    keys = build_keys(
        np.array([32, 96]),
        np.array([16, 16]),
        pa.array([a, b], pa.list_(pa.uint64())),
        16,
        output_hashes=pa.array([whole[2:4], None], pa.list_(pa.uint64())) if traced else None,
    )
    assert keys.output is None if not traced else np.diff(keys.output.offsets).tolist() == [2, 0]
    sc = make_scenario("vllm", num_gpu_blocks=100)
    inp = SimInput(np.array([0.0, 100.0]), np.array([32, 96]), np.array([40, 2]), prefix=keys)
    res = run_both(inp, sc)
    assert res.rq[:, R_CACHED].tolist() == [0, 64 if traced else 32]


def test_output_keys_follow_the_trace_blocks_past_a_tail() -> None:
    # 512-token trace blocks, 16-token engine blocks: 1,100 tokens = 2 blocks + 76 (a 64-token
    # tail). The trace's output hashes are of blocks 2, 3, ... of prompt + output: the first
    # keys the rest of the tail's unit (mixed with its length), the next a whole unit
    prompt = np.array([1100])
    keys = build_keys(
        prompt,
        np.array([512]),
        pa.array([[7, 8, 9]], pa.list_(pa.uint64())),
        16,
        output_hashes=pa.array([[20, 21]], pa.list_(pa.uint64())),
    )
    golden = np.uint64((512 * 0x9E3779B97F4A7C15) % 2**64)
    assert keys.tails.tolist() == [64] and keys.output is not None
    out = keys.output.keys
    assert out[1] == np.uint64(21) ^ golden and out[0] != np.uint64(20) ^ golden
    ext = extend_keys(keys, prompt, np.array([1000]))  # 2,099 tokens: units to 2,048
    assert np.diff(ext.offsets).tolist() == [5]  # 2 whole, the tail, its rest, one whole
    assert ext.keys[3:].tolist() == out.tolist()


def test_a_token_id_log_with_output_ids_replays_quoted_answers_as_hits(tmp_path: Path) -> None:
    # ingested as a user would: turn 2 quotes turn 1's prompt and the 40 tokens it
    # generated; vLLM hits both (79 of them computed: 4 blocks), not only the prompt's 2
    prompt, answer = list(range(1, 41)), list(range(1000, 1040))
    turns = [
        {"request_id": "t1", "timestamp": 1.0, "prompt_token_ids": prompt,
         "output_token_ids": answer},
        {"request_id": "t2", "timestamp": 100.0, "prompt_token_ids": prompt + answer + [7] * 20,
         "output_tokens": 5},
    ]  # fmt: skip
    log = tmp_path / "turns.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in turns))
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(log)], wh, IngestOptions(quiet=True))
    frame = read_requests(wh.files(REQUESTS))
    sc = make_scenario("vllm", num_gpu_blocks=100)
    res = run_both(prepare(frame, sc).inp, sc)
    assert res.rq[:, R_CACHED].tolist() == [0, 64]


def test_async_caches_a_prefill_last_token_at_once_as_the_reference_does() -> None:
    # vLLM async: a decode's input token is in flight and is cached a step later, a
    # prefill's last token is known and cached with its step. Request 6's prompt (18
    # tokens, units of 6) ends with a one-token chunk; the fast loop's decode path once
    # took it for a decode and left its third unit uncached, so the preemption a step
    # later freed 6 of its blocks instead of evicting them (384 evictions, not 390)
    from tests.sim.test_differential import check_equal

    keys = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 11, 12, 1, 2, 3, 13, 14, 15, 16, 17, 18]
    keys += [19, 20, 21, 22, 23, 24, 25, 26, 27, 1, 28, 29, 1, 28, 29]
    offsets = np.array([0, 3, 10, 12, 14, 19, 32, 35, 38])
    arrival = [0.04400603203547479, 0.05968000781845391, 0.07993172554521921,
               0.08657962141420715, 0.09021138581796838, 0.09300669325346683,
               0.1215395544028115, 0.12705932680672116]  # fmt: skip
    inp = SimInput(
        np.array(arrival),
        np.array([23, 42, 12, 12, 31, 78, 18, 18]),
        np.array([15, 1, 51, 55, 10, 27, 38, 42]),
        prefix=PrefixKeys(offsets, np.array(keys, dtype=np.uint64), np.full(8, 6)),
    )
    cost = {"fixed_s": 0.0039823060320663545, "flop_s_per_token": 1.3664313765340688e-05,
            "flop_s_per_attn": 1.51075575662018e-08, "mem_s_weights": 0.0019079614260974077,
            "mem_s_per_kv_token": 1.523890522725182e-06, "mem_s_per_token": 6.920170623173516e-09,
            "comm_s_fixed": 0.00037071240842639534,
            "comm_s_per_token": 6.13486448846588e-08}  # fmt: skip
    sc = build_scenario({
        "policy": "vllm", "cost": cost, "block_size": 1, "num_gpu_blocks": 116,
        "max_model_len": 123, "enable_prefix_caching": True, "async_scheduling": True,
        "max_num_seqs": 3, "max_num_batched_tokens": 123, "enable_chunked_prefill": False,
        "long_prefill_token_threshold": 17, "prefix_partial_blocks": False,
        "scheduler_reserve_full_isl": False,
    })  # fmt: skip
    fast = check_equal(inp, sc)
    assert fast.rq[:, R_PREEMPT].sum() > 0  # the case still preempts after its last chunk
    assert fast.st[:, S_EVICTED].sum() > 0  # ... and evicts: the totals above are compared
