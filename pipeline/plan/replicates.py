"""Replicates of a capacity probe: the same load again, with other arrivals.

A capacity answer sits where a statistic crosses its limit, usually close to
saturation, where one trace's p99 swings with a burst it happened to hold or
not; a bootstrap of the replayed requests cannot show a burst the trace never
had. So at the answer the load is replayed again, ``REPLICATES`` times, each
time with arrivals the trace could as well have had:

- drawn arrivals (``poisson``, ``gamma``): a new seed per replicate (the
  scenario's seed and the replicate's number, mixed), so new gaps (and, with
  ``num_requests``, new lengths);
- trace arrivals: the trace resampled in windows of consecutive requests (a
  block bootstrap of the trace itself): as many windows as it has, drawn with
  replacement and laid end to end, each keeping its own gaps and the gap that
  followed it. The window is the Politis-White block length of the trace's
  inter-arrival gaps (``intervals.block_length``, on their ranks), so that
  bursts stay whole, held between ``MIN_WINDOWS`` and ``MAX_WINDOWS`` windows
  like the bootstrap's. Then the scenario rescales it as it rescales the trace
  (``rate``, ``time_scale``).

Each replicate is replayed without writing anything (``measure``): only each
SLO's statistic is kept. With ``--shards`` each of these replays runs in parts
(``measure_in_parts``), as the probes do; each part gives back its requests'
metrics, which are put back in the whole replay's order, so that the statistics
and the bootstrap are a whole replay's (exactly so for replica groups under
round robin).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.busiest import WARMUP_COLUMN
from pipeline.errors import ScenarioError
from pipeline.plan.executor import run_tasks
from pipeline.plan.intervals import slo_bootstrap
from pipeline.plan.slo import Slo, evaluate
from pipeline.plan.tasks import METRIC_COLUMNS, sim_metrics, writable
from pipeline.sim import intervals as iv
from pipeline.sim.disagg import simulate_disaggregated
from pipeline.sim.replay_input import Prepared, prepare
from pipeline.sim.scenario import Scenario
from pipeline.sim.shard import Cut, ShardPlan, cuts, replay_cut
from pipeline.sim.simulate import simulate
from pipeline.sim.state import F_FINISH, R_PROMPT
from pipeline.sim.summary import request_metric

REPLICATES = 6  # replicate replays at each capacity answer
SEED_SALT = 0x2E91_1CA7  # mixed into replicate seeds and the trace resampling


def _drop(st: Any, stf: Any) -> None:
    """A step sink that keeps nothing."""


def replicate_seed(seed: int, replicate: int) -> int:
    """The seed of replicate ``replicate`` (1, 2, ...) of a scenario seeded ``seed``."""
    state = np.random.SeedSequence([seed, replicate, SEED_SALT]).generate_state(1)
    return int(state[0] & 0x7FFF_FFFF)


def trace_window(arrival_s: npt.NDArray[np.float64]) -> int:
    """Requests per window for resampling a trace with these (sorted) arrivals."""
    n = len(arrival_s)
    if n < 2:
        return max(n, 1)
    b = iv.block_length(np.diff(arrival_s))
    num = min(max(int(n / max(b, 1.0)), iv.MIN_WINDOWS), iv.MAX_WINDOWS)
    return max(1, -(-n // max(num, 1)))


def resample_trace(frame: pl.DataFrame, window: int, rng: np.random.Generator) -> pl.DataFrame:
    """The requests of ``frame`` (sorted by arrival_s) resampled in windows of ``window``
    consecutive requests, laid end to end (a request drawn twice keeps its id: replicates
    are measured, never written). A busiest window's warm-up rows (leading) stay as they
    are, ahead of the resampled window."""
    if WARMUP_COLUMN in frame.columns:
        lead = int(frame[WARMUP_COLUMN].sum())
        if lead and lead < frame.height:
            body = frame[lead:]
            start = float(body["arrival_s"][0])
            drawn = _resample(body, window, rng)
            return pl.concat([frame[:lead], drawn.with_columns(pl.col("arrival_s") + start)])
    return _resample(frame, window, rng)


def _resample(frame: pl.DataFrame, window: int, rng: np.random.Generator) -> pl.DataFrame:
    t = frame["arrival_s"].to_numpy().astype(np.float64)
    n = len(t)
    starts = np.arange(0, n, window)
    ends = np.minimum(starts + window, n)
    mean_gap = float(t[-1] - t[0]) / max(n - 1, 1)
    # the gap that followed each window (after the last: the mean gap)
    after = np.where(ends < n, t[np.minimum(ends, n - 1)] - t[ends - 1], mean_gap)
    drawn = rng.integers(0, len(starts), size=len(starts))
    rows = np.concatenate([np.arange(starts[k], ends[k]) for k in drawn])
    local = np.concatenate([t[starts[k] : ends[k]] - t[starts[k]] for k in drawn])
    span = np.array([t[ends[k] - 1] - t[starts[k]] + after[k] for k in drawn])
    offset = np.repeat(np.concatenate([[0.0], np.cumsum(span)[:-1]]), ends[drawn] - starts[drawn])
    return frame[rows].with_columns(pl.Series("arrival_s", offset + local))


def replicate(
    frame: pl.DataFrame, sc: Scenario, number: int, window: int | None
) -> tuple[Scenario, Prepared]:
    """Replicate ``number`` (1, 2, ...) of scenario ``sc`` on the requests ``frame``:
    a new seed for drawn arrivals, a resampled trace (``window`` requests per window) for
    trace arrivals."""
    if sc.arrivals.process != "trace":
        other = dataclasses.replace(sc, seed=replicate_seed(sc.seed, number))
        return other, prepare(frame, other)
    rng = np.random.default_rng([sc.seed, number, SEED_SALT])
    resampled = resample_trace(frame, window or trace_window(frame["arrival_s"].to_numpy()), rng)
    return sc, prepare(resampled, sc)


Measured = dict[str, float | None]  # SLO key -> statistic (None: no request completed)
Bootstrap = dict[str, tuple[float, float] | None]  # SLO key -> bootstrap interval


@dataclass(frozen=True)
class Measurement:
    """One replay to measure, nothing written: what a worker process needs."""

    scenario: Scenario
    prepared: Prepared
    slos: tuple[Slo, ...]
    bootstrap: bool = False


def run_measurement(m: Measurement) -> tuple[Measured, Bootstrap]:
    """``measure_with_bootstrap`` of one ``Measurement`` (a task of ``measure_all``)."""
    return measure_with_bootstrap(
        m.scenario, writable(m.prepared), list(m.slos), bootstrap=m.bootstrap
    )


def measure_all(
    measurements: Iterable[Measurement], *, jobs: int = 1, ray_address: str | None = None
) -> list[tuple[Measured, Bootstrap]]:
    """Every measurement's statistics, in order: replayed at once on ``jobs`` local worker
    processes (forked: they inherit the loaded loop) or on the Ray cluster at
    ``ray_address``, each replay independent of the others; ``jobs == 1`` here, one after
    the other. ``measurements`` is drawn lazily, a few ahead of the free workers, so a
    generator keeps only those in flight prepared. The results are the same whichever
    runs them.

    Raises:
        ScenarioError: a replay failed (the first, by position).
    """
    names: list[str] = []

    def drawn() -> Iterator[Measurement]:
        for m in measurements:
            names.append(m.scenario.name)
            yield m

    found: dict[int, tuple[Measured, Bootstrap] | BaseException | None] = {}
    for i, res in run_tasks(run_measurement, drawn(), jobs=max(1, jobs), ray_address=ray_address):
        found[i] = res
    out = []
    for i, name in enumerate(names):
        got = found.get(i)
        if got is None or isinstance(got, BaseException):
            raise ScenarioError(f"interval replay {name} failed: {got}")
        out.append(got)
    return out


@dataclass(frozen=True)
class PartTask:
    """One part of a measurement, to replay in a worker: the scenario and its cut."""

    scenario: Scenario
    cut: Cut


@dataclass(frozen=True)
class PartMetrics:
    """A replayed part's measured requests: their indices in the whole replay, whether
    each completed, its prompt tokens and its metrics (``METRIC_COLUMNS``; NaN where it
    did not complete)."""

    rows: npt.NDArray[np.int64]
    finished: npt.NDArray[np.bool_]
    prompt: npt.NDArray[np.int64]
    metrics: dict[str, npt.NDArray[np.float64]]


def measure_part(task: PartTask) -> PartMetrics:
    """Replay one part of a measurement; nothing is written (a module-level function, so
    a forked worker or Ray can run it)."""
    res = replay_cut(task.scenario, task.cut).result
    return PartMetrics(
        rows=task.cut.rows,
        finished=~np.isnan(res.rqf[:, F_FINISH]),
        prompt=np.asarray(res.rq[:, R_PROMPT], dtype=np.int64),
        metrics={c: request_metric(res, c) for c in METRIC_COLUMNS},
    )


class _Gathered:
    """One measurement's requests as its parts come back, in the whole replay's order."""

    def __init__(self, m: Measurement) -> None:
        self.m = m
        n = len(m.prepared.inp) - m.prepared.num_lead  # the measured requests
        self.finished = np.zeros(n, dtype=np.bool_)
        self.prompt = np.zeros(n, dtype=np.int64)
        self.values = {c: np.full(n, np.nan) for c in METRIC_COLUMNS}
        self.parts = -1  # how many it was cut in (-1: not known until its cuts are drawn)
        self.back = 0  # parts come back

    def add(self, out: PartMetrics) -> None:
        self.finished[out.rows] = out.finished
        self.prompt[out.rows] = out.prompt
        for c in METRIC_COLUMNS:
            self.values[c][out.rows] = out.metrics[c]
        self.back += 1

    @property
    def complete(self) -> bool:
        return self.back == self.parts

    def measured(self) -> tuple[Measured, Bootstrap]:
        """What ``run_measurement`` gives for the whole replay."""
        m, done = self.m, self.finished
        metrics = {c: v[done] for c, v in self.values.items()}
        groups: dict[str, Any] = {"prompt_tokens": self.prompt[done]}
        groups.update({k: np.asarray(v)[done] for k, v in m.prepared.groups.items()})
        slos = list(m.slos)
        measured = evaluate(slos, metrics, 1.0, groups).measured_s
        boot = slo_bootstrap(slos, metrics, groups, m.scenario.seed) if m.bootstrap else {}
        return measured, boot


def measure_all_in_parts(
    measurements: Iterable[Measurement],
    plan_of: Callable[[Scenario], ShardPlan],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
) -> list[tuple[Measured, Bootstrap]]:
    """``measure_all``, each replay in the parts of ``plan_of(its scenario)``: every part
    of every measurement goes to the same workers (``jobs`` forked processes, or the Ray
    cluster at ``ray_address``), drawn as they get free, so that one measurement's last
    parts run beside the next one's first. Each measurement's requests are put back in
    the whole replay's order before its statistics and bootstrap are taken: with replica
    groups (round robin) the figures are the whole replay's; with time windows, as close
    as the parts' replays are to it (``shard.py``). A measurement's arrays are let go as
    soon as its last part is back.

    Raises:
        ScenarioError: a part failed (the first to end so), or its plan cannot cut it.
    """
    gathered: list[_Gathered] = []
    owner: list[int] = []  # part task index -> its measurement
    found: dict[int, tuple[Measured, Bootstrap]] = {}

    def settle(i: int) -> None:
        if gathered[i].complete and i not in found:
            found[i] = gathered[i].measured()
            gathered[i].values.clear()

    def parts() -> Iterator[PartTask]:
        for m in measurements:
            i = len(gathered)
            gathered.append(_Gathered(m))
            count = 0
            for cut in cuts(m.prepared.inp, m.scenario, plan_of(m.scenario)):
                owner.append(i)
                count += 1
                yield PartTask(m.scenario, cut)
            gathered[i].parts = count
            settle(i)

    # each part's input is made as it is drawn: no more drawn than there are workers
    work = run_tasks(measure_part, parts(), jobs=jobs, ray_address=ray_address, ahead=0)
    for k, out in work:
        i = owner[k]
        if isinstance(out, BaseException):
            name = gathered[i].m.scenario.name
            raise ScenarioError(f"interval replay {name} failed in a part: {out}")
        gathered[i].add(out)
        settle(i)
    return [found[i] for i in range(len(gathered))]


def measure_in_parts(
    m: Measurement, plan: ShardPlan, *, jobs: int = 1, ray_address: str | None = None
) -> tuple[Measured, Bootstrap]:
    """``run_measurement`` of ``m`` replayed in the parts of ``plan``
    (``measure_all_in_parts`` of one)."""
    return measure_all_in_parts([m], lambda _: plan, jobs=jobs, ray_address=ray_address)[0]


def measure(sc: Scenario, prep: Prepared, slos: list[Slo]) -> dict[str, float | None]:
    """Each SLO's statistic of one replay of ``prep`` under ``sc``; nothing is written."""
    return measure_with_bootstrap(sc, prep, slos, bootstrap=False)[0]


def measure_with_bootstrap(
    sc: Scenario, prep: Prepared, slos: list[Slo], *, bootstrap: bool = True
) -> tuple[dict[str, float | None], dict[str, tuple[float, float] | None]]:
    """``measure``, and the block bootstrap interval of each statistic over the replay's
    own requests (seeded by the scenario's seed)."""
    if sc.disagg is not None:  # prefill workers, KV link, decode workers (sim/disagg.py)
        res = simulate_disaggregated(prep.inp, sc).result
    else:
        res = simulate(prep.inp, sc.engine(), on_steps=_drop)
    metrics, groups = sim_metrics(res, prep.groups)
    measured = evaluate(slos, metrics, 1.0, groups).measured_s
    return measured, slo_bootstrap(slos, metrics, groups, sc.seed) if bootstrap else {}
