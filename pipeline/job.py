"""The main job: ingest logs, replay them through scenarios, write the report.

``run_job`` is what ``tracereplay run`` and a nightly cron or Airflow task
call. It ingests the sources, replays the days they touched through the given
scenarios (or the built-in demonstration set), writes the HTML report of that
replay, and returns what it did. A
file that fails to ingest does not stop the replay of the others; the result
says so and the command exits non-zero.

``tracereplay nightly`` (the scheduled job over an inbox) is ``nightly.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from pipeline.ingest import IngestOptions, IngestResult, ingest_logs
from pipeline.sim.replay import ReplayResult, replay
from pipeline.sim.scenario import Scenario, build_scenario, resolve_scenarios

# The demonstration set used when no scenario is given: static against
# continuous batching, chunked prefill on and off, and a concurrency-cap
# sweep, all on the default profile (Llama-3-8B on one H100). The trace is
# replayed 4x faster than logged (time_scale 0.25) so that a small sample
# reaches the load where schedulers differ.
DEMO_TIME_SCALE = 0.25
DEMO_SCENARIOS: list[dict[str, Any]] = [
    {"name": "static", "policy": "static", "max_batch_size": 64},
    {"name": "vllm", "policy": "vllm"},
    {"name": "vllm-no-chunking", "policy": "vllm", "enable_chunked_prefill": False},
    *({"name": f"vllm-seqs-{n}", "policy": "vllm", "max_num_seqs": n} for n in (4, 8, 16, 32, 64)),
]


def demo_scenarios(defaults: dict[str, Any] | None = None) -> list[Scenario]:
    """The built-in demonstration scenarios, over the config's ``[replay]`` defaults."""
    base = {"time_scale": DEMO_TIME_SCALE, "drop_too_long": True, **(defaults or {})}
    return [build_scenario({**base, **s}, where="built-in scenario") for s in DEMO_SCENARIOS]


@dataclass
class JobResult:
    ingest: IngestResult
    replay: ReplayResult | None
    report: Path | None = None

    @property
    def ok(self) -> bool:
        return self.ingest.ok and self.replay is not None


def run_job(
    sources: list[str],
    warehouse: Path,
    *,
    scenario_files: list[Path] | None = None,
    replay_defaults: dict[str, Any] | None = None,
    ingest_options: IngestOptions | None = None,
    quiet: bool = False,
    report: bool = True,
) -> JobResult:
    """Ingest ``sources`` into ``warehouse``, replay the days they cover, write the report.

    Args:
        sources: log files, globs or directories.
        warehouse: the warehouse directory.
        scenario_files: scenario TOML files; none means the demonstration set.
        replay_defaults: the config file's ``[replay]`` section.
        ingest_options: how to read the logs.
        quiet: no progress bars.
        report: write the HTML report of the replay.

    Raises:
        ScenarioError: a scenario is invalid (checked before anything is replayed).
    """
    from pipeline.warehouse import Warehouse

    opts = ingest_options or IngestOptions()
    opts.quiet = quiet
    scenarios = (
        resolve_scenarios(scenario_files, {}, replay_defaults)
        if scenario_files
        else demo_scenarios(replay_defaults)
    )
    ingested = ingest_logs(sources, Warehouse(warehouse), opts)
    days = sorted({d for f in ingested.files for d in f.dates})
    if not days:
        return JobResult(ingested, None)
    replayed = replay(
        warehouse,
        scenarios,
        date_from=date.fromisoformat(days[0]),
        date_to=date.fromisoformat(days[-1]),
        quiet=quiet,
    )
    path = None
    if report:
        from pipeline.report import build_report

        path = build_report(Warehouse(warehouse), replayed.run_id)
    return JobResult(ingested, replayed, path)
