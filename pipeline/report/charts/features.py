"""The charts of the report's swap, speculation and KV offloading sections: KV swapped to
host memory and back, draft tokens accepted per step, and the prefix hits of the GPU and
of the tiers below it, over simulated time. Each section shows only for a run that has the
feature (``requires`` in reports/review.toml)."""

from __future__ import annotations

import polars as pl

from pipeline.report.charts.common import (
    AnyChart,
    ChartOptions,
    timeline_rows,
)

SWAP_MEASURES = {
    "out_mb": "swapped out (MB)",
    "in_mb": "swapped in (MB)",
    "wait_share": "waiting for copies",
}
SPEC_MEASURES = {
    "accepted_per_step": "accepted per step",
    "acceptance_rate": "acceptance rate",
}
TIER_MEASURES = {
    "gpu_hit_rate": "GPU prefix hits (share of looked-up tokens)",
    "cpu_hit_rate": "CPU tier hits (share)",
    "disk_hit_rate": "disk tier hits (share)",
    "load_mb": "loaded from the tiers (MB)",
}


def _filled(df: pl.DataFrame) -> pl.DataFrame:
    """Every bucket from 0 to each scenario's last one, those without a row at 0: the query
    leaves out buckets without traffic, a line must not bridge them."""
    if df.height == 0:
        return df
    width = float(df["bucket_s"].max())  # type: ignore[arg-type]
    grid = (
        df.group_by("scenario")
        .agg(pl.col("bucket_start_s").max().alias("last"))
        .with_columns(
            pl.int_ranges(0, (pl.col("last") / width).round().cast(pl.Int64) + 1).alias("k")
        )
        .explode("k")
        .select("scenario", (pl.col("k") * width).round(9).alias("bucket_start_s"))
    )
    keyed = df.with_columns((pl.col("bucket_start_s") / width).round().alias("_k"))
    out = grid.with_columns((pl.col("bucket_start_s") / width).round().alias("_k")).join(
        keyed.drop("bucket_start_s"), on=["scenario", "_k"], how="left"
    )
    measures = [c for c in df.columns if c not in ("scenario", "bucket_start_s", "bucket_s")]
    return out.drop("_k").with_columns(
        pl.col(measures).fill_null(0), pl.lit(width).alias("bucket_s")
    )


def swap_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """KV swapped out and in (MB per bucket), and the share of its step time the busiest
    replica waited for the copies, over simulated time: one row of panels per measure, the
    replicas of a scenario together.

    Expects: scenario, replica, bucket_start_s, bucket_s, swap_out_bytes, swap_in_bytes,
    swap_share.
    """
    per = _filled(
        df.group_by("scenario", "bucket_start_s")
        .agg(
            pl.col("bucket_s").first(),
            (pl.col("swap_out_bytes").sum() / 1e6).alias("out_mb"),
            (pl.col("swap_in_bytes").sum() / 1e6).alias("in_mb"),
            pl.col("swap_share").max().fill_null(0).alias("wait_share"),
        )
        .sort("scenario", "bucket_start_s")
    )
    return timeline_rows(per, opts, SWAP_MEASURES, title=opts.title, label_limit=160)


def spec_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """Accepted draft tokens per verify step and the token-weighted acceptance rate over
    simulated time, one row of panels per measure. Buckets without a verify step are left
    out (the line holds its last value over an idle spell).

    Expects: scenario, bucket_start_s, bucket_s, accepted_per_step, acceptance_rate.
    """
    per = df.select("scenario", "bucket_start_s", "bucket_s", *SPEC_MEASURES)
    return timeline_rows(per, opts, SPEC_MEASURES, title=opts.title, label_limit=160)


def tier_timeline(df: pl.DataFrame, opts: ChartOptions) -> AnyChart:
    """The shares of the looked-up prompt tokens found in the GPU prefix cache, loaded from
    the CPU tier and from the disk tier, and the MB the tiers loaded, over simulated time,
    one row of panels per measure. Buckets without a lookup or a load are left out (the
    line holds its last value over an idle spell).

    Expects: scenario, bucket_start_s, bucket_s, gpu_hit_rate, cpu_hit_rate,
    disk_hit_rate, tier_load_bytes.
    """
    per = df.select(
        "scenario",
        "bucket_start_s",
        "bucket_s",
        *(pl.col(c).fill_null(0) for c in ("gpu_hit_rate", "cpu_hit_rate", "disk_hit_rate")),
        (pl.col("tier_load_bytes") / 1e6).alias("load_mb"),
    )
    return timeline_rows(per, opts, TIER_MEASURES, title=opts.title, label_limit=200)
