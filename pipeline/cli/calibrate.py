"""``tracereplay calibrate``: fit a step-cost profile to measured step times or to production
latencies (docs/calibration.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pipeline.calibrate.fit import COEFFICIENTS, PhaseError
from pipeline.cli import options as opt
from pipeline.cli.sweep import render_table


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def error_table(columns: dict[str, dict[str, PhaseError]]) -> str:
    """Per phase: rows, then median and p90 |pred/measured - 1| of each named fit."""
    phases = [p for p in ("prefill", "decode") if any(p in c for c in columns.values())]
    headers = ["phase", "rows"]
    for label in columns:
        headers += [f"{label} median", f"{label} p90"]
    rows = []
    for phase in phases:
        first = next(c[phase] for c in columns.values() if phase in c)
        cells = [phase, f"{first.rows:,}"]
        for errs in columns.values():
            e = errs.get(phase)
            cells += [pct(e.median if e else None), pct(e.p90 if e else None)]
        rows.append(cells)
    return render_table(headers, rows)


def coefficient_table(start: dict[str, float], fitted: dict[str, float]) -> str:
    rows = []
    for name in COEFFICIENTS:
        a, b = start.get(name, 0.0), fitted[name]
        ratio = f"x{b / a:.3g}" if a > 0 else "new"
        rows.append([name, f"{a:.4g}", f"{b:.4g}", ratio])
    return render_table(["coefficient", "like", "fitted", "change"], rows)


@click.group(name="calibrate")
def calibrate() -> None:
    """Fit a step-cost profile to measured step times or to production latencies."""


@calibrate.command(name="measurements")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--like",
    "like",
    required=True,
    help="Profile to start from (shipped name or JSON path): its model, GPU and memory.",
)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the calibrated profile JSON.",
)
@click.option(
    "--cv",
    "cv",
    type=click.IntRange(min=2),
    default=None,
    help="Also print the K-fold cross-validated error.",
)
@opt.output
def measurements_command(
    file: Path, like: str, output: Path, cv: int | None, quiet: bool, as_json: bool
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
        cal = calibrate_measurements(file, like, output, cv=cv)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    r = cal.result
    if as_json:
        click.echo(json.dumps({"output": str(cal.output), "profile": cal.profile}, indent=2))
        return
    if not quiet:
        click.echo(
            f"calibrated {cal.like_name} on {r.rows:,} rows of {file} "
            f"({r.iterations} solver evaluations)"
        )
        columns: dict[str, Any] = {"like": r.like_error, "fit": r.fit_error}
        if r.cv_error is not None:
            columns[f"{r.cv_folds}-fold cv"] = r.cv_error
        click.echo("|predicted / measured - 1|:")
        click.echo(error_table(columns))
        click.echo(coefficient_table(r.start, r.coefficients))
    click.echo(f"wrote {cal.output}")


def _attach_live() -> None:
    from pipeline.cli.calibrate_live import live_command

    calibrate.add_command(live_command)


_attach_live()
