"""Swap preemption (``swap.py``): the fast loop equals the reference loop with swapping
on, a swapped request resumes without recompute, the step waits for its copies, and
with swapping off (or no host memory) nothing changes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipeline.errors import ScenarioError
from pipeline.sim import profiles
from pipeline.sim.cost_model import step_time
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    C_SWAP_BLOCKS,
    R_OUTPUT,
    R_PREEMPT,
    R_PROMPT,
    R_SWAPS,
    S_DECODE,
    S_NUM_STEPS,
    S_PREEMPT,
    S_PREFILL,
    S_RUNNING,
    S_SWAP_IN,
    S_SWAP_OUT,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    W_DISCARDED,
    W_TOTAL,
    SimInput,
)
from pipeline.sim.summary import summarize
from pipeline.sim.swap import HOST_LINK_BYTES_PER_S, V0_SWAP_BYTES_PER_S, Swap
from tests.sim.test_differential import _COST_KEYS, _case, check_equal, pressure_input

KV_BYTES = 131072  # a llama-3-8b token's K and V, bf16


def swapping(sc: Scenario, host_blocks: int, link_gb_s: float = 25.0) -> Scenario:
    """``sc`` (a vllm scenario without prefix caching) with swap preemption on."""
    params = dataclasses.replace(
        sc.params,
        preemption_mode="swap",
        async_scheduling=False,
        scheduling_policy="fcfs",
        swap_kv_bytes_per_token=KV_BYTES,
        swap_link_gb_s=link_gb_s,
    )
    block_bytes = KV_BYTES * sc.memory.block_size
    swap = Swap(host_blocks=host_blocks, block_bytes=block_bytes, link_bytes_per_s=link_gb_s * 1e9)
    return dataclasses.replace(sc, params=params, swap=swap)


@st.composite
def swap_cases(draw: Any) -> tuple[SimInput, Scenario]:
    inp, sc = _case(draw, "vllm", caching=False)
    inp = dataclasses.replace(inp, priority=None)
    # none, a few (some swaps fall back to recompute), or room for every block
    host = draw(st.sampled_from([0, 1, 4, 16, 10**6]))
    return inp, swapping(sc, host, draw(st.sampled_from([0.5, 25.0])))


@settings(max_examples=150)  # about one case in seven swaps
@given(swap_cases())
def test_fast_equals_reference_with_swapping(case: tuple[SimInput, Scenario]) -> None:
    inp, sc = case
    fast = check_equal(inp, sc)
    swaps = int(fast.rq[:, R_SWAPS].sum())
    preempts = int(fast.rq[:, R_PREEMPT].sum())
    event(f"swaps: {'yes' if swaps else 'no'}")
    event(f"fallbacks to recompute: {'yes' if preempts > swaps else 'no'}")
    # every block that went out came back in; each swap is a preemption
    assert fast.st[:, S_SWAP_OUT].sum() == fast.st[:, S_SWAP_IN].sum()
    assert swaps <= preempts
    assert (fast.st[fast.st[:, S_SWAP_OUT] > 0, S_PREEMPT] > 0).all()


def _pressure(**extra: Any) -> tuple[SimInput, Scenario]:
    """Many long requests at once on a pool that holds about two of them."""
    inp = pressure_input()
    values = {
        "policy": "vllm",
        "cost": {**dict.fromkeys(_COST_KEYS, 0.0), "fixed_s": 0.01, "flop_s_per_token": 1e-5},
        "num_gpu_blocks": 50,
        "block_size": 16,
        "max_model_len": 512,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "async_scheduling": False,
        "enable_prefix_caching": False,
        **extra,
    }
    return inp, build_scenario(values)


SWAP_KEYS = {
    "preemption_mode": "swap",
    "swap_kv_bytes_per_token": KV_BYTES,
    "swap_link_gb_s": 25.0,
}


def test_swapped_requests_resume_without_recompute() -> None:
    inp, rec = _pressure()
    _, swp = _pressure(**SWAP_KEYS, swap_space_gb=1.0)
    a = simulate(inp, rec.engine())
    b = simulate(inp, swp.engine())
    assert a.rq[:, R_PREEMPT].sum() > 0 and a.rqw[:, W_DISCARDED].sum() > 0
    # room for every swap: each preemption is a swap, and nothing is computed twice
    assert b.rq[:, R_SWAPS].sum() == b.rq[:, R_PREEMPT].sum() > 0
    assert b.rqw[:, W_DISCARDED].sum() == 0
    computed_once = b.rq[:, R_PROMPT] + b.rq[:, R_OUTPUT] - 1
    assert np.array_equal(b.rqw[:, W_TOTAL], computed_once)
    check_equal(inp, swp)


def test_a_step_waits_for_its_copies() -> None:
    inp, sc = _pressure(**{**SWAP_KEYS, "swap_space_gb": 1.0, "swap_link_gb_s": 0.5})
    res = simulate(inp, sc.engine())
    assert sc.swap is not None
    one = res.st[:, S_NUM_STEPS] == 1
    st_, stf = res.st[one], res.stf[one]
    compute = np.array(
        [
            step_time(
                sc.cost.as_array(),
                float(r[S_PREFILL]),
                a,
                float(r[S_RUNNING]),
                float(r[S_DECODE]),
                c,
            )
            for r, a, c in zip(st_, stf[:, SF_ATTN], stf[:, SF_CTX], strict=True)
        ]
    )
    moved = (st_[:, S_SWAP_OUT] + st_[:, S_SWAP_IN]) / sc.swap.link_bytes_per_s
    assert (moved > 0).any()
    assert np.allclose(stf[:, SF_DURATION], compute + moved, rtol=1e-12, atol=0)


def test_no_host_memory_is_recompute() -> None:
    """Swap mode with no swap space (and so every swap falls back) is recompute exactly."""
    inp, rec = _pressure()
    _, swp = _pressure(**SWAP_KEYS, swap_space_gb=0.0)
    a = simulate(inp, rec.engine())
    b = simulate(inp, swp.engine())
    assert a.rq[:, R_PREEMPT].sum() > 0
    assert np.array_equal(a.rq, b.rq)
    assert np.array_equal(a.rqf, b.rqf, equal_nan=True)
    assert np.array_equal(a.st, b.st) and np.array_equal(a.stf, b.stf)
    assert "swap" not in summarize(a)


def test_summary_counts_swaps_and_bytes() -> None:
    inp, sc = _pressure(**SWAP_KEYS, swap_space_gb=1.0)
    res = simulate(inp, sc.engine())
    s = summarize(res)["swap"]
    assert sc.swap is not None
    assert s["num_swaps"] == res.rq[:, R_SWAPS].sum() > 0
    assert s["swap_out_bytes"] == s["swap_in_bytes"] == res.st[:, S_SWAP_OUT].sum()
    assert s["swap_out_bytes"] % sc.swap.block_bytes == 0


def test_swap_space_becomes_host_blocks() -> None:
    sc = build_scenario(
        {
            "policy": "vllm",
            "preemption_mode": "swap",
            "async_scheduling": False,
            "enable_prefix_caching": False,
            "swap_space_gb": 2.5,
        }
    )
    prof = profiles.load_profile(profiles.DEFAULT_PROFILE)
    block = prof.kv_bytes_per_token * sc.memory.block_size
    assert sc.swap is not None
    assert sc.swap.host_blocks == int(2.5 * 2**30) // block
    assert sc.engine().cfg[C_SWAP_BLOCKS] == sc.swap.host_blocks
    assert sc.to_dict()["swap_host_blocks"] == sc.swap.host_blocks


def test_the_link_is_per_gpu_and_defaults_to_v0s_copy_rate() -> None:
    base = {"policy": "vllm", "preemption_mode": "swap", "async_scheduling": False}
    base |= {"enable_prefix_caching": False, "profile": "llama-3-70b_h100-80gb_tp8"}
    sc = build_scenario(base)
    assert sc.swap is not None  # V0's per-block copies, far below PCIe 5.0's 63 GB/s
    assert sc.swap.link_bytes_per_s == pytest.approx(8 * V0_SWAP_BYTES_PER_S)
    given = build_scenario({**base, "swap_link_gb_s": 20.0})
    assert given.swap is not None and given.swap.link_bytes_per_s == pytest.approx(8 * 20e9)
    slow = {**base, "profile": "llama-3-8b_a100-80gb_tp1"}  # never above the line rate
    assert min(HOST_LINK_BYTES_PER_S["a100-80gb"][0], V0_SWAP_BYTES_PER_S) == (
        build_scenario(slow).swap.link_bytes_per_s  # type: ignore[union-attr]
    )


def test_every_gpu_has_a_host_link() -> None:
    gpus = json.loads((profiles.PROFILE_DIR / "_gpus.json").read_text())
    assert set(gpus) <= set(HOST_LINK_BYTES_PER_S)


def test_recompute_is_the_default() -> None:
    assert build_scenario({"policy": "vllm"}).swap is None


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"policy": "tgi", "preemption_mode": "swap"}, "TGI never preempts"),
        ({"policy": "tgi", "swap_space_gb": 4}, "TGI never preempts"),
        ({"policy": "sglang", "preemption_mode": "swap"}, "policy = vllm"),
        ({"preemption_mode": "swapp"}, "unknown preemption_mode"),
        ({"preemption_mode": "swap"}, "async_scheduling = false"),
        ({"preemption_mode": "swap", "async_scheduling": False}, "enable_prefix_caching"),
        (
            {"preemption_mode": "swap", "async_scheduling": False, "scheduling_policy": "priority"},
            "fcfs",
        ),
        ({"swap_space_gb": -1.0}, "swap_space_gb must be >= 0"),
        ({"swap_space_gb": float("nan")}, "swap_space_gb"),
        ({"swap_space_gb": "lots"}, "swap_space_gb"),
        ({"swap_link_gb_s": -3.0}, "swap_link_gb_s must be >= 0"),
        ({"swap_link_gb_s": float("nan")}, "swap_link_gb_s"),
        ({"swap_link_gb_s": float("inf")}, "swap_link_gb_s"),
        ({"swap_space_gb": float("inf")}, "swap_space_gb"),
        ({"swap_kv_bytes_per_token": -3}, "swap_kv_bytes_per_token"),
    ],
)
def test_bad_swap_keys_are_refused(values: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match=words):
        build_scenario({"policy": "vllm", **values})


def test_a_cost_table_needs_the_kv_bytes() -> None:
    with pytest.raises(ScenarioError, match="swap_kv_bytes_per_token"):
        _pressure(preemption_mode="swap", swap_link_gb_s=25.0)
    with pytest.raises(ScenarioError, match="swap_link_gb_s"):
        _pressure(preemption_mode="swap", swap_kv_bytes_per_token=KV_BYTES)
