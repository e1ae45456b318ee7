"""``tracereplay profile check``: a profile's step times against measured ones."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli.calibrate import error_table
from pipeline.text import render_table


@click.command(name="check")
@click.argument("profile")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print rows and errors as JSON.")
def check_command(profile: str, file: Path, as_json: bool) -> None:
    """Predicted against measured step time, per row of FILE and per phase.

    PROFILE is a shipped profile name or a profile JSON file; FILE is a
    measurements file (CSV or Parquet, the schema of `tracereplay calibrate
    measurements`). The error is predicted / measured - 1: negative means the
    profile is too fast.

    Example:

    \b
        tracereplay profile check llama-3-70b_h100-80gb_tp4 bench.csv
    """
    from pipeline.calibrate.measured import check_profile
    from pipeline.calibrate.measurements import left_out_warning

    chk = check_profile(profile, file)
    warning = left_out_warning(chk.measurements)
    if warning:
        click.echo(warning, err=True)
    rows = chk.rows()
    if as_json:
        out = {
            "profile": chk.profile_name,
            "file": str(file),
            "errors": chk.error.to_dict(),
            "rows": rows,
        }
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"profile {chk.profile_name} against {len(rows):,} measured steps of {file}")
    table = [
        [
            str(r["row"]),
            r["phase"],
            str(r["batch_size"]),
            str(r["prompt_tokens"]),
            str(r["context_tokens"]),
            f"{r['measured_ms']:.3f}",
            f"{r['predicted_ms']:.3f}",
            f"{r['error']:+.1%}",
        ]
        for r in rows
    ]
    headers = ["row", "phase", "batch", "prompt", "context", "measured ms", "predicted ms", "error"]
    click.echo(render_table(headers, table))
    click.echo(error_table({"profile": chk.error}, file))
