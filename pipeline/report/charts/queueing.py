"""Charts of the report's queue-depth section: TTFT by the queue depth met on arrival, and
p99 TTFT against the concurrency cap across scenarios."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    HEIGHT,
    WIDTH,
    AnyChart,
    ChartOptions,
    faceted,
    highlight_opacity,
    interactive,
    log2_x,
    panel_size,
    scale_for,
    scale_title,
    series_color,
    slo_limits,
    slo_rules,
    values,
    with_layout,
)
from pipeline.report.layout import CONCURRENCY_KNOBS, natural_key


def ttft_by_queue_depth(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p50 (dashed) and p99 TTFT by the queue depth met on arrival, one colour per series,
    small multiples when the run has many scenarios.

    Expects: scenario, queue_depth_lo, queue_depth_hi, num_requests, p50_ttft_s, p99_ttft_s.
    """
    long = (
        with_layout(df, opts)
        .unpivot(
            index=[
                "scenario",
                "series",
                "panel",
                "queue_depth_lo",
                "queue_depth_hi",
                "num_requests",
            ],
            on=["p50_ttft_s", "p99_ttft_s"],
            variable_name="percentile",
            value_name="ttft_s",
        )
        .with_columns(pl.col("percentile").replace({"p50_ttft_s": "p50", "p99_ttft_s": "p99"}))
    )
    rules = opts.slos.lines("ttft", ("p50", "p99"))
    y_scale = scale_for(pl.concat([long["ttft_s"], slo_limits(rules)]))
    width, height = panel_size(opts)
    lines = interactive(
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "queue_depth_lo:Q",
                title="queue depth met on arrival (requests waiting)",
                scale=alt.Scale(type="symlog"),
            ),
            y=alt.Y("ttft_s:Q", title=scale_title("TTFT (s)", y_scale), scale=y_scale),
            color=series_color(opts),
            detail="scenario:N",
            opacity=highlight_opacity(),
            strokeDash=alt.StrokeDash(
                "percentile:N",
                title="percentile",
                scale=alt.Scale(domain=["p99", "p50"], range=[[1, 0], [4, 3]]),
                legend=alt.Legend(symbolType="stroke"),
            ),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("queue_depth_lo:Q", title="queue depth from"),
                alt.Tooltip("queue_depth_hi:Q", title="queue depth to"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
                alt.Tooltip("percentile:N"),
                alt.Tooltip("ttft_s:Q", title="TTFT (s)", format=".4~f"),
            ],
        )
    )
    chart = alt.layer(lines, *slo_rules(rules), data=values(long)).properties(
        width=width, height=height
    )
    return faceted(chart, opts, opts.title)


def ttft_vs_concurrency_cap(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p99 TTFT against the concurrency cap, one point per scenario; a line (and colour)
    joins only the scenarios equal in every other key that varies across the run (policy,
    rate, replicas, max_num_batched_tokens, ...), so that neither two sweeps nor a capacity
    run's replica probes at one cap draw one line; a bar through each point spans its 90%
    interval where the run has one.

    Expects: scenario, policy, max_concurrency, offered_requests_per_s, p99_ttft_s, and
    optionally p99_ttft_lo_s, p99_ttft_hi_s.
    """
    grid = opts.grid
    fixed = {
        n: grid.label(n, without=CONCURRENCY_KNOBS) or "no other key varies"
        for n in df["scenario"].cast(pl.String).to_list()
    }
    drawn = df.with_columns(
        pl.col("scenario").cast(pl.String).replace_strict(fixed, default="").alias("series")
    )
    if "p99_ttft_lo_s" not in drawn.columns:
        drawn = drawn.with_columns(
            pl.lit(None, pl.Float64).alias("p99_ttft_lo_s"),
            pl.lit(None, pl.Float64).alias("p99_ttft_hi_s"),
        )
    names = sorted(set(drawn["series"].to_list()), key=natural_key)
    shown = ["p99_ttft_s", "p99_ttft_lo_s", "p99_ttft_hi_s"]
    rules = opts.slos.lines("ttft", ("p99",))
    y_scale = scale_for(pl.concat([*(drawn[c] for c in shown), slo_limits(rules)]))
    x = log2_x("max_concurrency:Q", "concurrency cap (max_num_seqs / max_batch_size)")
    color = alt.Color(
        "series:N",
        title="held fixed (the keys that vary across the run)",
        sort=names,
        scale=alt.Scale(domain=names, scheme="tableau20" if len(names) > 10 else "tableau10"),
        legend=alt.Legend(
            symbolLimit=0,
            labelLimit=480,
            titleLimit=480,
            orient="bottom",
            direction="vertical",
            columns=1 if len(names) <= 12 else 2,
        ),
    )
    points = interactive(
        alt.Chart()
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=x,
            y=alt.Y("p99_ttft_s:Q", title=scale_title("p99 TTFT (s)", y_scale), scale=y_scale),
            color=color,
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("series:N", title="held fixed"),
                alt.Tooltip("max_concurrency:Q", title="concurrency cap"),
                alt.Tooltip(
                    "offered_requests_per_s:Q", title="offered (requests/s)", format=".3~f"
                ),
                alt.Tooltip("p99_ttft_s:Q", title="p99 TTFT (s)", format=".4~f"),
                alt.Tooltip("p99_ttft_lo_s:Q", title="90% interval from (s)", format=".4~f"),
                alt.Tooltip("p99_ttft_hi_s:Q", title="to (s)", format=".4~f"),
            ],
        )
    )
    bars = (
        alt.Chart()
        .transform_filter("isValid(datum.p99_ttft_lo_s)")
        .mark_rule(strokeWidth=2)
        .encode(
            x=x,
            y=alt.Y("p99_ttft_lo_s:Q", scale=y_scale),
            y2="p99_ttft_hi_s:Q",
            color=color,
            opacity=highlight_opacity(),
        )
    )
    return alt.layer(
        points, bars, *slo_rules(rules), data=values(drawn), title=opts.title
    ).properties(width=WIDTH, height=HEIGHT)
