"""vLLM's own V1 scheduler and the simulator's ``vllm`` policy, step by step (see harness.py).

Every configuration must be identical: the same requests with the same token
counts in every step, the same preemptions, and first-token and finish times
within 1e-9 relative; the fast loop must agree with the reference loop too.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

# skip only when vLLM is absent: an installed vLLM that fails to import is a failure
if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed: pip install -e '.[conformance]' && "
        "pip install --no-deps vllm==0.33.0 (scripts/test.sh does it)",
        allow_module_level=True,
    )

from tests.conformance.harness import (  # noqa: E402
    Comparison,
    Config,
    compare,
    configurations,
    cost_function,
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
