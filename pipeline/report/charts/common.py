"""What the charts share: their options, inline data, colours, highlighting, facets, scales.

Every chart module of this package draws with these, so that all charts of a report
look alike: the same scenario colours, the same legend-click highlight, the same
small multiples when a run has many scenarios (``layout.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import altair as alt
import polars as pl

from pipeline.report.layout import Layout
from pipeline.report.slos import ReportSlos, SloLine

AnyChart = alt.Chart | alt.LayerChart | alt.HConcatChart | alt.VConcatChart | alt.FacetChart

WIDTH = 640  # px of a full-width chart
HEIGHT = 260  # px of one panel


@dataclass(frozen=True)
class ChartOptions:
    """What a chart needs beyond its frame."""

    title: str
    scenarios: tuple[str, ...] = ()  # every scenario of the run, for stable colours
    # the report's SLOs: a rule per SLO on the charts of its metric (report/slos.py)
    slos: ReportSlos = field(default_factory=ReportSlos)
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


def scenario_color(opts: ChartOptions, field_name: str = "scenario") -> alt.Color:
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


def series_color(opts: ChartOptions) -> alt.Color:
    names = opts.grid.series_names
    title = (
        "scenario"
        if not opts.grid.faceted
        else ", ".join(a for a in opts.grid.axes if a != opts.grid.facet_by) or "scenario"
    )
    return alt.Color(
        "series:N",
        title=title,
        sort=names,
        scale=alt.Scale(domain=names, scheme="tableau10" if len(names) <= 10 else "tableau20"),
        legend=alt.Legend(symbolLimit=0, labelLimit=320, columns=1 if len(names) <= 24 else 2),
    )


def highlight_opacity() -> dict[str, Any]:
    test = {
        "and": [
            {"param": LEGEND_PICK, "empty": True},
            f"{FOCUS} === '' || datum.scenario === {FOCUS}",
        ]
    }
    return {"condition": {"test": test, "value": 1}, "value": FADED}


def interactive(chart: alt.Chart) -> alt.Chart:
    """Bind a legend-click selection of ``series`` and the page's FOCUS to ``chart``."""
    pick = alt.selection_point(fields=["series"], bind="legend", name=LEGEND_PICK)
    return chart.add_params(pick, alt.param(name=FOCUS, value=""))


def faceted(
    chart: AnyChart, opts: ChartOptions, title: str, **resolve: Literal["independent", "shared"]
) -> AnyChart:
    """Small multiples by the layout's panel, or the chart as it is when there is one panel."""
    grid = opts.grid
    if not grid.faceted:
        return chart.properties(title=title)
    out = chart.facet(
        facet=alt.Facet(
            "panel:N",
            title=None,
            sort=grid.panels,
            header=alt.Header(labelFontWeight="bold", labelFontSize=12),
        ),
        columns=2 if len(grid.panels) > 1 else 1,
        title=title,
    )
    return out.resolve_scale(**resolve) if resolve else out


def scale_for(series: pl.Series, *, zero_ok: bool = False) -> alt.Scale:
    """Log scale when the positive values span more than 1.5 decades, else linear."""
    s = series.drop_nulls()
    if s.dtype.is_float():
        s = s.drop_nans()
    s = s.filter(s > 0)
    if s.len() >= 2 and float(s.max()) / float(s.min()) > 10**1.5:  # type: ignore[operator,arg-type]
        return alt.Scale(type="log")
    return alt.Scale(type="linear", zero=zero_ok)


def scale_title(label: str, scale: alt.Scale) -> str:
    return f"{label}, log scale" if scale.type == "log" else label


def panel_size(opts: ChartOptions) -> tuple[int, int]:
    if opts.grid.faceted and len(opts.grid.panels) > 1:
        return WIDTH // 2 - 60, HEIGHT - 40
    return WIDTH, HEIGHT


def min_visible(df: pl.DataFrame, column: str, share: float = 0.008) -> pl.DataFrame:
    """Add ``<column>_drawn``: the value, but at least ``share`` of the largest, so that
    a one-record bar beside a 10,000-record one still shows; labels give the true value."""
    top = df[column].max() if df.height else 0
    floor = float(top or 0) * share  # type: ignore[arg-type]
    return df.with_columns(
        pl.max_horizontal(pl.col(column).cast(pl.Float64), pl.lit(floor)).alias(f"{column}_drawn")
    )


def log2_x(field: str, title: str) -> alt.X:
    """An x axis over powers of two (caps, cache sizes)."""
    return alt.X(field, title=title, scale=alt.Scale(type="log", base=2))


SLO_COLOR = "#b00"


def slo_limits(lines: tuple[SloLine, ...]) -> pl.Series:
    """The limits of ``lines``, for scale_for (a chart's scale must reach its rules)."""
    return pl.Series([line.limit_s for line in lines], dtype=pl.Float64)


def slo_rules(lines: tuple[SloLine, ...], *, axis: Literal["x", "y"] = "y") -> list[alt.Chart]:
    """A dashed rule and its label per SLO, in layers that share their chart's data (so the
    chart can be faceted): aggregated to one row, so each rule and label is drawn once per
    panel. ``axis``: the rule is horizontal at y = limit, or vertical at x = limit."""
    out: list[alt.Chart] = []
    for k, line in enumerate(lines):
        one = alt.Chart().transform_aggregate(n="count()")
        at = {axis: alt.datum(line.limit_s)}
        tip = alt.value(f"SLO: {line.label}")
        dash = [4, 3] if k % 2 == 0 else [8, 3, 2, 3]
        out.append(one.mark_rule(color=SLO_COLOR, strokeDash=dash).encode(**at, tooltip=tip))
        # the label above a horizontal rule, at the plot's right edge ("width") for the
        # first SLO, its left edge for the second, and so on, so that two close limits do
        # not print over each other; beside a vertical rule, a line lower for each
        if axis == "y":
            right = k % 2 == 0
            mark = one.mark_text(
                align="right" if right else "left",
                baseline="bottom",
                dx=-2 if right else 2,
                dy=-2 - 12 * (k // 2),
                color=SLO_COLOR,
                fontSize=11,
                text=line.label,
            )
            edge = alt.value("width") if right else alt.value(0)
            out.append(mark.encode(y=alt.datum(line.limit_s), x=edge))
        else:
            mark = one.mark_text(
                align="left",
                baseline="top",
                dx=3,
                dy=2 + 12 * k,
                color=SLO_COLOR,
                fontSize=11,
                text=line.label,
            )
            out.append(mark.encode(x=alt.datum(line.limit_s), y=alt.value(0)))
    return out


def timeline_rows(
    df: pl.DataFrame,
    opts: ChartOptions,
    measures: dict[str, str],
    *,
    title: str,
    label_limit: int = 140,
) -> AnyChart:
    """Measures over simulated time as step lines: one row of panels per measure (its own
    y scale), one column per panel of the layout, the scenarios coloured by series.

    ``df``: scenario, bucket_start_s, bucket_s and the columns of ``measures`` (column ->
    the row's label).
    """
    long = (
        with_layout(df, opts)
        .unpivot(
            index=["scenario", "series", "panel", "bucket_start_s", "bucket_s"],
            on=list(measures),
            variable_name="measure",
            value_name="value",
        )
        .with_columns(pl.col("measure").replace_strict(measures))
    )
    grid = opts.grid
    width = WIDTH if not grid.faceted else max(180, WIDTH // max(1, len(grid.panels)) - 40)
    chart = interactive(
        alt.Chart(values(long), width=width, height=HEIGHT // 2)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("bucket_start_s:Q", title="simulated time (s)"),
            y=alt.Y("value:Q", title=None),
            color=series_color(opts),
            detail="scenario:N",
            opacity=highlight_opacity(),
            tooltip=[
                alt.Tooltip("scenario:N"),
                alt.Tooltip("measure:N"),
                alt.Tooltip("bucket_start_s:Q", title="bucket start (s)", format=",.1f"),
                alt.Tooltip("value:Q", format=",.3~f"),
            ],
        )
    )
    row = alt.Row(
        "measure:N",
        title=None,
        sort=list(measures.values()),
        header=alt.Header(labelAngle=0, labelAlign="left", labelLimit=label_limit),
    )
    if grid.faceted:
        return chart.facet(
            row=row, column=alt.Column("panel:N", title=None, sort=grid.panels), title=title
        ).resolve_scale(y="independent")
    return chart.facet(row=row, title=title).resolve_scale(y="independent")
