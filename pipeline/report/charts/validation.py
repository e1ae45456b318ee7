"""Charts of the report's live validation: TTFT and TPOT CDFs live and simulated, and TTFT per
request simulated against live."""

from __future__ import annotations

import altair as alt
import polars as pl

from pipeline.report.charts.common import HEIGHT, WIDTH, AnyChart, ChartOptions, values


def validation_cdf(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Live and simulated CDFs of one latency metric overlaid, log time axis.

    Expects: metric, source (live, simulated), value_s, cdf (sql/validation_cdf.sql);
    ``opts.extra["metric"]`` picks the metric (ttft, tpot, e2e), ``opts.extra["axis"]``
    labels the time axis.
    """
    metric = opts.extra.get("metric", "ttft")
    axis = opts.extra.get("axis", "time (s)")
    drawn = df.filter((pl.col("metric") == metric) & (pl.col("value_s") > 0))
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("value_s:Q", title=f"{axis}, log scale", scale=alt.Scale(type="log")),
            y=alt.Y("cdf:Q", title="fraction of requests at or below", axis=alt.Axis(format="%")),
            color=alt.Color(
                "source:N",
                title="",
                scale=alt.Scale(domain=["live", "simulated"], range=["#1f77b4", "#ff7f0e"]),
            ),
            strokeDash=alt.StrokeDash(
                "source:N", scale=alt.Scale(domain=["live", "simulated"], range=[[1, 0], [6, 3]])
            ),
            tooltip=[
                alt.Tooltip("source:N"),
                alt.Tooltip("value_s:Q", title=f"{axis}, at most", format=".4~g"),
                alt.Tooltip("cdf:Q", title="share of requests", format=".3~%"),
            ],
        )
        .properties(width=WIDTH, height=HEIGHT)
    )


def validation_scatter(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Per request, simulated against live latency (log-log), with the line y = x.

    Expects: request_id, live_<metric>_s, sim_<metric>_s, <metric>_error
    (sql/validation_requests.sql); ``opts.extra["metric"]`` picks ttft, tpot or e2e.
    """
    metric = opts.extra.get("metric", "ttft")
    axis = opts.extra.get("axis", "time (s)")
    live, sim, err = f"live_{metric}_s", f"sim_{metric}_s", f"{metric}_error"
    drawn = df.select("request_id", "prompt_tokens", live, sim, err).filter(
        (pl.col(live) > 0) & (pl.col(sim) > 0)
    )
    lo = min(drawn[live].min() or 1e-3, drawn[sim].min() or 1e-3) if drawn.height else 1e-3
    hi = max(drawn[live].max() or 1.0, drawn[sim].max() or 1.0) if drawn.height else 1.0
    diagonal = pl.DataFrame({live: [lo, hi], sim: [lo, hi]})
    scale = alt.Scale(type="log")
    points = (
        alt.Chart(values(drawn))
        .mark_circle(size=28, opacity=0.6)
        .encode(
            x=alt.X(f"{live}:Q", title=f"live {axis}, log scale", scale=scale),
            y=alt.Y(f"{sim}:Q", title=f"simulated {axis}, log scale", scale=scale),
            tooltip=[
                alt.Tooltip("request_id:N", title="request"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
                alt.Tooltip(f"{live}:Q", title="live", format=".4~g"),
                alt.Tooltip(f"{sim}:Q", title="simulated", format=".4~g"),
                alt.Tooltip(f"{err}:Q", title="error", format="+.1%"),
            ],
        )
    )
    line = (
        alt.Chart(values(diagonal))
        .mark_line(color="#888", strokeDash=[4, 4])
        .encode(x=f"{live}:Q", y=f"{sim}:Q")
    )
    return alt.layer(line, points, title=opts.title).properties(width=WIDTH, height=HEIGHT)
