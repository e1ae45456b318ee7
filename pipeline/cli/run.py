"""``tracereplay run``: the main job, end to end, on the embedded defaults."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.cli.ingest import print_summary
from pipeline.cli.replay import format_run, result_dict
from pipeline.config import load_config, warehouse_path
from pipeline.ingest import IngestOptions
from pipeline.job import run_job

SAMPLES = Path(__file__).resolve().parents[2] / "traces"
DEFAULT_SAMPLE = "azure_conv.csv"


def sql_shell_command(warehouse: Path) -> str:
    """The command that opens the SQL shell over ``warehouse``, as this installation runs it:
    ``tracereplay sql`` when that is the program on PATH, else this environment's
    ``tracereplay`` by its path (``.venv/bin/tracereplay``), else ``python -m pipeline``."""
    script = Path(sys.prefix) / "bin" / "tracereplay"
    on_path = shutil.which("tracereplay")
    if on_path is not None and script.exists() and Path(on_path).resolve() == script.resolve():
        program = "tracereplay"
    elif script.exists():
        program = shlex.quote(_shortest(script))
    else:
        program = f"{shlex.quote(_shortest(Path(sys.executable)))} -m pipeline"
    return f"{program} sql --warehouse {shlex.quote(_shortest(warehouse))}"


def _shortest(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


@click.command()
@click.argument("sources", nargs=-1)
@opt.warehouse
@opt.config_file
@click.option(
    "--scenario",
    "scenario_files",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Scenario TOML file (repeatable). Default: the built-in demonstration set.",
)
@opt.output
@opt.locked
def run(
    sources: tuple[str, ...],
    warehouse: Path | None,
    config_file: Path | None,
    scenario_files: tuple[Path, ...],
    quiet: bool,
    as_json: bool,
) -> None:
    """Run the whole job: ingest the logs, replay the days they cover, write the report.

    With no SOURCES it uses the bundled sample log (traces/azure_conv.csv), and
    with no --scenario the built-in demonstration set (static vs vLLM, chunked
    prefill on and off, a max_num_seqs sweep, the trace replayed 4x faster).
    It exits non-zero when any step fails. For a scheduled job over an inbox of
    logs (only new files ingested, drift against the night before, a manifest
    per night) use `tracereplay nightly`.

    Example:

    \b
        tracereplay run                       # bundled sample -> ./warehouse
        tracereplay run logs/ --warehouse /data/wh --scenario prod.toml
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    srcs = list(sources) or [str(SAMPLES / DEFAULT_SAMPLE)]
    job = run_job(
        srcs,
        wh,
        scenario_files=list(scenario_files),
        replay_defaults=cfg.sections.get("replay"),
        ingest_options=IngestOptions.from_config(cfg, quiet=quiet),
        quiet=quiet,
    )
    if as_json:
        out = {
            "ingest": job.ingest.to_dict(),
            "replay": result_dict(job.replay, wh) if job.replay else None,
            "warehouse": str(wh.resolve()),
            "report": str(job.report) if job.report else None,
        }
        click.echo(json.dumps(out, indent=2))
    else:
        print_summary(job.ingest, as_json=False)
        for r in job.replay.runs if job.replay else []:
            click.echo(format_run(r))
        if job.replay is None:
            click.echo("nothing to replay: no requests landed", err=True)
        click.echo(f"results: {wh.resolve()}")
        if job.report:
            click.echo(f"report: {job.report.resolve()}")
        click.echo(f"query them: {sql_shell_command(wh)}")
    if not job.ok:
        raise SystemExit(1)
