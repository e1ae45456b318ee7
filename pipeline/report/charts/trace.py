"""Charts of the report's trace overview: arrival rate, prompt and output lengths, requests
per model and tenant, quarantined records by reason."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import HEIGHT, WIDTH, AnyChart, ChartOptions, min_visible, values


def arrival_rate(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests per second over wall-clock time, labelled in UTC on a 24-hour clock.

    Expects: bucket_start (UTC), bucket_s, num_requests, requests_per_s, prompt_tokens_per_s.
    """
    span_s = 0.0
    if df.height > 1:
        span_s = (df["bucket_start"].max() - df["bucket_start"].min()).total_seconds()  # type: ignore[operator,union-attr]
    # NOTE: on a utc scale the format is applied in UTC; adding formatType="utc" makes
    # Vega-Lite drop the format and fall back to its 12-hour labels.
    label = "%H:%M:%S" if span_s <= 600 else "%H:%M" if span_s <= 86400 else "%m-%d %H:%M"
    if df.height:
        df = df.with_columns(
            pl.col("bucket_start")
            .dt.convert_time_zone("UTC")
            .dt.strftime("%Y-%m-%d %H:%M:%S UTC")
            .alias("bucket_start_utc")
        )
    return (
        alt.Chart(values(df), title=opts.title)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X(
                "bucket_start:T",
                title="arrival time (UTC, 24-hour clock)",
                scale=alt.Scale(type="utc"),
                axis=alt.Axis(format=label, labelOverlap=True),
            ),
            y=alt.Y("requests_per_s:Q", title="arrivals (requests/s)"),
            tooltip=[
                alt.Tooltip(
                    "bucket_start:T",
                    title="bucket start (UTC)",
                    format="%Y-%m-%d %H:%M:%S",
                    formatType="utc",
                ),
                alt.Tooltip("bucket_s:Q", title="bucket (s)"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
                alt.Tooltip("requests_per_s:Q", title="requests/s", format=".3~f"),
                alt.Tooltip("prompt_tokens_per_s:Q", title="prompt tokens/s", format=",.0f"),
            ],
        )
        .properties(width=WIDTH, height=HEIGHT)
    )


def length_histogram(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Prompt and output length histograms on logarithmic bins, side by side.

    Expects: kind (prompt | output), bin_lo_tokens, bin_hi_tokens, num_requests, share.
    The bin [0, 1) (empty outputs) cannot sit on a log axis and is left out of the drawing.
    """
    drawn = df.filter(pl.col("bin_lo_tokens") > 0)
    base = alt.Chart(values(drawn), width=WIDTH // 2 - 40, height=HEIGHT).mark_bar()
    return (
        base.encode(
            x=alt.X(
                "bin_lo_tokens:Q",
                title="length (tokens, log scale)",
                scale=alt.Scale(type="log", base=2),
            ),
            x2="bin_hi_tokens:Q",
            y=alt.Y("share:Q", title="share of requests", axis=alt.Axis(format="%")),
            y2=alt.datum(0),
            color=alt.Color("kind:N", title="length of", legend=None),
            tooltip=[
                alt.Tooltip("kind:N", title="length of"),
                alt.Tooltip("bin_lo_tokens:Q", title="from (tokens)", format=",.0f"),
                alt.Tooltip("bin_hi_tokens:Q", title="to (tokens)", format=",.0f"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
                alt.Tooltip("share:Q", title="share", format=".2%"),
            ],
        )
        .facet(
            column=alt.Column(
                "kind:N",
                title=None,
                sort=["prompt", "output"],
                header=alt.Header(labelExpr="datum.value + ' tokens'"),
            ),
            title=opts.title,
        )
        .resolve_scale(x="independent", y="independent")
    )


def trace_groups(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests per model and per tenant, side by side; every bar visible, counts labelled.

    Expects: dimension (model | tenant), group_name, num_requests, prompt_tokens, share.
    """
    parts = df.partition_by("dimension", maintain_order=True) if df.height else []
    drawn = pl.concat([min_visible(p, "num_requests") for p in parts]) if parts else df
    base = alt.Chart(width=WIDTH // 2 - 80).encode(
        y=alt.Y("group_name:N", title=None, sort="-x", axis=alt.Axis(labelLimit=200)),
        x=alt.X("num_requests_drawn:Q", title="requests"),
    )
    bars = base.mark_bar().encode(
        color=alt.Color("dimension:N", legend=None),
        tooltip=[
            alt.Tooltip("dimension:N"),
            alt.Tooltip("group_name:N", title="group"),
            alt.Tooltip("num_requests:Q", title="requests", format=","),
            alt.Tooltip("share:Q", title="share of requests", format=".1%"),
            alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
        ],
    )
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#333").encode(
        text=alt.Text("num_requests:Q", format=",")
    )
    return (
        alt.layer(bars, labels, data=values(drawn))
        .facet(
            column=alt.Column(
                "dimension:N", title=None, header=alt.Header(labelExpr="'per ' + datum.value")
            ),
            title=opts.title,
        )
        .resolve_scale(y="independent", x="independent")
    )


def quarantine_reasons(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Rejected input records by reason; a one-record reason still shows a bar, and each
    bar is labelled with its count.

    Expects: reason, source_format, num_records.
    """
    per = (
        df.group_by("reason", "source_format", maintain_order=True).agg(pl.col("num_records").sum())
        if df.height
        else df
    )
    drawn = min_visible(per, "num_records")
    base = alt.Chart(values(drawn)).encode(
        y=alt.Y("reason:N", title="reason", sort="-x", axis=alt.Axis(labelLimit=360)),
    )
    bars = base.mark_bar().encode(
        x=alt.X("num_records_drawn:Q", title="records rejected", stack=True),
        color=alt.Color("source_format:N", title="log format"),
        tooltip=[
            alt.Tooltip("reason:N"),
            alt.Tooltip("source_format:N", title="log format"),
            alt.Tooltip("num_records:Q", title="records", format=","),
        ],
    )
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#333").encode(
        x=alt.X("sum(num_records_drawn):Q"), text=alt.Text("sum(num_records):Q", format=",")
    )
    return alt.layer(bars, labels, title=opts.title).properties(width=WIDTH - 200)
