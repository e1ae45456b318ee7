"""vLLM's own V1 scheduler and the simulator's ``vllm`` policy, step by step (see harness.py).

Every configuration must be identical: the same requests with the same token
counts in every step, the same preemptions, and first-token and finish times
within 1e-9 relative; the fast loop must agree with the reference loop too.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

# skip only when vLLM is absent: an installed vLLM that fails to import is a failure
if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed: pip install -e '.[conformance]' && "
        "pip install --no-deps vllm==0.33.0 (scripts/test.sh does it)",
        allow_module_level=True,
    )

from tests.conformance.harness import (  # noqa: E402
    VOCAB,
    Comparison,
    Config,
    Request,
    compare,
    configurations,
    cost_function,
    run_vllm,
)

FAST = {c.name: c for c in configurations()}


def check(c: Comparison) -> None:
    assert c.fast_equals_reference, f"{c.name}: the fast loop differs from the reference loop"
    assert c.first_divergence is None, (
        f"{c.name}: step {c.first_divergence} differs (vLLM {c.vllm_steps} steps, "
        f"{c.vllm_preemptions} preemptions; simulator {c.sim_steps}, {c.sim_preemptions})"
    )
    assert (c.vllm_steps, c.vllm_preemptions) == (c.sim_steps, c.sim_preemptions)
    assert c.ttft_max_s == 0.0 and c.e2e_max_s == 0.0, c


@pytest.mark.conformance
@pytest.mark.parametrize("name", list(FAST))
def test_vllm_scheduler_and_simulator_are_identical(name: str) -> None:
    check(compare(FAST[name]))


@pytest.mark.conformance
def test_the_harness_sees_a_different_admission_rule() -> None:
    # the simulator told to admit on the first chunk only, vLLM on the whole sequence
    cfg = dataclasses.replace(FAST["tight_kv"], sim_values={"scheduler_reserve_full_isl": False})
    c = compare(cfg)
    assert c.first_divergence is not None and c.sim_preemptions > 10 * c.vllm_preemptions


def _second_arrives_during_the_first_step() -> Config:
    """One prompt at 0 and a second one arriving halfway through its (only) prefill step."""
    rng = np.random.default_rng(5)
    first = Request(0.0, rng.integers(1, VOCAB, 800).tolist(), 6)
    cfg = Config("overlap", [first], 2_000)
    half = 0.5 * cost_function(cfg.scenario().cost.as_array())([(0, 800, False)])
    second = Request(half, rng.integers(1, VOCAB, 300).tolist(), 4)
    return dataclasses.replace(cfg, requests=[first, second])


@pytest.mark.conformance
@pytest.mark.parametrize("vllm_async", [True, False])
def test_the_harness_sees_the_step_async_scheduling_adds(vllm_async: bool) -> None:
    # the second request arrives while step 0 runs: the synchronous loop schedules it in
    # step 1, the async engine core (which decided step 1 when step 0 started) in step 2
    cfg = dataclasses.replace(_second_arrives_during_the_first_step(), async_scheduling=vllm_async)
    assert compare(cfg).identical
    other = dataclasses.replace(cfg, sim_values={"async_scheduling": not vllm_async})
    assert compare(other).first_divergence == 1


@pytest.mark.conformance
def test_async_scheduling_delays_an_arrival_by_one_step_in_vllm() -> None:
    cfg = _second_arrives_during_the_first_step()
    own = cost_function(cfg.scenario().cost.as_array())
    sync = run_vllm(cfg, own)
    asyn = run_vllm(dataclasses.replace(cfg, async_scheduling=True), own)
    assert asyn.first_token[0] == sync.first_token[0]  # an idle engine schedules at once
    assert sync.steps[1].scheduled.keys() == {0, 1}
    assert asyn.steps[1].scheduled == {0: 1} and asyn.steps[2].scheduled.keys() == {0, 1}
    # its prefill waits for one whole step more (a decode of the first request)
    lag = asyn.first_token[1] - sync.first_token[1]
    one_more = asyn.steps[1].duration + asyn.steps[2].duration - sync.steps[1].duration
    assert lag == pytest.approx(one_more, rel=1e-9) and lag > 0.9 * asyn.steps[1].duration


@pytest.mark.conformance
def test_the_step_cost_is_any_function_of_the_batch() -> None:
    # a cost model other than the scenario's: vLLM's clock follows it, so times diverge
    cfg: Config = FAST["threshold_512_lone"]
    own = cost_function(cfg.scenario().cost.as_array())
    c = compare(cfg, lambda batch: 2.0 * own(batch))
    assert c.first_divergence == 0 and c.e2e_max_s > 0


@pytest.mark.conformance_full
@pytest.mark.parametrize("name", [c.name for c in configurations(full=False)])
def test_full_set_is_identical(name: str) -> None:
    check(compare({c.name: c for c in configurations(full=True)}[name]))
