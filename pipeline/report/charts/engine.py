"""The chart of the report's engine section: KV cache use, running and waiting requests and
preemptions over simulated time."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    HEIGHT,
    WIDTH,
    AnyChart,
    ChartOptions,
    highlight_opacity,
    interactive,
    series_color,
    values,
    with_layout,
)


def engine_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """KV usage, running, waiting and preemptions over simulated time: one row of panels per
    measure, one column per panel of the layout.

    The time axis ends where most scenarios end: when a few run far longer (a capacity
    search's slowest rate), it stops at four times the median scenario's span and the
    title says how many run on.

    Expects: scenario, bucket_start_s, bucket_s, kv_usage, mean_running, mean_waiting,
    max_waiting, num_preemptions.
    """
    measures = {
        "kv_usage": "KV cache used (share of blocks)",
        "mean_running": "running requests (mean)",
        "mean_waiting": "waiting requests (mean)",
        "num_preemptions": "preemptions (per bucket)",
    }
    title = opts.title
    # the query cuts the axis (scenario_end_s says where each scenario really ends); a
    # frame without that column is cut here by the same rule
    ends = df.group_by("scenario").agg(
        pl.col("scenario_end_s").max()
        if "scenario_end_s" in df.columns
        else (pl.col("bucket_start_s") + pl.col("bucket_s")).max()
    )
    if ends.height:
        end = ends[:, 1]
        clip = min(4.0 * float(end.median()), float(end.max()))  # type: ignore[arg-type]
        longer = int((end > clip * (1 + 1e-9)).sum())
        if longer:
            df = df.filter(pl.col("bucket_start_s") < clip)
            title = (
                f"{title} (time axis cut at {clip:,.0f} s; {longer} scenario"
                f"{'s' if longer != 1 else ''} run longer)"
            )
    long = (
        with_layout(df, opts)
        .unpivot(
            index=["scenario", "series", "panel", "bucket_start_s", "bucket_s"],
            on=list(measures),
            variable_name="measure",
            value_name="value",
        )
        .with_columns(pl.col("measure").replace_strict(measures))
    )
    grid = opts.grid
    width = WIDTH if not grid.faceted else max(180, WIDTH // max(1, len(grid.panels)) - 40)
    chart = interactive(
        alt.Chart(values(long), width=width, height=HEIGHT // 2)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start_s:Q", title="simulated time (s)"),
            y=alt.Y("value:Q", title=None),
            color=series_color(opts),
            detail="scenario:N",
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("measure:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)", format=",.1f"),
                alt.Tooltip("value:Q", format=",.3~f"),
            ],
        )
    )
    row = alt.Row(
        "measure:N",
        title=None,
        sort=list(measures.values()),
        header=alt.Header(labelAngle=0, labelAlign="left", labelLimit=140),
    )
    if grid.faceted:
        return chart.facet(
            row=row, column=alt.Column("panel:N", title=None, sort=grid.panels), title=title
        ).resolve_scale(y="independent")
    return chart.facet(row=row, title=title).resolve_scale(y="independent")
