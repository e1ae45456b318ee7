"""``tracereplay calibrate``: fit a step-cost profile to measured step times or to production
latencies (docs/calibration.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import click

from pipeline.calibrate.fit import COEFFICIENTS
from pipeline.calibrate.fit_error import FitError, describe
from pipeline.cli import options as opt
from pipeline.text import render_table


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def error_table(columns: Mapping[str, FitError], source: object) -> str:
    """The line naming the rows of each figure (fit_error.describe), then per phase: rows,
    and the median and p90 of |predicted / measured - 1| of each labelled figure.

    ``calibrate measurements``, ``calibrate live`` and ``profile check`` print their error
    with it, so that one profile on one file reads the same in each.
    """
    phases = [p for p in ("prefill", "decode") if any(p in c.phases for c in columns.values())]
    headers = ["phase", "rows"]
    for label in columns:
        headers += [f"{label} median", f"{label} p90"]
    rows = []
    for phase in phases:
        first = next(c.phases[phase] for c in columns.values() if phase in c.phases)
        cells = [phase, f"{first.rows:,}"]
        for errs in columns.values():
            e = errs.phases.get(phase)
            cells += [pct(e.median if e else None), pct(e.p90 if e else None)]
        rows.append(cells)
    return describe(columns, str(source)) + ":\n" + render_table(headers, rows)


def coefficient_table(start: dict[str, float], fitted: dict[str, float]) -> str:
    rows = []
    for name in COEFFICIENTS:
        a, b = start.get(name, 0.0), fitted[name]
        ratio = f"x{b / a:.3g}" if a > 0 else "new"
        rows.append([name, f"{a:.4g}", f"{b:.4g}", ratio])
    return render_table(["coefficient", "like", "fitted", "change"], rows)


profile_output = click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the calibrated profile JSON.",
)


@click.group(name="calibrate")
def calibrate() -> None:
    """Fit a step-cost profile to measured step times or to production latencies.

    Example:

    \b
        tracereplay calibrate measurements bench.csv --like llama-3-70b_h100-80gb_tp4 \\
            -o my.json
        tracereplay calibrate observed --scenario prod.toml -o prod-calibrated.json
        tracereplay calibrate live --engine inprocess --model-config tiny -o tiny.json
    """


@calibrate.command(name="measurements")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--like",
    "like",
    required=True,
    help="Profile to start from (shipped name or JSON path): its model, GPU and memory.",
)
@profile_output
@click.option(
    "--cv",
    "cv",
    type=opt.BoundedInt(2, 1000),
    default=None,
    help="Also print the K-fold cross-validated error.",
)
@click.option(
    "--sync",
    "sync",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The same steps measured on the synchronous engine (FILE then the asynchronous "
    "one's): fits sched_cpu_s and sched_cpu_per_seq_s from the difference.",
)
@click.option(
    "--sched-cpu-s",
    "sched_cpu_s",
    type=opt.BoundedFloat(0.0, 1e3),
    default=None,
    help="The scheduler's CPU time per step, s (given; default: fitted with --sync, else "
    "the --like profile's).",
)
@click.option(
    "--sched-cpu-per-seq-s",
    "sched_cpu_per_seq_s",
    type=opt.BoundedFloat(0.0, 1e3),
    default=None,
    help="The scheduler's CPU time per scheduled sequence, s (as --sched-cpu-s).",
)
@opt.output
def measurements_command(
    file: Path,
    like: str,
    output: Path,
    cv: int | None,
    sync: Path | None,
    sched_cpu_s: float | None,
    sched_cpu_per_seq_s: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Fit a profile's coefficients to measured step times.

    FILE is CSV or Parquet, one row per measured step: phase (prefill or
    decode), batch_size, prompt_tokens, context_tokens, time_ms, and optionally
    model, gpu, tensor_parallel (which must match --like). The fit moves each
    physically derived term of the --like profile by a non-negative factor to
    minimise the relative error, robust to a few outliers; terms the data
    cannot pin down keep the --like value.

    Example:

    \b
        tracereplay calibrate measurements bench.csv \\
            --like llama-3-70b_h100-80gb_tp4 -o my-70b.json --cv 5
    """
    from pipeline.calibrate.measured import calibrate_measurements
    from pipeline.errors import PipelineError

    try:
        given = {
            k: v
            for k, v in (("sched_cpu_s", sched_cpu_s), ("sched_cpu_per_seq_s", sched_cpu_per_seq_s))
            if v is not None
        }
        cal = calibrate_measurements(file, like, output, cv=cv, sync_path=sync, sched_cpu=given)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    r = cal.result
    from pipeline.calibrate.measurements import left_out_warning

    warning = left_out_warning(cal.measurements)
    if warning:
        click.echo(warning, err=True)
    if as_json:
        click.echo(json.dumps({"output": str(cal.output), "profile": cal.profile}, indent=2))
        return
    if not quiet:
        click.echo(
            f"calibrated {cal.like_name} on {r.rows:,} rows of {file} "
            f"({r.iterations} solver evaluations)"
        )
        click.echo(error_table(r.errors(), file))
        click.echo(coefficient_table(r.start, r.coefficients))
    click.echo(f"wrote {cal.output}")


@calibrate.command(name="observed")
@opt.warehouse
@opt.config_file
@opt.plain_selection
@click.option(
    "--scenario",
    "scenario_file",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The production scenario TOML (policy, caps, replicas, profile).",
)
@opt.sets
@profile_output
@click.option(
    "--iterations",
    "max_iterations",
    type=click.IntRange(min=1, max=50),
    default=8,
    show_default=True,
    help="Replays after the first, at most.",
)
@opt.output
@opt.locked
def observed_command(
    warehouse: Path | None,
    config_file: Path | None,
    requests: opt.Requests,
    scenario_file: Path,
    sets: tuple[str, ...],
    output: Path,
    max_iterations: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Fit the scenario's profile (step-cost shape and front end) to the logged latencies.

    Replays the requests that carry observed latencies (gateway and OTel logs)
    at their logged arrival times through the production scenario, every load
    level the selection holds, and fits five groups of the profile's step cost
    (compute, memory, per step, per sequence, prefill launch) and its front end
    (per request, per prompt token, per streamed token) until the replayed TTFT
    and TPOT match the logged ones. Cross-validates by hour: each fold of hours is
    predicted by a fit on the others. Prints observed against simulated
    p50/p90/p99 before and after and the held-out errors, writes the calibrated
    profile and a calibration table (the report's "Simulated vs measured"
    section). A fit that does not converge, that pushes a factor to its limit or
    that predicts held-out hours worse than the starting profile is refused:
    exit 1, nothing written, and a line on what data would help.

    Example:

    \b
        tracereplay calibrate observed --scenario prod.toml \\
            --from 2024-05-01 --to 2024-05-07 -o prod-calibrated.json
    """
    from pipeline.calibrate.observed import calibrate_observed, statistics
    from pipeline.config import load_config, warehouse_path
    from pipeline.sim.profiles import DEFAULT_PROFILE
    from pipeline.sim.scenario import read_scenario_file, resolve_scenarios

    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    defaults = dict(cfg.sections.get("replay", {}))
    flags = opt.parse_sets(sets)
    (scenario,) = resolve_scenarios([scenario_file], flags, defaults)
    raw = {**defaults, **read_scenario_file(scenario_file), **flags}
    cal = calibrate_observed(
        wh,
        scenario,
        str(raw.get("profile") or DEFAULT_PROFILE),
        output,
        **requests.kwargs(),
        max_iterations=max_iterations,
    )
    rows = statistics(cal)
    params = cal.after.params
    if as_json:
        out = {
            "run_id": cal.run_id,
            "output": str(cal.output),
            "params": params.to_dict(),
            "iterations": len(cal.stages) - 1,
            "converged": cal.converged,
            "not_pinned": cal.unpinned,
            "held_out": {
                "basis": cal.held_out.basis if cal.held_out else None,
                "folds": cal.held_out.labels if cal.held_out else [],
            },
            "statistics": rows,
            "profile": cal.profile,
        }
        click.echo(json.dumps(out, indent=2))
        return
    if not quiet:
        click.echo(
            f"{cal.num_requests:,} requests replayed through {scenario.name} "
            f"({scenario.policy}, {cal.like_name}); with observed TTFT: "
            f"{cal.num_observed['ttft']:,}, TPOT: {cal.num_observed['tpot']:,}"
        )
        table = [
            [
                f"{r['metric']} {r['statistic']}",
                _ms(r["observed_s"]),
                _ms(r["before_s"]),
                pct_signed(r["before_error"]),
                _ms(r["after_s"]),
                pct_signed(r["after_error"]),
                pct_signed(r["held_out_before_error"]),
                pct_signed(r["held_out_error"]),
            ]
            for r in rows
        ]
        headers = ["", "observed", "before", "error", "after", "error", "held out: before", "after"]
        click.echo(render_table(headers, table))
        if cal.held_out is not None:
            click.echo(
                f"held out: {len(cal.held_out.folds)} folds by {cal.held_out.basis} "
                f"({'; '.join(cal.held_out.labels)}), each predicted by a fit on the others"
            )
        scales = ", ".join(f"{g} x{v:.3f}" for g, v in params.scales.items())
        fe = params.frontend
        click.echo(
            f"step cost: {scales}; prefill launch {params.prefill_fixed_s * 1e3:.2f} ms; "
            f"front end {fe.request_s * 1e3:.2f} ms + {fe.prompt_token_s * 1e6:.2f} us/prompt "
            f"token + {fe.output_token_s * 1e3:.3f} ms/streamed token "
            f"({len(cal.stages) - 1} replays, converged)"
        )
        if cal.unpinned:
            click.echo(
                "not pinned by these logs (kept near the starting profile): "
                + ", ".join(cal.unpinned)
            )
    click.echo(f"run {cal.run_id}: wrote {cal.output} and the calibration table to {wh}")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f} ms"


def pct_signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _attach_live() -> None:
    from pipeline.cli.calibrate_live import live_command

    calibrate.add_command(live_command)


_attach_live()
