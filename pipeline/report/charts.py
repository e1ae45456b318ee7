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
from typing import Any, Literal

import altair as alt
import polars as pl
from altair.utils.schemapi import debug_mode

from pipeline.report.layout import Layout, natural_key, natural_sorted

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
    layout: Layout | None = None  # panels and colours of many scenarios (layout.py)

    @property
    def grid(self) -> Layout:
        """The run's layout; without one, one colour per scenario and one panel."""
        if self.layout is not None:
            return self.layout
        return Layout(self.scenarios, series={n: n for n in self.scenarios})


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


# Clicking a legend entry highlights its series (the others fade); the page's scenario
# selector sets FOCUS on every chart that declares it, with the same effect.
LEGEND_PICK = "legend_pick"
FOCUS = "focus"
FADED = 0.12


def with_layout(df: pl.DataFrame, opts: ChartOptions) -> pl.DataFrame:
    """The frame with the ``series`` (colour) and ``panel`` (small multiple) of each row."""
    grid = opts.grid
    sc = pl.col("scenario").cast(pl.String)
    series = sc.replace_strict(grid.series, default=sc) if grid.series else sc
    panel = sc.replace_strict(grid.panel, default="") if grid.panel else pl.lit("")
    return df.with_columns(series.alias("series"), panel.alias("panel"))


def _series_color(opts: ChartOptions) -> alt.Color:
    names = opts.grid.series_names
    title = "scenario" if not opts.grid.faceted else ", ".join(
        a for a in opts.grid.axes if a != opts.grid.facet_by) or "scenario"  # fmt: skip
    return alt.Color(
        "series:N",
        title=title,
        sort=names,
        scale=alt.Scale(domain=names, scheme="tableau10" if len(names) <= 10 else "tableau20"),
        legend=alt.Legend(symbolLimit=0, labelLimit=320, columns=1 if len(names) <= 24 else 2),
    )


def _highlight_opacity() -> dict[str, Any]:
    test = {"and": [{"param": LEGEND_PICK, "empty": True},
                    f"{FOCUS} === '' || datum.scenario === {FOCUS}"]}  # fmt: skip
    return {"condition": {"test": test, "value": 1}, "value": FADED}


def _interactive(chart: alt.Chart) -> alt.Chart:
    """Bind a legend-click selection of ``series`` and the page's FOCUS to ``chart``."""
    pick = alt.selection_point(fields=["series"], bind="legend", name=LEGEND_PICK)
    return chart.add_params(pick, alt.param(name=FOCUS, value=""))


def _faceted(
    chart: AnyChart, opts: ChartOptions, title: str, **resolve: Literal["independent", "shared"]
) -> AnyChart:
    """Small multiples by the layout's panel, or the chart as it is when there is one panel."""
    grid = opts.grid
    if not grid.faceted:
        return chart.properties(title=title)
    out = chart.facet(
        facet=alt.Facet("panel:N", title=None, sort=grid.panels,
                        header=alt.Header(labelFontWeight="bold", labelFontSize=12)),
        columns=2 if len(grid.panels) > 1 else 1,
        title=title,
    )  # fmt: skip
    return out.resolve_scale(**resolve) if resolve else out


def _scale_for(series: pl.Series, *, zero_ok: bool = False) -> alt.Scale:
    """Log scale when the positive values span more than 1.5 decades, else linear."""
    s = series.drop_nulls()
    if s.dtype.is_float():
        s = s.drop_nans()
    s = s.filter(s > 0)
    if s.len() >= 2 and float(s.max()) / float(s.min()) > 10**1.5:  # type: ignore[operator,arg-type]
        return alt.Scale(type="log")
    return alt.Scale(type="linear", zero=zero_ok)


def _scale_title(label: str, scale: alt.Scale) -> str:
    return f"{label}, log scale" if scale.type == "log" else label


def _panel_size(opts: ChartOptions) -> tuple[int, int]:
    if opts.grid.faceted and len(opts.grid.panels) > 1:
        return WIDTH // 2 - 60, HEIGHT - 40
    return WIDTH, HEIGHT


def _min_visible(df: pl.DataFrame, column: str, share: float = 0.008) -> pl.DataFrame:
    """Add ``<column>_drawn``: the value, but at least ``share`` of the largest, so that
    a one-record bar beside a 10,000-record one still shows; labels give the true value."""
    top = df[column].max() if df.height else 0
    floor = float(top or 0) * share  # type: ignore[arg-type]
    return df.with_columns(
        pl.max_horizontal(pl.col(column).cast(pl.Float64), pl.lit(floor)).alias(f"{column}_drawn")
    )


def _log2_x(field: str, title: str) -> alt.X:
    """An x axis over powers of two (caps, cache sizes)."""
    return alt.X(field, title=title, scale=alt.Scale(type="log", base=2))


def _slo_rule(opts: ChartOptions) -> alt.Chart:
    return (
        alt.Chart(alt.Data(values=[{"slo_ttft_s": opts.slo_ttft_s}]))
        .mark_rule(color="#b00", strokeDash=[4, 3])
        .encode(y=alt.Y("slo_ttft_s:Q"), tooltip=[alt.Tooltip("slo_ttft_s:Q", title="SLO (s)")])
    )


def _slo_rule_datum(opts: ChartOptions) -> alt.Chart:
    """The SLO as a rule in a layer that shares its chart's data (so it can be faceted)."""
    return (
        alt.Chart().mark_rule(color="#b00", strokeDash=[4, 3]).encode(y=alt.datum(opts.slo_ttft_s))
    )


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
            pl.col("bucket_start").dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%d %H:%M:%S UTC")
            .alias("bucket_start_utc")
        )  # fmt: skip
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
        )  # fmt: skip
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
    """Requests per model and per tenant, side by side; every bar visible, counts labelled.

    Expects: dimension (model | tenant), group_name, num_requests, prompt_tokens, share.
    """
    parts = df.partition_by("dimension", maintain_order=True) if df.height else []
    drawn = pl.concat([_min_visible(p, "num_requests") for p in parts]) if parts else df
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
        .facet(column=alt.Column("dimension:N", title=None, header=alt.Header(
            labelExpr="'per ' + datum.value")), title=opts.title)
        .resolve_scale(y="independent", x="independent")
    )  # fmt: skip


def quarantine_reasons(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Rejected input records by reason; a one-record reason still shows a bar, and each
    bar is labelled with its count.

    Expects: reason, source_format, num_records.
    """
    per = df.group_by("reason", "source_format", maintain_order=True).agg(
        pl.col("num_records").sum()
    ) if df.height else df  # fmt: skip
    drawn = _min_visible(per, "num_records")
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
    long = with_layout(df, opts).unpivot(
        index=["scenario", "batching", "series"], on=list(panels), variable_name="measure",
        value_name="per_s",
    ).with_columns(pl.col("measure").replace_strict(panels))  # fmt: skip
    order = list(opts.grid.scenarios) or sorted(df["scenario"].to_list())
    pick = alt.selection_point(fields=["batching"], bind="legend", name=LEGEND_PICK)
    bars = (
        alt.Chart(values(long), width=WIDTH // 3 - 60,
                  height=alt.Step(14 if len(order) > 12 else 20))
        .mark_bar()
        .encode(
            y=alt.Y("scenario:N", title=None, sort=order, axis=alt.Axis(labelLimit=220)),
            x=alt.X("per_s:Q", title=None),
            color=alt.Color("batching:N", title="batching",
                            scale=alt.Scale(domain=["static", "continuous"])),
            opacity={"condition": {"test": {"and": [{"param": LEGEND_PICK, "empty": True},
                     f"{FOCUS} === '' || datum.scenario === {FOCUS}"]}, "value": 1},
                     "value": FADED},
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("batching:N"),
                alt.Tooltip("measure:N"),
                alt.Tooltip("per_s:Q", title="per second", format=",.2f"),
            ],
        )
        .add_params(pick, alt.param(name=FOCUS, value=""))
    )  # fmt: skip
    return bars.facet(
        column=alt.Column("measure:N", title=None, sort=list(panels.values())), title=opts.title
    ).resolve_scale(x="independent")


def ttft_by_queue_depth(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p50 (dashed) and p99 TTFT by the queue depth met on arrival, one colour per series,
    small multiples when the run has many scenarios.

    Expects: scenario, queue_depth_lo, queue_depth_hi, num_requests, p50_ttft_s, p99_ttft_s.
    """
    long = (
        with_layout(df, opts)
        .unpivot(
            index=[
                "scenario",
                "series",
                "panel",
                "queue_depth_lo",
                "queue_depth_hi",
                "num_requests",
            ],
            on=["p50_ttft_s", "p99_ttft_s"],
            variable_name="percentile",
            value_name="ttft_s",
        )
        .with_columns(pl.col("percentile").replace({"p50_ttft_s": "p50", "p99_ttft_s": "p99"}))
    )
    y_scale = _scale_for(pl.concat([long["ttft_s"], pl.Series([opts.slo_ttft_s])]))
    width, height = _panel_size(opts)
    lines = _interactive(
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "queue_depth_lo:Q",
                title="queue depth met on arrival (requests waiting)",
                scale=alt.Scale(type="symlog"),
            ),
            y=alt.Y("ttft_s:Q", title=_scale_title("TTFT (s)", y_scale), scale=y_scale),
            color=_series_color(opts),
            detail="scenario:N",
            opacity=_highlight_opacity(),
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
    chart = alt.layer(lines, _slo_rule_datum(opts), data=values(long)).properties(
        width=width, height=height
    )
    return _faceted(chart, opts, opts.title)


def ttft_vs_concurrency_cap(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """p99 TTFT against the concurrency cap, one point per scenario, one line (and colour)
    per policy and offered rate, so that a 1x and a 4x sweep never share a colour; a bar
    through each point spans its 90% interval where the run has one.

    Expects: scenario, policy, max_concurrency, offered_requests_per_s, p99_ttft_s, and
    optionally p99_ttft_lo_s, p99_ttft_hi_s.
    """
    drawn = df.with_columns(
        (pl.col("policy") + " at " + pl.col("offered_requests_per_s").round_sig_figs(3)
         .cast(pl.String) + " req/s").fill_null(pl.col("policy")).alias("series")
    ) if df.height else df.with_columns(pl.lit("").alias("series"))  # fmt: skip
    if "p99_ttft_lo_s" not in drawn.columns:
        drawn = drawn.with_columns(
            pl.lit(None, pl.Float64).alias("p99_ttft_lo_s"),
            pl.lit(None, pl.Float64).alias("p99_ttft_hi_s"),
        )
    names = sorted(set(drawn["series"].to_list()), key=natural_key)
    shown = ["p99_ttft_s", "p99_ttft_lo_s", "p99_ttft_hi_s"]
    y_scale = _scale_for(pl.concat([*(drawn[c] for c in shown), pl.Series([opts.slo_ttft_s])]))
    x = _log2_x("max_concurrency:Q", "concurrency cap (max_num_seqs / max_batch_size)")
    color = alt.Color(
        "series:N",
        title="policy at offered load",
        sort=names,
        scale=alt.Scale(domain=names, scheme="tableau20" if len(names) > 10 else "tableau10"),
        legend=alt.Legend(symbolLimit=0, labelLimit=320),
    )
    points = _interactive(
        alt.Chart()
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=x,
            y=alt.Y("p99_ttft_s:Q", title=_scale_title("p99 TTFT (s)", y_scale), scale=y_scale),
            color=color,
            opacity=_highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("policy:N"),
                alt.Tooltip("max_concurrency:Q", title="concurrency cap"),
                alt.Tooltip(
                    "offered_requests_per_s:Q", title="offered (requests/s)", format=".3~f"
                ),
                alt.Tooltip("p99_ttft_s:Q", title="p99 TTFT (s)", format=".4~f"),
                alt.Tooltip("p99_ttft_lo_s:Q", title="90% interval from (s)", format=".4~f"),
                alt.Tooltip("p99_ttft_hi_s:Q", title="to (s)", format=".4~f"),
            ],
        )  # fmt: skip
    )
    bars = (
        alt.Chart()
        .transform_filter("isValid(datum.p99_ttft_lo_s)")
        .mark_rule(strokeWidth=2)
        .encode(x=x, y=alt.Y("p99_ttft_lo_s:Q", scale=y_scale), y2="p99_ttft_hi_s:Q",
                color=color, opacity=_highlight_opacity())
    )  # fmt: skip
    return alt.layer(points, bars, _slo_rule_datum(opts), data=values(drawn), title=opts.title
                     ).properties(width=WIDTH, height=HEIGHT)  # fmt: skip


# latency_percentiles.sql columns of each percentile drawn with its interval
_INTERVAL_STATS = (
    ("TTFT", "p50", "p50_ttft"), ("TTFT", "p90", "p90_ttft"), ("TTFT", "p99", "p99_ttft"),
    ("TPOT", "p50", "p50_tpot"), ("TPOT", "p99", "p99_tpot"),
    ("E2E", "p50", "p50_e2e"), ("E2E", "p99", "p99_e2e"),
)  # fmt: skip


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
        scale = _scale_for(pl.concat([part["lo_s"], part["hi_s"]]))
        base = alt.Chart(values(part), title=metric).encode(
            y=alt.Y("scenario:N", title=None, sort=order, axis=alt.Axis(labelLimit=180)),
            yOffset=alt.YOffset("percentile:N", sort=["p50", "p90", "p99"]),
            color=alt.Color("percentile:N", sort=["p50", "p90", "p99"], title="percentile"),
        )
        x = alt.X("value_s:Q", title=_scale_title(f"{metric} (s)", scale), scale=scale)
        bar = base.mark_rule(strokeWidth=2).encode(x=alt.X("lo_s:Q", scale=scale, title=None),
                                                   x2="hi_s:Q")  # fmt: skip
        dot = base.mark_point(filled=True, size=40).encode(
            x=x,
            tooltip=[
                alt.Tooltip("scenario:N"), alt.Tooltip("metric:N"), alt.Tooltip("percentile:N"),
                alt.Tooltip("value_s:Q", title="value (s)", format=".4~g"),
                alt.Tooltip("lo_s:Q", title="90% interval from (s)", format=".4~g"),
                alt.Tooltip("hi_s:Q", title="to (s)", format=".4~g"),
            ],
        )  # fmt: skip
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
    x_scale = _scale_for(drawn["value_s"])
    width, height = _panel_size(opts)
    chart = _interactive(
        alt.Chart(values(drawn))
        .mark_line()
        .encode(
            x=alt.X("value_s:Q", title=_scale_title(axis, x_scale), scale=x_scale),
            y=alt.Y(
                "fraction:Q", title="fraction of requests at or below", axis=alt.Axis(format="%")
            ),
            color=_series_color(opts),
            detail="scenario:N",
            opacity=_highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("value_s:Q", title=f"{axis}, at most", format=".4~g"),
                alt.Tooltip("fraction:Q", title="share of requests", format=".3~%"),
                alt.Tooltip("num_requests:Q", title="requests", format=","),
            ],
        )  # fmt: skip
        .properties(width=width, height=height)
    )
    return _faceted(chart, opts, opts.title)


def engine_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """KV usage, running, waiting and preemptions over simulated time: one row of panels per
    measure, one column per panel of the layout.

    The time axis ends where most scenarios end: when a few run far longer (a capacity
    search's slowest rate), it stops at four times the median scenario's span and the
    title says how many run on.

    Expects: scenario, bucket_start_s, bucket_s, kv_usage, mean_running, mean_waiting,
    max_waiting, num_preemptions.
    """
    measures = {
        "kv_usage": "KV cache used (share of blocks)",
        "mean_running": "running requests (mean)",
        "mean_waiting": "waiting requests (mean)",
        "num_preemptions": "preemptions (per bucket)",
    }
    title = opts.title
    # the query cuts the axis (scenario_end_s says where each scenario really ends); a
    # frame without that column is cut here by the same rule
    ends = df.group_by("scenario").agg(
        pl.col("scenario_end_s").max() if "scenario_end_s" in df.columns
        else (pl.col("bucket_start_s") + pl.col("bucket_s")).max()
    )  # fmt: skip
    if ends.height:
        end = ends[:, 1]
        clip = min(4.0 * float(end.median()), float(end.max()))  # type: ignore[arg-type]
        longer = int((end > clip * (1 + 1e-9)).sum())
        if longer:
            df = df.filter(pl.col("bucket_start_s") < clip)
            title = (f"{title} (time axis cut at {clip:,.0f} s; {longer} scenario"
                     f"{'s' if longer != 1 else ''} run longer)")  # fmt: skip
    long = with_layout(df, opts).unpivot(
        index=["scenario", "series", "panel", "bucket_start_s", "bucket_s"],
        on=list(measures), variable_name="measure", value_name="value",
    ).with_columns(pl.col("measure").replace_strict(measures))  # fmt: skip
    grid = opts.grid
    width = WIDTH if not grid.faceted else max(180, WIDTH // max(1, len(grid.panels)) - 40)
    chart = _interactive(
        alt.Chart(values(long), width=width, height=HEIGHT // 2)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start_s:Q", title="simulated time (s)"),
            y=alt.Y("value:Q", title=None),
            color=_series_color(opts),
            detail="scenario:N",
            opacity=_highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("measure:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)", format=",.1f"),
                alt.Tooltip("value:Q", format=",.3~f"),
            ],
        )  # fmt: skip
    )
    row = alt.Row("measure:N", title=None, sort=list(measures.values()),
                  header=alt.Header(labelAngle=0, labelAlign="left", labelLimit=140))  # fmt: skip
    if grid.faceted:
        return chart.facet(
            row=row, column=alt.Column("panel:N", title=None, sort=grid.panels), title=title
        ).resolve_scale(y="independent")
    return chart.facet(row=row, title=title).resolve_scale(y="independent")


def prefix_hit_rate_overall(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted prefix-cache hit rate per scenario (scenarios without lookups left out).

    Expects: scenario, hit_rate, query_tokens, hit_tokens.
    """
    drawn = with_layout(df.filter(pl.col("hit_rate").is_not_null()), opts)
    order = list(opts.grid.scenarios) or "ascending"
    return _interactive(
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
            color=_series_color(opts),
            opacity=_highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("hit_tokens:Q", title="hit tokens", format=","),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )  # fmt: skip
        .properties(width=WIDTH - 200, height=alt.Step(14 if drawn.height > 12 else 20))
    )


def prefix_hit_rate_over_time(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Token-weighted hit rate per time bucket, one line per scenario.

    Expects: scenario, bucket_start_s, query_tokens, hit_tokens, hit_rate.
    """
    width, height = _panel_size(opts)
    chart = _interactive(
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
            color=_series_color(opts),
            detail="scenario:N",
            opacity=_highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)"),
                alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                alt.Tooltip("query_tokens:Q", title="looked-up tokens", format=","),
            ],
        )  # fmt: skip
        .properties(width=width, height=height)
    )
    return _faceted(chart, opts, opts.title)


def prefix_hit_rate_by_cache_size(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Hit rate against the KV cache capacity of one replica, one point per scenario.

    Expects: scenario, policy, cache_tokens, hit_rate.
    """
    drawn = df.filter(pl.col("hit_rate").is_not_null() & pl.col("cache_tokens").is_not_null())
    return (
        alt.Chart(values(drawn), title=opts.title)
        .mark_line(point=alt.OverlayMarkDef(size=70))
        .encode(
            x=_log2_x("cache_tokens:Q", "KV cache per replica (tokens, log scale)"),
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
            yOffset=alt.YOffset("scenario:N", sort=list(opts.grid.scenarios) or "ascending"),
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
    """Each SLO along each sweep: the measured statistic of the SLO's scope (p99 TTFT of
    every request, of tenant chat, of prompts over 2000 tokens, ...) per sweep point, the
    SLO's limit as a rule, one row of panels per SLO (its name and scope in the header);
    a cross marks a point that misses that SLO, a ring the sweep's capacity (the highest
    point meeting every SLO); the tooltip lists the SLOs a point meets and misses.

    Expects the rows of slo_capacity.sql: sweep (concurrency | rate), sweep_id,
    sweep_label, scenario, value, slo, slo_label, limit_s, measured_s, scope_requests,
    meets_slo, slos_met, slos_missed, is_capacity.
    """
    axis = {
        "concurrency": ("concurrency cap (max_num_seqs / max_batch_size)", "log"),
        "rate": ("offered load (requests/s)", "linear"),
    }
    labels = natural_sorted(set(df["slo_label"].to_list())) if df.height else []
    charts = []
    for kind in ("concurrency", "rate"):
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
        line = alt.Chart().mark_line(point=False).encode(
            x=x,
            y=alt.Y("measured_s:Q", title="the SLO's statistic (s, log scale)", scale=y_scale),
            color=alt.Color("sweep_name:N", title=f"{kind} sweep (what it holds fixed)",
                            sort=names,
                            scale=alt.Scale(domain=names, scheme="tableau20" if len(names) > 10
                                            else "tableau10"),
                            legend=alt.Legend(orient="bottom", direction="vertical",
                                              labelLimit=WIDTH, titleLimit=WIDTH,
                                              symbolLimit=0)),
            detail="slo:N",
        )  # fmt: skip
        points = alt.Chart().mark_point(size=60, filled=True).encode(
            x=x,
            y=alt.Y("measured_s:Q", scale=y_scale),
            color=alt.Color("sweep_name:N", sort=names, legend=None,
                            scale=alt.Scale(domain=names, scheme="tableau20" if len(names) > 10
                                            else "tableau10")),
            shape=alt.Shape("meets_slo:N", title="this SLO",
                            scale=alt.Scale(domain=[True, False], range=["circle", "cross"]),
                            legend=alt.Legend(labelExpr="datum.value ? 'met' : 'missed'")),
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
        )  # fmt: skip
        ring = (
            alt.Chart()
            .transform_filter("datum.is_capacity")
            .mark_point(size=260, shape="circle", filled=False, strokeWidth=2, color="#222")
            .encode(x=x, y=alt.Y("measured_s:Q", scale=y_scale))
        )
        rule = alt.Chart().mark_rule(color="#b00", strokeDash=[4, 3]).encode(
            y=alt.Y("max(limit_s):Q", scale=y_scale),
            tooltip=[alt.Tooltip("max(limit_s):Q", title="limit (s)", format=".4~g")],
        )  # fmt: skip
        charts.append(
            alt.layer(line, points, ring, rule, data=values(part))
            .properties(width=WIDTH // 2 - 30, height=HEIGHT // 2 if len(labels) > 1 else HEIGHT)
            .facet(
                row=alt.Row("slo_label:N", title=None, sort=labels,
                            header=alt.Header(labelAngle=0, labelOrient="top",
                                              labelAnchor="start", labelPadding=2,
                                              labelFontSize=12, labelFontWeight="bold",
                                              labelLimit=WIDTH)),
                spacing=40,
                title=f"{kind} sweeps",
            )
            .resolve_scale(y="independent")
        )  # fmt: skip
    return alt.hconcat(*charts, title=opts.title).resolve_scale(color="independent")


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
            *(pl.lit(None, pl.Float64).alias(c)
              for c in ("measured_lo_s", "measured_hi_s", "answer_lo", "answer_hi"))
        )  # fmt: skip
    drawn = df.with_columns(
        (pl.col("measured_s") / pl.col("limit_s")).alias("share_of_limit"),
        (pl.col("measured_lo_s") / pl.col("limit_s")).alias("share_lo"),
        (pl.col("measured_hi_s") / pl.col("limit_s")).alias("share_hi"),
        (pl.col("search") + " (" + pl.col("knob") + ")").alias("panel"),
    ).filter(pl.col("share_of_limit").is_not_null())
    y_scale = _scale_for(
        pl.concat([drawn["share_of_limit"], drawn["share_lo"], drawn["share_hi"], pl.Series([1.0])])
    )
    slos = natural_sorted(set(drawn["slo"].to_list()))
    base = alt.Chart()
    pick = alt.selection_point(fields=["slo"], bind="legend", name=LEGEND_PICK)
    points = (
        base.mark_point(filled=True, size=60)
        .encode(
            x=alt.X("value:Q", title="knob value (cap, requests/s or replicas)",
                    scale=alt.Scale(type="log")),
            y=alt.Y("share_of_limit:Q", title=_scale_title("measured / limit", y_scale),
                    scale=y_scale),
            color=alt.Color("slo:N", title="SLO", sort=slos, scale=alt.Scale(domain=slos)),
            shape=alt.Shape("met:N", title="every SLO met",
                            scale=alt.Scale(domain=[True, False], range=["circle", "cross"])),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(FADED)),
            tooltip=[
                alt.Tooltip("search:N"), alt.Tooltip("probe:Q"), alt.Tooltip("scenario:N"),
                alt.Tooltip("knob:N"), alt.Tooltip("value:Q", format=",.4~g"),
                alt.Tooltip("slo:N", title="SLO"),
                alt.Tooltip("measured_s:Q", title="measured (s)", format=".4~g"),
                alt.Tooltip("limit_s:Q", title="limit (s)", format=".4~g"),
                alt.Tooltip("met:N", title="every SLO met"),
            ],
        )
        .add_params(pick)
    )  # fmt: skip
    ring = (
        base.transform_filter("datum.is_answer")
        .mark_point(size=260, shape="circle", filled=False, strokeWidth=2, color="#222")
        .encode(x="value:Q", y="share_of_limit:Q")
    )
    bars = (
        base.transform_filter("isValid(datum.share_lo)")
        .mark_rule(strokeWidth=1.5)
        .encode(x="value:Q", y=alt.Y("share_lo:Q", scale=y_scale), y2="share_hi:Q",
                color=alt.Color("slo:N", sort=slos, scale=alt.Scale(domain=slos)),
                opacity=alt.condition(pick, alt.value(0.7), alt.value(FADED)))
    )  # fmt: skip
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
            tooltip=[alt.Tooltip("scenario:N"), alt.Tooltip("metric:N"), alt.Tooltip("run:N"),
                     alt.Tooltip("value:Q", format=",.4~g"),
                     alt.Tooltip("change:Q", title="B - A", format="+,.4~g")],
        )
        .add_params(pick)
        .facet(facet=alt.Facet("metric:N", title=None, sort=metrics), columns=3,
               title=opts.title)
        .resolve_scale(x="independent", y="independent")
    )  # fmt: skip


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
        latency_intervals,
        latency_cdf,
        engine_timeline,
        prefix_hit_rate_overall,
        prefix_hit_rate_over_time,
        prefix_hit_rate_by_cache_size,
        prefix_hit_rate_by_group,
        slo_capacity,
        capacity_probes,
        compare_runs,
        validation_cdf,
        validation_scatter,
    )
}


def spec(name: str, df: pl.DataFrame, opts: ChartOptions) -> dict[str, Any]:
    """The Vega-Lite spec of chart ``name`` drawn from ``df``, as a plain dict.

    NOTE: built without Altair's JSON-schema checks (on every object it makes and on the
    whole spec), which cost more than the chart itself: about 1.5 s of a report's
    build. tests/report/test_report.py checks every spec of a built report against the
    Vega-Lite schema instead.
    """
    with debug_mode(False):
        return CHARTS[name](df, opts).to_dict(validate=False)
