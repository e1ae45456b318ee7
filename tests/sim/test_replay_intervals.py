"""Replay summaries carry TTFT, TPOT and E2E p50/p90/p99 with their 90% intervals."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contracts import SCENARIOS, read_table
from pipeline.sim.replay import replay
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, make_scenario, requests_table

KEYS = [f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)]


@pytest.fixture
def root(warehouse_with: Callable[..., Path]) -> Path:
    rng = np.random.default_rng(3)
    n = 400
    table = requests_table(
        rng.integers(50, 1500, n),
        rng.integers(2, 200, n),
        rng.exponential(1 / 12.0, n),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    return warehouse_with(table)


def _summaries(root: Path, run_id: str) -> dict[str, dict[str, Any]]:
    (path,) = [p for p in Warehouse(root).files(SCENARIOS) if run_id in str(p)]
    rows = read_table(path, SCENARIOS).to_pylist()
    return {r["scenario"]: json.loads(r["summary_json"]) for r in rows}


def test_every_percentile_has_an_interval_around_it(root: Path) -> None:
    scenarios = [
        make_scenario("vllm", H100_8B_COST, name="a", num_gpu_blocks=4000),
        make_scenario("vllm", H100_8B_COST, name="b", num_gpu_blocks=4000, cost_uncertainty=0),
    ]
    result = replay(root, scenarios, quiet=True)
    stored = _summaries(root, result.run_id)
    for run in result.runs:
        s = run.summary
        assert stored[run.scenario.name]["intervals"] == json.loads(json.dumps(s["intervals"]))
        iv = s["intervals"]
        assert iv["level"] == 0.9 and iv["num_windows"] >= 20
        for key in KEYS:
            st = iv["stats"][key]
            assert st["lo"] <= s[key] <= st["hi"], key
            lo, hi = st["arrivals"]
            assert lo <= hi and st["lo"] <= lo and hi <= st["hi"]
    a, b = (r.summary["intervals"] for r in result.runs)
    assert a["cost_sd_default"] and a["cost_log_sd"] == 0.1
    # slower steps, longer latencies: the profile replays bracket the statistic
    for key in KEYS:
        low, high = a["stats"][key]["at_cost"]
        assert low <= result.runs[0].summary[key] <= high
    # no profile term: the interval is the bootstrap's
    assert b["cost_log_sd"] == 0 and not b["cost_sd_default"]
    for key in KEYS:
        assert b["stats"][key]["at_cost"] is None
        got = [b["stats"][key]["lo"], b["stats"][key]["hi"]]
        assert got == pytest.approx(b["stats"][key]["arrivals"], rel=1e-12)


def test_intervals_are_deterministic_given_the_seed(root: Path) -> None:
    def run(seed: int) -> dict[str, Any]:
        sc = make_scenario("vllm", H100_8B_COST, name="a", num_gpu_blocks=4000, seed=seed)
        return replay(root, [sc], quiet=True).runs[0].summary["intervals"]

    first, again, other = run(1), run(1), run(2)
    assert first == again
    assert first["stats"] != other["stats"]  # another bootstrap draw


def test_no_intervals_leaves_the_summary_as_it_was(root: Path) -> None:
    sc = make_scenario("vllm", H100_8B_COST, name="a", num_gpu_blocks=4000)
    plain = replay(root, [sc], quiet=True, intervals=False).runs[0].summary
    full = replay(root, [sc], quiet=True).runs[0].summary
    assert "intervals" not in plain
    assert {k: v for k, v in full.items() if k != "intervals"} == plain


def test_the_profile_replays_beside_the_main_one_give_the_same_summary(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replay`` with the profile term's two replays in forked children (forced here: the
    trace is below ``forked.MIN_REQUESTS``) writes the intervals it writes with one process."""
    from pipeline.sim import forked

    sc = make_scenario("vllm", H100_8B_COST, num_gpu_blocks=4000, name="v")
    one = replay(root, [sc], quiet=True, jobs=1, run_id="one")
    calls: list[int] = []

    def always(n: int, children: int, jobs: int | None = None) -> bool:
        calls.append(n)
        return True

    monkeypatch.setattr(forked, "worth_forking", always)
    two = replay(root, [sc], quiet=True, jobs=2, run_id="two")
    assert calls == [400]
    a, b = one.runs[0].summary["intervals"], two.runs[0].summary["intervals"]
    assert a["stats"] and a == b
    assert _summaries(root, "one")["v"]["intervals"] == _summaries(root, "two")["v"]["intervals"]
