"""SGLang's own ``SchedulePolicy`` / ``PrefillAdder`` / ``RadixCache`` on the batch states the
``sglang`` policy's reference loop recorded (see sglang_harness.py).

At every prefill decision SGLang's code must admit the same requests with the same extend
lengths, in the same queue order, and leave ``batch_is_full`` as the simulator did; the
rebuilt radix cache must hold the simulator's evictable tokens; every decode step without a
retraction must decay ``new_token_ratio`` as SGLang's ``NewTokenRatioTracker`` does.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

# skip only when SGLang is absent: an installed SGLang that fails to import is a failure
if importlib.util.find_spec("sglang") is None:
    pytest.skip(
        "SGLang is not installed: pip install -e '.[conformance]' && "
        "pip install --no-deps sglang==0.5.23 (scripts/test.sh does it)",
        allow_module_level=True,
    )

from tests.conformance.sglang_harness import (  # noqa: E402
    MOONCAKE_RAW,
    Config,
    Outcome,
    SglangSide,
    compare,
    configurations,
    fast_configurations,
    record,
)

FAST = {c.name: c for c in fast_configurations()}


def check(o: Outcome) -> None:
    assert o.state_mismatch == 0, f"{o.name}: rebuilt radix caches differ from the simulator's"
    assert o.admissions > 0, f"{o.name}: no prefill batch was formed"
    assert o.same == o.decisions, "\n".join(
        f"{o.name}: step {d.step}: simulator admitted {d.admitted} (batch full "
        f"{d.full_after}), SGLang {v.admitted} (batch full {v.full_after})"
        for d, v in o.diffs[:5]
    )
    assert o.ratio_diffs_decay == 0, f"{o.name}: new_token_ratio decays differently"


@pytest.mark.conformance
@pytest.mark.parametrize("name", list(FAST))
def test_sglang_admission_is_identical(name: str) -> None:
    check(compare(FAST[name]))


@pytest.mark.conformance
def test_the_harness_sees_a_different_chunk_size() -> None:
    # SGLang told 2048-token chunks where the simulator used 8192: batches differ
    cfg: Config = FAST["azure_tight"]
    decisions, loop = record(cfg)
    side = SglangSide(dataclasses.replace(cfg, chunked_prefill_size=2048), loop.max_running)
    assert any(side.decide(d)[0].admitted != d.admitted for d in decisions if d.admitted)


@pytest.mark.conformance
def test_the_harness_sees_a_different_new_token_ratio() -> None:
    # SGLang given a ratio of 1 where the simulator reserved less: it admits fewer
    cfg: Config = FAST["mooncake_tight"]
    decisions, loop = record(cfg)
    side = SglangSide(cfg, loop.max_running)
    assert any(
        side.decide(dataclasses.replace(d, ratio=1.0))[0].admitted != d.admitted
        for d in decisions
        if d.admitted and d.running
    )


@pytest.mark.conformance_full
@pytest.mark.skipif(not MOONCAKE_RAW.exists(), reason="needs the real traces beside the project")
@pytest.mark.parametrize("name", list(FAST))  # the same names, on 300 requests each
def test_full_set_is_identical(name: str) -> None:
    check(compare({c.name: c for c in configurations()}[name]))
