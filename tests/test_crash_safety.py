"""kill -9 at random moments: no partial run visible, clean-ups, identical reruns.

One trial per command (ingest, replay, sweep, capacity, report) on small logs;
``bench/crash_harness.py --trials 25`` runs the full count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import crash_harness as ch  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_kill_9_at_random_moments(tmp_path: Path) -> None:
    fx = ch.prepare(tmp_path, requests_per_file=400)
    # 4 files of 400 ids, the last three with 80 more ids of the file before
    assert fx.clean["ingest"][0][1] == 1600
    trials = ch.run_trials(fx, len(ch.COMMANDS), seed=1)
    assert [t.command for t in trials] == list(ch.COMMANDS)
    for t in trials:
        assert t.ok, t
    # the harness can fail: a visible partial run is caught
    wh = ch.start(fx, "replay", tmp_path / "planted")
    run = next((wh / "sim_requests").glob("run_id=2*"))
    victim = next(run.glob("*.parquet"))
    victim.rename(victim.with_name(".hidden"))
    assert ch.partial_runs(wh) == [run.name.split("=", 1)[1]]
