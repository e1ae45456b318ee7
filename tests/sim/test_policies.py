"""Each policy's rules on hand-checkable cases (every step costs 1 s)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.sim.reference import simulate_reference
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CHUNKS,
    R_PREEMPT,
    R_QDEPTH,
    R_REPLICA,
    S_DECODE,
    S_NUM_STEPS,
    S_PREEMPT,
    S_PREFILL,
    S_RUNNING,
    W_DISCARDED,
    SimInput,
    SimResult,
)
from tests.helpers import make_input, make_scenario


def run_both(inp: SimInput, sc: Scenario) -> SimResult:
    fast = simulate(inp, sc.engine())
    ref = simulate_reference(inp, sc)
    assert np.array_equal(fast.rq, ref.rq)
    assert np.allclose(fast.rqf, ref.rqf, rtol=1e-9, atol=1e-12, equal_nan=True)
    return fast


def times(res: SimResult, i: int) -> tuple[float, float, float]:
    return (
        float(res.rqf[i, F_FIRST_SCHED]),
        float(res.rqf[i, F_FIRST_TOKEN]),
        float(res.rqf[i, F_FINISH]),
    )


@pytest.mark.parametrize("policy", ["static", "orca", "vllm", "sarathi"])
def test_one_request_prefills_then_decodes(policy: str) -> None:
    res = run_both(make_input([0.0], [100], [3]), make_scenario(policy))
    # step 1 computes the prompt and samples token 1; two decode steps sample 2 and 3
    assert times(res, 0) == (0.0, 1.0, 3.0)
    assert res.num_steps == 3
    assert res.rq[0, R_CHUNKS] == 1


def test_vllm_chunked_prefill_splits_the_prompt_by_budget() -> None:
    sc = make_scenario("vllm", max_num_batched_tokens=64, max_num_seqs=4)
    res = run_both(make_input([0.0], [150], [2]), sc)
    assert res.rq[0, R_CHUNKS] == 3  # 64 + 64 + 22
    assert times(res, 0) == (0.0, 3.0, 4.0)
    assert list(res.st[:3, S_PREFILL]) == [64, 64, 22]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllm_long_prefill_threshold_caps_one_request_per_step(async_scheduling: bool) -> None:
    sc = make_scenario(
        "vllm",
        max_num_batched_tokens=256,
        max_num_seqs=4,
        long_prefill_token_threshold=50,
        async_scheduling=async_scheduling,
    )
    res = run_both(make_input([0.0, 0.0], [120, 30], [1, 1]), sc)
    # step 1: 50 of the long prompt, then the whole short one beside it; the short one is
    # done, so in step 2 the long one is alone and is not capped: its other 70 tokens.
    # Async, step 2 is decided while step 1 runs: the short one still counts, 50 again.
    chunks = [80, 50, 20] if async_scheduling else [80, 70]
    assert list(res.st[: len(chunks), S_PREFILL]) == chunks
    assert res.rqf[1, F_FIRST_TOKEN] == 1.0
    assert res.rq[0, R_CHUNKS] == len(chunks)


def test_vllm_long_prefill_threshold_leaves_a_lone_request_alone() -> None:
    # vLLM applies the threshold only when running + waiting > 1 at the start of the step
    sc = make_scenario(
        "vllm", max_num_batched_tokens=4096, max_num_seqs=4, long_prefill_token_threshold=512
    )
    res = run_both(make_input([0.0], [3000], [2]), sc)
    assert res.rq[0, R_CHUNKS] == 1 and times(res, 0) == (0.0, 1.0, 2.0)
    # a second request waiting makes it long again: 512 + 512 + ...
    res = run_both(make_input([0.0, 0.0], [3000, 10], [2, 2]), sc)
    assert list(res.st[:1, S_PREFILL]) == [522]


def test_vllm_admission_needs_the_whole_sequence_to_fit() -> None:
    # 27 usable blocks of 16 tokens; one request holds 10 (13 at its end); a 320-token prompt needs
    # 20 blocks in all, but its first 64-token chunk only 4. vLLM 0.33 (reserve_full_isl)
    # keeps it waiting until 20 fit; with the switch off it is admitted at once.
    base = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "num_gpu_blocks": 28}
    inp = make_input([0.0, 1.0], [160, 320], [40, 2])
    full = run_both(inp, make_scenario("vllm", **base))
    chunk = run_both(inp, make_scenario("vllm", scheduler_reserve_full_isl=False, **base))
    assert chunk.rqf[1, F_FIRST_SCHED] == 2.0  # beside the end of the first prompt
    assert full.rqf[1, F_FIRST_SCHED] > chunk.rqf[1, F_FIRST_SCHED]
    assert full.st[:, S_PREEMPT].sum() == 0 < chunk.st[:, S_PREEMPT].sum()


def test_vllm_without_chunking_a_prompt_waits_for_a_budget_it_fits() -> None:
    sc = make_scenario(
        "vllm",
        max_num_batched_tokens=200,
        max_num_seqs=4,
        enable_chunked_prefill=False,
        max_model_len=200,
    )
    res = run_both(make_input([0.0, 0.0, 0.0], [150, 100, 10], [1, 1, 1]), sc)
    # 150 fits; 100 does not fit the 50 left and blocks the 10 behind it (FCFS)
    assert res.rqf[:, F_FIRST_TOKEN].tolist() == [1.0, 2.0, 2.0]


def test_vllm_preempts_the_last_admitted_and_requeues_it_first() -> None:
    # 2 requests of 8 + 10 tokens, blocks of 4: each needs 5 blocks alone; 6 usable
    sc = make_scenario(
        "vllm",
        block_size=4,
        num_gpu_blocks=7,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        async_scheduling=False,
    )
    res = run_both(make_input([0.0, 0.0, 0.0], [8, 8, 4], [10, 10, 1]), sc)
    assert res.rq[:, R_PREEMPT].tolist() == [0, 1, 0]
    # B had computed 8 + 4 tokens (3 full blocks) when A needed a 4th block
    assert res.rqw[1, W_DISCARDED] == 12
    pre = np.flatnonzero(res.st[:, S_PREEMPT])
    assert len(pre) == 1
    # no admission in the step that preempted: only A runs in it
    assert res.st[pre[0], S_RUNNING] == 1
    # B went back to the front: it is resumed before C, which arrived with it but
    # only got in while there was room
    assert res.rqf[1, F_FINISH] > res.rqf[0, F_FINISH]


def test_vllm_async_a_request_finishing_in_flight_can_be_the_victim() -> None:
    # as above, decided asynchronously: step 1 is decided while step 0 runs, so C, whose one
    # token step 0 computes, still holds its block; B's decode needs it, and C (the last
    # admitted) is preempted. It still finishes with step 0, with nothing to recompute.
    sc = make_scenario(
        "vllm", block_size=4, num_gpu_blocks=7, max_num_batched_tokens=64, max_num_seqs=4
    )
    res = run_both(make_input([0.0, 0.0, 0.0], [8, 8, 4], [10, 10, 1]), sc)
    assert res.rq[2, R_PREEMPT] == 1 and res.rqw[2, W_DISCARDED] == 0
    assert times(res, 2) == (0.0, 1.0, 1.0)
    assert res.st[1, S_PREEMPT] == 1 and res.st[1, S_RUNNING] == 2  # A and B decode


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllm_async_an_arrival_waits_one_step_more(async_scheduling: bool) -> None:
    # B arrives while step 0 runs: the synchronous loop schedules it in step 1; async, step 1
    # was decided when step 0 started, so B's first step is step 2. C arrives at an idle
    # replica: scheduled at once either way.
    sc = make_scenario("vllm", async_scheduling=async_scheduling)
    res = run_both(make_input([0.0, 0.5, 10.0], [10, 10, 10], [5, 2, 2]), sc)
    lag = 1.0 if async_scheduling else 0.0
    assert times(res, 1) == (1.0 + lag, 2.0 + lag, 3.0 + lag)
    assert times(res, 2) == (10.0, 11.0, 12.0)
    assert times(res, 0) == (0.0, 1.0, 5.0)  # decodes are not delayed


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllm_async_a_finished_request_keeps_its_slot_one_step(async_scheduling: bool) -> None:
    # max_num_seqs 2: A and C run, B waits. A's last token comes out of step 1; async, step 2
    # is decided while step 1 runs, with A still in the running list, so B starts in step 3
    sc = make_scenario("vllm", max_num_seqs=2, async_scheduling=async_scheduling)
    res = run_both(make_input([0.0, 0.0, 0.0], [10, 10, 10], [2, 10, 2]), sc)
    assert res.rqf[0, F_FINISH] == 2.0
    assert res.rqf[2, F_FIRST_SCHED] == (3.0 if async_scheduling else 2.0)


def test_vllm_head_of_line_blocking() -> None:
    # A (running) holds most blocks; B cannot get its blocks, C could, but waits behind B
    sc = make_scenario(
        "vllm", block_size=10, num_gpu_blocks=11, max_num_batched_tokens=256, max_num_seqs=4
    )
    inp = make_input([0.0, 0.5, 0.6], [60, 50, 5], [5, 2, 2])
    res = run_both(inp, sc)
    a_done = res.rqf[0, F_FINISH]
    assert res.rqf[1, F_FIRST_SCHED] >= a_done
    assert res.rqf[2, F_FIRST_SCHED] >= res.rqf[1, F_FIRST_SCHED]


def test_vllm_watermark_keeps_blocks_free_when_admitting() -> None:
    base = {"block_size": 10, "num_gpu_blocks": 21, "max_num_batched_tokens": 256}
    inp = make_input([0.0, 0.0], [100, 60], [3, 3])
    without = run_both(inp, make_scenario("vllm", max_num_seqs=4, **base))
    with_wm = run_both(inp, make_scenario("vllm", max_num_seqs=4, watermark=0.25, **base))
    assert without.rqf[1, F_FIRST_SCHED] == 0.0  # 10 + 6 blocks of 20 fit
    assert with_wm.rqf[1, F_FIRST_SCHED] > 0.0  # 6 + 5 (watermark) > 10 free


def test_static_waits_for_a_full_batch_or_the_timer() -> None:
    inp = make_input([0.0, 0.5, 0.7], [10, 10, 10], [2, 2, 2])
    full = run_both(inp, make_scenario("static", max_batch_size=2, max_wait_s=10.0))
    assert full.rqf[0, F_FIRST_SCHED] == 0.5  # the second request fills the batch
    timer = run_both(inp, make_scenario("static", max_batch_size=4, max_wait_s=1.0))
    assert timer.rqf[:, F_FIRST_SCHED].tolist() == [1.0, 1.0, 1.0]  # oldest waited 1 s


def test_static_nothing_joins_a_running_batch() -> None:
    inp = make_input([0.0, 0.1], [10, 10], [5, 1])
    res = run_both(inp, make_scenario("static", max_batch_size=8))
    assert res.rqf[1, F_FIRST_SCHED] == res.rqf[0, F_FINISH] == 5.0


def test_static_reservation_limits_the_batch() -> None:
    # max_model_len 100 in blocks of 10: 10 blocks each; 25 blocks hold two requests
    sc = make_scenario(
        "static", max_batch_size=8, max_model_len=100, block_size=10, num_gpu_blocks=25
    )
    res = run_both(make_input([0.0, 0.0, 0.0], [10, 10, 10], [2, 2, 2]), sc)
    assert res.rqf[:, F_FIRST_SCHED].tolist() == [0.0, 0.0, 2.0]


def test_orca_admits_whenever_a_slot_is_free() -> None:
    inp = make_input([0.0, 0.0, 0.0], [10, 10, 10], [2, 5, 2])
    res = run_both(inp, make_scenario("orca", max_num_seqs=2))
    # the third joins as soon as the first finishes (end of step 2), beside the decodes
    assert res.rqf[2, F_FIRST_SCHED] == 2.0
    assert res.st[2, S_RUNNING] == 2 and res.st[2, S_PREFILL] == 10 and res.st[2, S_DECODE] == 1


def test_sarathi_decodes_first_then_a_chunk_of_what_is_left() -> None:
    sc = make_scenario("sarathi", chunk_size=32, max_num_seqs=4, watermark=0.0)
    inp = make_input([0.0, 0.5], [10, 100], [6, 1])
    res = run_both(inp, sc)
    # step at t=1: A decodes (1 token), B gets 32 - 1 = 31 prompt tokens
    assert res.st[1, S_DECODE] == 1 and res.st[1, S_PREFILL] == 31
    assert res.rq[1, R_CHUNKS] == 4  # 31 + 31 + 31 + 7


def test_round_robin_alternates_replicas() -> None:
    sc = make_scenario("vllm", replicas=3)
    res = run_both(make_input([0.0, 0.1, 0.2, 0.3], [10] * 4, [5] * 4), sc)
    assert res.rq[:, R_REPLICA].tolist() == [0, 1, 2, 0]


def test_least_outstanding_picks_the_least_busy_replica() -> None:
    inp = make_input([0.0, 0.1, 5.0, 5.1], [10] * 4, [50, 2, 2, 2])
    lo = run_both(inp, make_scenario("vllm", replicas=2, router="least_outstanding"))
    # r0 keeps the long request, so r1 gets the next two; then both have one
    assert lo.rq[:, R_REPLICA].tolist() == [0, 1, 1, 0]
    rr = run_both(inp, make_scenario("vllm", replicas=2, router="round_robin"))
    assert rr.rq[:, R_REPLICA].tolist() == [0, 1, 0, 1]


def test_queue_depth_at_arrival_counts_the_requests_waiting() -> None:
    res = run_both(make_input([0.0, 0.0, 0.0], [10] * 3, [2] * 3), make_scenario("vllm"))
    assert res.rq[:, R_QDEPTH].tolist() == [0, 1, 2]


def test_decode_runs_are_one_row() -> None:
    sc = make_scenario("vllm")
    res = simulate(make_input([0.0], [10], [100]), sc.engine())
    assert res.st[:, S_NUM_STEPS].tolist() == [1, 99]
