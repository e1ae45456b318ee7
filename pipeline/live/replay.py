"""The live stage: warehouse requests through a real engine, timed, written like a replay.

    requests (warehouse or one file) ──▶ slice + caps ──▶ LiveBatch ──▶ engine ──▶
        live_requests/run_id=<run>/<engine>.parquet
        live_metrics/run_id=<run>/<engine>.parquet
        runs/<run>.parquet   (command "live"; details: engine, engine_info, options, summary)

Requests are selected as ``replay`` selects them (one file, or warehouse days), sorted by
arrival; ``skip`` and ``sample`` take a contiguous slice (so a calibration slice and a
validation slice need not overlap); arrivals restart at 0 and are multiplied by
``time_scale``; a schedule that would sleep longer than ``max_wait_s`` at once (a gap of
days in the trace, an absurd scale) is refused before anything is sent, naming the fix.
Lengths can be capped (a tiny CPU model has a short context); a logged
output of 0 tokens is asked as 1 (a stream needs a token to time). The trace's prefix
hashes, where it has them, travel with the batch (``LiveBatch.prefix_hashes``).

A run in which no request streamed a token measured nothing: its rows are written, its
``runs`` row says ``failed`` (so the views hide them, as they hide any failed run's), and
``NoTokensError`` says so in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline import runs
from pipeline.contracts import LIVE_METRICS, LIVE_REQUESTS
from pipeline.errors import ConfigError, PipelineError
from pipeline.live.types import LiveBatch, LiveResult, longest_wait
from pipeline.progress import progress
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import read_requests, select_request_files
from pipeline.warehouse import Warehouse, new_run_id

ENGINES = ("inprocess", "http")
TIME_SCALES = (1e-6, 1e6)  # --time-scale, allowed range
MAX_WAIT_S = 300.0  # the longest sleep between arrivals, by default (wall time)


class NoTokensError(PipelineError):
    """A live run in which no request streamed a token (kept as a failed run)."""


@dataclass(frozen=True)
class Selection:
    """Which requests, and how they are shaped, for one live run."""

    sample: int | None = None  # requests to replay (None: all)
    skip: int = 0  # leading requests left out
    time_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_wait_s: float = MAX_WAIT_S  # the longest sleep between arrivals (inf: no bound)

    def __post_init__(self) -> None:
        for name, flag in (
            ("sample", "--num-requests"),
            ("max_prompt_tokens", None),
            ("max_output_tokens", None),
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = flag or f"--{name.replace('_', '-')}"
                raise ConfigError(f"{flag} {value}: must be at least 1")
        if self.skip < 0:
            raise ConfigError(f"--skip {self.skip}: must be 0 or more")
        lo, hi = TIME_SCALES
        if not (math.isfinite(self.time_scale) and lo <= self.time_scale <= hi):
            raise ConfigError(
                f"--time-scale {self.time_scale:g}: must be a finite number from {lo:g} to "
                f"{hi:g} (0.5 replays twice as fast)"
            )
        if not self.max_wait_s > 0:
            raise ConfigError(f"--max-gap-s {self.max_wait_s:g}: must be more than 0 seconds")


@dataclass
class LiveRun:
    """What ``run_live`` wrote."""

    run_id: str
    engine: str
    summary: dict[str, Any]
    engine_info: dict[str, str]
    num_requests_read: int
    paths: dict[str, Path] = field(default_factory=dict)


def make_batch(frame: pl.DataFrame, sel: Selection) -> LiveBatch:
    """The slice of ``frame`` (sorted by arrival) that ``sel`` names, as a LiveBatch.

    Raises:
        ConfigError: the slice is empty, an arrival time is not finite, or the replay
            would sleep longer than ``sel.max_wait_s`` at once.
    """
    end = None if sel.sample is None else sel.skip + sel.sample
    part = frame.slice(sel.skip, None if end is None else end - sel.skip)
    if part.height == 0:
        raise ConfigError(f"--skip {sel.skip} leaves none of the {frame.height} requests")
    arrival = part["arrival_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    bad = np.flatnonzero(~np.isfinite(arrival))
    if len(bad):
        rid = part["request_id"][int(bad[0])]
        raise ConfigError(
            f"request {rid}: arrival_s is {arrival[bad[0]]}, not a time; re-ingest its source "
            "or leave it out with --where"
        )
    prompt = part["prompt_tokens"].to_numpy().astype(np.int64)
    output = part["output_tokens"].to_numpy().astype(np.int64)
    if sel.max_prompt_tokens is not None:
        prompt = np.minimum(prompt, sel.max_prompt_tokens)
    if sel.max_output_tokens is not None:
        output = np.minimum(output, sel.max_output_tokens)
    hashes, block = None, None
    if "prefix_hashes" in part.columns and "block_size" in part.columns:
        lists = [h or [] for h in part["prefix_hashes"].to_list()]
        if any(lists):  # the trace's prefix sharing, for engines that make up prompts
            hashes = lists
            block = part["block_size"].fill_null(0).to_numpy().astype(np.int64)
    scaled = (arrival - arrival[0]) * sel.time_scale
    _check_waits(scaled, part["request_id"], sel)
    return LiveBatch(
        request_id=part["request_id"].to_list(),
        arrival_s=scaled,
        prompt_tokens=np.maximum(prompt, 1),
        output_tokens=np.maximum(output, 1),
        prefix_hashes=hashes,
        block_size=block,
    )


def _check_waits(arrival: npt.NDArray[np.float64], ids: pl.Series, sel: Selection) -> None:
    """Refuse a replay that would sleep longer than ``sel.max_wait_s`` at once, up front."""
    gap, k = longest_wait(arrival)
    if gap <= sel.max_wait_s:
        return
    faster = sel.time_scale * sel.max_wait_s / gap if math.isfinite(gap) else 0.0
    raise ConfigError(
        f"--time-scale {sel.time_scale:g}: the replay would sleep {gap:,.6g} s "
        f"({gap / 86400:,.3g} days) before request {ids[k]} (#{k + 1} of the slice), "
        f"past --max-gap-s {sel.max_wait_s:g} s; replay faster (--time-scale {faster:.3g} or "
        f"less), --skip {sel.skip + k} past the gap, or replay one day (--from/--to); "
        "--max-gap-s raises the bound"
    )


def _nullable(x: npt.NDArray[np.float64]) -> pa.Array:
    return pa.array(x, type=pa.float64(), mask=np.isnan(x))


def live_requests_table(engine: str, batch: LiveBatch, res: LiveResult) -> pa.Table:
    """The live_requests rows of one run, in the batch's order (run_id is the partition)."""
    n = len(batch)
    arrival = batch.arrival_s
    ttft = res.first_token_s - arrival
    e2e = res.finished_s - arrival
    got = res.output_tokens_received
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(got > 1, (e2e - ttft) / np.maximum(got - 1, 1), np.nan)
    ok = np.array([e is None for e in res.error], dtype=bool)
    return pa.table(
        {
            "request_id": pa.array(batch.request_id, pa.string()),
            "engine": pa.array([engine] * n, pa.string()),
            "arrival_s": pa.array(arrival, pa.float64()),
            "sent_s": _nullable(res.sent_s),
            "first_scheduled_s": _nullable(res.first_scheduled_s),
            "first_token_s": _nullable(res.first_token_s),
            "finished_s": _nullable(res.finished_s),
            "prompt_tokens": pa.array(batch.prompt_tokens, pa.int32()),
            "output_tokens": pa.array(batch.output_tokens, pa.int32()),
            "output_tokens_received": pa.array(got, pa.int32()),
            "ttft_s": _nullable(ttft),
            "tpot_s": _nullable(tpot),
            "e2e_s": _nullable(e2e),
            "itl_mean_s": _nullable(res.itl_mean_s),
            "itl_max_s": _nullable(res.itl_max_s),
            "error": pa.array(res.error, pa.string()),
            "ok": pa.array(ok, pa.bool_()),
        }
    )


def live_metrics_table(metrics: dict[str, npt.NDArray[np.float64]]) -> pa.Table:
    """LiveResult.metrics (one column per metric) in long format, NaN samples left out."""
    times = np.asarray(metrics.get("time_s", np.empty(0)), dtype=np.float64)
    t, names, values = [], [], []
    for name in sorted(k for k in metrics if k != "time_s"):
        v = np.asarray(metrics[name], dtype=np.float64)
        keep = ~np.isnan(v)
        t.append(times[keep])
        values.append(v[keep])
        names.extend([name] * int(keep.sum()))
    return pa.table(
        {
            "time_s": pa.array(np.concatenate(t) if t else np.empty(0), pa.float64()),
            "metric": pa.array(names, pa.string()),
            "value": pa.array(np.concatenate(values) if values else np.empty(0), pa.float64()),
        }
    )


def _pct(x: npt.NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _stats(prefix: str, x: npt.NDArray[np.float64]) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    return {
        f"{prefix}_p50_s": _pct(x, 50),
        f"{prefix}_p90_s": _pct(x, 90),
        f"{prefix}_p99_s": _pct(x, 99),
        f"{prefix}_mean_s": float(x.mean()) if len(x) else None,
    }


def summarize_live(table: pa.Table) -> dict[str, Any]:
    """The printed figures of one live run (JSON-able).

    Latencies and throughput count the completed requests (``ok``), over the span from
    the first arrival to the last completion, as the simulator's summary does. "Late"
    is how long after its arrival time the client sent a request.
    """
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    ok = df.filter(pl.col("ok"))

    def col(frame: pl.DataFrame, name: str) -> npt.NDArray[np.float64]:
        return frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy()

    span = 0.0
    if ok.height:
        span = float(ok["finished_s"].max()) - float(df["arrival_s"].min())  # type: ignore[arg-type]
    out_tokens = int(ok["output_tokens_received"].sum())
    in_tokens = int(ok["prompt_tokens"].sum())

    def per_s(x: float) -> float | None:
        return x / span if span > 0 else None

    failed = df.filter(~pl.col("ok"))
    reasons = (
        failed.group_by(pl.col("error").str.slice(0, 60).alias("reason"))
        .len()
        .sort(["len", "reason"], descending=[True, False])
    )
    late = col(df, "sent_s") - col(df, "arrival_s")
    return {
        "num_requests": df.height,
        "completed": ok.height,
        "failed": failed.height,
        "failure_reasons": {r["reason"]: r["len"] for r in reasons.head(5).to_dicts()},
        "duration_s": span,
        "request_throughput": per_s(ok.height),
        "output_token_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        **_stats("ttft", col(ok, "ttft_s")),
        **_stats("tpot", col(ok, "tpot_s")),
        **_stats("e2e", col(ok, "e2e_s")),
        "late_p50_s": _pct(late[~np.isnan(late)], 50),
        "late_max_s": float(np.nanmax(late)) if (~np.isnan(late)).any() else None,
    }


def _plain(value: Any) -> Any:
    """A value for the runs row's JSON: paths and non-finite numbers as text."""
    if isinstance(value, Path) or (isinstance(value, float) and not math.isfinite(value)):
        return str(value)
    return value


def run_engine(
    engine: str, batch: LiveBatch, options: dict[str, Any], *, quiet: bool = True
) -> LiveResult:
    """Run ``batch`` through the named engine with its options."""
    if engine == "http":
        from pipeline.live.http import HttpOptions, run_http

        opts = HttpOptions(**options)
        with progress(f"live http {opts.base_url}", total=len(batch), quiet=quiet) as bar:
            return run_http(batch, opts, on_done=bar.advance)
    if engine == "inprocess":
        from pipeline.live.inprocess import run_inprocess

        return run_inprocess(batch, **options)
    raise ConfigError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")


def run_live(
    warehouse: Path,
    engine: str,
    options: dict[str, Any],
    *,
    selection: Selection | None = None,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    selection_filter: RequestFilter | None = None,
    run_id: str | None = None,
    quiet: bool = True,
) -> LiveRun:
    """Replay the selected requests through a live engine and write the results.

    Args:
        warehouse: warehouse directory (requests are read from it unless
            ``requests_file`` is given; results are always written to it).
        engine: ``inprocess`` or ``http``.
        options: the engine's keyword options (``HttpOptions`` fields, or
            ``run_inprocess`` keywords), only those the user set.
        selection: which requests and how they are shaped.
        selection_filter: which requests of those days (models, tenants, a predicate,
            a time window), as ``replay`` takes them.
        quiet: no progress bar (there is one over HTTP on a terminal otherwise).

    Raises:
        ConfigError: no requests selected, bad options, server unreachable, a schedule
            that sleeps past ``selection.max_wait_s`` (before anything is sent).
        NoTokensError: no request streamed a token (the run is written as failed).
    """
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    sel = selection or Selection()
    started = datetime.now(UTC)
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    frame = read_requests(files, selection_filter)
    batch = make_batch(frame, sel)
    wh.init()
    status, summary, info = "failed", {}, {}
    n_req = len(batch)
    paths: dict[str, Path] = {}
    try:
        res = run_engine(engine, batch, options, quiet=quiet)
        info = dict(res.engine_info)
        part = {"run_id": run_id}
        table = live_requests_table(engine, batch, res)
        paths["live_requests"] = wh.write(LIVE_REQUESTS, table, part, engine)
        paths["live_metrics"] = wh.write(
            LIVE_METRICS, live_metrics_table(res.metrics), part, engine
        )
        summary = summarize_live(table)
        streamed = int(np.isfinite(res.first_token_s).sum())
        if streamed == 0:
            top = next(iter(summary["failure_reasons"].items()), ("no reason given", n_req))
            raise NoTokensError(
                f"live run {run_id}: none of the {n_req:,} requests streamed a token "
                f"({top[1]:,} x {top[0]}); the run is kept as failed and hidden from "
                f"live_requests; every request's reason is in {paths['live_requests']}"
            )
        status = "ok"
    finally:
        details = {
            "engine": engine,
            "engine_info": info,
            "options": {k: _plain(v) for k, v in options.items()},
            "selection": {k: _plain(v) for k, v in sel.__dict__.items()},
            "summary": summary,
        }
        inputs = [str(f) for f in files]
        n = len(batch)
        runs.write_run_row(
            wh,
            run_id=run_id,
            command="live",
            started=started,
            status=status,
            inputs=inputs,
            rows_read=frame.height,
            rows_kept=n,
            details=details,
        )
    return LiveRun(run_id, engine, summary, info, frame.height, paths)
