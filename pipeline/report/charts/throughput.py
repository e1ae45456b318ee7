"""The chart of the report's throughput section: requests/s and tokens/s per scenario."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    FADED,
    FOCUS,
    LEGEND_PICK,
    WIDTH,
    AnyChart,
    ChartOptions,
    values,
    with_layout,
)


def throughput(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests/s and tokens/s per scenario as horizontal bars (names stay readable at 100
    scenarios), coloured static vs continuous batching, scenarios in natural order.

    Expects: scenario, batching, requests_per_s, output_tokens_per_s, total_tokens_per_s.
    """
    panels = {
        "requests_per_s": "throughput (requests/s)",
        "output_tokens_per_s": "output tokens/s",
        "total_tokens_per_s": "prompt + output tokens/s",
    }
    long = (
        with_layout(df, opts)
        .unpivot(
            index=["scenario", "batching", "series"],
            on=list(panels),
            variable_name="measure",
            value_name="per_s",
        )
        .with_columns(pl.col("measure").replace_strict(panels))
    )
    order = list(opts.grid.scenarios) or sorted(df["scenario"].to_list())
    pick = alt.selection_point(fields=["batching"], bind="legend", name=LEGEND_PICK)
    bars = (
        alt.Chart(
            values(long), width=WIDTH // 3 - 60, height=alt.Step(14 if len(order) > 12 else 20)
        )
        .mark_bar()
        .encode(
            y=alt.Y("scenario:N", title=None, sort=order, axis=alt.Axis(labelLimit=220)),
            x=alt.X("per_s:Q", title=None),
            color=alt.Color(
                "batching:N", title="batching", scale=alt.Scale(domain=["static", "continuous"])
            ),
            opacity={
                "condition": {
                    "test": {
                        "and": [
                            {"param": LEGEND_PICK, "empty": True},
                            f"{FOCUS} === '' || datum.scenario === {FOCUS}",
                        ]
                    },
                    "value": 1,
                },
                "value": FADED,
            },
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("batching:N"),
                alt.Tooltip("measure:N"),
                alt.Tooltip("per_s:Q", title="per second", format=",.2f"),
            ],
        )
        .add_params(pick, alt.param(name=FOCUS, value=""))
    )
    return bars.facet(
        column=alt.Column("measure:N", title=None, sort=list(panels.values())), title=opts.title
    ).resolve_scale(x="independent")
