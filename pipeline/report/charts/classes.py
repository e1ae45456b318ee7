"""Charts of the report's per-class section: one small chart per traffic class (each tenant,
each model), its TTFT percentiles per scenario against the SLOs that judge that class."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    SLO_COLOR,
    WIDTH,
    AnyChart,
    ChartOptions,
    scale_for,
    scale_title,
    values,
)
from pipeline.report.layout import natural_sorted

_PERCENTILES = ("p50", "p90", "p99")
MANY = 30  # scenarios past which a panel's rows are too thin to name each


def class_panels(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Small multiples, one panel per class: each scenario's p50, p90 and p99 TTFT over that
    class's requests (log axis when they spread), and a red rule per TTFT percentile SLO
    that judges the class (unscoped, or scoped to it), named with its scope.

    Expects the rows of class_slos.sql (class_label, scenario, ttft_p50_s, ttft_p90_s,
    ttft_p99_s, is_first, slo, slo_label, metric, stat, limit_s).
    """
    return panels(df, opts, "class_label", "class")


def panels(
    df: pl.DataFrame,
    opts: ChartOptions,
    label: str,
    noun: str,
    order: list[str] | None = None,
) -> AnyChart:
    """One panel per value of column ``label`` (a class, a pool): each scenario's p50, p90
    and p99 TTFT over its requests, and a red rule per TTFT percentile SLO in its rows;
    ``noun`` names what a panel is in the axis title and tooltips; the panels in
    ``order`` (default: natural order of their labels)."""
    firsts = df.filter(pl.col("is_first"))
    points = (
        firsts.unpivot(
            index=[label, "scenario"],
            on=[f"ttft_{p}_s" for p in _PERCENTILES],
            variable_name="percentile",
            value_name="value_s",
        )
        .with_columns(pl.col("percentile").str.slice(5, 3), pl.lit("point").alias("layer"))
        .filter(pl.col("value_s") > 0)
    )
    rules = (
        df.filter((pl.col("metric") == "ttft") & pl.col("stat").is_in(list(_PERCENTILES)))
        .select(label, "slo_label", "limit_s")
        .unique()
        .sort(label, "limit_s")
        # each SLO's label a line below the one before it in its panel
        .with_columns(
            pl.lit("rule").alias("layer"),
            (pl.int_range(pl.len()).over(label) * 13 + 2).alias("label_dy"),
        )
    )
    drawn = pl.concat([points, rules], how="diagonal_relaxed")
    scale = scale_for(pl.concat([points["value_s"], rules["limit_s"]]))
    names = natural_sorted(set(points["scenario"].to_list()))
    many = len(names) > MANY
    x = alt.X(
        "value_s:Q", title=scale_title(f"TTFT of the {noun}'s requests (s)", scale), scale=scale
    )
    dots = (
        alt.Chart()
        .transform_filter("datum.layer === 'point'")
        .mark_point(filled=True, size=30 if many else 45)
        .encode(
            x=x,
            y=alt.Y(
                "scenario:N",
                title=f"{len(names)} scenarios (hover for names)" if many else None,
                sort=names,
                axis=alt.Axis(labels=not many, ticks=not many, labelLimit=160),
            ),
            color=alt.Color("percentile:N", sort=list(_PERCENTILES), title="percentile"),
            tooltip=[
                alt.Tooltip(f"{label}:N", title=noun),
                alt.Tooltip("scenario:N"),
                alt.Tooltip("percentile:N"),
                alt.Tooltip("value_s:Q", title="TTFT (s)", format=".4~g"),
            ],
        )
    )
    limit = (
        alt.Chart()
        .transform_filter("datum.layer === 'rule'")
        .mark_rule(color=SLO_COLOR, strokeDash=[4, 3])
        .encode(
            x=alt.X("limit_s:Q", scale=scale), tooltip=[alt.Tooltip("slo_label:N", title="SLO")]
        )
    )
    slo_text = (
        alt.Chart()
        .transform_filter("datum.layer === 'rule'")
        .mark_text(
            align="left",
            baseline="top",
            dx=3,
            dy=alt.ExprRef("datum.label_dy"),
            color=SLO_COLOR,
            fontSize=11,
        )
        .encode(x=alt.X("limit_s:Q", scale=scale), y=alt.value(0), text="slo_label:N")
    )
    names_of_panels = order or natural_sorted(set(drawn[label].to_list()))
    # room for the SLO labels under the panel's top even with one scenario
    counts = rules.group_by(label).len()["len"].to_list()
    per_panel = max(counts, default=0)
    height = max(13 * per_panel + 40, len(names) * (5 if many else 14))
    return (
        alt.layer(dots, limit, slo_text, data=values(drawn))
        .properties(width=WIDTH // 2 - 70, height=height)
        .facet(
            facet=alt.Facet(
                f"{label}:N",
                title=None,
                sort=names_of_panels,
                header=alt.Header(labelFontWeight="bold", labelFontSize=12, labelLimit=WIDTH),
            ),
            columns=2,
            title=opts.title,
        )
        .resolve_scale(x="independent")
    )
