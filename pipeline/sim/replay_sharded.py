"""``replay --shards``: one scenario replayed in parts, written part by part.

    prepared requests ──▶ shard.cuts ──▶ each part replayed (here, in forked
        processes or on Ray: ``plan.executor``) ──▶ its sim_requests and sim_steps
        rows appended as it ends ──▶ the summary, added up part by part

Only the parts being replayed hold loop state; what is kept of each is the summary's
totals (``summary.RequestTotals``, ``StepTotals``). How a scenario is cut, and what is
exact and what is not: ``shard.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.contracts import (
    CONTRACTS,
    SIM_REQUESTS,
    SIM_STEPS,
    BackgroundWriter,
    parquet_bytes,
    write_bytes,
)
from pipeline.plan.executor import run_tasks
from pipeline.progress import progress
from pipeline.sim import uncertainty
from pipeline.sim.classes import ClassLabels, Slo
from pipeline.sim.cost_uncertainty import cost_factors, scaled_cost
from pipeline.sim.intervals import Z
from pipeline.sim.replay_tables import sim_requests_table, sim_steps_table
from pipeline.sim.scenario import Scenario
from pipeline.sim.shard import (
    Cut,
    Shard,
    ShardPlan,
    cuts,
    plan_shards,
    replay_cut,
    sharding_record,
)
from pipeline.sim.state import C_NUM_BLOCKS, SimInput
from pipeline.sim.summary import RequestTotals, StepTotals, summarize_totals
from pipeline.sim.uncertainty import QUANTILES, AtCost, stat_key
from pipeline.warehouse import Warehouse


def plan_sharding(sc: Scenario, shards: int, warmup_s: float | None) -> ShardPlan:
    """How ``sc`` is cut into ``shards`` (``shard.plan_shards``), checked before any run.

    Raises:
        ScenarioError: it cannot be sharded.
    """
    return plan_shards(sc, shards, warmup_s=warmup_s)


@dataclass
class ShardTask:
    """One part to replay elsewhere: the scenario, the cut and its requests' ids."""

    sc: Scenario
    cut: Cut  # (with its request ids)
    rows: int  # rows per table handed back
    slos: tuple[Slo, ...] = ()  # SLOs its totals count the good requests of
    write: bool = True  # False: its totals only, no rows (a summary-only run)
    ordered: bool = False  # its totals keep its requests' rows (for the intervals)


@dataclass
class ShardTables:
    """A replayed part: its totals, and its sim_requests rows as tables (replayed here:
    its step rows were written as the loop handed them out) or its rows as the Parquet
    files of its own that the worker made (``files``, by table: replayed in another
    process or on another machine, so that the encoding runs there too)."""

    rows: npt.NDArray[np.int64]
    totals: RequestTotals
    steps: StepTotals
    requests: list[pa.Table] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


def replay_shard(task: ShardTask) -> ShardTables:
    """Replay one part and build its sim_requests and sim_steps tables (no polars, so safe
    in a forked worker; a module-level function, so Ray can ship it)."""
    sc = task.sc
    if not task.write:
        shard = replay_cut(sc, task.cut, step_rows=task.rows)
        return _tables(sc, shard, None, task.rows, task.slos, task.cut.labels, task.ordered)
    blocks = sc.engine().get(C_NUM_BLOCKS)
    timeline: list[pa.Table] = []

    def keep(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        timeline.append(sim_steps_table(sc.name, st, stf, blocks))

    shard = replay_cut(sc, task.cut, on_steps=keep, step_rows=task.rows)
    out = _tables(
        sc, shard, task.cut.request_ids, task.rows, task.slos, task.cut.labels, task.ordered
    )
    out.files = {
        SIM_REQUESTS.name: parquet_bytes(out.requests, SIM_REQUESTS, f"{sc.name} sim_requests"),
        SIM_STEPS.name: parquet_bytes(timeline, SIM_STEPS, f"{sc.name} sim_steps"),
    }
    out.requests = []
    return out


def whole_input_parts(
    inp: SimInput,
    ids: pa.Array,
    sc: Scenario,
    plan: ShardPlan,
    classes: Mapping[str, ClassLabels] | None = None,
) -> Iterator[Cut]:
    """The parts of ``plan`` cut from a whole replay's input ``inp`` (request ids ``ids``,
    and the requests' ``classes``, aligned with ``inp``)."""
    for cut in cuts(inp, sc, plan):
        cut.request_ids = ids.take(pa.array(cut.rows))
        if classes is not None:
            cut.labels = {kind: lab.take(cut.rows) for kind, lab in classes.items()}
        yield cut


def run_sharded(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    parts: Iterator[Cut],
    plan: ShardPlan,
    *,
    total: int | None,
    quiet: bool,
    rows: int,
    jobs: int | None = None,
    ray_address: str | None = None,
    slos: Sequence[Slo] = (),
    write: bool = True,
    intervals: Callable[[], AtCost | None] | None = None,
) -> tuple[dict[str, Any], dict[str, Path], float]:
    """Replay ``sc`` in ``parts`` (the cuts of ``plan``, each with its request ids:
    ``whole_input_parts``, or ``replay_windows.read_windows``), ``jobs`` at once (every
    core by default) or on the Ray cluster at ``ray_address``; ``total``: the requests
    they measure, for the progress bar (None: not known before they are read).

    One at a time (``jobs`` 1), the parts run in this process and their rows go to one
    sim_requests and one sim_steps file, the step rows as the loop hands them out.
    Else each part is replayed and encoded in a worker, and its files are written as
    it ends, as files of their own (``<scenario>.part-<k>.parquet``, beside each other).
    ``write`` False: nothing is written, only the summary is made (a capacity search's
    ``--summary-only`` probes, and the probes only its intervals need). ``intervals``:
    give the summary its intervals (``uncertainty.intervals_of``: the bootstrap over
    every part's requests, put back in arrival order), this call giving the profile
    term's statistics once the parts have run (``profile_in_parts``).

    Returns the summary (with its ``sharding`` entry, and with ``slos``, whole-traffic
    SLOs only, their verdicts as a whole replay's summary has them), the files written
    (the first part's, with several) and the seconds the parts took, writing included.
    """
    width = min(jobs if jobs is not None else (os.cpu_count() or 1), plan.shards)
    part = {"run_id": run_id}
    ordered = intervals is not None
    slos = tuple(slos)
    totals, steps = RequestTotals(slos=slos), StepTotals()
    t0 = time.perf_counter()
    with progress(f"replay {sc.name}", total=total, quiet=quiet) as bar:
        if not write and width == 1 and ray_address is None:
            for out in _here(sc, parts, rows, None, slos, ordered):
                totals.merge(out.totals)
                steps.merge(out.steps)
                bar.advance(len(out.rows))
            paths: dict[str, Path] = {}
        elif width == 1 and ray_address is None:
            with (
                wh.writer(SIM_STEPS, part, sc.name) as steps_out,
                wh.writer(SIM_REQUESTS, part, sc.name) as requests_out,
                BackgroundWriter(steps_out) as bg,  # both files, encoded beside the loop
            ):
                for out in _here(sc, parts, rows, bg.write, slos, ordered):
                    totals.merge(out.totals)
                    steps.merge(out.steps)
                    for table in out.requests:
                        bg.write(table, to=requests_out)
                    bar.advance(len(out.rows))
            paths = {"sim_steps": steps_out.path, "sim_requests": requests_out.path}
        else:
            written: dict[int, dict[str, Path]] = {}
            ended: dict[int, tuple[RequestTotals, StepTotals]] = {}  # (files written)
            for k, out in _elsewhere(sc, parts, rows, width, ray_address, slos, write, ordered):
                ended[k] = (out.totals, out.steps)
                stem = f"{sc.name}.part-{k:05d}"
                if out.files:
                    written[k] = {
                        name: write_bytes(data, wh.partition_path(CONTRACTS[name], part, stem))
                        for name, data in out.files.items()
                    }
                bar.advance(len(out.rows))
            # added up in the parts' order, not as they ended: the same figures (a mean
            # over the parts' requests, to the last bit) whichever worker was first
            for k in sorted(ended):
                part_totals, part_steps = ended.pop(k)
                totals.merge(part_totals)
                steps.merge(part_steps)
            paths = written[min(written)] if written else {}
    wall_s = time.perf_counter() - t0
    # (in arrival order before the summary's percentiles take the metrics)
    values = totals.in_arrival_order(uncertainty.METRICS) if intervals is not None else None
    summary = {**summarize_totals(totals, steps), "sharding": sharding_record(sc, plan)}
    if intervals is not None and values is not None:
        summary["intervals"] = uncertainty.intervals_of(sc, values, intervals())
    summary["sharding"]["workers"] = f"ray {ray_address}" if ray_address else width
    return summary, paths, wall_s


def profile_in_parts(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    parts_for: Callable[[Scenario], Iterator[Cut]],
    plan: ShardPlan,
    *,
    rows: int,
    jobs: int | None = None,
    ray_address: str | None = None,
) -> Callable[[], AtCost | None]:
    """The profile term of a replay in parts (``uncertainty.profile_statistics``): when
    called, ``sc`` replayed twice more at the low and the high step cost, each in the
    parts ``parts_for`` cuts anew, nothing written; None when its sd is 0."""

    def at_cost() -> AtCost | None:
        sd = sc.cost_uncertainty.log_sd
        if sd <= 0:
            return None
        found = []
        for factor in cost_factors(sd, Z):
            scaled = dataclasses.replace(sc, cost=scaled_cost(sc.cost, factor))
            summary, _, _ = run_sharded(
                wh, run_id, scaled, parts_for(scaled), plan, total=None, quiet=True,
                rows=rows, jobs=jobs, ray_address=ray_address, write=False,
            )  # fmt: skip
            found.append(
                {
                    stat_key(m, q): summary[stat_key(m, q)]
                    for m in uncertainty.METRICS
                    for q in QUANTILES
                }
            )
        return found[0], found[1]

    return at_cost


def _here(
    sc: Scenario,
    parts: Iterator[Cut],
    rows: int,
    write_steps: Callable[[pa.Table], None] | None,
    slos: tuple[Slo, ...],
    ordered: bool = False,
) -> Iterator[ShardTables]:
    """Each part replayed in this process, its step rows written as the loop hands them
    out (the timeline never lives whole); its sim_requests rows as tables (neither with
    no ``write_steps``: its totals only)."""
    blocks = sc.engine().get(C_NUM_BLOCKS)

    def on_steps(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        assert write_steps is not None
        write_steps(sim_steps_table(sc.name, st, stf, blocks))

    sink = on_steps if write_steps is not None else None
    for cut in parts:
        shard = replay_cut(sc, cut, on_steps=sink, step_rows=rows)
        ids, labels = (cut.request_ids if sink else None), cut.labels
        del cut
        yield _tables(sc, shard, ids, rows, slos, labels, ordered)


def _tables(
    sc: Scenario,
    shard: Shard,
    ids: pa.Array | None,
    rows: int,
    slos: tuple[Slo, ...],
    labels: Mapping[str, ClassLabels] | None,
    ordered: bool = False,
) -> ShardTables:
    """A part's totals (its good requests under ``slos`` counted) and its sim_requests
    tables (``rows`` rows each; none without its request ``ids``: nothing written)."""
    res = shard.result
    requests = [
        sim_requests_table(sc.name, ids, res, slice(a, a + rows))
        for a in range(0, res.num_requests, rows)
        if ids is not None
    ]
    totals = RequestTotals.of(res, slos, labels, shard.rows if ordered else None)
    return ShardTables(shard.rows, totals, shard.steps, requests)


def _elsewhere(
    sc: Scenario,
    parts: Iterator[Cut],
    rows: int,
    width: int,
    ray_address: str | None,
    slos: tuple[Slo, ...],
    write: bool = True,
    ordered: bool = False,
) -> Iterator[tuple[int, ShardTables]]:
    """Each part replayed in a worker (forked, or a Ray task), as the parts end (in any
    order, with their indices); the first that fails stops the replay with its error."""
    tasks = (ShardTask(sc, cut, rows, slos, write, ordered) for cut in parts)
    # each part's input is made as it is drawn: no more drawn than there are workers
    work = run_tasks(replay_shard, tasks, jobs=width, ray_address=ray_address, ahead=0)
    for k, out in work:
        if isinstance(out, BaseException):
            raise out
        yield k, out
