"""One scenario as a unit of work: run it in any process, write what it produced.

Sweeps and capacity searches replay many scenarios over one set of requests.
The requests are read and prepared once, in the calling process (``prepare``
checks each scenario against them); a ``ScenarioTask`` then carries one
scenario and its prepared requests to wherever it runs, and ``run_task``
returns its summary, its SLO verdicts and either the paths it wrote (when the
worker can reach the warehouse) or its tables (for the caller to write, as
with Ray). ``run_task`` never raises: an error comes back as text.

Runs are recorded like ``replay`` runs: ``sim_requests`` and ``sim_steps`` per
scenario, one ``scenarios`` file per run, and a ``runs`` row naming the command.
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.contracts import SCENARIOS, SIM_REQUESTS, SIM_STEPS
from pipeline.errors import PipelineError
from pipeline.plan.slo import Slo, SloReport, evaluate
from pipeline.sim.classes import slo_fields
from pipeline.sim.replay import (
    ScenarioRun,
    run_prepared,
    run_sharded_prepared,
    scenarios_table,
    summarize_prepared,
)
from pipeline.sim.replay_input import Prepared
from pipeline.sim.scenario import Scenario
from pipeline.sim.shard import ShardPlan
from pipeline.sim.state import F_FINISH, R_PROMPT, SimResult
from pipeline.sim.summary import request_metric
from pipeline.warehouse import Warehouse

METRIC_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


@dataclass(frozen=True)
class ScenarioTask:
    """Everything one worker needs to replay one scenario."""

    index: int  # position in the sweep or search
    scenario: Scenario
    prepared: Prepared
    slos: tuple[Slo, ...] = ()
    run_id: str = ""
    warehouse: Path | None = None  # write here; None: return the tables instead
    tables: bool = True  # False: the summary and SLO verdicts only, no sim tables built


@dataclass
class TaskOutcome:
    """What one task produced (``error`` set when it failed)."""

    index: int
    name: str
    run: ScenarioRun | None = None
    slo: SloReport | None = None
    offered_rate: float | None = None  # requests / last arrival (req/s)
    tables: dict[str, pa.Table] = field(default_factory=dict)  # when not written
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def request_metrics(table: pa.Table) -> dict[str, npt.NDArray[np.float64]]:
    """Per-request ttft_s, tpot_s (NaN for one token), e2e_s, queue_s of completed requests."""
    done = ~np.isnan(table.column("finished_s").to_numpy(zero_copy_only=False))
    return {
        c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)[done]
        for c in METRIC_COLUMNS
    }


def request_groups(table: pa.Table, groups: dict[str, Any]) -> dict[str, Any]:
    """Per completed request: prompt_tokens, and the tenant and model of ``groups`` (aligned
    with the table's rows), for SLOs with a scope."""
    done = ~np.isnan(table.column("finished_s").to_numpy(zero_copy_only=False))
    out = {"prompt_tokens": table.column("prompt_tokens").to_numpy(zero_copy_only=False)[done]}
    out.update({k: np.asarray(v)[done] for k, v in groups.items()})
    return out


def sim_metrics(
    res: SimResult, groups: dict[str, Any]
) -> tuple[dict[str, npt.NDArray[np.float64]], dict[str, Any]]:
    """``request_metrics`` and ``request_groups`` of a replay's result, without its table."""
    done = ~np.isnan(res.rqf[:, F_FINISH])
    metrics = {c: request_metric(res, c)[done] for c in METRIC_COLUMNS}
    out: dict[str, Any] = {"prompt_tokens": res.rq[done, R_PROMPT]}
    out.update({k: np.asarray(v)[done] for k, v in groups.items()})
    return metrics, out


def offered_rate(arrival_s: npt.NDArray[np.float64]) -> float | None:
    """Requests per second offered: N over the last arrival (the convention of ``rate``)."""
    span = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
    return len(arrival_s) / span if span > 0 else None


def _has_readonly_array(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return not obj.flags.writeable
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(_has_readonly_array(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return False


def writable(prep: Prepared) -> Prepared:
    """``prep`` with writable arrays: a copy if any array of its input is read-only.

    # NOTE: Ray hands numpy arrays out of its object store read-only, and numba
    # compiles (and caches) a separate specialization of the loop for read-only
    # arrays: minutes on a cold cache in every Ray worker. A copy costs far less.
    """
    if not _has_readonly_array(prep.inp):
        return prep
    return dataclasses.replace(prep, inp=copy.deepcopy(prep.inp))


def run_task(task: ScenarioTask) -> TaskOutcome:
    """Replay one scenario; write its sim tables (or return them). Never raises."""
    name = task.scenario.name
    try:
        tables: dict[str, pa.Table] = {}
        if task.tables:
            run, requests, steps = run_prepared(task.scenario, writable(task.prepared), task.slos)
            tables = {SIM_REQUESTS.name: requests, SIM_STEPS.name: steps}
        else:
            run, res = summarize_prepared(task.scenario, writable(task.prepared), task.slos)
        report = None
        if task.slos:
            if task.tables:
                metrics = request_metrics(requests)
                groups = request_groups(requests, task.prepared.groups)
            else:
                metrics, groups = sim_metrics(res, task.prepared.groups)
            duration_s = run.summary["duration_s"] or 0.0
            report = evaluate(list(task.slos), metrics, duration_s, groups)
            # (the fields a replay's summary has)
            run.summary.update(
                slo_fields(task.slos, report.measured_s, report.num_good, duration_s)
            )
        outcome = TaskOutcome(
            index=task.index,
            name=name,
            run=run,
            slo=report,
            offered_rate=offered_rate(task.prepared.inp.arrival_s[task.prepared.num_lead :]),
        )
        if task.warehouse is None:
            outcome.tables = tables
        elif tables:
            write_tables(Warehouse(task.warehouse), task.run_id, outcome, tables)
        return outcome
    except PipelineError as exc:
        return TaskOutcome(index=task.index, name=name, error=str(exc))
    except Exception as exc:  # a bug, but one scenario must not lose the others
        tb = traceback.format_exc(limit=-3).strip().splitlines()
        where = next((line.strip() for line in reversed(tb) if line.strip().startswith("File")), "")
        return TaskOutcome(
            index=task.index, name=name, error=f"{type(exc).__name__}: {exc} ({where})"
        )


def write_tables(
    wh: Warehouse, run_id: str, outcome: TaskOutcome, tables: dict[str, pa.Table]
) -> None:
    """Write one scenario's sim_requests and sim_steps under ``run_id``."""
    assert outcome.run is not None
    part = {"run_id": run_id}
    for contract in (SIM_REQUESTS, SIM_STEPS):
        outcome.run.paths[contract.name] = wh.write(
            contract, tables[contract.name], part, outcome.name
        )


def write_scenarios(wh: Warehouse, run_id: str, runs: list[ScenarioRun]) -> Path | None:
    """The run's scenarios file (every scenario's configuration and summary)."""
    if not runs:
        return None
    return wh.write(SCENARIOS, scenarios_table(runs), {"run_id": run_id}, "scenarios")


def run_in_parts(
    wh: Warehouse,
    run_id: str,
    index: int,
    sc: Scenario,
    prep: Prepared,
    plan: ShardPlan,
    slos: list[Slo],
    jobs: int,
    ray_address: str | None,
    *,
    write: bool = True,
) -> TaskOutcome:
    """One scenario replayed in the parts of ``plan`` (``replay --shards``: ``jobs`` parts
    at once, or on the Ray cluster) and written, its files as the parts end (``write``
    False: nothing written), as a task's outcome with its SLO report; a failure comes back
    as its error, as a task's does. Sweeps and capacity probes with ``--shards`` run so."""
    try:
        run = run_sharded_prepared(
            wh, run_id, sc, prep, plan, quiet=True, jobs=jobs, slos=slos,
            ray_address=ray_address, write=write,
        )  # fmt: skip
    except PipelineError as exc:
        return TaskOutcome(index=index, name=sc.name, error=str(exc))
    s = run.summary
    report = None
    if slos:
        report = SloReport(
            measured_s={k: e["measured_s"] for k, e in s["slo"].items()},
            met={k: e["met"] for k, e in s["slo"].items()},
            num_good=s["num_good"],
            goodput=s["goodput"],
        )
    rate = offered_rate(prep.inp.arrival_s[prep.num_lead :])
    return TaskOutcome(index=index, name=sc.name, run=run, slo=report, offered_rate=rate)
