"""Charts of the report's per-pool section: one small chart per replica pool of a fleet,
its TTFT percentiles per scenario against the whole-traffic TTFT SLOs."""

from __future__ import annotations

import polars as pl

from pipeline.report.charts.classes import panels
from pipeline.report.charts.common import AnyChart, ChartOptions


def pool_panels(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Small multiples, one panel per pool (by name, across the run's fleets): each fleet
    scenario's p50, p90 and p99 TTFT over that pool's requests (log axis when they
    spread), and a red rule per unscoped TTFT percentile SLO; the panels in the fleet's
    order of its pools (the query's row order).

    Expects the rows of pool_slos.sql (pool_label, scenario, ttft_p50_s, ttft_p90_s,
    ttft_p99_s, is_first, slo, slo_label, metric, stat, limit_s).
    """
    order = [str(x) for x in df["pool_label"].unique(maintain_order=True).to_list()]
    return panels(df, opts, "pool_label", "pool", order=order)
