"""``tracereplay report``: one self-contained HTML report of a replay run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.report import DEFAULT_REPORT, DEFAULT_SLO_TTFT_S, build_report, png_dir
from pipeline.warehouse import Warehouse


@click.command()
@click.argument("run_id", required=False)
@opt.warehouse
@opt.config_file
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="HTML file to write [default: <warehouse>/reports/<run id>/review.html].",
)
@click.option("--png", is_flag=True, help="Also write one PNG per chart (beside the HTML).")
@click.option(
    "--slo-ttft-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SLO_TTFT_S * 1000,
    show_default=True,
    help="The p99 TTFT objective, in ms, of the capacity search and goodput.",
)
@click.option(
    "--report",
    "report_name",
    default=DEFAULT_REPORT,
    show_default=True,
    help="Report definition: reports/<name>.toml.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def report(
    run_id: str | None,
    warehouse: Path | None,
    config_file: Path | None,
    output: Path | None,
    png: bool,
    slo_ttft_ms: float,
    report_name: str,
    as_json: bool,
) -> None:
    """Write the HTML report of a replay run (RUN_ID, default: the latest run).

    One self-contained file: trace overview, throughput of static vs continuous
    batching, queue depth vs tail TTFT, TTFT/TPOT distributions, KV cache and
    preemptions over time, prefix-cache hit rate, SLO capacity and the
    scenarios' full configuration. Vega is inlined, so it opens with no
    network. Every chart's query is a file in sql/.

    Example:

    \b
        tracereplay report                          # latest run -> warehouse/reports/
        tracereplay report 20240501T020000Z-1a2b -o review.html --png --slo-ttft-ms 500
    """
    wh = Warehouse(warehouse_path(str(warehouse) if warehouse else None, load_config(config_file)))
    wh.remove_orphan_temp_files()  # of reports killed while writing
    html = build_report(
        wh,
        run_id,
        output=output,
        png=png,
        slo_ttft_s=slo_ttft_ms / 1000.0,
        report=report_name,
    )
    pngs = sorted(str(p) for p in png_dir(html).glob("*.png")) if png else []
    if as_json:
        out = {"html": str(html), "bytes": html.stat().st_size, "pngs": pngs}
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"report: {html} ({html.stat().st_size / 1e6:.1f} MB)")
    if png:
        click.echo(f"charts: {len(pngs)} PNG files in {png_dir(html)}")
