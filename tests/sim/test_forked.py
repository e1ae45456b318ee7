"""The profile term's replays in forked children: the same statistics as replayed here,
and a child that dies costs time, never the answer."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pipeline.sim import forked, uncertainty
from pipeline.sim.state import SimInput
from tests.helpers import H100_8B_COST, make_scenario


def _input(n: int) -> SimInput:
    r = np.random.default_rng(3)
    return SimInput(
        np.cumsum(r.exponential(1 / 12.0, n)),
        r.integers(50, 2000, n).astype(np.int64),
        r.integers(1, 300, n).astype(np.int64),
    )


@pytest.fixture
def fork_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fork whatever the input's size and the machine's cores."""
    monkeypatch.setattr(forked, "worth_forking", lambda n, children, jobs=None: True)


SC = make_scenario("vllm", H100_8B_COST, num_gpu_blocks=4000, cost_uncertainty=0.1)


def test_forked_profile_replays_equal_the_ones_run_here(fork_always: None) -> None:
    inp = _input(3000)
    here = uncertainty.profile_statistics(SC, inp)
    pending = uncertainty.start_profile_statistics(SC, inp)
    assert here is not None and pending() == here
    assert here[0]["ttft_p99_s"] < here[1]["ttft_p99_s"]  # the low cost, then the high


def test_a_child_that_dies_is_replayed_here(
    fork_always: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    inp = _input(2000)
    here = uncertainty.profile_statistics(SC, inp)

    def die(parent: int) -> None:  # the children inherit this: each dies at once
        os._exit(3)

    monkeypatch.setattr(forked, "die_with_parent", die)
    child = forked.start(uncertainty._at_factor, SC, inp, 1.0)
    assert uncertainty.start_profile_statistics(SC, inp)() == here
    assert child.result() == uncertainty._at_factor(SC, inp, 1.0)
    assert child._proc.exitcode == 3  # it did die: the result was computed here


def test_a_function_that_raises_in_the_child_raises_here() -> None:
    child = forked.start(int, "not a number")
    with pytest.raises(ValueError, match="not a number"):
        child.result()


def test_small_replays_and_one_core_are_not_forked() -> None:
    assert not forked.worth_forking(forked.MIN_REQUESTS - 1, 2, jobs=8)
    assert not forked.worth_forking(10**6, 2, jobs=1)
    assert not forked.worth_forking(10**15, 2, jobs=8)  # no machine has that memory free
