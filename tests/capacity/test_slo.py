"""SLOs: parsing with units, verdicts and goodput as vLLM's benchmark client counts them."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.plan.slo import Slo, evaluate, format_seconds, parse_slo, parse_slos


@pytest.mark.parametrize(
    ("key", "limit", "expected"),
    [
        ("ttft_p99", "200ms", Slo("ttft", "p99", 0.2)),
        ("TPOT_P50", "30 ms", Slo("tpot", "p50", 0.03)),
        ("e2e_p99.9", "1.5s", Slo("e2e", "p99.9", 1.5)),
        ("queue_mean", "250us", Slo("queue", "mean", 250e-6)),
        ("ttft_p100", "2e2ms", Slo("ttft", "p100", 0.2)),
    ],
)
def test_parse(key: str, limit: str, expected: Slo) -> None:
    slo = parse_slo(key, limit)
    assert slo.metric == expected.metric and slo.stat == expected.stat
    assert slo.limit_s == pytest.approx(expected.limit_s)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("ttft_p99=200", "give a unit; allowed units: us, ms, s"),
        ("ttft_p99=200min", "unknown unit 'min'; allowed units: us, ms, s"),
        ("ttft_p99=fast", "is not a time limit"),
        ("ttft_p99=0ms", "must be a positive time"),
        ("itl_p99=50ms", "unknown SLO metric 'itl'"),
        ("ttft_p0=1s", "must be in (0, 100]"),
        ("ttft_max=1s", "is not an SLO name"),
        ("ttft_p99", "expected KEY=LIMIT"),
    ],
)
def test_bad_slos_name_the_problem(item: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_slos([item])
    assert message in str(exc.value)


def test_table_form_needs_strings_and_no_duplicates() -> None:
    assert [str(s) for s in parse_slos({"ttft_p99": "0.2s"})] == ["ttft_p99<=200ms"]
    with pytest.raises(ConfigError, match='ttft_p99 = "200ms"'):
        parse_slos({"ttft_p99": 200})
    with pytest.raises(ConfigError, match="given twice"):
        parse_slos(["ttft_p99=1s", "TTFT_P99=2s"])


def test_format_seconds() -> None:
    assert [format_seconds(x) for x in (0.2, 1.5, 2e-4, 60.0)] == ["200ms", "1.5s", "200us", "60s"]


def test_verdicts_are_inclusive_and_goodput_counts_requests_meeting_every_slo() -> None:
    metrics = {
        "ttft_s": np.array([0.1, 0.2, 0.3, 0.4]),
        # a one-token request has no TPOT: it counts as 0, as in vLLM
        "tpot_s": np.array([0.01, np.nan, 0.05, 0.02]),
        "e2e_s": np.array([1.0, 1.0, 1.0, 1.0]),
        "queue_s": np.zeros(4),
    }
    slos = parse_slos(["ttft_p50=250ms", "tpot_p99=20ms"])
    report = evaluate(slos, metrics, duration_s=2.0)
    # p50 of 0.1..0.4 is 0.25: equal to the limit, so met
    assert report.measured_s["ttft_p50"] == pytest.approx(0.25)
    assert report.met["ttft_p50"]
    # TPOT p99 over the three defined values (0.01, 0.02, 0.05)
    assert report.measured_s["tpot_p99"] == pytest.approx(0.02 + 0.98 * 0.03)
    assert not report.met["tpot_p99"] and not report.all_met
    # good: r0 (0.1, 0.01) and r1 (0.2, one token); r2 tpot 0.05, r3 ttft 0.4
    assert report.num_good == 2 and report.goodput == pytest.approx(1.0)


def test_a_statistic_no_request_has_meets() -> None:
    metrics = {k: np.array([0.1]) for k in ("ttft_s", "e2e_s", "queue_s")}
    metrics["tpot_s"] = np.array([np.nan])
    report = evaluate(parse_slos(["tpot_p99=1ms"]), metrics, duration_s=0.0)
    assert report.measured_s["tpot_p99"] is None and report.all_met
    assert report.goodput is None  # no span to divide by
