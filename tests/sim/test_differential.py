"""The fast loop against the reference loop, and the invariants both must keep.

Traces and configurations are generated: hypothesis draws the shape (policy,
sizes, memory pressure, replicas, router) and a seed; the seed drives a numpy
generator for the continuous values (arrival times, cost coefficients), so
that no arrival lands exactly on a step boundary, where the closed-form sum of
a decode run and the step-by-step sum may round differently.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipeline.sim.policies import POLICIES, sglang
from pipeline.sim.reference import simulate_reference
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CACHED,
    R_GENERATED,
    R_HELD,
    R_LOOKUPS,
    R_OUTPUT,
    R_PREEMPT,
    R_PROMPT,
    R_SHARED,
    R_STATUS,
    R_TAIL,
    R_UNIT_TOK,
    S_CPU_HIT,
    S_DECODE,
    S_DISK_HIT,
    S_EVICTED,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    S_SPEC_ACC,
    S_SPEC_DRAFT,
    S_STEP,
    S_TIER_LOAD,
    S_WAITING,
    SF_SCHED_CPU,
    SF_SCHED_EXPOSED,
    ST_FINISHED,
    W_CPU_HITS,
    W_DISCARDED,
    W_DISK_HITS,
    W_HITS,
    W_TOTAL,
    SimInput,
    SimResult,
)
from tests.helpers import shared_prefix_hashes, with_prefix


def _case(
    draw: Any,
    policy: str,
    *,
    caching: bool | None = None,
    replicas: tuple[int, int] = (1, 3),
    routers: tuple[str, ...] = ("round_robin", "least_outstanding", "prefix_aware"),
    speculative: bool = False,
    kv_tiers: bool = False,
) -> tuple[SimInput, Scenario]:
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, 40))
    num_replicas = draw(st.integers(*replicas))
    caches = policy in ("vllm", "sglang", "tgi")
    if caching is None:
        caching = caches and draw(st.booleans())
    allowed = [r for r in routers if caching or r != "prefix_aware"]
    router = draw(st.sampled_from(allowed))
    block_size = draw(st.sampled_from([1, 4, 16]))
    # 1.0: the largest request just fits; sarathi preempts only with the pool nearly full
    pressure = draw(st.sampled_from([1.0, 1.0, 1.1, 1.3, 2.0, 6.0]))
    load = draw(st.sampled_from([0.01, 0.05, 0.5, 5.0]))  # mean gap between arrivals, seconds
    long_prompts = draw(st.booleans())
    rng = np.random.default_rng(seed)
    arrival = np.sort(np.cumsum(rng.exponential(load, n)) * rng.uniform(0.5, 1.0))
    prompt_max = 600 if long_prompts else 80
    prompt = rng.integers(1, prompt_max, n)
    retry = rng.random(n) < 0.15  # the same prompt as an earlier request
    for j in np.flatnonzero(retry[1:]) + 1:
        prompt[j] = prompt[rng.integers(j)]
    output = rng.integers(1, 60, n)
    cost = {
        "fixed_s": rng.uniform(1e-3, 5e-3),
        "flop_s_per_token": rng.uniform(1e-5, 5e-5),
        "flop_s_per_attn": rng.uniform(0, 1e-7),
        "mem_s_weights": rng.uniform(0, 1e-2),
        "mem_s_per_kv_token": rng.uniform(0, 1e-5),
        "mem_s_per_token": rng.uniform(0, 1e-6),
        "comm_s_fixed": rng.uniform(0, 1e-3),
        "comm_s_per_token": rng.uniform(0, 1e-7),
    }
    if draw(st.booleans()):  # cost model v2 terms
        cost["seq_s"] = rng.uniform(0, 1e-3)
        cost["flop_tokens_half"] = rng.uniform(0, 300)
        cost["overlap"] = rng.uniform(0, 1)
        cost["prefill_fixed_s"] = rng.uniform(0, 5e-3)
    if draw(st.booleans()):  # the scheduler's CPU time (v4), at times above the GPU's
        cost["sched_cpu_s"] = rng.uniform(0, 8e-3)
        cost["sched_cpu_per_seq_s"] = rng.uniform(0, 2e-3)
    max_model_len = int((prompt + output).max()) + int(rng.integers(0, 50))
    values: dict[str, Any] = {
        "policy": policy,
        "cost": cost,
        "replicas": num_replicas,
        "router": router,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "num_gpu_blocks": 1,  # replaced below, once the policy's needs are known
    }
    if caches:
        values["enable_prefix_caching"] = caching
        if caching:
            values["prefix_partial_blocks"] = draw(st.booleans())
    if router == "prefix_aware":
        values |= {
            "cache_threshold": draw(st.sampled_from([0.0, 0.3, 0.8])),
            "balance_abs_threshold": draw(st.sampled_from([0, 2, 64])),
            "balance_rel_threshold": draw(st.sampled_from([1.0, 1.5])),
        }
    priority = None
    if policy == "vllm":
        seqs = draw(st.integers(1, 8))
        values |= {
            "max_num_seqs": seqs,
            "max_num_batched_tokens": draw(st.integers(seqs, 300)),
            "enable_chunked_prefill": draw(st.booleans()),
            "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 17, 64])),
            "watermark": draw(st.sampled_from([0.0, 0.0, 0.05])),
            "scheduling_policy": draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
            "scheduler_reserve_full_isl": draw(st.booleans()),
            "async_scheduling": draw(st.booleans()),
        }
        if not values["enable_chunked_prefill"]:
            values["max_num_batched_tokens"] = max(values["max_num_batched_tokens"], max_model_len)
        if values["scheduling_policy"] == "priority":
            priority = rng.integers(0, 3, n).astype(np.int64)
        if speculative:  # speculative decoding (speculation.py): vLLM's synchronous loop
            k = draw(st.integers(1, 5))
            rates = draw(st.sampled_from(["one", "list"]))
            values["async_scheduling"] = False
            values["speculative"] = {
                "method": draw(st.sampled_from(["ngram", "eagle", "draft_model"])),
                "num_tokens": k,
                "acceptance": (
                    float(rng.choice([0.0, 0.5, 0.8, 1.0]))
                    if rates == "one"
                    else [float(x) for x in rng.uniform(0, 1, k)]
                ),
            }
            least = k + 2  # a decode, its drafts and a draft model's slot
            values["max_num_batched_tokens"] = max(values["max_num_batched_tokens"], least)
    elif policy == "sarathi":
        seqs = draw(st.integers(1, 8))
        values |= {
            "max_num_seqs": seqs,
            "chunk_size": draw(st.integers(seqs, 300)),
            "watermark": draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        }
    elif policy == "orca":
        values |= {"max_num_seqs": draw(st.integers(1, 8))}
    elif policy == "sglang":
        values |= {
            "max_running_requests": draw(st.integers(1, 8)),
            "max_prefill_tokens": draw(st.integers(1, 400)),
            "chunked_prefill_size": draw(st.sampled_from([-1, 16, 64, 300])),
            "schedule_policy": draw(st.sampled_from(sglang.ORDERS)),
            "schedule_conservativeness": draw(st.sampled_from([0.3, 1.0, 2.0])),
            "overlap_schedule": draw(st.booleans()),
        }
        if values["chunked_prefill_size"] != -1:
            values["chunked_prefill_size"] = max(values["chunked_prefill_size"], block_size)
    elif policy == "transformers":
        values |= {
            "max_batch_tokens": draw(st.integers(1, 300)),
            "scheduler_type": draw(st.sampled_from(["fifo", "prefill_first"])),
            "max_requests_per_batch": draw(st.sampled_from([1, 3, 8, 1024])),
            "safety_margin": draw(st.sampled_from([-1.0, -1.0, 0.0, 0.3])),
        }
    elif policy == "tgi":
        chunking = draw(st.booleans())
        values |= {
            "prefill_chunking": chunking,
            "max_batch_prefill_tokens": draw(st.integers(1, 300)),
            "max_batch_size": draw(st.sampled_from([0, 1, 3, 8])),
            "waiting_served_ratio": draw(st.sampled_from([0.0, 0.3, 1.2])),
            "max_waiting_tokens": draw(st.sampled_from([0, 3, 20])),
        }
        if not chunking:
            values["max_batch_prefill_tokens"] = max(
                values["max_batch_prefill_tokens"], max_model_len - 1
            )
    else:
        values |= {
            "max_batch_size": draw(st.integers(1, 8)),
            "max_wait_s": draw(st.sampled_from([0.0, 0.0, 0.3, 2.0])) * rng.uniform(0.9, 1.1),
        }
    probe = build_scenario({**values, "num_gpu_blocks": 10**9})
    need = int(POLICIES[policy].blocks_alone(probe.params, probe.memory, prompt, output).max())
    if probe.speculative is not None:  # the last decode's drafts and lookahead slots too
        mem = probe.memory
        sizes = probe.speculative.blocks_alone(mem.block_size, mem.max_model_len, prompt, output)
        need = int(sizes.max())
    extra_null = probe.memory.num_gpu_blocks - probe.num_kv_blocks
    values["num_gpu_blocks"] = int(math.ceil(need * pressure)) + extra_null
    if policy == "sarathi":  # the watermark grows with the pool: find the smallest that fits
        while True:
            sc = build_scenario(values)
            if POLICIES[policy].blocks_alone(sc.params, sc.memory, prompt, output).max() <= (
                sc.num_kv_blocks
            ):
                break
            values["num_gpu_blocks"] += 1
    if kv_tiers:  # KV offloading tiers (kv_tiers.py): from a block to more than the replay's
        kv = 4096  # KV bytes per token: a block is whole pages, a tier's GiB exact
        block_bytes = kv * block_size
        cpu = draw(st.sampled_from([1, 4, 16, 64, 10**4]))
        disk = draw(st.sampled_from([0, 0, 8, 64]))
        values |= {
            "kv_offloading_size_gb": cpu * block_bytes / 2**30,
            "kv_disk_size_gb": disk * block_bytes / 2**30,
            "kv_offloading_kv_bytes_per_token": kv,
            "kv_offloading_link_gb_s": float(rng.uniform(0.01, 1.0)),
            "kv_disk_read_gb_s": float(rng.uniform(0.005, 0.5)),
        }
    sc = build_scenario(values)
    inp = SimInput(arrival, prompt.astype(np.int64), output.astype(np.int64), priority=priority)
    sc.cap_lengths(inp.prompt_tokens, inp.output_tokens, np.zeros(n, dtype=np.int64))
    if caching:
        trace_block = draw(st.sampled_from([block_size, block_size, 2 * block_size, 4, 6, 16]))
        partial = draw(st.booleans())  # a hash for a partial last block (Mooncake's)
        hashes = shared_prefix_hashes(rng, prompt, trace_block, partial=partial)
        warmup = draw(st.sampled_from([0, 0, min(3, n - 1)]))
        tails = sc.prefix_partial_blocks
        inp = with_prefix(inp, hashes, trace_block, block_size, warmup=warmup, partial_blocks=tails)
    return inp, sc


@st.composite
def cases(
    draw: Any,
    policy: str,
    caching: bool | None = None,
    speculative: bool = False,
    kv_tiers: bool = False,
) -> tuple[SimInput, Scenario]:
    return _case(draw, policy, caching=caching, speculative=speculative, kv_tiers=kv_tiers)


def expand(res: SimResult) -> np.ndarray:
    """One row per engine step: replica, step, running, waiting, prefill, decode, preempt,
    prefix lookups and hits (a compressed row has none)."""
    cols = [
        S_REPLICA,
        S_STEP,
        S_RUNNING,
        S_WAITING,
        S_PREFILL,
        S_DECODE,
        S_PREEMPT,
        S_PQUERY,
        S_PHIT,
        S_SPEC_DRAFT,
        S_SPEC_ACC,
        S_CPU_HIT,
        S_DISK_HIT,
        S_TIER_LOAD,
    ]
    rows = np.repeat(res.st[:, cols], res.st[:, S_NUM_STEPS], axis=0)
    offsets = np.concatenate([np.arange(k) for k in res.st[:, S_NUM_STEPS]])
    rows[:, 1] += offsets
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    return rows[order]


def check_invariants(inp: SimInput, sc: Scenario, res: SimResult) -> None:
    rq, rqw, rqf = res.rq, res.rqw, res.rqf
    # every request completes exactly once, with all its tokens
    assert (rq[:, R_STATUS] == ST_FINISHED).all()
    assert (rq[:, R_GENERATED] == rq[:, R_OUTPUT]).all()
    assert not np.isnan(rqf[:, F_FINISH]).any()
    # tokens computed = tokens needed + recomputation - tokens found in the prefix cache
    needed = rq[:, R_PROMPT] + rq[:, R_OUTPUT] - 1
    assert (rqw[:, W_TOTAL] == needed + rqw[:, W_DISCARDED] - rqw[:, W_HITS]).all()
    assert (rqw[rq[:, R_PREEMPT] == 0, W_DISCARDED] == 0).all()
    # nothing is held at the end; hits are whole units (or end with a tail), never the whole
    # prompt
    assert (rq[:, R_HELD] == 0).all() and (rq[:, R_SHARED] == 0).all()
    assert (rq[:, R_CACHED] <= rq[:, R_PROMPT] - 1).all()
    units = np.maximum(rq[:, R_UNIT_TOK], 1)
    whole = rq[:, R_TAIL] == 0
    assert (rq[whole, R_CACHED] % units[whole] == 0).all()
    assert (rqw[whole, W_HITS] % units[whole] == 0).all()
    tail_end = rq[:, R_PROMPT] // units * units + rq[:, R_TAIL]
    assert ((rq[:, R_CACHED] % units == 0) | (rq[:, R_CACHED] == tail_end)).all()
    looked = rq[:, R_UNIT_TOK] > 0
    assert (rq[looked, R_LOOKUPS] >= 1).all() and (rq[~looked, R_LOOKUPS] == 0).all()
    assert res.st[:, S_PQUERY].sum() == rq[looked, R_PROMPT].sum()
    assert res.st[:, S_PHIT].sum() == rq[:, R_CACHED].sum()
    # causality
    assert (rqf[:, F_ARRIVAL] <= rqf[:, F_FIRST_SCHED]).all()
    assert (rqf[:, F_FIRST_SCHED] < rqf[:, F_FIRST_TOKEN]).all()
    assert (rqf[:, F_FIRST_TOKEN] <= rqf[:, F_FINISH]).all()
    # capacity: KV, batch size, token budget
    assert (res.st[:, S_KV_USED] <= sc.num_kv_blocks).all()
    assert (res.st[:, S_KV_USED] >= 0).all()
    if sc.policy == "sglang":
        seqs = sglang.max_running(sc.params, sc.memory)
    elif sc.policy == "tgi":  # chunking models ignore max_batch_size once a batch runs
        seqs = len(inp) if sc.params.prefill_chunking else sc.params.max_batch_size or len(inp)
    elif sc.policy == "transformers":
        seqs = sc.params.max_requests_per_batch
    else:
        seqs = getattr(sc.params, "max_num_seqs", getattr(sc.params, "max_batch_size", 0))
    assert (res.st[:, S_RUNNING] <= seqs).all()
    budget = getattr(sc.params, "max_num_batched_tokens", getattr(sc.params, "chunk_size", None))
    if sc.policy == "transformers":
        budget = sc.params.max_batch_tokens
    if budget is not None:
        assert (res.st[:, S_PREFILL] + res.st[:, S_DECODE] <= budget).all()
    if sc.policy == "sglang":  # a step is a prefill batch or a decode step, never both
        assert ((res.st[:, S_PREFILL] == 0) | (res.st[:, S_DECODE] == 0)).all()
    if sc.policy in ("static", "orca", "tgi"):
        assert res.st[:, S_PREEMPT].sum() == 0
    assert res.st[:, S_PREEMPT].sum() == rq[:, R_PREEMPT].sum()
    assert (res.st[:, S_SPEC_ACC] <= res.st[:, S_SPEC_DRAFT]).all()
    if sc.speculative is None:
        assert res.st[:, S_SPEC_DRAFT].sum() == 0
    else:  # no decode runs: the accepted counts make every step its own
        assert (res.st[:, S_NUM_STEPS] == 1).all()


def check_equal(inp: SimInput, sc: Scenario) -> SimResult:
    fast = simulate(inp, sc.engine())
    ref = simulate_reference(inp, sc)
    check_invariants(inp, sc, fast)
    check_invariants(inp, sc, ref)
    bad = np.flatnonzero((fast.rq != ref.rq).any(axis=1))
    assert len(bad) == 0, f"request {bad[0]}: fast {fast.rq[bad[0]]} reference {ref.rq[bad[0]]}"
    close = np.isclose(fast.rqf, ref.rqf, rtol=1e-9, atol=1e-12)
    bad = np.flatnonzero(~close.all(axis=1))
    assert len(bad) == 0, f"request {bad[0]}: fast {fast.rqf[bad[0]]} reference {ref.rqf[bad[0]]}"
    assert np.array_equal(expand(fast), expand(ref))
    assert fast.num_steps == ref.num_steps
    # the fast loop's compressed rows end where the reference's steps do
    ends = fast.st[:, S_STEP] + fast.st[:, S_NUM_STEPS] - 1
    ref_kv = {(int(r[S_REPLICA]), int(r[S_STEP])): int(r[S_KV_USED]) for r in ref.st}
    for row, end in zip(fast.st, ends, strict=True):
        assert ref_kv[(int(row[S_REPLICA]), int(end))] == row[S_KV_USED]
    for r in range(sc.replicas):  # evictions: rows may compress, totals per replica may not
        mine = fast.st[:, S_REPLICA] == r
        theirs = ref.st[:, S_REPLICA] == r
        assert fast.st[mine, S_EVICTED].sum() == ref.st[theirs, S_EVICTED].sum()
    total_ref = np.array([ref.stf[ref.st[:, S_REPLICA] == r, 1].sum() for r in range(sc.replicas)])
    total_fast = np.array(
        [fast.stf[fast.st[:, S_REPLICA] == r, 1].sum() for r in range(sc.replicas)]
    )
    assert np.allclose(total_fast, total_ref, rtol=1e-9)
    for col in (SF_SCHED_CPU, SF_SCHED_EXPOSED):  # the scheduler's CPU time, paid and hidden
        for r in range(sc.replicas):
            mine, theirs = fast.st[:, S_REPLICA] == r, ref.st[:, S_REPLICA] == r
            f, t = fast.stf[mine, col].sum(), ref.stf[theirs, col].sum()
            assert math.isclose(f, t, rel_tol=1e-9, abs_tol=1e-12), (col, r, f, t)
    assert (fast.stf[:, SF_SCHED_EXPOSED] <= fast.stf[:, SF_SCHED_CPU] * (1 + 1e-9)).all()
    if not sc.cost.sched_cpu_s and not sc.cost.sched_cpu_per_seq_s:
        assert not fast.stf[:, SF_SCHED_CPU].any()
    return fast


def check_case(case: tuple[SimInput, Scenario]) -> None:
    fast = check_equal(*case)
    event(f"preemptions: {'yes' if fast.rq[:, R_PREEMPT].any() else 'no'}")
    event(f"decode runs compressed: {'yes' if len(fast.st) < fast.num_steps else 'no'}")
    if case[1].prefix_caching:
        event(f"prefix hits: {'yes' if fast.rq[:, R_CACHED].any() else 'no'}")
        event(f"evictions: {'yes' if fast.st[:, S_EVICTED].any() else 'no'}")
        rq = fast.rq
        units = np.maximum(rq[:, R_UNIT_TOK], 1)
        tail_hit = (rq[:, R_TAIL] > 0) & (rq[:, R_CACHED] % units != 0)
        event(f"tail units: {'hit' if tail_hit.any() else 'yes' if rq[:, R_TAIL].any() else 'no'}")
    if case[1].kv_tiers is not None:
        event(f"CPU tier hits: {'yes' if fast.st[:, S_CPU_HIT].any() else 'no'}")
        event(f"disk tier hits: {'yes' if fast.st[:, S_DISK_HIT].any() else 'no'}")


# (policy, caching, examples): hypothesis draws this many cases of each; caching None lets
# it draw whether a caching policy caches, True forces prefix caching on.
FAST_EQUALS_REFERENCE = [
    pytest.param("vllm", None, 60, id="vllm"),
    pytest.param("transformers", None, 60, id="transformers"),
    pytest.param("sarathi", None, 40, id="sarathi"),
    pytest.param("orca", None, 30, id="orca"),
    pytest.param("static", None, 30, id="static"),
    pytest.param("vllm", True, 50, id="vllm-prefix-caching"),
    pytest.param("sglang", None, 50, id="sglang"),
    pytest.param("tgi", None, 40, id="tgi"),
    pytest.param("vllm-speculative", None, 60, id="vllm-speculative"),
    pytest.param("vllm-speculative", True, 40, id="vllm-speculative-prefix-caching"),
    pytest.param("vllm-kv-tiers", True, 100, id="vllm-kv-tiers"),  # ~1 in 4 hits a tier
]


@pytest.mark.parametrize(("policy", "caching", "examples"), FAST_EQUALS_REFERENCE)
def test_fast_equals_reference(
    request: pytest.FixtureRequest, policy: str, caching: bool | None, examples: int
) -> None:
    """Each policy's fast loop gives the reference loop's results on generated cases."""

    def fast_equals_reference(case: tuple[SimInput, Scenario]) -> None:
        check_case(case)

    # Hypothesis keys its example database and its derandomized seed by the test's source;
    # the case's id added to that key (as its pytest plugin does for parametrized tests)
    # keeps each configuration's seeds and failing examples its own.
    key = request.node.nodeid.encode()
    fast_equals_reference._hypothesis_internal_add_digest = key  # type: ignore[attr-defined]
    speculative = policy == "vllm-speculative"
    kv_tiers = policy == "vllm-kv-tiers"
    policy = policy.removesuffix("-speculative").removesuffix("-kv-tiers")
    strategy = cases(policy, caching, speculative, kv_tiers)
    settings(max_examples=examples)(given(strategy)(fast_equals_reference))()


@settings(max_examples=10)
@given(cases("vllm"))
def test_same_seed_same_result(case: tuple[SimInput, Scenario]) -> None:
    inp, sc = case
    a = simulate(inp, sc.engine())
    b = simulate(inp, sc.engine())
    assert np.array_equal(a.rq, b.rq)
    assert np.array_equal(a.rqf, b.rqf, equal_nan=True)
    assert np.array_equal(a.st, b.st)


def pressure_input() -> SimInput:
    """Many long requests at once, for a pool that holds about two of them (50 blocks of 16)."""
    rng = np.random.default_rng(7)
    n = 30
    return SimInput(
        np.sort(rng.uniform(0, 0.2, n)),
        rng.integers(100, 300, n).astype(np.int64),
        rng.integers(20, 80, n).astype(np.int64),
    )


def test_kv_pressure_preempts_and_still_matches() -> None:
    inp = pressure_input()
    for policy, params in [
        ("vllm", {"max_num_seqs": 8, "max_num_batched_tokens": 512}),
        ("sarathi", {"max_num_seqs": 8, "chunk_size": 256, "watermark": 0.0}),
        ("transformers", {"max_batch_tokens": 512, "scheduler_type": "fifo"}),
        ("transformers", {"max_batch_tokens": 256, "scheduler_type": "prefill_first"}),
    ]:
        sc = build_scenario(
            {
                "policy": policy,
                "cost": {
                    **dict.fromkeys(_COST_KEYS, 0.0),
                    "fixed_s": 0.01,
                    "flop_s_per_token": 1e-5,
                },
                "num_gpu_blocks": 50,
                "block_size": 16,
                "max_model_len": 512,
                **params,
            }
        )
        fast = simulate(inp, sc.engine())
        assert fast.rq[:, R_PREEMPT].sum() > 0, policy
        check_equal(inp, sc)


_COST_KEYS = [
    "fixed_s",
    "flop_s_per_token",
    "flop_s_per_attn",
    "mem_s_weights",
    "mem_s_per_kv_token",
    "mem_s_per_token",
    "comm_s_fixed",
    "comm_s_per_token",
]


def test_decode_runs_are_compressed() -> None:
    # one request alone: one prefill step, then one row for the whole decode run
    sc = build_scenario(
        {
            "policy": "vllm",
            "cost": {**dict.fromkeys(_COST_KEYS, 0.0), "fixed_s": 0.01, "mem_s_per_kv_token": 1e-6},
            "num_gpu_blocks": 100,
            "max_model_len": 2048,
        }
    )
    inp = SimInput(np.array([0.0]), np.array([100]), np.array([500]))
    res = simulate(inp, sc.engine())
    assert res.num_steps == 500
    assert len(res.st) == 2
    check_equal(inp, sc)


@settings(max_examples=40)
@given(cases("vllm", True, kv_tiers=True))
def test_kv_tier_hits_per_request_match_the_steps(case: tuple[SimInput, Scenario]) -> None:
    # each request's CPU and disk tier tokens (sim_requests), fast == reference (rq), add
    # up to the steps' (sim_steps) and are part of its hits over all its lookups
    fast = check_equal(*case)
    rqw = fast.rqw
    assert rqw[:, W_CPU_HITS].sum() == fast.st[:, S_CPU_HIT].sum()
    assert rqw[:, W_DISK_HITS].sum() == fast.st[:, S_DISK_HIT].sum()
    assert (rqw[:, W_CPU_HITS] >= 0).all() and (rqw[:, W_DISK_HITS] >= 0).all()
    assert (rqw[:, W_CPU_HITS] + rqw[:, W_DISK_HITS] <= rqw[:, W_HITS]).all()
    event(f"per-request tier hits: {'yes' if rqw[:, W_CPU_HITS : W_DISK_HITS + 1].any() else 'no'}")
    event(f"decode runs compressed: {'yes' if len(fast.st) < fast.num_steps else 'no'}")
