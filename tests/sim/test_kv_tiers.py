"""kv_tiers.replay_hits: what each tier adds to the GPU prefix hits; and the tiers in
the replay loops: a hit below the GPU, the load the step waits for, a full tier, the
disk tier below the CPU one, the keys' checks."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contracts import SIM_REQUESTS, SIM_STEPS
from pipeline.errors import ScenarioError
from pipeline.plan.grid import build_grid
from pipeline.sim.cost_model import step_time
from pipeline.sim.kv_tiers import DiskTier, num_chunks, replay_hits
from pipeline.sim.replay_tables import sim_requests_table, sim_steps_table
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    S_CPU_HIT,
    S_DECODE,
    S_DISK_HIT,
    S_NUM_STEPS,
    S_PHIT,
    S_PREFILL,
    S_RUNNING,
    S_TIER_LOAD,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    W_CPU_HITS,
    W_DISK_HITS,
    W_TOTAL,
    SimInput,
    SimResult,
)
from pipeline.sim.summary import summarize
from tests.helpers import with_prefix
from tests.sim.test_differential import _COST_KEYS, check_equal

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


# --- the tiers in the replay loops ---------------------------------------------------
# Three requests, one at a time: A, then B (another prompt, whose blocks evict most of
# A's from a GPU pool that holds one request), then C = A's prompt again. Each prompt is
# 4 blocks of 16 tokens; a lookup may hit 3 of them (the last token is computed).
BLOCK = 16
KV = 4096  # KV bytes per token
BLOCK_BYTES = KV * BLOCK
UNITS = 3  # units C may hit: its first 63 tokens hold 3 whole blocks


def _replay(**tiers: Any) -> tuple[SimInput, Scenario]:
    prompt = np.array([4 * BLOCK] * 3, dtype=np.int64)
    inp = SimInput(np.array([0.0, 10.0, 20.0]), prompt, np.ones(3, dtype=np.int64))
    inp = with_prefix(inp, [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4]], BLOCK, BLOCK)
    values = {
        "policy": "vllm",
        "cost": {**dict.fromkeys(_COST_KEYS, 0.0), "fixed_s": 0.01, "flop_s_per_token": 1e-5},
        "num_gpu_blocks": 6,  # 5 usable: A's 4 blocks, then B's take 3 of them
        "block_size": BLOCK,
        "max_model_len": 128,
        "async_scheduling": False,
        "enable_prefix_caching": True,
        "kv_offloading_kv_bytes_per_token": KV,
        "kv_offloading_link_gb_s": 0.5,
        "kv_disk_read_gb_s": 0.1,
        **{k: v * BLOCK_BYTES / 2**30 for k, v in tiers.items()},  # sizes in blocks
    }
    return inp, build_scenario(values)


def _c_row(res: SimResult) -> np.ndarray:
    """The step that admitted C (the last request: its prefill is the last step)."""
    return res.st[-1]


def test_a_hit_below_the_gpu_counts_as_computed() -> None:
    inp, sc = _replay(kv_offloading_size_gb=16)
    res = check_equal(inp, sc)
    off = simulate(*_without_tiers())
    row, row_off = _c_row(res), _c_row(off)
    gpu = int(row_off[S_PHIT])  # what the GPU still holds of A's prompt: its first unit
    assert 0 < gpu < UNITS * BLOCK
    assert row[S_PHIT] == gpu  # the CPU tier adds to the GPU's hits, it takes none
    assert row[S_CPU_HIT] == UNITS * BLOCK - gpu  # ... up to the lookup's bound
    assert row[S_DISK_HIT] == 0
    assert row[S_TIER_LOAD] == row[S_CPU_HIT] // BLOCK * BLOCK_BYTES
    assert res.st[:-1, S_CPU_HIT].sum() == 0  # A and B find nothing below the GPU
    # C computes the loaded tokens no more
    assert off.rqw[2, W_TOTAL] - res.rqw[2, W_TOTAL] == row[S_CPU_HIT]
    assert res.rqw[:2, W_TOTAL].tolist() == off.rqw[:2, W_TOTAL].tolist()


def _without_tiers() -> tuple[SimInput, Any]:
    inp, sc = _replay()
    assert sc.kv_tiers is None
    return inp, sc.engine()


def test_the_step_waits_for_its_load() -> None:
    inp, sc = _replay(kv_offloading_size_gb=16, kv_disk_size_gb=64)
    assert sc.kv_tiers is not None
    res = simulate(inp, sc.engine())
    compute = np.array(
        [
            step_time(sc.cost.as_array(), float(r[S_PREFILL]), a, float(r[S_RUNNING]),
                      float(r[S_DECODE]), c)
            for r, a, c in zip(res.st, res.stf[:, SF_ATTN], res.stf[:, SF_CTX], strict=True)
        ]
    )  # fmt: skip
    loads = res.st[:, S_TIER_LOAD] / sc.kv_tiers.cpu_bytes_per_s  # every hit is the CPU's here
    assert res.st[:, S_DISK_HIT].sum() == 0 and loads[-1] > 0
    assert np.allclose(res.stf[:, SF_DURATION], compute + loads, rtol=1e-12, atol=0)


def test_a_full_tier_keeps_its_latest_units() -> None:
    # 2 blocks: A's units evict each other, then B's evict A's: C finds nothing after
    # the GPU's hit (the CPU tier holds B's last two units)
    inp, sc = _replay(kv_offloading_size_gb=2)
    res = check_equal(inp, sc)
    assert res.st[:, S_CPU_HIT].sum() == 0
    assert res.st[:, S_PHIT].tolist() == simulate(*_without_tiers()).st[:, S_PHIT].tolist()


def test_the_disk_tier_takes_the_cpu_tiers_evictions() -> None:
    inp, sc = _replay(kv_offloading_size_gb=2, kv_disk_size_gb=8)
    assert sc.kv_tiers is not None
    res = check_equal(inp, sc)
    row = _c_row(res)
    gpu = int(row[S_PHIT])
    assert row[S_CPU_HIT] == 0 and row[S_DISK_HIT] == UNITS * BLOCK - gpu
    blocks = row[S_DISK_HIT] // BLOCK
    assert row[S_TIER_LOAD] == blocks * BLOCK_BYTES
    # C's step waits for the load at the disk's bandwidth
    a, c = res.stf[-1, SF_ATTN], res.stf[-1, SF_CTX]
    counts = float(row[S_PREFILL]), float(row[S_RUNNING]), float(row[S_DECODE])
    compute = step_time(sc.cost.as_array(), counts[0], a, counts[1], counts[2], c)
    wait = res.stf[-1, SF_DURATION] - compute
    assert np.isclose(wait, blocks * BLOCK_BYTES / sc.kv_tiers.disk_bytes_per_s, rtol=1e-9)


def test_off_is_the_same_replay() -> None:
    inp, sc = _replay(kv_offloading_size_gb=0)
    base = simulate(*_without_tiers())
    res = simulate(inp, sc.engine())
    assert np.array_equal(res.rq, base.rq) and np.array_equal(res.st, base.st)
    assert np.array_equal(res.stf, base.stf)


def test_sizes_become_blocks() -> None:
    _, sc = _replay(kv_offloading_size_gb=16, kv_disk_size_gb=64)
    assert sc.kv_tiers is not None
    assert (sc.kv_tiers.cpu_blocks, sc.kv_tiers.disk_blocks) == (16, 64)
    assert sc.kv_tiers.block_bytes == BLOCK_BYTES
    # from the profile: its KV bytes and its GPU's host link (8 GiB of a llama-3-8b)
    sc = build_scenario({"policy": "vllm", "kv_offloading_size_gb": 8.0})
    assert sc.kv_tiers is not None and sc.kv_tiers.cpu_bytes_per_s > 0
    per_block = sc.kv_tiers.block_bytes
    assert sc.kv_tiers.cpu_blocks == num_chunks(8.0, per_block, 1)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"kv_offloading_size_gb": -1.0}, "kv_offloading_size_gb must be a finite number >= 0"),
        ({"kv_offloading_size_gb": float("nan")}, "kv_offloading_size_gb"),
        ({"kv_offloading_size_gb": float("inf")}, "kv_offloading_size_gb"),
        ({"kv_disk_size_gb": 4.0}, "needs kv_offloading_size_gb"),
        ({"kv_offloading_size_gb": 4.0, "enable_prefix_caching": False}, "enable_prefix_caching"),
        ({"kv_offloading_link_gb_s": -2.0}, "kv_offloading_link_gb_s"),
        ({"policy": "sglang", "kv_offloading_size_gb": 4.0}, "kv_offloading_size_gb"),
        (
            {
                "kv_offloading_size_gb": 4.0,
                "async_scheduling": False,
                "speculative": {"method": "ngram", "num_tokens": 2},
            },
            "speculative",
        ),
    ],
)
def test_bad_tier_keys_are_refused(values: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match=words):
        build_scenario({"policy": "vllm", **values})


def test_summary_and_steps_table_report_the_tiers() -> None:
    inp, sc = _replay(kv_offloading_size_gb=2, kv_disk_size_gb=8)
    res = simulate(inp, sc.engine())
    s = summarize(res)
    assert s["kv_tiers"] == {
        "cpu_hit_tokens": int(res.st[:, S_CPU_HIT].sum()),
        "disk_hit_tokens": int(res.st[:, S_DISK_HIT].sum()),
        "tier_load_bytes": int(res.st[:, S_TIER_LOAD].sum()),
    }
    assert s["kv_tiers"]["disk_hit_tokens"] > 0
    assert s["prefix_resumed_hit_tokens"] == 0  # nothing was preempted: the tiers' are apart
    table = sim_steps_table("c", res.st, res.stf, res.num_kv_blocks)
    want = [(f.name, f.type) for f in SIM_STEPS.schema()]
    assert [(f.name, f.type) for f in table.schema] == want
    assert table["disk_hit_tokens"].to_pylist() == res.st[:, S_DISK_HIT].tolist()
    assert "kv_tiers" not in summarize(simulate(*_without_tiers()))


def test_a_sweep_turns_the_cpu_tier_size() -> None:
    grid = build_grid(
        {"base": {"policy": "vllm"}, "axes": {"vllm": {"kv_offloading_size_gb": [0, 8, 64]}}}
    )
    tiers = [p.scenario.kv_tiers for p in grid.points]
    assert tiers[0] is None and tiers[1] is not None and tiers[2] is not None
    assert tiers[2].cpu_blocks == 8 * tiers[1].cpu_blocks


def test_each_request_counts_its_tier_hits() -> None:
    # C's loads are its own: the requests table's columns are the steps', request by request
    inp, sc = _replay(kv_offloading_size_gb=2, kv_disk_size_gb=8)
    res = check_equal(inp, sc)
    row = _c_row(res)
    assert row[S_DISK_HIT] > 0
    assert res.rqw[:, W_CPU_HITS].tolist() == [0, 0, int(row[S_CPU_HIT])]
    assert res.rqw[:, W_DISK_HITS].tolist() == [0, 0, int(row[S_DISK_HIT])]
    table = sim_requests_table("c", pa.array(["a", "b", "c"]), res)
    schema = {f.name: f.type for f in SIM_REQUESTS.schema()}
    assert {f.name: f.type for f in table.schema}.items() <= schema.items()
    assert {"cpu_hit_tokens", "disk_hit_tokens"} <= set(table.column_names)
    assert table["cpu_hit_tokens"].to_pylist() == res.rqw[:, W_CPU_HITS].tolist()
    assert table["disk_hit_tokens"].to_pylist() == [0, 0, int(row[S_DISK_HIT])]
    off = simulate(*_without_tiers())
    assert not off.rqw[:, W_CPU_HITS].any() and not off.rqw[:, W_DISK_HITS].any()


def test_decode_runs_skip_steps_with_tiers_on() -> None:
    # three requests decode together, each settling a generated unit every BLOCK tokens a
    # few tokens after the one before: the runs store several units of each to a CPU tier
    # of 3 blocks (it evicts as it stores), in the steps' order, as the reference does step
    # by step; D, preempted by nobody, then reads A's prompt back from what is left
    prompt = np.array([2 * BLOCK + 1, 2 * BLOCK + 5, 2 * BLOCK + 9, 2 * BLOCK], dtype=np.int64)
    output = np.array([6 * BLOCK, 6 * BLOCK + 3, 6 * BLOCK + 7, 2], dtype=np.int64)
    arrival = np.array([0.0, 0.0, 0.0, 100.0])
    inp = SimInput(arrival, prompt, output)
    inp = with_prefix(inp, [[1, 2], [3, 4], [5, 6], [1, 2]], BLOCK, BLOCK)
    for cpu in (3, 64):
        values = {
            "policy": "vllm",
            "cost": {**dict.fromkeys(_COST_KEYS, 0.0), "fixed_s": 0.01, "flop_s_per_token": 1e-5},
            "num_gpu_blocks": 200,
            "block_size": BLOCK,
            "max_model_len": 512,
            "async_scheduling": False,
            "enable_prefix_caching": True,
            "kv_offloading_kv_bytes_per_token": KV,
            "kv_offloading_link_gb_s": 0.5,
            "kv_offloading_size_gb": cpu * BLOCK_BYTES / 2**30,
        }
        for is_async in (False, True):
            sc = build_scenario({**values, "async_scheduling": is_async})
            res = check_equal(inp, sc)
            assert len(res.st) < res.num_steps  # runs were skipped
            assert (res.st[:, S_NUM_STEPS] > BLOCK).any()  # ... some across unit boundaries


def test_a_run_stops_before_a_store_that_could_let_a_waiting_request_in() -> None:
    # A generated case (tests/sim/test_differential.py's vllm-kv-tiers, 12 requests, a CPU
    # tier of 4 blocks, 7 GPU blocks, chunks of at most 17 tokens). Request 8 waits with
    # its first unit in the tier: loaded, it would make the chunk reach 3 blocks, more
    # than the free 2, so it waits while request 6 decodes alone. Five steps later request
    # 6 settles a unit whose store evicts request 8's from the tier, and that step's
    # decision admits request 8 with a chunk of 2 blocks. A run that stored its units (in
    # the steps' order) but kept the first step's decision admitted it 30 steps late.
    values = {
        "policy": "vllm",
        "cost": {
            "comm_s_fixed": 0.0003716181628322084,
            "comm_s_per_token": 3.691920961949619e-08,
            "fixed_s": 0.0013865692489489516,
            "flop_s_per_attn": 9.76347175579728e-09,
            "flop_s_per_token": 3.5912561865162324e-05,
            "mem_s_per_kv_token": 8.711997773504399e-07,
            "mem_s_per_token": 9.088204492936823e-07,
            "mem_s_weights": 0.007597140832153673,
        },
        "block_size": 16,
        "num_gpu_blocks": 7,
        "max_model_len": 144,
        "max_num_batched_tokens": 144,
        "max_num_seqs": 3,
        "long_prefill_token_threshold": 17,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": True,
        "watermark": 0.0,
        "async_scheduling": False,
        "scheduler_reserve_full_isl": False,
        "scheduling_policy": "fcfs",
        "prefix_partial_blocks": False,
        "kv_offloading_kv_bytes_per_token": 4096,
        "kv_offloading_link_gb_s": 0.6746752615275203,
        "kv_offloading_size_gb": 4 * 16 * 4096 / 2**30,
        "kv_disk_size_gb": 0.0,
        "kv_disk_read_gb_s": 0.21221967407237177,
    }
    arrival = [
        0.00608751957821074,
        0.01139921623459854,
        0.012059843567178227,
        0.016056808783230684,
        0.019966589958899106,
        0.022242757922435137,
        0.024569185216681656,
        0.03706903801459827,
        0.037294971061723275,
        0.04280042217203303,
        0.07035091775390624,
        0.07874741098708483,
    ]
    prompt = [27, 41, 37, 37, 41, 22, 40, 5, 63, 21, 10, 47]
    output = [1, 52, 35, 25, 55, 2, 54, 16, 13, 13, 30, 24]
    hashes = [
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
        [1, 2, 3, 4, 17, 18, 19, 20, 21],
        [1, 2, 3, 4, 17, 18, 19, 20, 21],
        [22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
        [7, 8, 9, 10, 11],
        [7, 8, 9, 10, 11, 12, 13, 32, 33, 34],
        [7],
        [1, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48],
        [1, 2, 3, 4, 49],
        [7, 8],
        [1, 35, 36, 37, 38, 39, 40, 41, 50, 51, 52],
    ]
    sc = build_scenario(values)
    inp = SimInput(np.array(arrival), np.array(prompt), np.array(output))
    inp = with_prefix(inp, hashes, 4, 16, warmup=0, partial_blocks=False)
    res = check_equal(inp, sc)
    assert len(res.st) < res.num_steps  # runs were taken
    assert res.st[:, S_CPU_HIT].any()  # ... and the tier was read
