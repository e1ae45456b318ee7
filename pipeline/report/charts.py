"""Chart functions: one aggregated frame in, one Altair chart out.

They do no I/O and run no SQL: ``pipeline.report`` runs ``sql/<query>.sql`` and
hands the frame to the chart named next to it in ``reports/<report>.toml``.
Each function documents the columns it expects (the query's output columns).
Display labels ("TTFT (s)") live here and in the report definition only; the
columns keep their unit-suffixed names.

Data is inlined as plain values (``alt.Data(values=...)``) so a chart's spec is
self-contained and no row limit of Altair's data transformers applies; the
queries already aggregate, so a chart never carries per-request rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import altair as alt
import polars as pl

AnyChart = alt.Chart | alt.LayerChart | alt.HConcatChart | alt.VConcatChart | alt.FacetChart

WIDTH = 640  # px of a full-width chart
HEIGHT = 260  # px of one panel


@dataclass(frozen=True)
class ChartOptions:
    """What a chart needs beyond its frame."""

    title: str
    scenarios: tuple[str, ...] = ()  # every scenario of the run, for stable colours
    slo_ttft_s: float = 0.2  # drawn as a rule on TTFT-against-something charts
    extra: dict[str, Any] = field(default_factory=dict)  # chart-specific settings


def values(df: pl.DataFrame) -> alt.Data:
    """The frame as inline JSON values: times as ISO-8601 UTC strings, NaN as null."""
    exprs = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, pl.Datetime):
            col = pl.col(name)
            if dtype.time_zone:
                col = col.dt.convert_time_zone("UTC")
            exprs.append(col.dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
        elif dtype == pl.Date:
            exprs.append(pl.col(name).dt.strftime("%Y-%m-%d"))
        elif dtype.is_float():
            exprs.append(pl.col(name).fill_nan(None))
        elif dtype.is_decimal():
            exprs.append(pl.col(name).cast(pl.Float64))
    rows = df.with_columns(exprs).to_dicts() if exprs else df.to_dicts()
    return alt.Data(values=[{k: _clean(v) for k, v in r.items()} for r in rows])


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _scenario_color(opts: ChartOptions, field_name: str = "scenario") -> alt.Color:
    scale = alt.Scale(domain=list(opts.scenarios)) if opts.scenarios else alt.Undefined
    return alt.Color(f"{field_name}:N", title="scenario", scale=scale)


def _slo_rule(opts: ChartOptions) -> alt.Chart:
    return (
        alt.Chart(alt.Data(values=[{"slo_ttft_s": opts.slo_ttft_s}]))
        .mark_rule(color="#b00", strokeDash=[4, 3])
        .encode(y=alt.Y("slo_ttft_s:Q"), tooltip=[alt.Tooltip("slo_ttft_s:Q", title="SLO (s)")])
    )


def arrival_rate(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests per second over wall-clock time.

    Expects: bucket_start (UTC), bucket_s, num_requests, requests_per_s, prompt_tokens_per_s.
    """
    return (
        alt.Chart(values(df), title=opts.title)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start:T", title="arrival time (UTC)", scale=alt.Scale(type="utc")),
            y=alt.Y("requests_per_s:Q", title="arrivals (requests/s)"),
            tooltip=[
                alt.Tooltip(
                    "bucket_start:T", title="bucket start (UTC)", format="%Y-%m-%d %H:%M:%S"
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
        )  # fmt: skip
        .facet(
            column=alt.Column(
                "kind:N",
                title=None,
                sort=["prompt", "output"],
                header=alt.Header(labelExpr="datum.value + ' tokens'"),
            ),
            title=opts.title,
        )  # fmt: skip
        .resolve_scale(x="independent", y="independent")
    )


def trace_groups(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests per model and per tenant, side by side.

    Expects: dimension (model | tenant), group_name, num_requests, prompt_tokens, share.
    """
    return (
        alt.Chart(values(df), width=WIDTH // 2 - 80)
        .mark_bar()
        .encode(
            y=alt.Y("group_name:N", title=None, sort="-x", axis=alt.Axis(labelLimit=200)),
            x=alt.X("num_requests:Q", title="requests"),
            color=alt.Color("dimension:N", legend=None),
            tooltip=[
                alt.Tooltip("dimension:N"),
                alt.Tooltip("group_name:N", title="group"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
                alt.Tooltip("share:Q", title="share of requests", format=".1%"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
            ],
        )
        .facet(column=alt.Column("dimension:N", title=None, header=alt.Header(
            labelExpr="'per ' + datum.value")), title=opts.title)
        .resolve_scale(y="independent", x="independent")
    )  # fmt: skip


def quarantine_reasons(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Rejected input records by reason.

    Expects: reason, source_format, num_records.
    """
    return (
        alt.Chart(values(df), title=opts.title)
        .mark_bar()
        .encode(
            y=alt.Y("reason:N", title="reason", sort="-x", axis=alt.Axis(labelLimit=360)),
            x=alt.X("sum(num_records):Q", title="records rejected"),
            color=alt.Color("source_format:N", title="log format"),
            tooltip=[
                alt.Tooltip("reason:N"),
                alt.Tooltip("source_format:N", title="log format"),
                alt.Tooltip("num_records:Q", title="records", format=","),
            ],
        )
        .properties(width=WIDTH - 200)
    )


def throughput(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Requests/s and tokens/s per scenario, coloured static vs continuous batching.

    Expects: scenario, batching, requests_per_s, output_tokens_per_s, total_tokens_per_s.
    """
    panels = [
        ("requests_per_s", "throughput (requests/s)"),
        ("output_tokens_per_s", "output tokens/s"),
        ("total_tokens_per_s", "prompt + output tokens/s"),
    ]
    data = values(df)
    charts = [
        alt.Chart(data, width=WIDTH // 3 - 30, height=HEIGHT)
        .mark_bar()
        .encode(
            x=alt.X("scenario:N", title="scenario", sort=list(opts.scenarios) or "ascending"),
            y=alt.Y(f"{col}:Q", title=label),
            color=alt.Color(
                "batching:N", title="batching", scale=alt.Scale(domain=["static", "continuous"])
            ),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("batching:N"),
                alt.Tooltip(f"{col}:Q", title=label, format=",.2f"),
            ],
        )  # fmt: skip
        for col, label in panels
    ]
    return alt.hconcat(*charts, title=opts.title)


def ttft_by_queue_depth(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p50 (dashed) and p99 TTFT by the queue depth met on arrival, one colour per scenario.

    Expects: scenario, queue_depth_lo, queue_depth_hi, num_requests, p50_ttft_s, p99_ttft_s.
    """
    long = df.unpivot(
        index=["scenario", "queue_depth_lo", "queue_depth_hi", "num_requests"],
        on=["p50_ttft_s", "p99_ttft_s"],
        variable_name="percentile",
        value_name="ttft_s",
    ).with_columns(pl.col("percentile").replace({"p50_ttft_s": "p50", "p99_ttft_s": "p99"}))
    lines = (
        alt.Chart(values(long))
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "queue_depth_lo:Q",
                title="queue depth met on arrival (requests waiting)",
                scale=alt.Scale(type="symlog"),
            ),
            y=alt.Y("ttft_s:Q", title="TTFT (s, log scale)", scale=alt.Scale(type="log")),
            color=_scenario_color(opts),
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
        )  # fmt: skip
    )
    return alt.layer(lines, _slo_rule(opts), title=opts.title).properties(
        width=WIDTH, height=HEIGHT
    )


def ttft_vs_concurrency_cap(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p99 TTFT against the concurrency cap, one point per scenario, lines per policy.

    Expects: scenario, policy, max_concurrency, offered_requests_per_s, p99_ttft_s.
    """
    points = (
        alt.Chart(values(df))
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=alt.X(
                "max_concurrency:Q",
                title="concurrency cap (max_num_seqs / max_batch_size)",
                scale=alt.Scale(type="log", base=2),
            ),
            y=alt.Y("p99_ttft_s:Q", title="p99 TTFT (s, log scale)", scale=alt.Scale(type="log")),
            color=alt.Color("policy:N", title="policy"),
            detail="offered_requests_per_s:Q",
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("policy:N"),
                alt.Tooltip("max_concurrency:Q", title="concurrency cap"),
                alt.Tooltip(
                    "offered_requests_per_s:Q", title="offered (requests/s)", format=".3~f"
                ),
                alt.Tooltip("p99_ttft_s:Q", title="p99 TTFT (s)", format=".4~f"),
            ],
        )  # fmt: skip
    )
    return alt.layer(points, _slo_rule(opts), title=opts.title).properties(
        width=WIDTH, height=HEIGHT
    )


def latency_cdf(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Empirical CDF of one latency metric per scenario, log time axis.

    Expects: scenario, metric, value_s, num_requests, fraction; ``opts.extra["metric"]``
    picks the metric (ttft_s or tpot_s) and ``opts.extra["axis"]`` labels the time axis.
    """
    metric = opts.extra.get("metric", "ttft_s")
    axis = opts.extra.get("axis", "time (s)")
    drawn = df.filter(pl.col("metric") == metric)
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_line()
        .encode(
            x=alt.X("value_s:Q", title=f"{axis}, log scale", scale=alt.Scale(type="log")),
            y=alt.Y(
                "fraction:Q", title="fraction of requests at or below", axis=alt.Axis(format="%")
            ),
            color=_scenario_color(opts),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("value_s:Q", title=f"{axis}, at most", format=".4~g"),
                alt.Tooltip("fraction:Q", title="share of requests", format=".3~%"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
            ],
        )  # fmt: skip
        .properties(width=WIDTH, height=HEIGHT)
    )


def engine_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """KV usage, running, waiting and preemptions over simulated time, stacked panels.

    Expects: scenario, bucket_start_s, bucket_s, kv_usage, mean_running, mean_waiting,
    max_waiting, num_preemptions.
    """
    data = values(df)
    x = alt.X("bucket_start_s:Q", title="simulated time (s)")
    tip = [alt.Tooltip("scenario:N"), alt.Tooltip("bucket_start_s:Q", title="bucket start (s)")]

    def panel(col: str, label: str, fmt: str, mark: str = "line") -> alt.Chart:
        chart = alt.Chart(data, width=WIDTH, height=HEIGHT // 2 + 20)
        enc: dict[str, Any] = {
            "x": x,
            "y": alt.Y(f"{col}:Q", title=label, axis=alt.Axis(format=fmt)),
            "color": _scenario_color(opts),
            "tooltip": [*tip, alt.Tooltip(f"{col}:Q", title=label, format=fmt)],
        }
        if mark == "bar":  # a bar spans its bucket
            chart = chart.transform_calculate(
                bucket_end_s="datum.bucket_start_s + datum.bucket_s"
            ).mark_bar(opacity=0.8)
            enc["x2"] = "bucket_end_s:Q"
        else:
            chart = chart.mark_line(interpolate="step-after")
        return chart.encode(**enc)

    return alt.vconcat(
        panel("kv_usage", "KV cache used (share of blocks)", ".0%"),
        panel("mean_running", "running requests (mean)", ",.1f"),
        panel("mean_waiting", "waiting requests (mean)", ",.1f"),
        panel("num_preemptions", "preemptions (per bucket)", ",d", mark="bar"),
        title=opts.title,
    )


def prefix_hit_rate_overall(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted prefix-cache hit rate per scenario (scenarios without lookups left out).

    Expects: scenario, hit_rate, query_tokens, hit_tokens.
    """
    drawn = df.filter(pl.col("hit_rate").is_not_null())
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_bar()
        .encode(
            y=alt.Y("scenario:N", title="scenario", sort=list(opts.scenarios) or "ascending"),
            x=alt.X(
                "hit_rate:Q",
                title="prefix-cache hit rate (hit tokens / looked-up tokens)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=_scenario_color(opts),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("hit_tokens:Q", title="hit tokens", format=","),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )  # fmt: skip
        .properties(width=WIDTH - 160)
    )


def prefix_hit_rate_over_time(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted hit rate per time bucket, one line per scenario.

    Expects: scenario, bucket_start_s, query_tokens, hit_tokens, hit_rate.
    """
    return (
        alt.Chart(values(df), title=opts.title)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start_s:Q", title="simulated time (s)"),
            y=alt.Y(
                "hit_rate:Q",
                title="hit rate (hit / looked-up tokens)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=_scenario_color(opts),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )  # fmt: skip
        .properties(width=WIDTH, height=HEIGHT)
    )


def prefix_hit_rate_by_cache_size(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Hit rate against the KV cache capacity of one replica, one point per scenario.

    Expects: scenario, policy, cache_tokens, hit_rate.
    """
    drawn = df.filter(pl.col("hit_rate").is_not_null() & pl.col("cache_tokens").is_not_null())
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=alt.X(
                "cache_tokens:Q",
                title="KV cache per replica (tokens, log scale)",
                scale=alt.Scale(type="log", base=2),
            ),
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
        )  # fmt: skip
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
            yOffset=alt.YOffset("scenario:N", sort=list(opts.scenarios) or "ascending"),
            x=alt.X(
                "hit_rate:Q",
                title="cached / prompt tokens",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=_scenario_color(opts),
            tooltip=[
                alt.Tooltip("dimension:N"),
                alt.Tooltip("group_name:N", title="group"),
                alt.Tooltip("scenario:N"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens", format=","),
                alt.Tooltip("cached_tokens:Q", title="cached tokens", format=","),
            ],
        )  # fmt: skip
        .facet(
            column=alt.Column(
                "dimension:N", title=None, header=alt.Header(labelExpr="'per ' + datum.value")
            ),
            title=opts.title,
        )
        .resolve_scale(y="independent")
    )


def slo_capacity(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Tail TTFT along each sweep, the SLO as a rule, the capacity point ringed.

    Expects: sweep (concurrency | rate), sweep_id, sweep_label, scenario, value,
    ttft_q_s, meets_slo, is_capacity.
    """
    axis = {
        "concurrency": ("concurrency cap (max_num_seqs / max_batch_size)", "log"),
        "rate": ("offered load (requests/s)", "linear"),
    }
    charts = []
    for kind in ("concurrency", "rate"):
        part = df.filter(pl.col("sweep") == kind).with_columns(
            (pl.col("sweep_id").cast(pl.String) + ": " + pl.col("sweep_label")).alias("sweep_name")
        )
        if part.is_empty():
            continue
        title, scale = axis[kind]
        x_scale = alt.Scale(type="log", base=2) if scale == "log" else alt.Scale(zero=False)
        base = alt.Chart(values(part))
        line = base.mark_line(point=alt.OverlayMarkDef(size=60)).encode(
            x=alt.X("value:Q", title=title, scale=x_scale),
            y=alt.Y("ttft_q_s:Q", title="tail TTFT (s, log scale)", scale=alt.Scale(type="log")),
            color=alt.Color("sweep_name:N", title="sweep (what it holds fixed)",
                            legend=alt.Legend(orient="bottom", direction="vertical",
                                              labelLimit=WIDTH)),
            tooltip=[
                alt.Tooltip("sweep_name:N", title="sweep"),
                alt.Tooltip("scenario:N"),
                alt.Tooltip("value:Q", title=title, format=",.3~f"),
                alt.Tooltip("ttft_q_s:Q", title="tail TTFT (s)", format=".4~f"),
                alt.Tooltip("meets_slo:N", title="meets SLO"),
            ],
        )  # fmt: skip
        ring = (
            base.transform_filter("datum.is_capacity")
            .mark_point(size=260, shape="circle", filled=False, strokeWidth=2, color="#222")
            .encode(x="value:Q", y="ttft_q_s:Q")
        )
        charts.append(
            alt.layer(line, ring, _slo_rule(opts)).properties(
                width=WIDTH // 2 - 30, height=HEIGHT, title=f"{kind} sweeps"
            )
        )
    return alt.hconcat(*charts, title=opts.title)


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
        )  # fmt: skip
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
        )  # fmt: skip
    )
    line = (
        alt.Chart(values(diagonal))
        .mark_line(color="#888", strokeDash=[4, 4])
        .encode(x=f"{live}:Q", y=f"{sim}:Q")
    )
    return alt.layer(line, points, title=opts.title).properties(width=WIDTH, height=HEIGHT)


CHARTS: dict[str, Callable[[pl.DataFrame, ChartOptions], AnyChart]] = {
    f.__name__: f
    for f in (
        arrival_rate,
        length_histogram,
        trace_groups,
        quarantine_reasons,
        throughput,
        ttft_by_queue_depth,
        ttft_vs_concurrency_cap,
        latency_cdf,
        engine_timeline,
        prefix_hit_rate_overall,
        prefix_hit_rate_over_time,
        prefix_hit_rate_by_cache_size,
        prefix_hit_rate_by_group,
        slo_capacity,
        validation_cdf,
        validation_scatter,
    )
}
