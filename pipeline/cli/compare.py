"""``tracereplay compare``: what changed from one run to another."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.warehouse import Warehouse


@click.command()
@click.argument("run_a")
@click.argument("run_b", nargs=-1, required=True)
@opt.warehouse
@opt.config_file
@opt.gpu_hour_price
@opt.pairing
@opt.output
def compare(
    run_a: str,
    run_b: tuple[str, ...],
    warehouse: Path | None,
    config_file: Path | None,
    gpu_hour_price: float | None,
    pair_by: str,
    pairs: tuple[str, ...],
    quiet: bool,
    as_json: bool,
) -> None:
    """Compare RUN_B (and any further runs) against RUN_A, the baseline.

    Per pair of scenarios (by name; --by position; --pair A=B; the first
    line says how they paired, and --json's "pairing"): throughput, TTFT and
    TPOT percentiles, preemptions, the prefix-cache hit rate, the cost
    ($/hour, $ per 1M tokens; with a price in [gpu_prices] or
    --gpu-hour-price) and each capacity search's answer, with the signed
    change B - A and the relative change; then per tenant and per model
    (where there are several) requests and TTFT and TPOT percentiles with
    their changes, and for a fleet per pool (paired by name) its requests,
    replicas, TTFT, TPOT and E2E percentiles and throughput. --quiet leaves
    out the note on how the intervals were drawn.

    Example:

    \b
        tracereplay compare 20240501T020000Z-1a2b 20240502T020000Z-3c4d
        tracereplay compare RUN_A RUN_B RUN_C --json
        tracereplay compare SHARED PRIORITY --by position
        tracereplay compare SHARED PRIORITY --pair shared-64=priority-64
    """
    from pipeline.compare import (
        class_changes,
        compare_paired,
        comparison_dict,
        format_comparison,
        parse_pairs,
        pool_changes,
    )
    from pipeline.pricing import gpu_prices

    cfg = load_config(config_file)
    wh = Warehouse(warehouse_path(str(warehouse) if warehouse else None, cfg))
    prices = gpu_prices(cfg, gpu_hour_price)
    mapping = parse_pairs(pairs)
    done = [compare_paired(wh, run_a, b, prices, by=pair_by, pairs=mapping) for b in run_b]
    classes = [class_changes(wh, df, pairing) for df, pairing in done]  # per tenant, model
    pools = [pool_changes(wh, df, pairing) for df, pairing in done]  # per pool of a fleet
    if as_json:
        out = [
            comparison_dict(df, pairing, c, p)
            for (df, pairing), c, p in zip(done, classes, pools, strict=True)
        ]
        click.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return
    click.echo(
        "\n\n".join(
            format_comparison(df, pairing, notes=not quiet, classes=c, pools=p)
            for (df, pairing), c, p in zip(done, classes, pools, strict=True)
        )
    )
