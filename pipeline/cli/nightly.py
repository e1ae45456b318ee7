"""``tracereplay nightly``: the scheduled job over an inbox of logs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path

_NIGHTLY_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)


@click.command()
@click.argument("nightly_file", required=False, type=_NIGHTLY_FILE)
@click.option(
    "--config",
    "old_nightly_file",
    cls=opt.DeprecatedOption,
    use="the NIGHTLY_FILE argument",  # --config is the general config file elsewhere
    type=_NIGHTLY_FILE,
    default=None,
)
@opt.warehouse
@opt.lock_timeout
@opt.output
def nightly(
    nightly_file: Path | None,
    old_nightly_file: Path | None,
    warehouse: Path | None,
    lock_timeout: float,
    quiet: bool,
    as_json: bool,
) -> None:
    """Ingest what is new in the inbox, replay it, search capacity, flag drift, report.

    NIGHTLY_FILE is the nightly TOML file: inbox, scenarios, SLOs, capacity
    searches, drift thresholds. Only inbox files that are new or changed (by
    content hash) are ingested; the days they cover are replayed through the
    production scenarios and capacity searches; tonight's traffic, p99 TTFT and
    TPOT, capacity answers and simulated-vs-observed latency are compared with
    the last night's. Writes <warehouse>/nightly/<night id>/manifest.json and
    keeps the last nightly.keep_nights nights. Holds the warehouse lock
    throughout.

    Exit codes: 0 ok (or nothing new), 1 failed, 3 drift over a threshold.
    See docs/nightly.md.

    Example:

    \b
        tracereplay nightly nightly.toml
        tracereplay nightly /etc/tracereplay/nightly.toml --warehouse /data/wh --json
    """
    if nightly_file is not None and old_nightly_file is not None:
        raise click.UsageError("give NIGHTLY_FILE or the deprecated --config, not both")
    nightly_file = nightly_file or old_nightly_file
    if nightly_file is None:
        raise click.UsageError("give the nightly TOML file: tracereplay nightly NIGHTLY_FILE")
    from pipeline.nightly import load_nightly_config, run_nightly

    cfg = load_nightly_config(nightly_file)
    flag = str(warehouse) if warehouse else (str(cfg.warehouse) if cfg.warehouse else None)
    wh = warehouse_path(flag, load_config(None))
    log = None if (quiet or as_json) else (lambda line: click.echo(line, err=True))
    result = run_nightly(cfg, wh, lock_timeout_s=lock_timeout, quiet=True, log=log)
    m = result.manifest
    if as_json:
        click.echo(json.dumps(m, indent=2, default=str))
    else:
        for error in m["errors"]:
            click.echo(f"error: {error}", err=True)
        click.echo(
            f"night {result.night_id}: {m['status']} (exit {result.exit_code}); "
            f"manifest {result.manifest_path}"
        )
    raise SystemExit(result.exit_code)
