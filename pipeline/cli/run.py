"""``tracereplay run``: the main job, end to end, on the embedded defaults."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.cli.ingest import print_summary
from pipeline.config import load_config, warehouse_path
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import SQL_DIR, Warehouse

SAMPLES = Path(__file__).resolve().parents[2] / "traces"
DEFAULT_SAMPLE = "azure_conv.csv"


@click.command()
@click.argument("sources", nargs=-1)
@opt.warehouse
@opt.config_file
@opt.output
def run(
    sources: tuple[str, ...],
    warehouse: Path | None,
    config_file: Path | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Run the whole job: ingest the logs, then print where the results are.

    With no SOURCES it uses the bundled sample log (traces/azure_conv.csv) and
    the local warehouse, so it works on a fresh checkout. This is the command
    a nightly job runs; it exits non-zero when any step fails.

    Example:

    \b
        tracereplay run                       # bundled sample -> ./warehouse
        tracereplay run logs/ --warehouse /data/wh
    """
    cfg = load_config(config_file)
    wh = Warehouse(warehouse_path(str(warehouse) if warehouse else None, cfg))
    srcs = list(sources) or [str(SAMPLES / DEFAULT_SAMPLE)]
    result = ingest_logs(srcs, wh, IngestOptions(quiet=quiet))
    if as_json:
        out = {"ingest": result.to_dict(), "warehouse": str(wh.root.resolve())}
        click.echo(json.dumps(out, indent=2))
    else:
        print_summary(result, as_json=False)
        click.echo(f"results: {wh.root.resolve()}")
        click.echo(f'query them: cd {wh.root} && duckdb -cmd ".read {SQL_DIR / "views.sql"}"')
    if not result.ok:
        raise SystemExit(1)
