"""Arrival processes: trace replay, scaling, and seeded poisson/gamma draws."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ScenarioError
from pipeline.sim.arrivals import make_arrivals, trace_rate
from pipeline.sim.scenario import ArrivalSpec

TRACE = np.array([0.0, 1.0, 1.5, 4.0])


def spec(process: str = "trace", **kw: object) -> ArrivalSpec:
    base: dict[str, object] = {
        "process": process,
        "time_scale": 1.0,
        "rate": None,
        "burstiness": 1.0,
        "num_requests": None,
    }
    return ArrivalSpec(**(base | kw))  # type: ignore[arg-type]


def test_trace_keeps_its_timestamps() -> None:
    idx, t = make_arrivals(spec(), TRACE, np.random.default_rng(0))
    assert idx.tolist() == [0, 1, 2, 3] and t.tolist() == TRACE.tolist()


def test_time_scale_compresses_the_trace() -> None:
    _, t = make_arrivals(spec(time_scale=0.5), TRACE, np.random.default_rng(0))
    assert t.tolist() == [0.0, 0.5, 0.75, 2.0]


def test_rate_rescales_the_trace_so_the_last_arrives_at_n_over_rate() -> None:
    _, t = make_arrivals(spec(rate=2.0), TRACE, np.random.default_rng(0))
    assert t[-1] == pytest.approx(4 / 2.0)
    assert np.allclose(t / t[-1], TRACE / TRACE[-1])


def test_num_requests_takes_the_first_of_the_trace() -> None:
    idx, t = make_arrivals(spec(num_requests=2), TRACE, np.random.default_rng(0))
    assert idx.tolist() == [0, 1] and t.tolist() == [0.0, 1.0]


@pytest.mark.parametrize(("process", "burstiness"), [("poisson", 1.0), ("gamma", 0.25)])
def test_drawn_arrivals_have_the_rate_and_are_seeded(process: str, burstiness: float) -> None:
    trace = np.linspace(0, 10, 11)
    s = spec(process, rate=50.0, burstiness=burstiness, num_requests=20_000)
    idx, t = make_arrivals(s, trace, np.random.default_rng(1))
    assert len(t) == 20_000 and (np.diff(t) >= 0).all()
    assert t[-1] == pytest.approx(20_000 / 50.0)
    cv = np.diff(t).std() / np.diff(t).mean()
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)
    assert set(np.unique(idx)) == set(range(11))  # lengths drawn from the whole trace
    idx2, t2 = make_arrivals(s, trace, np.random.default_rng(1))
    assert np.array_equal(idx, idx2) and np.array_equal(t, t2)


def test_poisson_defaults_to_the_trace_rate() -> None:
    idx, t = make_arrivals(spec("poisson"), TRACE, np.random.default_rng(0))
    assert idx.tolist() == [0, 1, 2, 3]
    assert t[-1] == pytest.approx(4 / trace_rate(TRACE))


def test_poisson_needs_a_rate_when_the_trace_has_no_span() -> None:
    with pytest.raises(ScenarioError, match="needs a rate"):
        make_arrivals(spec("poisson"), np.zeros(3), np.random.default_rng(0))
