"""``tracereplay check``: verify every file of the warehouse; with --repair, set damage aside."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.errors import PipelineError
from pipeline.warehouse import Warehouse

if TYPE_CHECKING:
    from pipeline.integrity import CheckResult

# exit status when damage was found (0: clean; 1: the check could not run; 2: usage)
DAMAGE_FOUND = 3


@click.command()
@click.option(
    "--repair",
    is_flag=True,
    help="Move each damaged file to <warehouse>/damaged/ (recorded in damaged/manifest.jsonl) "
    "and remove what killed commands left; takes the warehouse lock.",
)
@click.option("--full", is_flag=True, help="Read every file again, even those verified before.")
@opt.warehouse
@opt.config_file
@opt.lock_timeout
@opt.output
def check(
    repair: bool,
    full: bool,
    warehouse: Path | None,
    config_file: Path | None,
    lock_timeout: float,
    quiet: bool,
    as_json: bool,
) -> None:
    """Verify every file of the warehouse: page checksums, footers, columns and values.

    Prints one line per damaged file (what failed and what to do) and a summary;
    changes nothing unless --repair. Every command also leaves a damaged file out
    of what it reads, and one holding the warehouse lock (ingest, replay, ...)
    sets it aside itself.

    Exit status: 0 when every file is sound, 3 when damage was found (with
    --repair: and set aside), 1 when the check could not run.

    Example:

    \b
        tracereplay check
        tracereplay check --repair
        tracereplay check --json    # the damaged files and the counts as JSON
    """
    from pipeline.integrity import check as run_check

    root = warehouse_path(str(warehouse) if warehouse else None, load_config(config_file))
    if not root.is_dir():
        raise PipelineError(
            f"no warehouse at {root}: run `tracereplay ingest` first or pass --warehouse"
        )
    wh = Warehouse(root)
    result = run_check(wh, repair=repair, full=full, lock_timeout_s=lock_timeout)
    moved = {s.damage.rel: s.moved_to for s in result.moved}
    n = len(result.scan.damaged)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "warehouse": str(root),
                    "checked": result.scan.checked,
                    "tables": len(result.scan.served),
                    "damaged": [
                        {
                            "table": d.table,
                            "path": d.rel,
                            "problem": d.problem,
                            "fix": d.fix,
                            "moved_to": moved.get(d.rel),
                        }
                        for d in result.scan.damaged
                    ],
                    "set_aside": len(moved),
                    "temporary_files": [str(p) for p in result.stale],
                    "set_aside_before": result.earlier,
                },
                indent=2,
            )
        )
    else:
        _report(result, root, repair, quiet)
    if n:
        sys.exit(DAMAGE_FOUND)


def _report(result: CheckResult, root: Path, repair: bool, quiet: bool) -> None:
    """The text output: a line per damaged file (not when ``quiet``), then the summary."""
    moved = {s.damage.rel: s.moved_to for s in result.moved}
    n = len(result.scan.damaged)
    if not quiet:
        for d in result.scan.damaged:
            where = f"; moved to {moved[d.rel]}" if d.rel in moved else ""
            click.echo(f"damaged: {d.rel}: {d.problem}{where}; {d.fix}")
    tables = len(result.scan.served)
    from pipeline.integrity import DAMAGED_DIR, MANIFEST

    line = f"checked {result.scan.checked:,} files of {tables} tables in {root}: "
    if not n:
        line += "no damage"
    elif repair:
        line += f"{n} damaged, {len(moved)} set aside in {DAMAGED_DIR}/ ({DAMAGED_DIR}/{MANIFEST})"
    else:
        line += f"{n} damaged; `tracereplay check --repair` sets them aside"
    if result.stale:
        verb = "removed" if repair else "left by killed commands (--repair removes them)"
        line += f"; {len(result.stale)} temporary files {verb}"
    if result.earlier:
        line += f"; {result.earlier} set aside before ({DAMAGED_DIR}/{MANIFEST})"
    click.echo(line)
