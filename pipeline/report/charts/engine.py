"""The chart of the report's engine section: KV cache use, running and waiting requests and
preemptions over simulated time."""

from __future__ import annotations

import polars as pl

from pipeline.report.charts.common import (
    AnyChart,
    ChartOptions,
    timeline_rows,
)


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
        pl.col("scenario_end_s").max()
        if "scenario_end_s" in df.columns
        else (pl.col("bucket_start_s") + pl.col("bucket_s")).max()
    )
    if ends.height:
        end = ends[:, 1]
        clip = min(4.0 * float(end.median()), float(end.max()))  # type: ignore[arg-type]
        longer = int((end > clip * (1 + 1e-9)).sum())
        if longer:
            df = df.filter(pl.col("bucket_start_s") < clip)
            title = (
                f"{title} (time axis cut at {clip:,.0f} s; {longer} scenario"
                f"{'s' if longer != 1 else ''} run longer)"
            )
    return timeline_rows(df, opts, measures, title=title)
