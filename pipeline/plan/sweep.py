"""The sweep stage: a grid of scenarios over one set of requests, in parallel, under one run id.

::

    grid.toml ──expand, check──▶ scenarios ──prepare each (checks memory)──▶ tasks
        ──local processes (--jobs) or a Ray cluster (--ray)──▶
            sim_requests/run_id=<run>/<scenario>.parquet   (one file per scenario)
            sim_steps/run_id=<run>/<scenario>.parquet
            scenarios/run_id=<run>/scenarios.parquet       (every scenario that ran)
            runs/<run>.parquet                             (command "sweep")

The requests are read once. Every scenario is expanded, validated and checked
against the requests before the first one runs, so a bad grid writes nothing.
A scenario that fails while running is reported in the result and the runs
row (status "partial"); the others are written as usual.

With ``shards``, the scenarios run one after another, each in parts (``replay
--shards``: replica groups under round_robin, else time windows; the parts on the
local processes or the Ray cluster, their files ``<scenario>.part-<k>.parquet``), so
that a fleet's day fits in memory; SLO verdicts (scoped ones too) and per-class figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pipeline.lock import with_warehouse_lock
from pipeline.plan.executor import run_tasks
from pipeline.plan.grid import Grid
from pipeline.plan.slo import Slo
from pipeline.plan.tasks import (
    ScenarioTask,
    TaskOutcome,
    run_in_parts,
    run_task,
    write_scenarios,
    write_tables,
)
from pipeline.processes import default_jobs
from pipeline.progress import progress
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim.replay import ScenarioRun, load_loop, selection_record
from pipeline.sim.replay_input import Prepared, prepare, read_window, select_request_files
from pipeline.sim.replay_sharded import plan_sharding
from pipeline.sim.shard import ShardPlan
from pipeline.warehouse import Warehouse, new_run_id

# Up to this many prepared requests (over all scenarios) are kept from the checks
# for the runs; above it each scenario is prepared again just before it runs.
KEEP_PREPARED = 5_000_000


@dataclass
class SweepResult:
    """What a sweep ran and wrote."""

    run_id: str
    num_requests_read: int
    inputs: list[str]
    outcomes: list[TaskOutcome]  # one per grid point, in grid order
    coords: list[dict[str, Any]]  # the axis values of each point
    slos: list[Slo]
    jobs: int
    executor: str  # "this process", "N local processes" or "ray <address>"
    wall_s: float
    selection: dict[str, Any] = field(default_factory=dict)  # ``replay.selection_record``

    @property
    def runs(self) -> list[ScenarioRun]:
        return [o.run for o in self.outcomes if o.run is not None]

    @property
    def failures(self) -> dict[str, str]:
        return {o.name: o.error for o in self.outcomes if o.error is not None}

    @property
    def ok(self) -> bool:
        return not self.failures


@with_warehouse_lock
def sweep(
    warehouse: Path,
    grid: Grid,
    *,
    jobs: int | None = None,
    ray_address: str | None = None,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    shards: int | None = None,
    shard_warmup_s: float | None = None,
) -> SweepResult:
    """Replay the selected requests through every scenario of ``grid``, in parallel.

    Args:
        warehouse: the warehouse (requests are read from it unless ``requests_file``).
        grid: the expanded grid (``grid.load_grid``).
        jobs: local worker processes (default: every core); 1 runs here.
        ray_address: run on the Ray cluster at this address instead.
        requests_file: one requests Parquet file instead of the warehouse.
        date_from, date_to: inclusive range of request days (warehouse only).
        quiet: no progress bar.
        run_id: the run id to write under (default: a new one).
        shards: run each scenario in this many parts (``replay --shards``), the parts
            ``jobs`` at once or on the Ray cluster; ``shard_warmup_s``: cut by time,
            each window after this much of the traffic before it.

    Returns:
        Every scenario's outcome (summary, SLO verdicts, files, or its error).

    Raises:
        ScenarioError: a scenario cannot run on these requests (nothing is written).
        ConfigError: no requests selected, bad jobs, Ray unavailable.
    """
    t0 = time.perf_counter()
    started = datetime.now(UTC)
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    scenarios = grid.scenarios
    plans = (  # (every check before anything is read or written)
        None if shards is None else [plan_sharding(sc, shards, shard_warmup_s) for sc in scenarios]
    )
    frame, window = read_window(files, selection)
    chosen = selection_record(selection, window)
    prepared: list[Prepared] | None = [prepare(frame, sc) for sc in scenarios]
    if sum(len(p.inp) for p in prepared or []) > KEEP_PREPARED:
        prepared = None
    # with shards, the workers replay one scenario's parts: as many as the parts
    jobs = max(1, min(jobs or default_jobs(), len(scenarios) if plans is None else shards or 1))
    if ray_address is not None:
        executor = f"ray {ray_address}"
    else:
        executor = "this process" if jobs == 1 else f"{jobs} local processes"
    if plans is not None:
        executor = f"{executor}, each scenario in parts"
    wh.init()
    if ray_address is None and scenarios:
        load_loop(scenarios[0].engine())  # forked workers inherit the loaded loop
    target = None if ray_address is not None else wh.root

    def tasks() -> Any:
        for i, sc in enumerate(scenarios):
            prep = prepared[i] if prepared is not None else prepare(frame, sc)
            yield ScenarioTask(i, sc, prep, tuple(grid.slos), run_id, target)

    def sharded(plans: list[ShardPlan]) -> Any:
        for i, (sc, plan) in enumerate(zip(scenarios, plans, strict=True)):
            prep = prepared[i] if prepared is not None else prepare(frame, sc)
            yield i, run_in_parts(wh, run_id, i, sc, prep, plan, grid.slos, jobs, ray_address)

    outcomes: list[TaskOutcome | None] = [None] * len(scenarios)
    status = "failed"
    try:
        with progress(f"sweep ({executor})", total=len(scenarios), quiet=quiet) as bar:
            ended = (
                run_tasks(run_task, tasks(), jobs=jobs, ray_address=ray_address)
                if plans is None
                else sharded(plans)
            )
            for i, res in ended:
                out = _outcome(i, scenarios[i].name, res)
                if out.ok and out.tables:
                    write_tables(wh, run_id, out, out.tables)
                    out.tables = {}
                outcomes[i] = out
                bar.advance(1)
        done = [o for o in outcomes if o is not None]
        runs = [o.run for o in done if o.run is not None]
        write_scenarios(wh, run_id, runs)
        status = "ok" if len(runs) == len(scenarios) else ("partial" if runs else "failed")
    finally:
        done = [o for o in outcomes if o is not None]
        write_run_row(
            wh,
            run_id=run_id,
            command="sweep",
            started=started,
            status=status,
            inputs=[str(f) for f in files],
            rows_read=frame.height,
            rows_kept=sum(o.run.summary["num_requests"] for o in done if o.run is not None),
            details={
                "selection": chosen,
                "grid": grid.where,
                "executor": executor,
                "jobs": jobs,
                "slos": [str(s) for s in grid.slos],
                "scenarios": [sc.name for sc in scenarios],
                "failures": {o.name: o.error for o in done if o.error is not None},
            },
        )
    return SweepResult(
        run_id=run_id,
        num_requests_read=frame.height,
        inputs=[str(f) for f in files],
        outcomes=[o for o in outcomes if o is not None],
        coords=[p.coords for p in grid.points],
        slos=grid.slos,
        jobs=jobs,
        executor=executor,
        wall_s=time.perf_counter() - t0,
        selection=chosen,
    )


def _outcome(index: int, name: str, res: TaskOutcome | BaseException) -> TaskOutcome:
    if isinstance(res, BaseException):
        first = str(res).strip().splitlines()[0] if str(res).strip() else ""
        return TaskOutcome(index=index, name=name, error=f"{type(res).__name__}: {first}")
    return res
