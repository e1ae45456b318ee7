"""``tracereplay capacity``: SLO searches for the highest cap and rate, the fewest replicas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from pipeline.cli import options as opt
from pipeline.cli.replay import replay_command
from pipeline.cli.sweep import number, render_table, seconds
from pipeline.config import load_config, warehouse_path
from pipeline.plan.capacity import (
    SEARCHES,
    CapacityResult,
    SearchOutcome,
    SearchSpec,
    load_capacity_file,
    run_capacity,
)
from pipeline.plan.slo import Slo, parse_slos
from pipeline.pricing import deployment_cost, format_cost, gpu_prices
from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import read_scenario_file


def _value(search: SearchOutcome, x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x:,.3g} req/s" if search.spec.kind == "rate" else f"{int(x):,}"


def answer_cost(search: SearchOutcome, prices: dict[str, float]) -> dict[str, Any] | None:
    """The deployment's cost at the search's answer (None: no answer or no price)."""
    at = search.answer_probe
    if at is None or at.run is None:
        return None
    sc = at.run.scenario
    return deployment_cost(prices, sc.profile, sc.replicas, at.run.summary)


def format_search(
    search: SearchOutcome,
    slos: list[Slo],
    base_rate: float | None,
    prices: dict[str, float] | None = None,
) -> str:
    kind = search.spec.kind
    rate = search.spec.rate or base_rate
    head = {
        "concurrency": f"highest {search.knob} that meets every SLO at {number(rate)} req/s",
        "rate": f"highest request rate that meets every SLO (within {search.spec.tolerance:.0%})",
        "replicas": f"fewest replicas that meet every SLO at {number(rate)} req/s",
    }[kind]
    lines = [f"{kind}: {head}: {_value(search, search.answer)}"]
    at = search.answer_probe
    if at is not None and at.run is not None and at.slo is not None:
        s = at.run.summary
        lines.append(
            f"  there: {number(s['request_throughput'])} req/s, "
            f"{number(s['output_token_throughput'], 0)} output tok/s, "
            f"goodput {number(at.slo.goodput)} req/s ({at.name})"
        )
        cost = format_cost(answer_cost(search, prices or {}))
        if cost:
            lines.append(f"  {cost}")
    if search.note:
        lines.append(f"  note: {search.note}")
    headers = ["probe", search.knob, *[s.key for s in slos], "met", "req/s", "goodput", "preempt"]
    rows = []
    for i, ((value, met), out) in enumerate(zip(search.result.probes, search.probes, strict=True)):
        assert out.run is not None and out.slo is not None
        cell = f"{value:,.4g}" if kind == "rate" else f"{int(value):,}"
        rows.append(
            [
                str(i),
                cell + (" *" if value == search.answer else ""),
                *[seconds(out.slo.measured_s[s.key]) for s in slos],
                "yes" if met else "no",
                number(out.run.summary["request_throughput"]),
                number(out.slo.goodput),
                f"{out.run.summary['num_preemptions']:,}",
            ]
        )
    table = render_table(headers, rows)
    lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def format_capacity(result: CapacityResult, prices: dict[str, float] | None = None) -> str:
    b = result.base
    out = [
        f"base {b.name} ({b.policy}, {b.profile}, {b.replicas} replica(s)): "
        f"{result.num_requests_read:,} requests offered at {number(result.base_rate)} req/s",
        "SLOs: " + ", ".join(str(s) for s in result.slos),
    ]
    out += [format_search(s, result.slos, result.base_rate, prices) for s in result.searches]
    return "\n".join(out)


def result_dict(
    result: CapacityResult, warehouse: Path, prices: dict[str, float] | None = None
) -> dict[str, Any]:
    def probe(value: float, met: bool, o: Any) -> dict[str, Any]:
        return {
            "value": value,
            "met": met,
            "scenario": o.name,
            "slo": o.slo.to_dict(),
            "summary": o.run.summary,
        }

    return {
        "run_id": result.run_id,
        "warehouse": str(warehouse),
        "base": result.base.to_dict(),
        "base_rate": result.base_rate,
        "num_requests_read": result.num_requests_read,
        "slos": [str(s) for s in result.slos],
        "num_replays": result.num_replays,
        "wall_s": result.wall_s,
        "searches": {
            s.spec.kind: {
                "knob": s.knob,
                "range": [s.lo, s.hi],
                "rate": s.spec.rate or (result.base_rate if s.spec.kind != "rate" else None),
                "answer": s.answer,
                "cost": answer_cost(s, prices or {}),
                "monotone": s.result.monotone,
                "note": s.note,
                "probes": [
                    probe(v, m, o) for (v, m), o in zip(s.result.probes, s.probes, strict=True)
                ],
            }
            for s in result.searches
        },
    }


def _specs(
    file_specs: list[SearchSpec],
    kinds: tuple[str, ...],
    target_rate: float | None,
    max_concurrency: int | None,
    max_replicas: int | None,
) -> list[SearchSpec]:
    by_kind = {s.kind: s for s in file_specs}
    chosen = [by_kind.get(k, SearchSpec(k)) for k in kinds] if kinds else file_specs
    out = []
    for spec in chosen:
        if spec.kind == "concurrency" and max_concurrency is not None:
            spec = dataclasses.replace(spec, hi=float(max_concurrency))
        if spec.kind == "replicas":
            if max_replicas is not None:
                spec = dataclasses.replace(spec, hi=float(max_replicas))
            if target_rate is not None:
                spec = dataclasses.replace(spec, rate=target_rate)
        out.append(spec)
    return out


@click.command(name="capacity")
@click.argument(
    "capacity_file", required=False, type=click.Path(dir_okay=False, exists=True, path_type=Path)
)
@opt.warehouse
@opt.config_file
@opt.requests_selection
@click.option(
    "--slo",
    "slo_items",
    multiple=True,
    metavar="KEY=LIMIT",
    help="Objective every probe must meet, e.g. ttft_p99=200ms, tpot_p99=50ms (repeatable; "
    "metrics ttft, tpot, e2e, queue; statistics p<q>, mean; units us, ms, s).",
)
@click.option(
    "--search",
    "kinds",
    multiple=True,
    type=click.Choice(SEARCHES),
    help="Run only these searches (repeatable) [default: the file's, else all three].",
)
@click.option(
    "--scenario",
    "scenario_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Base scenario TOML file (over the capacity file's [base]).",
)
@click.option("--policy", type=click.Choice(sorted(POLICIES)), default=None, help="Base policy.")
# every other flag of `replay` (--router, --replicas, --max-num-seqs, ...) is added below
@click.option("--profile", default=None, help="Base step-cost profile.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any base scenario key (repeatable), e.g. --set drop_too_long=true.",
)
@click.option(
    "--target-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Requests/s the replicas search must serve [default: the base scenario's].",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Top of the concurrency search [default: the file's, else 1024].",
)
@click.option(
    "--max-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Top of the replicas search [default: the file's, else 64].",
)
@click.option(
    "--summary-only",
    is_flag=True,
    help="Write each probe's summary and the search, not its sim_requests and sim_steps.",
)
@opt.gpu_hour_price
@opt.output
@opt.locked
def capacity_command(
    capacity_file: Path | None,
    warehouse: Path | None,
    config_file: Path | None,
    requests_file: Path | None,
    date_from: opt.Moment | None,
    date_to: opt.Moment | None,
    models: tuple[str, ...],
    tenants: tuple[str, ...],
    where: str | None,
    slo_items: tuple[str, ...],
    kinds: tuple[str, ...],
    scenario_file: Path | None,
    policy: str | None,
    profile: str | None,
    sets: tuple[str, ...],
    target_rate: float | None,
    max_concurrency: int | None,
    max_replicas: int | None,
    summary_only: bool,
    gpu_hour_price: float | None,
    quiet: bool,
    as_json: bool,
    **scenario_flags: Any,
) -> None:
    """Find the highest cap, the highest rate and the fewest replicas within SLOs.

    For the requests and a base scenario: the highest concurrency cap
    (max_num_seqs, max_batch_size, ...) that meets every SLO at the base's
    arrival rate, with the throughput and goodput there; the highest request
    rate (the trace time-scaled) that meets them; and the fewest replicas
    that meet them at a target rate. Each is a bisection; every probe is a
    replay, written under one run id with the search path (capacity_search).
    CAPACITY_FILE is optional TOML: [base], [slo], [search.<kind>] (see
    docs/capacity.md).

    Example:

    \b
        tracereplay capacity --slo ttft_p99=200ms --slo tpot_p99=50ms \\
            --scenario examples/scenarios/vllm.toml
        tracereplay capacity examples/seed_lab/capacity.toml --search rate
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    base: dict[str, Any] = dict(cfg.sections.get("replay", {}))
    file_slos: list[Slo] = []
    file_specs = [SearchSpec(k) for k in SEARCHES]
    if capacity_file is not None:
        file_base, file_slos, file_specs = load_capacity_file(capacity_file)
        base.update(file_base)
    if scenario_file is not None:
        base.update(read_scenario_file(scenario_file))
    flags = {"policy": policy, "profile": profile, **scenario_flags, **opt.parse_sets(sets)}
    base.update({k: v for k, v in flags.items() if v is not None})
    slos = {s.key: s for s in file_slos}
    slos.update({s.key: s for s in parse_slos(slo_items)})
    result = run_capacity(
        wh,
        base,
        list(slos.values()),
        _specs(file_specs, kinds, target_rate, max_concurrency, max_replicas),
        requests_file=requests_file,
        **opt.selection_kwargs(date_from, date_to, models, tenants, where),
        summary_only=summary_only,
        quiet=quiet,
    )
    prices = gpu_prices(cfg, gpu_hour_price)
    if as_json:
        click.echo(json.dumps(result_dict(result, wh, prices), indent=2))
        return
    click.echo(format_capacity(result, prices))
    click.echo(
        f"run {result.run_id}: {result.num_replays} replays in {result.wall_s:.1f} s, "
        f"written to {wh}"
    )


# The base scenario takes the same flags as `replay` (--router, --replicas, --max-num-seqs,
# ...): the replay command's own options, so the two never drift apart.
_NOT_SCENARIO_KEYS = {"warehouse", "config_file", "requests_file", "date_from", "date_to",
                      "models", "tenants", "where", "scenario_files", "sets", "quiet", "as_json",
                      "gpu_hour_price", "name", "no_intervals"}  # fmt: skip
_have = {p.name for p in capacity_command.params}
capacity_command.params.extend(
    p for p in replay_command.params if p.name not in _NOT_SCENARIO_KEYS | _have
)

capacity = capacity_command
