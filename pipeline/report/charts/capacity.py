"""Charts of the report's SLO capacity section: each SLO along each sweep, and every probe of
each capacity search."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import (
    FADED,
    HEIGHT,
    LEGEND_PICK,
    WIDTH,
    AnyChart,
    ChartOptions,
    scale_for,
    scale_title,
    values,
)
from pipeline.report.layout import natural_sorted


def slo_capacity(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Each SLO along each sweep: the measured statistic of the SLO's scope (p99 TTFT of
    every request, of tenant chat, of prompts over 2000 tokens, ...) per sweep point, the
    SLO's limit as a rule, one row of panels per SLO (its name and scope in the header);
    a cross marks a point that misses that SLO, a ring the sweep's capacity (the highest
    point meeting every SLO; the lowest for the swap space and k); the tooltip lists the
    SLOs a point meets and misses. One chart per kind of sweep the run has, two side by
    side.

    Expects the rows of slo_capacity.sql: sweep (concurrency | rate | swap_space | spec_k),
    sweep_id,
    sweep_label, scenario, value, slo, slo_label, limit_s, measured_s, scope_requests,
    meets_slo, slos_met, slos_missed, is_capacity.
    """
    axis = {
        "concurrency": ("concurrency cap (max_num_seqs / max_batch_size)", "log"),
        "rate": ("offered load (requests/s)", "linear"),
        "swap_space": ("host swap space (GiB per GPU)", "linear"),
        "spec_k": ("draft tokens per step (k)", "linear"),
    }
    labels = natural_sorted(set(df["slo_label"].to_list())) if df.height else []
    charts = []
    for kind in axis:
        part = df.filter(
            (pl.col("sweep") == kind) & pl.col("measured_s").is_not_null()
        ).with_columns(
            (pl.col("sweep_id").cast(pl.String) + ": " + pl.col("sweep_label")).alias("sweep_name"),
            pl.col("slos_met").fill_null("none"),
            pl.col("slos_missed").fill_null("none"),
        )
        if part.is_empty():
            continue
        names = natural_sorted(set(part["sweep_name"].to_list()))
        title, scale = axis[kind]
        x_scale = alt.Scale(type="log", base=2) if scale == "log" else alt.Scale(zero=False)
        y_scale = alt.Scale(type="log")
        x = alt.X("value:Q", title=title, scale=x_scale)
        line = (
            alt.Chart()
            .mark_line(point=False)
            .encode(
                x=x,
                y=alt.Y("measured_s:Q", title="the SLO's statistic (s, log scale)", scale=y_scale),
                color=alt.Color(
                    "sweep_name:N",
                    title=f"{kind} sweep (what it holds fixed)",
                    sort=names,
                    scale=alt.Scale(
                        domain=names, scheme="tableau20" if len(names) > 10 else "tableau10"
                    ),
                    legend=alt.Legend(
                        orient="bottom",
                        direction="vertical",
                        labelLimit=WIDTH,
                        titleLimit=WIDTH,
                        symbolLimit=0,
                    ),
                ),
                detail="slo:N",
            )
        )
        points = (
            alt.Chart()
            .mark_point(size=60, filled=True)
            .encode(
                x=x,
                y=alt.Y("measured_s:Q", scale=y_scale),
                color=alt.Color(
                    "sweep_name:N",
                    sort=names,
                    legend=None,
                    scale=alt.Scale(
                        domain=names, scheme="tableau20" if len(names) > 10 else "tableau10"
                    ),
                ),
                shape=alt.Shape(
                    "meets_slo:N",
                    title="this SLO",
                    scale=alt.Scale(domain=[True, False], range=["circle", "cross"]),
                    legend=alt.Legend(labelExpr="datum.value ? 'met' : 'missed'"),
                ),
                tooltip=[
                    alt.Tooltip("sweep_name:N", title="sweep"),
                    alt.Tooltip("scenario:N"),
                    alt.Tooltip("value:Q", title=title, format=",.3~f"),
                    alt.Tooltip("slo_label:N", title="SLO"),
                    alt.Tooltip("measured_s:Q", title="measured (s)", format=".4~g"),
                    alt.Tooltip("scope_requests:Q", title="requests in scope", format=","),
                    alt.Tooltip("slos_met:N", title="SLOs met here"),
                    alt.Tooltip("slos_missed:N", title="SLOs missed here"),
                ],
            )
        )
        ring = (
            alt.Chart()
            .transform_filter("datum.is_capacity")
            .mark_point(size=260, shape="circle", filled=False, strokeWidth=2, color="#222")
            .encode(x=x, y=alt.Y("measured_s:Q", scale=y_scale))
        )
        rule = (
            alt.Chart()
            .mark_rule(color="#b00", strokeDash=[4, 3])
            .encode(
                y=alt.Y("max(limit_s):Q", scale=y_scale),
                tooltip=[alt.Tooltip("max(limit_s):Q", title="limit (s)", format=".4~g")],
            )
        )
        charts.append(
            alt.layer(line, points, ring, rule, data=values(part))
            .properties(width=WIDTH // 2 - 30, height=HEIGHT // 2 if len(labels) > 1 else HEIGHT)
            .facet(
                row=alt.Row(
                    "slo_label:N",
                    title=None,
                    sort=labels,
                    header=alt.Header(
                        labelAngle=0,
                        labelOrient="top",
                        labelAnchor="start",
                        labelPadding=2,
                        labelFontSize=12,
                        labelFontWeight="bold",
                        labelLimit=WIDTH,
                    ),
                ),
                spacing=40,
                title=f"{kind} sweeps",
            )
            .resolve_scale(y="independent")
        )
    if len(charts) <= 2:
        return alt.hconcat(*charts, title=opts.title).resolve_scale(color="independent")
    rows = [
        alt.hconcat(*charts[i : i + 2]).resolve_scale(color="independent")
        for i in range(0, len(charts), 2)
    ]
    return alt.vconcat(*rows, title=opts.title).resolve_scale(color="independent")


def capacity_probes(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Each capacity search's probes: the measured statistic over its SLO limit (1 is the
    limit), one colour per SLO, the answer ringed; one panel per search. With intervals,
    a bar through each probe spans its statistic's 90% interval and a band the answer's.

    Expects: search, knob, probe, value, scenario, slo, limit_s, measured_s, met,
    is_answer, and optionally measured_lo_s, measured_hi_s, answer_lo, answer_hi (the rows
    of capacity_search.sql).
    """
    if "measured_lo_s" not in df.columns:  # a frame from before intervals
        df = df.with_columns(
            *(
                pl.lit(None, pl.Float64).alias(c)
                for c in ("measured_lo_s", "measured_hi_s", "answer_lo", "answer_hi")
            )
        )
    drawn = df.with_columns(
        (pl.col("measured_s") / pl.col("limit_s")).alias("share_of_limit"),
        (pl.col("measured_lo_s") / pl.col("limit_s")).alias("share_lo"),
        (pl.col("measured_hi_s") / pl.col("limit_s")).alias("share_hi"),
        (pl.col("search") + " (" + pl.col("knob") + ")").alias("panel"),
    ).filter(pl.col("share_of_limit").is_not_null())
    y_scale = scale_for(
        pl.concat([drawn["share_of_limit"], drawn["share_lo"], drawn["share_hi"], pl.Series([1.0])])
    )
    slos = natural_sorted(set(drawn["slo"].to_list()))
    base = alt.Chart()
    pick = alt.selection_point(fields=["slo"], bind="legend", name=LEGEND_PICK)
    points = (
        base.mark_point(filled=True, size=60)
        .encode(
            x=alt.X(
                "value:Q",
                title="knob value (cap, requests/s or replicas)",
                scale=alt.Scale(type="log"),
            ),
            y=alt.Y(
                "share_of_limit:Q", title=scale_title("measured / limit", y_scale), scale=y_scale
            ),
            color=alt.Color("slo:N", title="SLO", sort=slos, scale=alt.Scale(domain=slos)),
            shape=alt.Shape(
                "met:N",
                title="every SLO met",
                scale=alt.Scale(domain=[True, False], range=["circle", "cross"]),
            ),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(FADED)),
            tooltip=[
                alt.Tooltip("search:N"),
                alt.Tooltip("probe:Q"),
                alt.Tooltip("scenario:N"),
                alt.Tooltip("knob:N"),
                alt.Tooltip("value:Q", format=",.4~g"),
                alt.Tooltip("slo:N", title="SLO"),
                alt.Tooltip("measured_s:Q", title="measured (s)", format=".4~g"),
                alt.Tooltip("limit_s:Q", title="limit (s)", format=".4~g"),
                alt.Tooltip("met:N", title="every SLO met"),
            ],
        )
        .add_params(pick)
    )
    ring = (
        base.transform_filter("datum.is_answer")
        .mark_point(size=260, shape="circle", filled=False, strokeWidth=2, color="#222")
        .encode(x="value:Q", y="share_of_limit:Q")
    )
    bars = (
        base.transform_filter("isValid(datum.share_lo)")
        .mark_rule(strokeWidth=1.5)
        .encode(
            x="value:Q",
            y=alt.Y("share_lo:Q", scale=y_scale),
            y2="share_hi:Q",
            color=alt.Color("slo:N", sort=slos, scale=alt.Scale(domain=slos)),
            opacity=alt.condition(pick, alt.value(0.7), alt.value(FADED)),
        )
    )
    # the answer's interval: a band across the panel, at the answer's rows only
    band = (
        base.transform_filter("datum.is_answer && isValid(datum.answer_lo)")
        .mark_rect(color="#4c78a8", opacity=0.12)
        .encode(x="answer_lo:Q", x2="answer_hi:Q")
    )
    limit = base.mark_rule(color="#b00", strokeDash=[4, 3]).encode(y=alt.datum(1.0))
    panels = natural_sorted(set(drawn["panel"].to_list()))
    return (
        alt.layer(band, bars, points, ring, limit, data=values(drawn))
        .properties(width=WIDTH // 3 - 40, height=HEIGHT - 40)
        .facet(column=alt.Column("panel:N", title=None, sort=panels), title=opts.title)
        .resolve_scale(x="independent")
    )
