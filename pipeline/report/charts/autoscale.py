"""Charts of the report's autoscaling section: replicas over time beside the arrivals."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import HEIGHT, WIDTH, AnyChart, ChartOptions, values

MAX_PANELS = 12  # autoscaled scenarios or pools drawn; the table lists them all


def autoscale_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """One panel per autoscaled scenario or pool (the query's ``label``): active and
    starting replicas as steps (left axis) over the requests arriving per bucket (grey
    bars, right axis), on the replay's clock.

    Expects the rows of autoscale_timeline.sql (label, measure: active | starting |
    arrivals, t_s, value, bucket_s).
    """
    labels = [str(x) for x in df["label"].unique(maintain_order=True).to_list()][:MAX_PANELS]
    title = opts.title
    if df["label"].n_unique() > MAX_PANELS:
        title = f"{title} (the first {MAX_PANELS}; the table has every one)"
    panels: list[alt.LayerChart] = []
    for label in labels:
        part = df.filter(pl.col("label") == label)
        arrivals = part.filter(pl.col("measure") == "arrivals")
        replicas = part.filter(pl.col("measure") != "arrivals").with_columns(
            pl.col("measure").replace_strict(
                {"active": "active replicas", "starting": "starting replicas"}
            )
        )
        bucket = float(arrivals["bucket_s"][0]) if arrivals.height else 0.0
        bars = (
            alt.Chart(values(arrivals.with_columns((pl.col("t_s") + bucket).alias("t_end_s"))))
            .mark_rect(color="#bbbbbb", opacity=0.6)
            .encode(
                x=alt.X("t_s:Q", title="simulated time (s)"),
                x2="t_end_s:Q",
                y=alt.Y("value:Q", title=f"requests arriving per {bucket:g} s"),
                tooltip=[
                    alt.Tooltip("t_s:Q", title="from (s)", format=",.0f"),
                    alt.Tooltip("value:Q", title="requests", format=",.0f"),
                ],
            )
        )
        steps = (
            alt.Chart(values(replicas))
            .mark_line(interpolate="step-after")
            .encode(
                x=alt.X("t_s:Q"),
                y=alt.Y("value:Q", title="replicas"),
                color=alt.Color(
                    "measure:N",
                    title=None,
                    scale=alt.Scale(
                        domain=["active replicas", "starting replicas"],
                        range=["#1f77b4", "#ff7f0e"],
                    ),
                ),
                tooltip=[
                    alt.Tooltip("measure:N"),
                    alt.Tooltip("t_s:Q", title="from (s)", format=",.1f"),
                    alt.Tooltip("value:Q", title="replicas", format=",.0f"),
                ],
            )
        )
        panels.append(
            alt.layer(bars, steps, title=label)
            .resolve_scale(y="independent")
            .properties(width=WIDTH, height=HEIGHT // 2 + 40)
        )
    if not panels:
        return alt.Chart(values(df)).mark_point().properties(title=title)
    return alt.vconcat(*panels, title=title)
