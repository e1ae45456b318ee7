"""Disaggregated prefill and decode (``disagg.py``) and requests that arrive with their KV
(``SimInput.remote_tokens``).

Hand-checked cases use ``UNIT_COST`` (every step takes 1 s) and a link of 8e-3 Gb/s
(1e6 bytes/s): a prompt of p tokens at 1,000 KV bytes per token is on the wire for
p / 1,000 s.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts import SCENARIOS, SIM_REQUESTS, SIM_STEPS, read_table
from pipeline.errors import ScenarioError
from pipeline.sim.disagg import (
    DECODE_ROUTERS,
    LINKS,
    ROLE_DECODE,
    ROLE_PREFILL,
    Disagg,
    link_queue,
    simulate_disaggregated,
    take_keys,
)
from pipeline.sim.reference import simulate_reference
from pipeline.sim.replay import replay
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CHUNKS,
    R_GENERATED,
    R_HELD,
    R_OUTPUT,
    R_PREEMPT,
    R_PROMPT,
    R_REPLICA,
    R_SHARED,
    R_STATUS,
    S_NUM_STEPS,
    S_REPLICA,
    ST_FINISHED,
    W_DISCARDED,
    W_HITS,
    W_TOTAL,
    PrefixKeys,
    SimInput,
    SimResult,
)
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, UNIT_COST, make_input, make_scenario, requests_table
from tests.sim.test_differential import cases, expand

SLOW_LINK = {"kv_link_gbps": 8e-3, "kv_link_latency_s": 0.05, "kv_bytes_per_token": 1000}


def disagg_scenario(x: int = 1, y: int = 1, **values: Any) -> Scenario:
    return make_scenario("vllm", prefill_replicas=x, decode_replicas=y, **{**SLOW_LINK, **values})


def reference_side(inp: SimInput, sc: Scenario, *, on_progress: Any = None) -> SimResult:
    return simulate_reference(inp, sc)


def assert_same(fast: SimResult, ref: SimResult) -> None:
    bad = np.flatnonzero((fast.rq != ref.rq).any(axis=1))
    assert len(bad) == 0, f"request {bad[0]}: fast {fast.rq[bad[0]]} reference {ref.rq[bad[0]]}"
    close = np.isclose(fast.rqf, ref.rqf, rtol=1e-9, atol=1e-12)
    bad = np.flatnonzero(~close.all(axis=1))
    assert len(bad) == 0, f"request {bad[0]}: fast {fast.rqf[bad[0]]} reference {ref.rqf[bad[0]]}"
    assert np.array_equal(expand(fast), expand(ref))
    assert fast.num_steps == ref.num_steps


# --- requests that arrive with their prompt's KV -----------------------------------------


@st.composite
def remote_cases(draw: Any) -> tuple[SimInput, Scenario]:
    inp, sc = draw(cases("vllm"))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    prompt = inp.prompt_tokens
    # mostly the whole prompt but its last token (a KV connector's), some partial, some none
    kind = rng.integers(0, 3, len(inp))
    partial = (rng.random(len(inp)) * prompt).astype(np.int64)
    remote = np.where(kind == 0, 0, np.where(kind == 1, partial, prompt - 1))
    return dataclasses.replace(inp, remote_tokens=np.minimum(remote, prompt - 1)), sc


@settings(max_examples=60, deadline=None)
@given(remote_cases())
def test_remote_tokens_fast_equals_reference(case: tuple[SimInput, Scenario]) -> None:
    """Requests that start with computed tokens: the fast loop gives the reference's
    results, every request finishes, and only what was not remote is computed."""
    inp, sc = case
    fast = simulate(inp, sc.engine())
    ref = simulate_reference(inp, sc)
    assert_same(fast, ref)
    rq, rqw = fast.rq, fast.rqw
    assert (rq[:, R_STATUS] == ST_FINISHED).all()
    assert (rq[:, R_GENERATED] == rq[:, R_OUTPUT]).all()
    assert (rq[:, R_HELD] == 0).all() and (rq[:, R_SHARED] == 0).all()
    assert inp.remote_tokens is not None
    needed = rq[:, R_PROMPT] + rq[:, R_OUTPUT] - 1 - inp.remote_tokens
    assert (rqw[:, W_TOTAL] == needed + rqw[:, W_DISCARDED] - rqw[:, W_HITS]).all()
    rqf = fast.rqf
    assert (rqf[:, F_ARRIVAL] <= rqf[:, F_FIRST_SCHED]).all()
    assert (rqf[:, F_FIRST_SCHED] < rqf[:, F_FIRST_TOKEN]).all()


def test_remote_prompt_takes_one_step_to_its_first_token() -> None:
    """With all but its last prompt token present, a request's first step computes one
    token and samples its first output token (vLLM's decode worker)."""
    sc = make_scenario("vllm")
    inp = dataclasses.replace(
        make_input([0.0], [500], [3]), remote_tokens=np.array([499], dtype=np.int64)
    )
    res = simulate(inp, sc.engine())
    assert res.rqf[0, F_FIRST_TOKEN] == 1.0  # one step of 1 s
    assert res.rqf[0, F_FINISH] == 3.0
    assert res.rqw[0, W_TOTAL] == 3  # the last prompt token, then two decodes
    assert res.rq[0, R_CHUNKS] == 1


# --- the KV link -------------------------------------------------------------------------


def test_transfer_time_is_bytes_over_bandwidth() -> None:
    d = Disagg(1, 1, "ib_ndr", link_gbps=400.0, link_latency_s=0.0, kv_bytes_per_token=131072)
    prompt = np.array([1000, 1], dtype=np.int64)
    # 1,000 tokens of 128 KiB: 131,072,000 bytes = 1,048,576,000 bits at 4e11 bit/s
    assert np.allclose(d.wire_s(prompt), [1048576000 / 4e11, 1048576 / 4e11])
    assert LINKS["ib_ndr"].gbps == 400.0


def test_transfers_on_one_link_queue() -> None:
    """Two transfers of one prefill worker go one after the other; another worker's
    link is free."""
    done = np.array([1.0, 1.0, 1.0, 5.0])
    link = np.array([0, 0, 1, 0], dtype=np.int64)
    wire = np.array([2.0, 3.0, 2.0, 1.0])
    land = link_queue(done, link, wire, 0.5, 2)
    # link 0: [1, 3] then [3, 6]; request 3 done at 5 waits for it: [6, 7]
    assert np.allclose(land, [3.5, 6.5, 3.5, 7.5])


# --- a disaggregated replay --------------------------------------------------------------


def test_one_request_timeline() -> None:
    """Prefill step [0, 1]; 100 tokens' KV on the wire 0.1 s, landing 0.05 s later at
    1.15; the decode worker's steps end at 2.15 (first token), 3.15 and 4.15."""
    sc = disagg_scenario()
    out = simulate_disaggregated(make_input([0.0], [100], [3]), sc)
    assert np.allclose(out.prefill_done_s, [1.0])
    assert np.allclose(out.transfer_s, [0.15])
    assert np.allclose(out.decode_arrival_s, [1.15])
    rqf = out.result.rqf
    assert np.allclose(rqf[0], [0.0, 0.0, 2.15, 4.15])
    assert out.result.rq[0, R_REPLICA] == 1  # the decode worker, after the prefill one
    steps = out.result.st[:, S_NUM_STEPS]  # (a run of decode steps is one row)
    assert steps[out.step_role == ROLE_PREFILL].sum() == 1
    assert steps[out.step_role == ROLE_DECODE].sum() == 3
    assert list(out.result.st[:, S_REPLICA]) == [0] + [1] * (len(steps) - 1)
    # the prefill worker computed the prompt, the decode worker its last token again
    assert out.result.rqw[0, W_TOTAL] == 100 + 3


def test_ttft_covers_prefill_and_transfer() -> None:
    rng = np.random.default_rng(5)
    n = 60
    arrival = np.sort(rng.uniform(0, 20, n))
    prompt = rng.integers(1, 2000, n)
    output = rng.integers(1, 40, n)
    sc = disagg_scenario(2, 3, decode_router="least_outstanding")
    inp = SimInput(arrival, prompt.astype(np.int64), output.astype(np.int64))
    out = simulate_disaggregated(inp, sc)
    d = sc.disagg
    assert d is not None
    rqf = out.result.rqf
    assert (out.transfer_s >= d.wire_s(inp.prompt_tokens) + d.link_latency_s - 1e-12).all()
    assert np.allclose(out.decode_arrival_s, out.prefill_done_s + out.transfer_s)
    assert (rqf[:, F_FIRST_TOKEN] > out.decode_arrival_s).all()
    assert (rqf[:, F_FIRST_TOKEN] - rqf[:, F_ARRIVAL] >= out.prefill_done_s - arrival).all()
    assert np.array_equal(rqf[:, F_ARRIVAL], arrival)
    assert (out.result.rq[:, R_STATUS] == ST_FINISHED).all()
    assert set(out.result.rq[:, R_REPLICA]) <= {2, 3, 4}
    assert set(out.prefill.rq[:, R_REPLICA]) <= {0, 1}
    assert (np.diff(out.result.stf[:, 0]) >= 0).all()  # both sides' rows by start


def test_disaggregated_fast_equals_reference() -> None:
    rng = np.random.default_rng(11)
    n = 40
    arrival = np.sort(rng.uniform(0, 5, n))
    prompt = rng.integers(1, 300, n).astype(np.int64)
    output = rng.integers(1, 30, n).astype(np.int64)
    sc = disagg_scenario(2, 2, num_gpu_blocks=60, max_num_seqs=4, max_num_batched_tokens=128)
    inp = SimInput(arrival, prompt, output)
    fast = simulate_disaggregated(inp, sc)
    ref = simulate_disaggregated(inp, sc, simulate_side=reference_side)
    assert_same(fast.prefill, ref.prefill)
    assert_same(fast.decode, ref.decode)
    assert np.array_equal(fast.result.rq, ref.result.rq)
    assert np.allclose(fast.transfer_s, ref.transfer_s)


@settings(max_examples=25, deadline=None)
@given(cases("vllm"), st.integers(1, 3), st.integers(1, 3), st.sampled_from(DECODE_ROUTERS))
def test_disaggregated_replay_fast_equals_reference(
    case: tuple[SimInput, Scenario], x: int, y: int, decode_router: str
) -> None:
    """Generated vLLM cases (any prefill router, prefix caching, KV pressure, async or
    not) replayed disaggregated: both sides of the fast loop give the reference's."""
    inp, sc = case
    d = Disagg(x, y, "ib_ndr", 8e-3, 0.01, 1000, decode_router=decode_router)
    sc = dataclasses.replace(sc, replicas=x + y, disagg=d)
    fast = simulate_disaggregated(inp, sc)
    ref = simulate_disaggregated(inp, sc, simulate_side=reference_side)
    assert_same(fast.prefill, ref.prefill)
    assert_same(fast.decode, ref.decode)
    assert (fast.result.rq[:, R_STATUS] == ST_FINISHED).all()
    rqf = fast.result.rqf
    assert (rqf[:, F_FIRST_TOKEN] > fast.decode_arrival_s).all()
    assert (fast.decode_arrival_s >= fast.prefill_done_s + d.link_latency_s).all()


def test_fewer_decode_blocks_preempt_on_the_decode_side() -> None:
    n = 30
    inp = SimInput(np.zeros(n), np.full(n, 200, dtype=np.int64), np.full(n, 100, dtype=np.int64))
    roomy = simulate_disaggregated(inp, disagg_scenario(1, 1, num_gpu_blocks=2000))
    tight = simulate_disaggregated(inp, disagg_scenario(1, 1, decode_num_gpu_blocks=60))
    assert roomy.decode.rq[:, R_PREEMPT].sum() == 0
    assert tight.decode.rq[:, R_PREEMPT].sum() > 0
    assert tight.prefill.rq[:, R_PREEMPT].sum() == 0  # the prefill side kept its blocks
    assert tight.result.rq[:, R_PREEMPT].sum() == tight.decode.rq[:, R_PREEMPT].sum()
    assert tight.result.num_kv_blocks == 59  # the decode workers' (one is the null block)
    assert (tight.result.rq[:, R_STATUS] == ST_FINISHED).all()


def test_prefix_keys_follow_their_requests() -> None:
    pk = PrefixKeys(
        np.array([0, 2, 2, 5], dtype=np.int64),
        np.array([1, 2, 3, 4, 5], dtype=np.uint64),
        np.array([16, 0, 32], dtype=np.int64),
    )
    got = take_keys(pk, np.array([2, 0, 1], dtype=np.int64))
    assert list(got.offsets) == [0, 3, 5, 5]
    assert list(got.keys) == [3, 4, 5, 1, 2]
    assert list(got.unit_tokens) == [32, 16, 0]


# --- scenario keys -----------------------------------------------------------------------


def test_keys_resolve() -> None:
    sc = build_scenario({"prefill_replicas": 2, "decode_replicas": 3, "kv_link": "eth_100g"})
    assert sc.replicas == 5
    assert sc.disagg is not None and sc.disagg.link_gbps == 100.0
    assert sc.disagg.kv_bytes_per_token > 0  # the profile's
    config = sc.to_dict()
    assert config["prefill_replicas"] == 2 and config["kv_link"] == "eth_100g"
    assert "prefill_replicas" not in build_scenario({}).to_dict()


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"policy": "sglang", "prefill_replicas": 1, "decode_replicas": 1}, "only vllm"),
        ({"prefill_replicas": 1}, "both be >= 1"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "kv_link": "carrier-pigeon"}, "kv_link"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "kv_link_gbps": 0}, "kv_link_gbps"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "replicas": 2}, "not both"),
        (
            {"prefill_replicas": 1, "decode_replicas": 1, "decode_router": "prefix_aware"},
            "decode_router",
        ),
        ({"kv_link": "ib_ndr"}, "applies to a disaggregated scenario"),
        ({"prefill_replicas": -1, "decode_replicas": 1}, "prefill_replicas"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "decode_num_gpu_blocks": 1}, "decode_num"),
    ],
)
def test_bad_keys(values: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match=words) as err:
        build_scenario(values, where="s.toml")
    assert "\n" not in str(err.value) and str(err.value).startswith("s.toml")


def test_cost_table_needs_kv_bytes() -> None:
    with pytest.raises(ScenarioError, match="kv_bytes_per_token is required"):
        build_scenario(
            {
                "cost": UNIT_COST,
                "num_gpu_blocks": 100,
                "prefill_replicas": 1,
                "decode_replicas": 1,
            }
        )


def test_not_vllm_or_not_disaggregated_cannot_replay() -> None:
    with pytest.raises(ScenarioError, match="not disaggregated"):
        simulate_disaggregated(make_input([0.0], [4], [2]), make_scenario("vllm"))


# --- through replay ----------------------------------------------------------------------


def test_replay_writes_both_sides(warehouse_with: Callable[..., Path]) -> None:
    """``replay`` of a disaggregated scenario: client-facing requests, both sides' steps
    (prefill workers 0, 1; decode workers 2, 3, 4), its keys in the scenarios table."""
    n = 40
    rng = np.random.default_rng(3)
    table = requests_table(
        rng.integers(10, 400, n),
        rng.integers(1, 50, n),
        rng.exponential(0.05, n),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    root = warehouse_with(table)
    sc = make_scenario(
        "vllm", H100_8B_COST, name="pd", prefill_replicas=2, decode_replicas=3, **SLOW_LINK
    )
    agg = make_scenario("vllm", H100_8B_COST, name="agg", replicas=5)
    result = replay(root, [sc, agg], quiet=True)
    pd_run, agg_run = result.runs
    sim = read_table(pd_run.paths["sim_requests"], SIM_REQUESTS)
    steps = read_table(pd_run.paths["sim_steps"], SIM_STEPS)
    assert sim.num_rows == n == pd_run.summary["completed"]
    assert set(steps["replica"].to_pylist()) <= {0, 1, 2, 3, 4}
    assert {0, 2} <= set(steps["replica"].to_pylist())
    assert pc.sum(steps["num_steps"]).as_py() == pd_run.summary["num_steps"]
    # the slow link (1e6 bytes/s) adds prompt / 1000 s to every first token
    ttft = sim["ttft_s"].to_numpy()
    agg_ttft = read_table(agg_run.paths["sim_requests"], SIM_REQUESTS)["ttft_s"].to_numpy()
    prompt = sim["prompt_tokens"].to_numpy()
    assert (ttft >= prompt / 1000.0 + SLOW_LINK["kv_link_latency_s"]).all()
    assert np.median(ttft) > np.median(agg_ttft)
    (scen_file,) = [p for p in Warehouse(root).files(SCENARIOS) if result.run_id in str(p)]
    config = json.loads(read_table(scen_file, SCENARIOS).to_pylist()[0]["config_json"])
    assert config["prefill_replicas"] == 2 and config["kv_link_gbps"] == 8e-3


def test_a_fleets_disaggregated_pool_is_the_disaggregated_replay_of_its_share() -> None:
    from pipeline.sim.fleet import prepare_fleet, simulate_fleet
    from pipeline.sim.summary import summarize
    from tests.sim.test_pools import _frame

    base = {"cost": UNIT_COST, "num_gpu_blocks": 900, "max_model_len": 4096, "name": "f"}
    pools = [
        {"name": "chat", "tenants": ["chat"], "replicas": 2},
        {"name": "rest", "prefill_replicas": 1, "decode_replicas": 2, "kv_bytes_per_token": 1024},
    ]
    fleet = build_scenario({**base, "pool": pools, "rate": 20.0, "arrivals": "poisson"})
    assert fleet.replicas == 5
    fp = prepare_fleet(_frame(200, 5), fleet)
    fr = simulate_fleet(fleet, fp)
    k = 1
    prep = fp.prepared[k]
    assert prep is not None
    mine = np.flatnonzero(fp.pool_of == k)
    arrival = fr.result.rqf[mine, F_ARRIVAL]
    own = dataclasses.replace(prep.inp, arrival_s=arrival - arrival[0])
    want = simulate_disaggregated(own, fleet.pools[k].scenario).result
    np.testing.assert_allclose(
        fr.result.rqf[mine, F_FIRST_TOKEN] - arrival[0], want.rqf[:, F_FIRST_TOKEN], atol=1e-9
    )
    np.testing.assert_array_equal(fr.result.rq[mine, R_REPLICA] - 2, want.rq[:, R_REPLICA])
    times = fr.result.disagg_times
    assert times is not None
    assert np.isnan(times[fp.pool_of == 0]).all() and not np.isnan(times[mine]).any()
    summary = summarize(fr.result)
    assert summary["disagg"]["num_requests"] == len(mine)


def test_the_replay_summary_prints_ttft_in_its_parts() -> None:
    from pipeline.cli.replay import _disagg_lines

    parts = {
        f"{n}_p{q}_s": 0.001 * (q + i)
        for i, n in enumerate(("prefill", "kv_transfer", "decode_wait"))
        for q in (50, 99)
    }
    (line,) = _disagg_lines({"disagg": {"num_requests": 3, **parts}})
    assert "prefill p50 50 ms p99 99 ms" in line and "KV transfer p50 51 ms" in line
    assert "decode wait p50 52 ms p99 101 ms" in line
    assert _disagg_lines({}) == [] and _disagg_lines({"disagg": {"num_requests": 0}}) == []
