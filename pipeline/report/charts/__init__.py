"""Chart functions: one aggregated frame in, one Altair chart out.

They do no I/O and run no SQL: ``pipeline.report`` runs ``sql/<query>.sql`` and
hands the frame to the chart named next to it in ``reports/<report>.toml``.
Each function documents the columns it expects (the query's output columns).
Display labels ("TTFT (s)") live here and in the report definition only; the
columns keep their unit-suffixed names.

Data is inlined as plain values (``alt.Data(values=...)``) so a chart's spec is
self-contained and no row limit of Altair's data transformers applies; the
queries already aggregate, so a chart never carries per-request rows.

One module per report section (``trace``, ``compare``, ``throughput``, ``queueing``,
``latency``, ``classes``, ``pools``, ``autoscale``, ``engine``, ``features`` (swap and
speculation), ``prefix``, ``capacity``, ``validation``); what they share (options,
colours, highlighting, facets, scales) is ``common``. ``CHARTS`` names
every chart for ``reports/<report>.toml``; ``spec`` draws one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
from altair.utils.schemapi import debug_mode

from pipeline.report.charts.autoscale import autoscale_timeline
from pipeline.report.charts.capacity import capacity_probes, slo_capacity
from pipeline.report.charts.classes import class_panels
from pipeline.report.charts.common import AnyChart, ChartOptions
from pipeline.report.charts.compare import compare_runs
from pipeline.report.charts.engine import engine_timeline
from pipeline.report.charts.features import spec_timeline, swap_timeline, tier_timeline
from pipeline.report.charts.latency import latency_cdf, latency_intervals
from pipeline.report.charts.pools import pool_panels
from pipeline.report.charts.prefix import (
    prefix_hit_rate_by_cache_size,
    prefix_hit_rate_by_group,
    prefix_hit_rate_over_time,
    prefix_hit_rate_overall,
)
from pipeline.report.charts.queueing import ttft_by_queue_depth, ttft_vs_concurrency_cap
from pipeline.report.charts.throughput import throughput
from pipeline.report.charts.trace import (
    arrival_rate,
    length_histogram,
    quarantine_reasons,
    trace_groups,
)
from pipeline.report.charts.validation import validation_cdf, validation_scatter

__all__ = ["CHARTS", "ChartOptions", "spec"]


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
        class_panels,
        pool_panels,
        autoscale_timeline,
        engine_timeline,
        swap_timeline,
        spec_timeline,
        tier_timeline,
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
        out = CHARTS[name](df, opts).to_dict(validate=False)
    axis = out.setdefault("config", {}).setdefault("axis", {})
    axis.update(AXIS_LABELS)
    return out


# Every axis of every chart: labels that would touch or overlap are dropped (greedily, so
# 256, 512, 1,024 on a log axis never run together as "2565121,024"), at least 4 px apart.
AXIS_LABELS: dict[str, Any] = {"labelOverlap": "greedy", "labelSeparation": 4}
