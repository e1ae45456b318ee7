"""The replay stage: requests in, one simulated run per scenario out.

    requests (warehouse or one file) ──▶ arrivals + caps ──▶ fast loop ──▶
        sim_requests/run_id=<run>/<scenario>.parquet
        sim_steps/run_id=<run>/<scenario>.parquet
        scenarios/run_id=<run>/scenarios.parquet
        runs/<run>.parquet

Every scenario is validated, and its requests checked against its memory,
before the first one runs. Arrival times are relative to the earliest
selected request (``arrival_time``; ``arrival_s`` is per source file).

Reading and preparing the requests is ``replay_input``; building the sim_requests
and sim_steps tables is ``replay_tables``; this module runs the scenarios and writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.busiest import BusiestWindow
from pipeline.contracts import SCENARIOS, SIM_REQUESTS, SIM_STEPS, BackgroundWriter
from pipeline.jit import compile_notice
from pipeline.lock import with_warehouse_lock
from pipeline.progress import progress
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim import uncertainty
from pipeline.sim.classes import Slo, class_summary, whole_traffic_slos
from pipeline.sim.disagg import simulate_disaggregated
from pipeline.sim.fleet import (
    FleetPrepared,
    FleetResult,
    PoolOutcome,
    fleet_summary,
    pool_names,
    scenario_extras,
    simulate_fleet,
)
from pipeline.sim.replay_input import (
    Prepared,
    prepare,
    read_window,
    select_request_files,
)
from pipeline.sim.replay_sharded import (
    plan_sharding,
    profile_in_parts,
    run_sharded,
    whole_input_parts,
)
from pipeline.sim.replay_tables import (
    CHUNK_ROWS,
    sim_requests_table,
    sim_steps_table,
    write_sim_requests,
)
from pipeline.sim.replay_windows import WindowFacts, check_streamable, read_windows
from pipeline.sim.scenario import Scenario
from pipeline.sim.shard import Cut, ShardPlan, cuts
from pipeline.sim.simulate import simulate, warm_up
from pipeline.sim.state import C_NUM_BLOCKS, EngineConfig, SimInput, SimResult
from pipeline.sim.summary import StepTotals, summarize
from pipeline.warehouse import Warehouse, new_run_id


@dataclass
class ScenarioRun:
    """The outcome of one scenario."""

    scenario: Scenario
    summary: dict[str, Any]
    num_dropped: int  # requests left out (drop_too_long)
    sim_s: float  # wall seconds in the replay loop
    paths: dict[str, Path] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """What ``replay`` wrote."""

    run_id: str
    num_requests_read: int
    inputs: list[str]
    runs: list[ScenarioRun]
    selection: dict[str, Any] = field(default_factory=dict)  # ``selection_record``


def _simulate(
    sc: Scenario,
    inputs: list[SimInput],
    keep: Callable[[pa.Table], None],
    *,
    chunk_rows: int,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[SimResult, StepTotals, float]:
    """Run one scenario, handing its sim_steps rows to ``keep`` a chunk at a time.

    ``inputs`` holds the scenario's input, taken out of it for the loop: when
    the caller keeps no other reference, the loop frees it once copied.

    Returns the result (its timeline empty), the timeline's totals, and the
    seconds spent in the loop (not in converting and keeping the chunks).
    """
    if sc.disagg is not None:
        return _simulate_disaggregated(
            sc, inputs, keep, chunk_rows=chunk_rows, on_progress=on_progress
        )
    eng = sc.engine()
    blocks = eng.get(C_NUM_BLOCKS)
    steps = StepTotals()
    kept_s = 0.0

    def on_steps(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        nonlocal kept_s
        t = time.perf_counter()
        steps.add(st, stf)
        keep(sim_steps_table(sc.name, st, stf, blocks))
        kept_s += time.perf_counter() - t

    t0 = time.perf_counter()
    res = simulate(
        inputs.pop(), eng, on_progress=on_progress, on_steps=on_steps, step_rows=chunk_rows
    )
    return res, steps, time.perf_counter() - t0 - kept_s


def _simulate_disaggregated(
    sc: Scenario,
    inputs: list[SimInput],
    keep: Callable[[pa.Table], None],
    *,
    chunk_rows: int,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[SimResult, StepTotals, float]:
    """``_simulate`` of a disaggregated scenario (``disagg.py``): both sides' step rows,
    the client-facing requests; its timeline is kept whole while it is handed out."""
    t0 = time.perf_counter()
    half = None if on_progress is None else (lambda k: on_progress(k // 2))
    res = simulate_disaggregated(inputs.pop(), sc, on_progress=half).result
    sim_s = time.perf_counter() - t0
    steps = StepTotals()
    steps.add(res.st, res.stf)
    for lo in range(0, len(res.st), chunk_rows):
        hi = lo + chunk_rows
        role = None if res.step_role is None else res.step_role[lo:hi]
        keep(sim_steps_table(sc.name, res.st[lo:hi], res.stf[lo:hi], res.num_kv_blocks, role=role))
    res.st, res.stf = res.st[:0], res.stf[:0]  # as _simulate's: the timeline handed out
    return res, steps, sim_s


def _with_classes(
    summary: dict[str, Any], res: SimResult, prep: Prepared, slos: Sequence[Slo] = ()
) -> dict[str, Any]:
    """``summary`` with its per-class figures (``classes``), against ``slos`` if any."""
    summary["classes"] = class_summary(res, prep.classes, slos, summary["duration_s"])
    return summary


def _facts(prep: Prepared) -> dict[str, Any]:
    """What a scenario's summary says of its preparation (dropped, warm-up, prefix facts)."""
    return {
        "num_dropped": prep.num_dropped,
        "num_warmup_requests": prep.num_warmup,
        "num_busiest_warmup_requests": prep.num_lead,
        **prep.prefix_info,
    }


@with_warehouse_lock
def replay(
    warehouse: Path,
    scenarios: list[Scenario],
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    chunk_rows: int = CHUNK_ROWS,
    intervals: bool = True,
    slos: Sequence[Slo] = (),
    jobs: int | None = None,
    shards: int | None = None,
    shard_warmup_s: float | None = None,
    ray_address: str | None = None,
) -> ReplayResult:
    """Replay the selected requests through every scenario and write the results.

    Args:
        warehouse: warehouse directory (requests are read from it unless
            ``requests_file`` is given; results are always written to it).
        scenarios: validated scenarios (``scenario.resolve_scenarios``).
        requests_file: one requests Parquet file instead of the warehouse.
        date_from, date_to: inclusive range of request days (warehouse only).
        quiet: no progress bar.
        run_id: the run id to write under (default: a new one).
        selection: which of those requests (models, tenants, predicate, time window).
        chunk_rows: step rows converted and written at once, and requests per
            row group of sim_requests (bounds the memory the writing takes).
        intervals: give each summary's TTFT, TPOT and E2E percentiles their 90%
            intervals (``pipeline.sim.uncertainty``: a bootstrap, and two more
            replays for the profile term, in forked children beside the main replay
            when ``jobs`` leaves a core to spare: ``uncertainty.start_profile_statistics``).
        jobs: cores a replay may use (default: every core; 1: one process).
        slos: objectives (``pipeline.plan.slo``): each summary gets each one's verdict
            and the goodput, for the whole traffic and per class (``sim.classes``).
        shards: replay each scenario in this many parts, so that only the parts being
            replayed hold loop state (``replay_sharded``, ``shard.py``): replica
            groups, exact, where the router is independent of load, else time windows
            after ``shard_warmup_s`` of warm-up (approximate; read a window at a time
            when every scenario is cut so: ``replay_windows``). The parts run ``jobs``
            at once in forked processes (``jobs`` 1: one after the other, here), or on
            the Ray cluster at ``ray_address``. Each summary's ``sharding`` says how;
            a sharded summary has the figures of a whole one: the SLO verdicts, the
            classes and (with ``intervals``) the intervals, over every part's requests
            (the profile term's two replays in parts too).
        shard_warmup_s: the time windows' warm-up (asks for time windows).
        ray_address: with ``shards``, replay the parts on this Ray cluster.

    Returns:
        The run id, the inputs and each scenario's summary and files.

    Raises:
        ScenarioError: a scenario cannot run on these requests (nothing is written).
        ConfigError: no requests selected.
    """
    started = datetime.now(UTC)
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    kw: dict[str, Any] = {
        "quiet": quiet,
        "rows": chunk_rows,
        "intervals": intervals,
        "slos": slos,
        "jobs": jobs,
    }
    # every check before any run
    plans = [
        None if shards is None else plan_sharding(sc, shards, shard_warmup_s) for sc in scenarios
    ]
    if scenarios and all(plan is not None and plan.by == "time" for plan in plans):
        # every scenario cut by time: each reads its requests a window at a time
        return _replay_windows(
            wh, run_id, started, files, selection, scenarios, plans, kw, ray_address
        )
    frame, window = read_window(files, selection)
    chosen = selection_record(selection, window)
    # the groups (tenant, model) are only for SLOs
    prepared = [prepare(frame, sc, with_groups=False) for sc in scenarios]
    rows_read = frame.height
    del frame  # the prepared arrays are all the runs need: free the frame's memory
    wh.init()

    def runs() -> Iterator[ScenarioRun]:
        if scenarios:
            load_loop(scenarios[0].engine(), quiet=quiet)
        for sc, plan in zip(scenarios, plans, strict=True):
            # each scenario's inputs are let go once it has run
            if plan is not None:
                yield run_sharded_prepared(
                    wh,
                    run_id,
                    sc,
                    prepared.pop(0),
                    plan,
                    quiet=kw["quiet"],
                    rows=kw["rows"],
                    jobs=kw["jobs"],
                    slos=kw["slos"],
                    ray_address=ray_address,
                    intervals=kw["intervals"],
                )
            else:
                yield _run_one(wh, run_id, sc, prepared.pop(0), **kw)

    return _run_and_commit(wh, run_id, started, files, chosen, runs(), lambda: rows_read)


def _run_and_commit(
    wh: Warehouse,
    run_id: str,
    started: datetime,
    files: list[Path],
    chosen: dict[str, Any],
    runs: Iterator[ScenarioRun],
    rows_read: Callable[[], int],
) -> ReplayResult:
    """Run the scenarios ``runs`` yields, then write their scenarios rows and the run's
    runs row (status failed, with the runs that ended, when one raised); ``rows_read``:
    the requests read, asked once the runs are over."""
    done: list[ScenarioRun] = []
    status = "failed"
    try:
        done.extend(runs)
        wh.write(SCENARIOS, _scenarios_table(done), {"run_id": run_id}, "scenarios")
        status = "ok"
    finally:
        _write_run_row(wh, run_id, started, status, files, rows_read(), done, chosen)
    return ReplayResult(
        run_id=run_id,
        num_requests_read=rows_read(),
        inputs=[str(f) for f in files],
        runs=done,
        selection=chosen,
    )


def selection_record(
    selection: RequestFilter | None, window: BusiestWindow | None
) -> dict[str, Any]:
    """What a run records of its selection (the runs row's ``details.selection``):
    ``filter``, in words, and ``busiest``, the window picked (``BusiestWindow.to_dict``)
    or None."""
    return {
        "filter": selection.describe() if selection is not None else "every request",
        "busiest": window.to_dict() if window is not None else None,
    }


def load_loop(eng: EngineConfig, *, quiet: bool = False) -> None:
    """Load the compiled loop from numba's cache, or compile it with a notice on stderr."""
    from pipeline.sim import loop

    # NOTE: numba's list of compiled signatures: non-empty once this process has the loop
    with compile_notice(quiet=quiet, loaded=bool(loop.replay_loop.signatures)):
        warm_up(eng)


def _run_one(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    prep: Prepared,
    *,
    quiet: bool,
    rows: int,
    intervals: bool = False,
    slos: Sequence[Slo] = (),
    jobs: int | None = None,
) -> ScenarioRun:
    """Run one scenario; its step rows are written as the loop hands them out."""
    if isinstance(prep, FleetPrepared):
        return _run_fleet(
            wh, run_id, sc, prep, quiet=quiet, rows=rows, intervals=intervals, slos=slos
        )
    # the profile term's replays start first, while the input is still held: in forked
    # children beside the main replay where a core is free, else here, now
    at_cost = uncertainty.start_profile_statistics(sc, prep.inp, jobs=jobs) if intervals else None
    n, inputs, ids, facts = len(prep.inp), [prep.inp], prep.request_ids, _facts(prep)
    classes = prep.classes
    del prep  # the caller holds it no more: the loop frees the input once it has copied it
    part = {"run_id": run_id}
    with (
        progress(f"replay {sc.name}", total=n, quiet=quiet) as bar,
        wh.writer(SIM_STEPS, part, sc.name) as steps_out,
        BackgroundWriter(steps_out) as steps_bg,  # (encoded beside the loop)
    ):
        seen = [0]

        def on_progress(k: int) -> None:
            bar.advance(k - seen[0])
            seen[0] = k

        res, steps, sim_s = _simulate(
            sc, inputs, steps_bg.write, chunk_rows=rows, on_progress=on_progress
        )
    summary = {**summarize(res, steps), **facts, **scenario_extras(sc, res, slos)}
    if slos:
        summary.update(whole_traffic_slos(res, classes, slos, summary["duration_s"]))
    summary["classes"] = class_summary(res, classes, slos, summary["duration_s"])
    if at_cost is not None:
        summary["intervals"] = uncertainty.summary_intervals(sc, res, at_cost())
    paths = {
        "sim_steps": steps_out.path,
        "sim_requests": write_sim_requests(
            wh.writer(SIM_REQUESTS, part, sc.name), sc.name, ids, res, rows
        ),
    }
    return ScenarioRun(
        scenario=sc, summary=summary, num_dropped=facts["num_dropped"], sim_s=sim_s, paths=paths
    )


def run_sharded_prepared(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    prep: Prepared,
    plan: ShardPlan,
    *,
    quiet: bool,
    rows: int = CHUNK_ROWS,
    jobs: int | None = None,
    slos: Sequence[Slo] = (),
    ray_address: str | None = None,
    write: bool = True,
    intervals: bool = False,
) -> ScenarioRun:
    """Run one prepared scenario in the parts of ``plan`` (``replay_sharded.run_sharded``:
    ``jobs`` parts at once, or on the Ray cluster at ``ray_address``) and write them under
    ``run_id`` (``write`` False: only its summary is made); its summary has the
    ``slos``' verdicts and, with ``intervals``, its intervals (the profile term's two
    replays in parts too). ``replay``, ``sweep`` and ``capacity`` (with ``--shards``) run
    each scenario so."""
    assert not isinstance(prep, FleetPrepared), "plan_sharding refuses fleets"
    facts = _facts(prep)
    summary, paths, sim_s = run_sharded(
        wh,
        run_id,
        sc,
        whole_input_parts(prep.inp, prep.request_ids, sc, plan, prep.classes),
        plan,
        total=len(prep.inp),
        quiet=quiet,
        rows=rows,
        jobs=jobs,
        ray_address=ray_address,
        slos=slos,
        write=write,
        intervals=profile_in_parts(
            wh, run_id, sc, lambda s: cuts(prep.inp, s, plan), plan, rows=rows, jobs=jobs,
            ray_address=ray_address,
        ) if intervals else None,
    )  # fmt: skip
    return ScenarioRun(
        scenario=sc,
        summary={**summary, **facts},
        num_dropped=facts["num_dropped"],
        sim_s=sim_s,
        paths=paths,
    )


def _replay_windows(
    wh: Warehouse,
    run_id: str,
    started: datetime,
    files: list[Path],
    selection: RequestFilter | None,
    scenarios: list[Scenario],
    plans: list[ShardPlan | None],
    kw: dict[str, Any],
    ray_address: str | None,
) -> ReplayResult:
    """``replay`` of scenarios that are all cut by time: each reads the requests a window
    at a time (``replay_windows``), so the selection never lives whole in memory. A
    window whose requests do not fit its scenario stops the run there (status failed:
    nothing of it shows in the views)."""
    for sc in scenarios:
        check_streamable(sc, selection)
    chosen = selection_record(selection, None)
    wh.init()
    rows_read = [0]

    def runs() -> Iterator[ScenarioRun]:
        load_loop(scenarios[0].engine(), quiet=kw["quiet"])
        for sc, plan in zip(scenarios, plans, strict=True):
            assert plan is not None
            facts = WindowFacts()
            profile = profile_in_parts(
                wh, run_id, sc, _windows_of(files, selection, plan), plan, rows=kw["rows"],
                jobs=kw["jobs"], ray_address=ray_address,
            )  # fmt: skip
            summary, paths, sim_s = run_sharded(
                wh,
                run_id,
                sc,
                read_windows(files, selection, sc, plan, facts),
                plan,
                total=None,
                quiet=kw["quiet"],
                rows=kw["rows"],
                jobs=kw["jobs"],
                ray_address=ray_address,
                slos=kw["slos"],
                intervals=profile if kw["intervals"] else None,
            )
            rows_read[0] = max(rows_read[0], facts.num_read)
            summary.update(
                {
                    "num_dropped": facts.num_dropped,
                    "num_warmup_requests": 0,
                    "num_busiest_warmup_requests": 0,
                }
            )
            summary["sharding"]["streamed_windows"] = facts.windows
            yield ScenarioRun(
                scenario=sc,
                summary=summary,
                num_dropped=facts.num_dropped,
                sim_s=sim_s,
                paths=paths,
            )

    return _run_and_commit(wh, run_id, started, files, chosen, runs(), lambda: rows_read[0])


def _windows_of(
    files: list[Path], selection: RequestFilter | None, plan: ShardPlan
) -> Callable[[Scenario], Iterator[Cut]]:
    """The time windows of ``plan``, read anew for a scenario each call (the profile
    term's replays)."""
    return lambda sc: read_windows(files, selection, sc, plan, WindowFacts())


def _fleet_facts(fp: FleetPrepared) -> dict[str, Any]:
    return {
        "num_dropped": fp.num_dropped,
        "num_warmup_requests": fp.num_warmup,
        "num_busiest_warmup_requests": fp.num_pool_lead,
    }


def _pool_intervals(intervals: bool) -> Callable[[PoolOutcome], dict[str, Any]] | None:
    """Each pool's intervals (its own scenario's profile term and bootstrap), if asked."""
    if not intervals:
        return None

    def extra(o: PoolOutcome) -> dict[str, Any]:
        assert o.result is not None and o.prep is not None
        at_cost = uncertainty.profile_statistics(o.pool.scenario, o.prep.inp)
        return {"intervals": uncertainty.summary_intervals(o.pool.scenario, o.result, at_cost)}

    return extra


def _run_fleet(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    fp: FleetPrepared,
    *,
    quiet: bool,
    rows: int,
    intervals: bool = False,
    slos: Sequence[Slo] = (),
) -> ScenarioRun:
    """Run a fleet's pools; their step rows are written as the loop hands them out."""
    part = {"run_id": run_id}
    names = [p.name for p in fp.pools]
    t0 = time.perf_counter()
    kept_s = 0.0
    with (
        progress(f"replay {sc.name}", total=fp.num_requests, quiet=quiet) as bar,
        wh.writer(SIM_STEPS, part, sc.name) as steps_out,
        BackgroundWriter(steps_out) as steps_bg,  # (encoded beside the loop)
    ):
        seen = [0]

        def on_progress(k: int) -> None:
            bar.advance(k - seen[0])
            seen[0] = k

        def on_steps(
            k: int,
            st: npt.NDArray[np.int64],
            stf: npt.NDArray[np.float64],
            role: npt.NDArray[np.int8] | None,
            blocks: int,
        ) -> None:
            nonlocal kept_s
            t = time.perf_counter()
            steps_bg.write(sim_steps_table(sc.name, st, stf, blocks, pool=names[k], role=role))
            kept_s += time.perf_counter() - t

        fr = simulate_fleet(sc, fp, on_steps=on_steps, on_progress=on_progress, step_rows=rows)
    sim_s = time.perf_counter() - t0 - kept_s
    summary = fleet_summary(sc, fr, fp, _fleet_facts(fp), slos, _pool_intervals(intervals))
    if intervals:
        summary["intervals"] = uncertainty.summary_intervals(sc, fr.result, None)
    paths = {
        "sim_steps": steps_out.path,
        "sim_requests": write_sim_requests(
            wh.writer(SIM_REQUESTS, part, sc.name),
            sc.name,
            fp.request_ids,
            fr.result,
            rows,
            pools=pool_names(fp),
        ),
    }
    return ScenarioRun(
        scenario=sc, summary=summary, num_dropped=fp.num_dropped, sim_s=sim_s, paths=paths
    )


def _scenarios_table(runs: list[ScenarioRun]) -> pa.Table:
    return pa.table(
        {
            "scenario": [r.scenario.name for r in runs],
            "policy": [r.scenario.policy for r in runs],
            "replicas": pa.array([r.scenario.replicas for r in runs], pa.int32()),
            "profile": [r.scenario.profile for r in runs],
            "config_json": [json.dumps(r.scenario.to_dict(), sort_keys=True) for r in runs],
            "summary_json": [json.dumps(r.summary, sort_keys=True) for r in runs],
        }
    )


def _write_run_row(
    wh: Warehouse,
    run_id: str,
    started: datetime,
    status: str,
    files: list[Path],
    rows_read: int,
    runs: list[ScenarioRun],
    selection: dict[str, Any],
) -> None:
    details = {
        "selection": selection,
        "scenarios": {
            r.scenario.name: {"config": r.scenario.to_dict(), "summary": r.summary} for r in runs
        },
    }
    write_run_row(
        wh,
        run_id=run_id,
        command="replay",
        started=started,
        status=status,
        inputs=[str(f) for f in files],
        rows_read=rows_read,
        rows_kept=sum(r.summary["num_requests"] for r in runs),
        details=details,
    )


# --- Hooks for stages that run many scenarios (sweeps, capacity searches) ---


def run_prepared(
    sc: Scenario, prep: Prepared, slos: Sequence[Slo] = ()
) -> tuple[ScenarioRun, pa.Table, pa.Table]:
    """Simulate one prepared scenario and return its run, sim_requests and sim_steps tables.

    The summary holds the per-class figures, against ``slos`` (``sim.classes``).

    Writes nothing: the caller writes the tables, in bulk or from another process.
    Uses no polars, so it is safe in a forked worker process.
    """
    if isinstance(prep, FleetPrepared):
        fr, sim_s = _timed_fleet(sc, prep)
        summary = fleet_summary(sc, fr, prep, _fleet_facts(prep), slos)
        run = ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s)
        steps_tables = [
            sim_steps_table(
                sc.name,
                o.result.st,
                o.result.stf,
                o.result.num_kv_blocks,
                pool=o.pool.name,
                role=o.result.step_role,
            )
            for o in fr.pools
            if o.result is not None
        ]
        requests = sim_requests_table(sc.name, prep.request_ids, fr.result, pools=pool_names(prep))
        return run, requests, pa.concat_tables(steps_tables)
    chunks: list[pa.Table] = []
    res, steps, sim_s = _simulate(sc, [prep.inp], chunks.append, chunk_rows=CHUNK_ROWS)
    blocks = res.num_kv_blocks
    steps_table = pa.concat_tables(chunks or [sim_steps_table(sc.name, res.st, res.stf, blocks)])
    summary = _with_classes(
        {**summarize(res, steps), **_facts(prep), **scenario_extras(sc, res, slos)}, res, prep, slos
    )
    run = ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s)
    return run, sim_requests_table(sc.name, prep.request_ids, res), steps_table


def summarize_prepared(
    sc: Scenario, prep: Prepared, slos: Sequence[Slo] = ()
) -> tuple[ScenarioRun, SimResult]:
    """Simulate one prepared scenario for its summary only: no tables are built. The
    summary holds the per-class figures, against ``slos`` (``sim.classes``).

    Returns the run and the result (its step timeline kept whole, for the summary).
    """
    if isinstance(prep, FleetPrepared):
        fr, sim_s = _timed_fleet(sc, prep)
        summary = fleet_summary(sc, fr, prep, _fleet_facts(prep), slos)
        run = ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s)
        return run, fr.result
    t0 = time.perf_counter()
    if sc.disagg is not None:
        res = simulate_disaggregated(prep.inp, sc).result
    else:
        res = simulate(prep.inp, sc.engine())
    sim_s = time.perf_counter() - t0
    summary = _with_classes(
        {**summarize(res), **_facts(prep), **scenario_extras(sc, res, slos)}, res, prep, slos
    )
    return ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s), res


def _timed_fleet(sc: Scenario, fp: FleetPrepared) -> tuple[FleetResult, float]:
    t0 = time.perf_counter()
    fr = simulate_fleet(sc, fp)
    return fr, time.perf_counter() - t0


def scenarios_table(runs: list[ScenarioRun]) -> pa.Table:
    """The scenarios table rows of ``runs``, one per scenario."""
    return _scenarios_table(runs)
