"""SGLang's and TGI's scheduling rules on hand-checkable cases (every step costs 1 s)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.sim.reference import simulate_reference
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_FINISH,
    F_FIRST_SCHED,
    R_CHUNKS,
    R_PREEMPT,
    S_DECODE,
    S_PREEMPT,
    S_PREFILL,
    SimInput,
    SimResult,
)
from tests.helpers import chain, make_input, make_scenario, with_prefix


def run_both(inp: SimInput, sc: Scenario) -> SimResult:
    fast = simulate(inp, sc.engine())
    ref = simulate_reference(inp, sc)
    assert np.array_equal(fast.rq, ref.rq)
    assert np.allclose(fast.rqf, ref.rqf, rtol=1e-9, atol=1e-12, equal_nan=True)
    return fast


def sglang(**values: object) -> Scenario:
    return make_scenario("sglang", num_gpu_blocks=10_000, **values)


def test_sglang_runs_a_prefill_batch_whenever_it_can() -> None:
    # B arrives while A decodes: the next step prefills B alone, A's decode waits
    res = run_both(make_input([0.0, 2.5], [10, 20], [6, 2]), sglang())
    (b,) = np.flatnonzero(res.st[:, S_PREFILL] == 20)
    assert (res.st[b - 1, S_DECODE], res.st[b, S_DECODE], res.st[b + 1, S_DECODE]) == (1, 0, 2)
    assert ((res.st[:, S_PREFILL] == 0) | (res.st[:, S_DECODE] == 0)).all()


def test_sglang_max_prefill_tokens_closes_a_batch() -> None:
    # without chunking: A and B (200 < 250); C's 100 would reach what is left (50): next batch
    inp = make_input([0.0] * 3, [100] * 3, [1] * 3)
    res = run_both(inp, sglang(max_prefill_tokens=250, chunked_prefill_size=-1))
    assert res.st[:, S_PREFILL].tolist() == [200, 100]
    # with chunking (SGLang 0.5.23) the cap only ends the batch once spent: C joins
    res = run_both(inp, sglang(max_prefill_tokens=250))
    assert res.st[:, S_PREFILL].tolist() == [300]


def test_sglang_chunks_a_long_prompt() -> None:
    res = run_both(make_input([0.0], [300], [1]), sglang(chunked_prefill_size=128))
    assert res.st[:, S_PREFILL].tolist() == [128, 128, 44]
    assert res.rq[0, R_CHUNKS] == 3


def test_sglang_admission_reserves_for_the_running_requests() -> None:
    # A (10 + 40 tokens) runs; B needs 10 + 40 too: with ratio 0.7 B does not fit in 80
    # tokens beside A's expected decodes, with a tiny ratio it does (and is retracted later)
    inp = make_input([0.0, 2.5], [10, 10], [40, 40])
    conservative = run_both(inp, make_scenario("sglang", num_gpu_blocks=80, max_model_len=64))
    assert conservative.rq[:, R_PREEMPT].tolist() == [0, 0]
    assert conservative.rqf[1, F_FIRST_SCHED] >= conservative.rqf[0, F_FINISH] - 30
    eager = run_both(
        inp,
        make_scenario(
            "sglang", num_gpu_blocks=80, max_model_len=64, schedule_conservativeness=0.05
        ),
    )
    assert eager.rqf[1, F_FIRST_SCHED] < conservative.rqf[1, F_FIRST_SCHED]
    # the retraction victim is the request with the fewest generated tokens: B
    assert eager.rq[:, R_PREEMPT].tolist() == [0, 1]
    assert eager.st[:, S_PREEMPT].sum() == 1


def test_sglang_retracts_the_longer_prompt_on_a_tie() -> None:
    # B and C join A in one batch (equal generated tokens); when KV runs short the
    # longer prompt, C, goes first
    sc = make_scenario(
        "sglang", num_gpu_blocks=110, max_model_len=64, schedule_conservativeness=0.05
    )
    res = run_both(make_input([0.0, 5.0, 5.0], [10, 10, 20], [40, 30, 30]), sc)
    assert res.rq[:, R_PREEMPT].tolist() == [0, 0, 1]


def _busy_then_waiting(num_waiting: int, matched: int) -> SimInput:
    """One long request occupies the only slot; then num_waiting arrive, the last sharing
    ``matched`` blocks with the first's prompt."""
    n = num_waiting + 1
    inp = make_input(
        [0.0] + [1.0 + 0.01 * k for k in range(num_waiting)], [64] * n, [20] + [1] * num_waiting
    )
    hashes = [chain(*range(4))] + [chain(100 + k) for k in range(num_waiting - 1)]
    hashes.append(chain(*range(matched), 999))
    return with_prefix(inp, hashes, 16, 16)


@pytest.mark.parametrize(
    ("policy", "num_waiting", "last_goes_first"),
    [("fcfs", 4, False), ("lpm", 4, True), ("lpm", 129, False), ("dfs-weight", 4, True)],
)
def test_sglang_schedule_policies(policy: str, num_waiting: int, last_goes_first: bool) -> None:
    sc = sglang(max_running_requests=1, schedule_policy=policy)
    res = run_both(_busy_then_waiting(num_waiting, 3), sc)
    first = res.rqf[1:, F_FIRST_SCHED]
    assert (first[-1] == first.min()) == last_goes_first


def test_sglang_longest_output_first() -> None:
    inp = make_input([0.0, 1.0, 1.1, 1.2], [10] * 4, [8, 2, 5, 3])
    res = run_both(inp, sglang(max_running_requests=1, schedule_policy="lof"))
    assert np.argsort(res.rqf[1:, F_FIRST_SCHED]).tolist() == [1, 2, 0]


def test_sglang_random_order_is_seeded() -> None:
    inp = make_input([0.0] + [1.0 + 0.01 * k for k in range(6)], [10] * 7, [8] + [2] * 6)
    a = run_both(inp, sglang(max_running_requests=1, schedule_policy="random", seed=1))
    b = run_both(inp, sglang(max_running_requests=1, schedule_policy="random", seed=1))
    assert np.array_equal(a.rqf, b.rqf)


def tgi(**values: object) -> Scenario:
    return make_scenario("tgi", block_size=1, **values)


def test_tgi_reserves_the_whole_lifetime_and_never_preempts() -> None:
    # each request needs 10 + 30 - 1 tokens; 60 fit one at a time
    inp = make_input([0.0, 0.5], [10, 10], [30, 30])
    res = run_both(inp, tgi(num_gpu_blocks=61, max_model_len=64))
    assert res.rqf[1, F_FIRST_SCHED] == res.rqf[0, F_FINISH]
    assert res.st[:, S_PREEMPT].sum() == 0
    vllm = run_both(inp, make_scenario("vllm", block_size=1, num_gpu_blocks=61, max_model_len=64))
    assert vllm.rqf[1, F_FIRST_SCHED] < res.rqf[1, F_FIRST_SCHED]  # just-in-time admits early


@pytest.mark.parametrize(("ratio", "first"), [(0.3, 20.0), (0.0, 1.0)])
def test_tgi_waiting_served_ratio_and_max_waiting_tokens(ratio: float, first: float) -> None:
    # 10 requests decode; one more waits until 10 x ratio wait or 20 decode steps passed
    inp = make_input([0.0] * 10 + [0.5], [10] * 11, [40] * 10 + [2])
    sc = tgi(num_gpu_blocks=10_000, prefill_chunking=False, max_batch_prefill_tokens=4096,
             waiting_served_ratio=ratio)  # fmt: skip
    res = run_both(inp, sc)
    assert res.rqf[10, F_FIRST_SCHED] == first
    step = int(first)
    assert res.st[step, S_DECODE] == 0  # the new batch is prefilled while the others wait


def test_tgi_chunking_joins_the_running_batch() -> None:
    inp = make_input([0.0, 0.5], [10, 300], [10, 1])
    res = run_both(inp, tgi(num_gpu_blocks=10_000, max_batch_prefill_tokens=128))
    mixed = (res.st[:, S_PREFILL] > 0) & (res.st[:, S_DECODE] > 0)
    assert mixed.any()
    assert res.rq[1, R_CHUNKS] == 3  # 128 - 1 decode, then the rest within the budget
