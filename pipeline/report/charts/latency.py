"""Charts of the report's latency distributions: percentiles with their 90% intervals, and
the CDFs of TTFT and TPOT per scenario."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    WIDTH,
    AnyChart,
    ChartOptions,
    faceted,
    highlight_opacity,
    interactive,
    panel_size,
    scale_for,
    scale_title,
    series_color,
    slo_limits,
    slo_rules,
    values,
    with_layout,
)
from pipeline.report.layout import natural_sorted

# latency_percentiles.sql columns of each percentile drawn with its interval
_INTERVAL_STATS = (
    ("TTFT", "p50", "p50_ttft"),
    ("TTFT", "p90", "p90_ttft"),
    ("TTFT", "p99", "p99_ttft"),
    ("TPOT", "p50", "p50_tpot"),
    ("TPOT", "p99", "p99_tpot"),
    ("E2E", "p50", "p50_e2e"),
    ("E2E", "p99", "p99_e2e"),
)


def latency_intervals(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Each scenario's TTFT, TPOT and E2E percentiles as points, each with a bar over its
    90% interval; one panel per metric (its own time axis, log when the values spread).

    Expects the rows of latency_percentiles.sql (scenario, p50_ttft_s, p50_ttft_lo_s,
    p50_ttft_hi_s, ...).
    """
    parts = [
        df.select(
            pl.col("scenario"),
            pl.lit(metric).alias("metric"),
            pl.lit(q).alias("percentile"),
            pl.col(f"{col}_s").alias("value_s"),
            pl.col(f"{col}_lo_s").alias("lo_s"),
            pl.col(f"{col}_hi_s").alias("hi_s"),
        )
        for metric, q, col in _INTERVAL_STATS
    ]
    long = pl.concat(parts).filter(pl.col("lo_s").is_not_null() & (pl.col("value_s") > 0))
    order = natural_sorted(set(long["scenario"].to_list()))
    panels = []
    for metric in ("TTFT", "TPOT", "E2E"):
        part = long.filter(pl.col("metric") == metric)
        if part.is_empty():
            continue
        scale = scale_for(pl.concat([part["lo_s"], part["hi_s"]]))
        base = alt.Chart(values(part), title=metric).encode(
            y=alt.Y("scenario:N", title=None, sort=order, axis=alt.Axis(labelLimit=180)),
            yOffset=alt.YOffset("percentile:N", sort=["p50", "p90", "p99"]),
            color=alt.Color("percentile:N", sort=["p50", "p90", "p99"], title="percentile"),
        )
        x = alt.X("value_s:Q", title=scale_title(f"{metric} (s)", scale), scale=scale)
        bar = base.mark_rule(strokeWidth=2).encode(
            x=alt.X("lo_s:Q", scale=scale, title=None), x2="hi_s:Q"
        )
        dot = base.mark_point(filled=True, size=40).encode(
            x=x,
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("metric:N"),
                alt.Tooltip("percentile:N"),
                alt.Tooltip("value_s:Q", title="value (s)", format=".4~g"),
                alt.Tooltip("lo_s:Q", title="90% interval from (s)", format=".4~g"),
                alt.Tooltip("hi_s:Q", title="to (s)", format=".4~g"),
            ],
        )
        panels.append(alt.layer(bar, dot).properties(width=WIDTH // 3 - 40, height=alt.Step(8)))
    return alt.hconcat(*panels, title=opts.title).resolve_scale(x="independent")


def latency_cdf(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Empirical CDF of one latency metric per scenario, log or linear time axis (by the
    spread of the values), small multiples when the run has many scenarios.

    Expects: scenario, metric, value_s, num_requests, fraction; ``opts.extra["metric"]``
    picks the metric (ttft_s or tpot_s) and ``opts.extra["axis"]`` labels the time axis.
    """
    metric = opts.extra.get("metric", "ttft_s")
    axis = opts.extra.get("axis", "time (s)")
    drawn = with_layout(df.filter(pl.col("metric") == metric), opts)
    # a percentile SLO of this metric reads off the CDF where it crosses the limit
    rules = tuple(r for r in opts.slos.lines(metric.removesuffix("_s")) if r.stat != "mean")
    x_scale = scale_for(pl.concat([drawn["value_s"], slo_limits(rules)]))
    width, height = panel_size(opts)
    lines = interactive(
        alt.Chart()
        .mark_line()
        .encode(
            x=alt.X("value_s:Q", title=scale_title(axis, x_scale), scale=x_scale),
            y=alt.Y(
                "fraction:Q", title="fraction of requests at or below", axis=alt.Axis(format="%")
            ),
            color=series_color(opts),
            detail="scenario:N",
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("value_s:Q", title=f"{axis}, at most", format=".4~g"),
                alt.Tooltip("fraction:Q", title="share of requests", format=".3~%"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
            ],
        )
    )
    chart = alt.layer(lines, *slo_rules(rules, axis="x"), data=values(drawn)).properties(
        width=width, height=height
    )
    return faceted(chart, opts, opts.title)
