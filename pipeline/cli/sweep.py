"""``tracereplay sweep``: a grid of scenarios, replayed in parallel under one run id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pipeline.busiest import selection_lines
from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.objectstore import display
from pipeline.plan.grid import load_grid
from pipeline.plan.slo import parse_slos
from pipeline.plan.sweep import SweepResult
from pipeline.plan.sweep import sweep as run_sweep
from pipeline.plan.tasks import TaskOutcome
from pipeline.pricing import gpu_prices, scenario_cost
from pipeline.text import number, render_table, seconds


def outcome_row(o: TaskOutcome, with_slo: bool) -> list[str]:
    if o.run is None:
        return [o.name, "failed", *[""] * (9 if with_slo else 7)]
    s = o.run.summary
    row = [
        o.name,
        number(s["request_throughput"]),
        number(s["output_token_throughput"], 0),
        seconds(s["ttft_p99_s"]),
        seconds(s["tpot_p99_s"]),
        seconds(s["queue_p99_s"]),
        number(s["mean_queue_depth"], 1),
        f"{s['max_queue_depth']:,}",
        f"{s['num_preemptions']:,}",
    ]
    if with_slo:
        row += [number(s.get("goodput")), "yes" if s.get("slo_met") else "no"]
    return row


def outcome_cost(o: TaskOutcome, prices: dict[str, float]) -> dict[str, Any] | None:
    """A scenario's cost ($/hour, $ per 1M tokens; ``pipeline.pricing``), None: no price."""
    if o.run is None:
        return None
    sc = o.run.scenario
    return scenario_cost(prices, sc, o.run.summary)


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}" if x >= 0.1 else f"${x:,.4f}"


def cost_cells(o: TaskOutcome, prices: dict[str, float]) -> list[str]:
    """$/hour and $ per 1M output tokens of one scenario (dashes: failed, or no price)."""
    cost = outcome_cost(o, prices)
    if cost is None:
        return ["-", "-"]
    return [_usd(cost["usd_per_hour"]), _usd(cost["usd_per_1m_output_tokens"])]


def format_sweep(result: SweepResult, prices: dict[str, float] | None = None) -> str:
    with_slo = bool(result.slos)
    headers = [
        "scenario",
        "req/s",
        "out tok/s",
        "TTFT p99",
        "TPOT p99",
        "queue p99",
        "depth mean",
        "depth max",
        "preempt",
    ]
    if with_slo:
        headers += ["goodput", "SLOs met"]
    rows = [outcome_row(o, with_slo) for o in result.outcomes]
    if prices:
        headers += ["$/hour", "$/1M out"]
        rows = [row + cost_cells(o, prices) for row, o in zip(rows, result.outcomes, strict=True)]
    text = render_table(headers, rows)
    if with_slo:
        text += "\nSLOs: " + ", ".join(str(s) for s in result.slos)
    return text + _class_text(result)


def _class_text(result: SweepResult) -> str:
    """The per-pool table of the fleets and the per-class tables (tenants, models) of
    every scenario that ran."""
    from pipeline.cli.classes import sweep_class_lines
    from pipeline.cli.pools import sweep_pool_lines

    ran = [(o.name, o.run.summary) for o in result.outcomes if o.run]
    lines = sweep_pool_lines(ran) + sweep_class_lines(ran)
    return "\n".join(["", *lines]) if lines else ""


def result_dict(
    result: SweepResult, warehouse: Path, prices: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "warehouse": str(warehouse),
        "num_requests_read": result.num_requests_read,
        "inputs": result.inputs,
        "selection": result.selection,
        "executor": result.executor,
        "jobs": result.jobs,
        "wall_s": result.wall_s,
        "slos": [str(s) for s in result.slos],
        "scenarios": {
            o.name: {
                "axes": coords,
                "config": o.run.scenario.to_dict() if o.run else None,
                "summary": o.run.summary if o.run else None,
                "cost": outcome_cost(o, prices or {}),
                "error": o.error,
            }
            for o, coords in zip(result.outcomes, result.coords, strict=True)
        },
        "failures": result.failures,
    }


@click.command(name="sweep")
@click.argument("grid_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@opt.warehouse
@opt.config_file
@opt.selection
@opt.jobs
@opt.ray
@opt.shards
@click.option(
    "--slo",
    "slo_items",
    multiple=True,
    metavar="KEY=LIMIT",
    help="Objective for goodput and met/not met, e.g. ttft_p99=200ms (repeatable; adds to "
    "the grid's [slo]).",
)
@click.option("--dry-run", is_flag=True, help="Expand and check the grid, list it, run nothing.")
@opt.gpu_hour_price
@opt.output
@opt.locked
def sweep_command(
    grid_file: Path,
    warehouse: Path | None,
    config_file: Path | None,
    requests: opt.Requests,
    jobs: int | None,
    ray_address: str | None,
    shards: int | None,
    shard_warmup_s: float | None,
    slo_items: tuple[str, ...],
    dry_run: bool,
    gpu_hour_price: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Replay a grid of scenarios in parallel; write every result under one run id.

    GRID_FILE is a TOML file: [base] scenario keys, [axes] lists whose product
    is the grid (policy, concurrency, replicas, rate_scale, profile, or any
    scenario key; [axes.<policy>] for one policy's parameters) and optional
    [slo] objectives (see docs/capacity.md). The grid is checked before
    anything runs. Prints one row per scenario (with a price in [gpu_prices]
    or --gpu-hour-price, its $/hour and $ per 1M output tokens); exits 1 when any scenario
    failed (the others are still written).

    --shards N runs the scenarios one after another, each in N parts as
    `replay --shards` does (replica groups under round_robin, else time
    windows after --shard-warmup), the parts --jobs at once or on the Ray
    cluster: for a fleet's day. SLO verdicts and per-class rows as for a
    whole scenario.

    Example:

    \b
        tracereplay sweep examples/seed_lab/grid.toml --jobs 2
        tracereplay sweep grid.toml --ray 10.0.0.5:6379 --slo ttft_p99=200ms --json
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    prices = gpu_prices(cfg, gpu_hour_price)
    grid = load_grid(
        grid_file,
        defaults=dict(cfg.sections.get("replay", {})),
        extra_slos=parse_slos(slo_items),
    )
    if dry_run:
        for point in grid.points:
            click.echo(f"{point.scenario.name}: {json.dumps(point.coords)}")
        click.echo(f"{len(grid.points)} scenario(s) in {grid_file}")
        return
    result = run_sweep(
        wh,
        grid,
        jobs=jobs,
        ray_address=ray_address,
        **requests.kwargs(),
        quiet=quiet,
        shards=shards,
        shard_warmup_s=shard_warmup_s,
    )
    if as_json:
        click.echo(json.dumps(result_dict(result, wh, prices), indent=2))
    else:
        for line in selection_lines(result.selection):
            click.echo(line)
        click.echo(format_sweep(result, prices))
        for name, error in result.failures.items():
            click.echo(f"failed: {name}: {error}", err=True)
        click.echo(
            f"run {result.run_id}: {len(result.runs)} of {len(result.outcomes)} scenario(s) "
            f"written to {display(wh)} in {result.wall_s:.1f} s ({result.executor})"
        )
    if not result.ok:
        raise SystemExit(1)


sweep = sweep_command
