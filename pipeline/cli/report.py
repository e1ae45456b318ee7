"""``tracereplay report``: one self-contained HTML report of a replay run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.report import DEFAULT_REPORT, build_report, png_dir
from pipeline.warehouse import Warehouse


def report_slos(
    items: tuple[str, ...], slo_ttft_ms: float | None
) -> tuple[float | None, list[str]]:
    """The SLOs the report judges by, from --slo (capacity's syntax, scopes included) or the
    deprecated --slo-ttft-ms (an unscoped p99 TTFT), as (that objective in seconds, the
    --slo SLOs as runs store them). Both empty: the report takes the run's own SLOs
    (``sweep``/``capacity --slo``, nightly [slo]), else says it has none."""
    from pipeline.errors import ConfigError
    from pipeline.plan.slo import parse_slos

    if slo_ttft_ms is not None:
        if items:
            raise ConfigError("give --slo ttft_p99=... or the deprecated --slo-ttft-ms, not both")
        return slo_ttft_ms / 1000.0, []
    return None, [str(s) for s in parse_slos(items, where="--slo")]


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
    "--slo",
    "slo_items",
    multiple=True,
    metavar="KEY=LIMIT",
    help="An SLO, as for capacity (repeatable; scoped too: 'ttft_p99@tenant=chat=500ms'). "
    "The header lists them, TTFT charts draw a rule per TTFT SLO, goodput, the sweep charts "
    "and the per-class tables judge them [default: the run's own SLOs; without any, the "
    "report says so and draws p99 TTFT 200ms as an example].",
)
@click.option(
    "--slo-ttft-ms",
    cls=opt.DeprecatedOption,
    use="--slo ttft_p99=<N>ms",
    type=opt.BoundedFloat(0.0, 1e9, lo_open=True),
    default=None,
)
@click.option(
    "--compare",
    "compare_run",
    default=None,
    metavar="RUN_B",
    help="Draw this run beside RUN_ID: a comparison section (metrics of both, signed changes).",
)
@opt.pairing
@opt.gpu_hour_price
@click.option(
    "--report",
    "report_name",
    default=DEFAULT_REPORT,
    show_default=True,
    help="Report definition: reports/<name>.toml.",
)
@opt.output
def report(
    run_id: str | None,
    warehouse: Path | None,
    config_file: Path | None,
    output: Path | None,
    png: bool,
    slo_items: tuple[str, ...],
    slo_ttft_ms: float | None,
    compare_run: str | None,
    pair_by: str,
    pairs: tuple[str, ...],
    gpu_hour_price: float | None,
    report_name: str,
    quiet: bool,
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
        tracereplay report 20240501T020000Z-1a2b -o review.html --png --slo ttft_p99=500ms
        tracereplay report RUN_A --compare RUN_B     # both runs, and what changed
    """
    from pipeline.compare import parse_pairs
    from pipeline.objectstore import publish
    from pipeline.pricing import gpu_prices
    from pipeline.storage import writing

    cfg = load_config(config_file)
    wh = Warehouse(warehouse_path(str(warehouse) if warehouse else None, cfg))
    wh.remove_orphan_temp_files()  # of reports killed while writing
    slo_s, slos = report_slos(slo_items, slo_ttft_ms)
    # the report only reads the warehouse: where it cannot write there (a read-only
    # mount), the line says to write the report elsewhere
    where, elsewhere = (
        (wh.root, "write the report elsewhere with -o FILE")
        if output is None
        else (output, "give -o another path")
    )
    with writing(where, elsewhere):
        html = build_report(
            wh,
            run_id,
            output=output,
            png=png,
            slo_ttft_s=slo_s,
            report=report_name,
            compare=compare_run,
            pair_by=pair_by,
            pairs=parse_pairs(pairs),
            gpu_prices=gpu_prices(cfg, gpu_hour_price),
            slos=slos or None,
        )
    pngs = sorted(str(p) for p in png_dir(html).glob("*.png")) if png else []
    # a report of an s3:// warehouse is written in its local mirror and uploaded beside it
    uploaded = publish(wh.root, html) if output is None else None
    if as_json:
        out = {"html": str(html), "bytes": html.stat().st_size, "pngs": pngs}
        if uploaded:
            out["uploaded"] = uploaded
        click.echo(json.dumps(out, indent=2))
        return
    if quiet:
        click.echo(str(html))
        return
    click.echo(f"report: {html} ({html.stat().st_size / 1e6:.1f} MB)")
    if uploaded:
        click.echo(f"uploaded: {uploaded}")
    if png:
        click.echo(f"charts: {len(pngs)} PNG files in {png_dir(html)}")
