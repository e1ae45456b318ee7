"""``tracereplay validate LIVE_RUN``: the simulator against a live run of the same requests."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.live.validate import Validation, validate_live
from pipeline.text import render_table


def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "s":
        return f"{x * 1000:,.1f} ms"
    return f"{x:,.2f}/s"


def format_validation(v: Validation) -> str:
    rows = []
    for r in v.aggregate.to_dicts():
        unit = "s" if r["metric"] in ("ttft", "tpot", "e2e") else "rate"
        err = "n/a" if r["error"] is None else f"{r['error']:+.1%}"
        rows.append(
            [r["metric"], r["stat"], _num(r["live"], unit), _num(r["simulated"], unit), err]
        )
    head = (
        f"validate {v.run_id}: live run {v.live_run_id} ({v.requests.height} requests, "
        f"engine {v.engine_info.get('engine', '?')}, transformers "
        f"{v.engine_info.get('transformers', '?')}, {v.engine_info.get('device', '?')})"
    )
    return head + "\n" + render_table(["metric", "stat", "live", "simulated", "error"], rows)


@click.command(name="validate")
@click.argument("live_run")
@opt.warehouse
@opt.config_file
@click.option(
    "--profile",
    "profile",
    default=None,
    help="Step-cost profile (name or JSON path), e.g. the output of `calibrate live`.",
)
@click.option(
    "--scenario",
    "scenario",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Scenario TOML to replay instead of the engine's own settings.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@opt.locked
def validate_command(
    live_run: str,
    warehouse: Path | None,
    config_file: Path | None,
    profile: str | None,
    scenario: Path | None,
    as_json: bool,
) -> None:
    """Replay a live run's requests through the simulator and compare the latencies.

    The simulator gets the engine's settings from the live run (the transformers
    policy with its scheduler, max_batch_tokens, block size and KV blocks) and the
    step costs from --profile. Writes the validation and validation_requests tables
    (queries sql/validation.sql, validation_cdf.sql, validation_requests.sql).

    Example:

    \b
        tracereplay calibrate live --engine inprocess -o profile.json
        tracereplay live --engine inprocess --sample 200
        tracereplay validate <live run id> --profile profile.json
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    v = validate_live(wh, live_run, profile=profile, scenario=scenario)
    if as_json:
        out = {
            "run_id": v.run_id,
            "live_run_id": v.live_run_id,
            "errors": v.aggregate.to_dicts(),
            "scenario": v.scenario,
        }
        click.echo(json.dumps(out, indent=2, default=str))
        return
    click.echo(format_validation(v))
    click.echo(f"run {v.run_id} written to {wh}")


validate = validate_command
