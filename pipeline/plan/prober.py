"""The probes of one capacity search: each knob value replayed once, whoever asks.

The bisection asks for verdicts; the interval's searches (``intervals.py``) ask
for the statistics of the same values and of a few more. A ``Prober`` replays
each value once, writes it like a sweep's scenario, and remembers it, so the
interval's searches pay only for the values the bisection never needed. Probes
the bisection asked for are ``search`` probes (written with their sim tables
unless the run is summary only); those only the interval needed are
``interval`` probes (their summary and search rows only).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline.errors import ScenarioError
from pipeline.plan import intervals as civ
from pipeline.plan import replicates
from pipeline.plan.slo import Slo
from pipeline.plan.tasks import ScenarioTask, TaskOutcome, run_in_parts, run_task, write_tables
from pipeline.sim.cost_uncertainty import cost_factors, scaled_cost
from pipeline.sim.intervals import Z
from pipeline.sim.replay_input import Prepared, prepare
from pipeline.sim.replay_sharded import plan_sharding
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.warehouse import Warehouse

if TYPE_CHECKING:
    from pipeline.plan.capacity import SearchSpec


def fmt_value(x: float) -> str:
    """A knob value for messages and scenario names: 64, 5.532 (never an exponent)."""
    return str(int(x)) if x == int(x) else f"{x:.6f}".rstrip("0").rstrip(".")


def probe_values(
    base: dict[str, Any], name: str, spec: SearchSpec, knob: str, value: float
) -> dict[str, Any]:
    """The scenario keys of the probe at ``value`` of search ``spec``."""
    values = {**base, "name": f"{name}-{spec.kind}-{fmt_value(value)}"}
    rate = value if spec.kind == "rate" else spec.rate
    if rate is not None:
        values.pop("time_scale", None)
        values["rate"] = rate
    if spec.kind != "rate":
        values[knob] = int(value)
    return values


@dataclass
class ProbeContext:
    """What every probe of a capacity run shares."""

    frame: pl.DataFrame  # the requests, read once
    base_values: dict[str, Any]
    base_name: str
    slos: list[Slo]
    run_id: str
    warehouse: Warehouse
    summary_only: bool
    outcomes: list[TaskOutcome]  # every probe of the run, in order (its scenarios)
    bar: Any  # the progress bar
    trace_window: int | None = None  # requests per window when replicates resample the trace
    # the knob leaves the requests' preparation alone (replicas): prepare them once
    prepare_once: bool = False
    # where the interval's independent replays run (``replicates.measure_all``): local
    # worker processes, or the Ray cluster at ``ray_address``
    jobs: int = 1
    ray_address: str | None = None
    # each probe replayed in this many parts (``replay --shards``), its tables written by
    # the parts as they end; ``shard_warmup_s``: cut by time after this much traffic
    shards: int | None = None
    shard_warmup_s: float | None = None


@dataclass
class Prober:
    """The probes of one search (see the module docstring)."""

    ctx: ProbeContext
    spec: SearchSpec
    knob: str
    done: dict[float, TaskOutcome] = field(default_factory=dict)
    role: dict[float, str] = field(default_factory=dict)  # "search" | "interval"
    _prep: Prepared | None = None  # with ctx.prepare_once: the requests, prepared once

    def prepared(self, sc: Scenario) -> Prepared:
        """The requests prepared for ``sc`` (once per search where the knob allows)."""
        if not self.ctx.prepare_once:
            return prepare(self.ctx.frame, sc)
        if self._prep is None:
            self._prep = prepare(self.ctx.frame, sc)
        return self._prep

    def scenario(self, value: float) -> Scenario:
        c = self.ctx
        values = probe_values(c.base_values, c.base_name, self.spec, self.knob, value)
        return build_scenario(values, where=f"{self.spec.kind} probe {value}")

    def outcome(self, value: float, role: str = "search") -> TaskOutcome:
        """The replay at ``value`` (run now if it never ran)."""
        if value in self.done:
            return self.done[value]
        c = self.ctx
        sc = self.scenario(value)
        c.bar.describe(f"capacity search: {self.spec.kind} {self.knob}={fmt_value(value)}")
        # a probe only the interval needed is summarized, not written: no tables to build
        write = role == "search" and not c.summary_only
        if c.shards is not None:  # its parts write their tables as they end, if at all
            plan = plan_sharding(sc, c.shards, c.shard_warmup_s)
            prep = self.prepared(sc)
            out = run_in_parts(
                c.warehouse, c.run_id, len(c.outcomes), sc, prep, plan, c.slos, c.jobs,
                c.ray_address, write=write,
            )  # fmt: skip
            write = False
        else:
            task = ScenarioTask(
                len(c.outcomes), sc, self.prepared(sc), tuple(c.slos), c.run_id, tables=write
            )
            out = run_task(task)
        if out.error is not None or out.slo is None:
            raise ScenarioError(f"probe {sc.name} failed: {out.error}")
        if write:
            write_tables(c.warehouse, c.run_id, out, out.tables)
        out.tables = {}
        c.outcomes.append(out)
        c.bar.advance(1)
        self.done[value] = out
        self.role[value] = role
        return out

    def verdict(self, value: float) -> bool:
        """Every SLO met at ``value`` (the bisection's question)."""
        report = self.outcome(value).slo
        assert report is not None
        return report.all_met

    def measured(self, value: float) -> dict[str, float | None]:
        """Each SLO's statistic at ``value`` (the interval's question)."""
        report = self.outcome(value, "interval").slo
        assert report is not None
        return report.measured_s

    @property
    def interval_probes(self) -> list[tuple[float, TaskOutcome]]:
        """The probes only the interval needed, in the order they ran."""
        return [(v, o) for v, o in self.done.items() if self.role[v] == "interval"]

    def _at_cost(self, value: float, prep: Prepared | None = None) -> list[replicates.Measurement]:
        """The replays of ``value`` at the low and the high step cost of the profile term
        (none when its sd is 0)."""
        sc = self.scenario(value)
        unc = sc.cost_uncertainty
        if unc.log_sd <= 0:
            return []
        prep = prep or self.prepared(sc)
        return [
            replicates.Measurement(
                dataclasses.replace(sc, cost=scaled_cost(sc.cost, factor)),
                prep,
                tuple(self.ctx.slos),
            )
            for factor in cost_factors(unc.log_sd, Z)
        ]

    def _measure_all(self, ms: list[replicates.Measurement]) -> list[replicates.Measured]:
        return [m for m, _ in self._measure(ms)]

    def _measure(
        self, ms: Iterable[replicates.Measurement]
    ) -> list[tuple[replicates.Measured, replicates.Bootstrap]]:
        """Each measurement's statistics, in order: replayed whole, several at once on the
        workers; or, with ``shards``, each in parts (as the probes are), the parts of all
        of them on the workers."""
        c = self.ctx
        if c.shards is None:
            return replicates.measure_all(ms, jobs=c.jobs, ray_address=c.ray_address)
        shards, warmup = c.shards, c.shard_warmup_s
        return replicates.measure_all_in_parts(
            ms,
            lambda sc: plan_sharding(sc, shards, warmup),
            jobs=c.jobs,
            ray_address=c.ray_address,
        )

    def _profile_terms(self, values: list[float]) -> dict[float, dict[str, tuple[float, float]]]:
        """The profile term at each of ``values``: their cost-scaled replays run at once."""
        at_cost = [self._at_cost(v) for v in values]
        flat = self._measure_all([m for ms in at_cost for m in ms])
        out, k = {}, 0
        for v, ms in zip(values, at_cost, strict=True):
            main, mine = self.measured(v), flat[k : k + len(ms)]
            k += len(ms)
            out[v] = {
                s.key: civ.profile_halfwidths(main[s.key], [a[s.key] for a in mine])
                for s in self.ctx.slos
            }
        return out

    def answer_interval(
        self, answer: float, knob: civ.Knob, num_replicates: int = replicates.REPLICATES
    ) -> civ.AnswerInterval:
        """The interval of ``answer`` (``intervals.py``): replicates and the profile term at
        the answer, then the ends, over this search's probes (``knob``: its range); the
        profile term measured again at each end found, and the ends found again."""
        c, slos = self.ctx, self.ctx.slos
        sc = self.scenario(answer)
        prep = self.prepared(sc)
        c.bar.describe(f"capacity search: {self.spec.kind} interval at {fmt_value(answer)}")
        # the answer's own replay (for its bootstrap), its replicates and its cost-scaled
        # replays are independent: one batch, in parallel where jobs allow
        # (a generator: each replicate's requests are prepared as a worker gets free)
        batch = itertools.chain(
            [replicates.Measurement(sc, prep, tuple(slos), bootstrap=True)],
            (
                replicates.Measurement(
                    *replicates.replicate(c.frame, sc, r, c.trace_window), tuple(slos)
                )
                for r in range(1, num_replicates + 1)
            ),
            self._at_cost(answer, prep),
        )
        found = self._measure(batch)
        main, bootstrap = found[0]
        reps = [m for m, _ in found[1 : num_replicates + 1]]
        at_cost = [m for m, _ in found[num_replicates + 1 :]]
        model = civ.SpreadModel(
            arrivals={
                s.key: civ.arrivals_halfwidth(
                    main[s.key], [r[s.key] for r in reps], bootstrap.get(s.key)
                )
                for s in slos
            },
            profile={
                answer: {
                    s.key: civ.profile_halfwidths(main[s.key], [a[s.key] for a in at_cost])
                    for s in slos
                }
            },
        )

        def probe(v: float) -> civ.Probe:
            return self.measured(v), model.at(v)

        ends = civ.answer_ends(self.spec.kind, answer, probe, lambda: list(self.done), knob, slos)
        if sc.cost_uncertainty.log_sd > 0:  # the profile term where the ends are, then again
            model.profile.update(
                self._profile_terms(sorted({e for e in ends if e is not None and e != answer}))
            )
            ends = civ.answer_ends(
                self.spec.kind, answer, probe, lambda: list(self.done), knob, slos
            )
        met = {v: self.verdict(v) for v in self.done}
        if sc.arrivals.process == "trace":
            how = f"the trace resampled in windows of {c.trace_window or 1:,} requests"
        else:
            how = f"new {sc.arrivals.process} arrivals (other seeds)"
        return civ.AnswerInterval(
            lo=ends[0],
            hi=ends[1],
            safe=civ.pessimistic(probe(answer), slos),
            model=model,
            spread_at=model.at,
            replicates={s.key: [r[s.key] for r in reps] for s in slos},
            at_cost={s.key: [a[s.key] for a in at_cost] for s in slos},
            uncertainty=sc.cost_uncertainty,
            arrivals=how,
            reversals=civ.reversals(self.spec.kind, {v: probe(v) for v in self.done}, met, slos),
        )


__all__ = ["ProbeContext", "Prober", "fmt_value", "probe_values"]
