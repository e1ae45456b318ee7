"""The chart of the report's run comparison: run A and run B, metric by metric."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import FADED, LEGEND_PICK, WIDTH, AnyChart, ChartOptions, values
from pipeline.report.layout import natural_sorted


def compare_runs(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Run A's and run B's value of each metric per scenario, side by side, one panel per
    metric (its own scale).

    Expects: run_a, run_b, scenario, metric, value_a, value_b, change, metric_order.
    """
    names = {"value_a": f"A: {df['run_a'][0]}", "value_b": f"B: {df['run_b'][0]}"}
    long = df.unpivot(
        index=["scenario", "metric", "metric_order", "change"],
        on=["value_a", "value_b"],
        variable_name="run",
        value_name="value",
    ).with_columns(pl.col("run").replace_strict(names))
    metrics = df.select("metric", "metric_order").unique().sort("metric_order")["metric"].to_list()
    order = natural_sorted(set(df["scenario"].to_list()))
    pick = alt.selection_point(fields=["run"], bind="legend", name=LEGEND_PICK)
    return (
        alt.Chart(values(long), width=WIDTH // 3 - 50, height=alt.Step(10))
        .mark_bar()
        .encode(
            y=alt.Y("scenario:N", title=None, sort=order, axis=alt.Axis(labelLimit=160)),
            yOffset=alt.YOffset("run:N"),
            x=alt.X("value:Q", title=None),
            color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=320)),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(FADED)),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("metric:N"),
                alt.Tooltip("run:N"),
                alt.Tooltip("value:Q", format=",.4~g"),
                alt.Tooltip("change:Q", title="B - A", format="+,.4~g"),
            ],
        )
        .add_params(pick)
        .facet(facet=alt.Facet("metric:N", title=None, sort=metrics), columns=3, title=opts.title)
        .resolve_scale(x="independent", y="independent")
    )
