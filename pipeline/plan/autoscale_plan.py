"""Autoscaled against fixed: what an autoscaler saves over the fixed pool that meets the SLOs.

For a scenario with an ``[autoscale]`` table (``sim/autoscale.py``), capacity
answers two questions over one set of requests:

- the fewest FIXED replicas that meet every SLO: the scenario without its
  autoscale table, searched like any other (``capacity.run_capacity``, the
  replicas search), and the GPU-hours that count pays over the replayed span;
- the autoscaled scenario replayed once with the same SLOs, at the same rate:
  its GPU-hours (start to drain, ``autoscale.autoscale_summary``), whether it
  meets each SLO, and the requests that arrived while replicas were starting
  and how many of those were over each limit (``autoscale.scale_up_misses``).

The span is the autoscaled replay's: replay time 0 to its last finish (its
``end_s``); the fixed count is paid for the whole of it. Both replays are
written under the capacity run's id, and the comparison goes into its runs
row's details (``autoscale``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, ScenarioError
from pipeline.plan.capacity import CapacityResult, SearchOutcome, SearchSpec, run_capacity
from pipeline.plan.prober import ProbeContext
from pipeline.plan.slo import Slo, format_seconds
from pipeline.plan.tasks import ScenarioTask, TaskOutcome, run_task, write_tables
from pipeline.selection import RequestFilter
from pipeline.sim.autoscale import KEY
from pipeline.sim.replay_input import prepare
from pipeline.sim.scenario import build_scenario

AUTOSCALED_SUFFIX = "autoscaled"  # the autoscaled replay's scenario: <base name>-autoscaled


@dataclass
class AutoscaleComparison:
    """The fixed count that meets every SLO beside the autoscaled replay."""

    scenario: str  # the autoscaled replay's scenario name
    gpus_per_replica: int
    span_s: float  # the autoscaled replay's span (0 to its last finish)
    fixed_replicas: int | None  # None: no count in the search's range meets every SLO
    autoscale: dict[str, Any]  # the replay summary's autoscale entry
    slo: dict[str, dict[str, Any]]  # SLO key -> limit_s, measured_s, met (autoscaled)
    fixed_slo: dict[str, dict[str, Any]] | None = None  # ... at the fixed answer

    @property
    def gpu_hours(self) -> float:
        return float(self.autoscale["gpu_hours"])

    @property
    def fixed_gpu_hours(self) -> float | None:
        """The fixed count paid over the autoscaled replay's span."""
        if self.fixed_replicas is None:
            return None
        return self.fixed_replicas * self.gpus_per_replica * self.span_s / 3600

    @property
    def all_met(self) -> bool:
        return all(v["met"] for v in self.slo.values())

    @property
    def saved_share(self) -> float | None:
        """1 - autoscaled / fixed GPU-hours (negative: the autoscaler costs more)."""
        fixed = self.fixed_gpu_hours
        return 1 - self.gpu_hours / fixed if fixed else None

    @property
    def during_scale_ups(self) -> dict[str, Any]:
        out: dict[str, Any] = self.autoscale.get("during_scale_ups") or {}
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the runs row's ``autoscale`` details and ``capacity --json``."""
        a = self.autoscale
        return {
            "scenario": self.scenario,
            "fixed_replicas": self.fixed_replicas,
            "fixed_gpu_hours": self.fixed_gpu_hours,
            "fixed_slo": self.fixed_slo,
            "span_s": self.span_s,
            "gpus_per_replica": self.gpus_per_replica,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_at_max": a["gpu_hours_at_max"],
            "saved_vs_fixed_share": self.saved_share,
            "mean_active": a["mean_active"],
            "peak_active": a["peak_active"],
            "scale_ups": a["scale_ups"],
            "scale_downs": a["scale_downs"],
            "startup_s": a.get("startup_s"),
            "slo": self.slo,
            "slo_met": self.all_met,
            "during_scale_ups": self.during_scale_ups,
        }


def fixed_values(values: dict[str, Any]) -> dict[str, Any]:
    """The scenario's keys without its autoscale table: the fixed pool capacity searches."""
    return {k: v for k, v in values.items() if k != KEY}


def _slo_entry(out: TaskOutcome, slos: list[Slo]) -> dict[str, dict[str, Any]]:
    assert out.slo is not None
    return {
        s.key: {
            "limit_s": s.limit_s,
            "measured_s": out.slo.measured_s[s.key],
            "met": out.slo.met[s.key],
        }
        for s in slos
    }


def autoscaled_replay(
    ctx: ProbeContext, values: dict[str, Any], rate: float | None, name: str | None = None
) -> TaskOutcome:
    """Replay the autoscaled scenario once with the run's SLOs (at ``rate`` when the
    replicas search ran at one), written with the run's probes, named ``name``
    [default: ``<base name>-autoscaled``].

    Raises:
        ScenarioError: the replay failed.
    """
    run_values = {**values, "name": name or f"{ctx.base_name}-{AUTOSCALED_SUFFIX}"}
    if rate is not None:
        run_values.pop("time_scale", None)
        run_values["rate"] = rate
    sc = build_scenario(run_values, where="autoscaled scenario")
    ctx.bar.describe(f"capacity: the autoscaled replay ({sc.name})")
    write = not ctx.summary_only
    task = ScenarioTask(
        len(ctx.outcomes), sc, prepare(ctx.frame, sc), tuple(ctx.slos), ctx.run_id, tables=write
    )
    out = run_task(task)
    if out.error is not None or out.slo is None or out.run is None:
        raise ScenarioError(f"the autoscaled replay {sc.name} failed: {out.error}")
    if write:
        write_tables(ctx.warehouse, ctx.run_id, out, out.tables)
    out.tables = {}
    ctx.outcomes.append(out)
    ctx.bar.advance(1)
    return out


def compare(fixed: SearchOutcome | None, auto: TaskOutcome, slos: list[Slo]) -> AutoscaleComparison:
    """The comparison from the fixed replicas search and the autoscaled replay."""
    assert auto.run is not None
    summary = auto.run.summary
    entry = summary.get("autoscale")
    if not entry:
        raise ScenarioError(f"the replay {auto.name} has no autoscale summary")
    at = fixed.answer_probe if fixed is not None else None
    answer = fixed.answer if fixed is not None else None
    return AutoscaleComparison(
        scenario=auto.name,
        gpus_per_replica=int(entry["gpus_per_replica"]),
        span_s=float(entry["end_s"]),
        fixed_replicas=int(answer) if answer is not None else None,
        autoscale=entry,
        slo=_slo_entry(auto, slos),
        fixed_slo=_slo_entry(at, slos) if at is not None else None,
    )


def run_autoscale_capacity(
    warehouse: Path,
    values: dict[str, Any],
    slos: list[Slo],
    spec: SearchSpec | None = None,
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    summary_only: bool = False,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    intervals: bool = True,
    jobs: int | None = None,
    ray_address: str | None = None,
) -> tuple[CapacityResult, AutoscaleComparison]:
    """Autoscaled against fixed for a scenario with an autoscale table (module docstring).

    ``spec``: the fixed replicas search (default: 1 to 64 replicas at the scenario's
    rate); the rest as ``run_capacity``. The result's searches are the fixed one; its
    ``extra["autoscale"]`` (and the runs row's details) the comparison.

    Raises:
        ConfigError: no autoscale table, a fleet, a search other than replicas, and what
            ``run_capacity`` raises.
    """
    if not values.get(KEY):
        raise ConfigError("the scenario has no [autoscale] table: use run_capacity")
    if values.get("pool"):
        raise ConfigError(
            "an autoscaled fleet's pools are searched by plan.fleet.run_fleet_capacity"
        )
    spec = spec or SearchSpec("replicas")
    if spec.kind != "replicas":
        raise ConfigError(
            f"an autoscaled scenario is compared with the fewest fixed replicas: the {spec.kind} "
            "search does not apply (give --search replicas, or drop the autoscale table)"
        )
    build_scenario(values, where="autoscaled scenario")  # its errors before any probe
    found: list[AutoscaleComparison] = []

    def step(ctx: ProbeContext, result: CapacityResult) -> dict[str, Any]:
        search = result.searches[0] if result.searches else None
        rate = search.spec.rate if search is not None else spec.rate
        auto = autoscaled_replay(ctx, values, rate)
        found.append(compare(search, auto, slos))
        return {"autoscale": found[0].to_dict()}

    result = run_capacity(
        warehouse,
        fixed_values(values),
        slos,
        [dataclasses.replace(spec)],
        requests_file=requests_file,
        date_from=date_from,
        date_to=date_to,
        summary_only=summary_only,
        quiet=quiet,
        run_id=run_id,
        selection=selection,
        intervals=intervals,
        extra=step,
        jobs=jobs,
        ray_address=ray_address,
    )
    return result, found[0]


def _secs(v: float | None) -> str:
    return format_seconds(float(f"{v:.4g}")) if v is not None else "-"


def format_comparison(cmp: AutoscaleComparison) -> list[str]:
    """Text lines: fixed against autoscaled GPU-hours, the SLOs, the scale-up misses."""
    a = cmp.autoscale
    span_h = cmp.span_s / 3600
    lines = [f"autoscaled vs fixed over the replayed span ({span_h:,.2f} h):"]
    if cmp.fixed_replicas is None:
        lines.append("  fixed: no replica count in the search's range meets every SLO")
    else:
        lines.append(
            f"  fixed: {cmp.fixed_replicas} replica(s) meet every SLO: "
            f"{cmp.fixed_gpu_hours:,.2f} GPU-hours"
        )
    saved = cmp.saved_share
    vs = ""
    if saved is not None:
        vs = f", saves {saved:.0%}" if saved >= 0 else f", costs {-saved:.0%} more"
    lines.append(
        f"  autoscaled ({cmp.scenario}): {cmp.gpu_hours:,.2f} GPU-hours{vs} "
        f"(at max_replicas the whole span: {a['gpu_hours_at_max']:,.2f}); active mean "
        f"{a['mean_active']:.2f}, peak {a['peak_active']}; {a['scale_ups']} scale-up(s), "
        f"{a['scale_downs']} scale-down(s)"
    )
    cells = [
        f"{k} {_secs(v['measured_s'])} "
        f"against {format_seconds(v['limit_s'])} {'met' if v['met'] else 'MISSED'}"
        for k, v in cmp.slo.items()
    ]
    lines.append("  autoscaled SLOs: " + ", ".join(cells))
    d = cmp.during_scale_ups
    if d:
        over = ", ".join(f"{k} {n:,}" for k, n in (d.get("over_limit") or {}).items())
        lines.append(
            f"  during scale-ups: {d['num_requests']:,} request(s) arrived while replicas were "
            f"starting, {d['completed']:,} completed; over the limit: {over or 'none'}"
        )
    return lines
