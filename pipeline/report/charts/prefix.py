"""Charts of the report's prefix-cache section: the hit rate overall, over time, by KV cache
size, and per model and tenant."""

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
    scenario_color,
    series_color,
    values,
    with_layout,
)


def prefix_hit_rate_overall(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted prefix-cache hit rate per scenario (scenarios without lookups left out).

    Expects: scenario, hit_rate, query_tokens, hit_tokens.
    """
    drawn = with_layout(df.filter(pl.col("hit_rate").is_not_null()), opts)
    order = list(opts.grid.scenarios) or "ascending"
    return interactive(
        alt.Chart(values(drawn), title=opts.title)
        .mark_bar()
        .encode(
            y=alt.Y("scenario:N", title="scenario", sort=order, axis=alt.Axis(labelLimit=220)),
            x=alt.X(
                "hit_rate:Q",
                title="prefix-cache hit rate (hit tokens / looked-up tokens)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=series_color(opts),
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("hit_tokens:Q", title="hit tokens", format=","),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )
        .properties(width=WIDTH - 200, height=alt.Step(14 if drawn.height > 12 else 20))
    )


def prefix_hit_rate_over_time(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted hit rate per time bucket, one line per scenario.

    Expects: scenario, bucket_start_s, query_tokens, hit_tokens, hit_rate.
    """
    width, height = panel_size(opts)
    chart = interactive(
        alt.Chart(values(with_layout(df, opts)))
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start_s:Q", title="simulated time (s)"),
            y=alt.Y(
                "hit_rate:Q",
                title="hit rate (hit / looked-up tokens)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=series_color(opts),
            detail="scenario:N",
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )
        .properties(width=width, height=height)
    )
    return faceted(chart, opts, opts.title)


def prefix_hit_rate_by_cache_size(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Hit rate against the KV cache capacity of one replica, one point per scenario.

    Expects: scenario, policy, cache_tokens, hit_rate.
    """
    drawn = df.filter(pl.col("hit_rate").is_not_null() & pl.col("cache_tokens").is_not_null())
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=log2_x("cache_tokens:Q", "KV cache per replica (tokens, log scale)"),
            y=alt.Y(
                "hit_rate:Q",
                title="hit rate (hit / looked-up tokens)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=alt.Color("policy:N", title="policy"),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("cache_tokens:Q", title="cache (tokens)", format=","),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
            ],
        )
        .properties(width=WIDTH, height=HEIGHT)
    )


def prefix_hit_rate_by_group(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Share of prompt tokens served from cache per model and per tenant, per scenario.

    Expects: scenario, dimension (model | tenant), group_name, prompt_tokens,
    cached_tokens, hit_rate.
    """
    return (
        alt.Chart(values(df), width=WIDTH // 2 - 80)
        .mark_bar()
        .encode(
            y=alt.Y("group_name:N", title=None, sort="-x", axis=alt.Axis(labelLimit=200)),
            yOffset=alt.YOffset("scenario:N", sort=list(opts.grid.scenarios) or "ascending"),
            x=alt.X(
                "hit_rate:Q",
                title="cached / prompt tokens",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=scenario_color(opts),
            tooltip=[
                alt.Tooltip("dimension:N"),
                alt.Tooltip("group_name:N", title="group"),
                alt.Tooltip("scenario:N"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
                alt.Tooltip("cached_tokens:Q", title="cached tokens", format=","),
            ],
        )
        .facet(
            column=alt.Column(
                "dimension:N", title=None, header=alt.Header(labelExpr="'per ' + datum.value")
            ),
            title=opts.title,
        )
        .resolve_scale(y="independent")
    )
