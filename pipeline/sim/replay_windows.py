"""The requests of a replay cut by time, read one window at a time.

A replay cut into time windows (``shard.py``) needs, for each window, only its own
requests and those of the warm-up before it. Read so, a table of a fleet's day never
lives whole in memory: each window is read from the files (``RequestFilter.read``
with the window's bounds, which DuckDB prunes to the row groups that hold them),
prepared for the scenario as a whole replay's requests are (``replay_input.prepare``:
caps, drops, prefix keys, priorities), replayed, and let go.

    files ──▶ bounds of the arrivals ──▶ N windows of equal time ──▶ per window:
        read [start - warm-up, end) ──▶ prepare ──▶ a ``shard.Cut`` (warm-up not measured)

Every window's arrivals count from the first selected request, as the whole
replay's do. What cannot be read a window at a time: a busiest window (it is chosen
over the whole selection), arrivals drawn by the scenario (a process over the whole
replay) and a prefix-cache warm-up of the first requests (``check_streamable``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.errors import ScenarioError
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import _read, _scan, prepare
from pipeline.sim.scenario import Scenario
from pipeline.sim.shard import STEP_BASE, Cut, ShardPlan

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WINDOW_REQUESTS = 100


@dataclass
class WindowFacts:
    """What the windows read came to, for the summary and the runs row."""

    num_read: int = 0  # rows read in the windows proper (warm-ups not counted)
    num_dropped: int = 0  # of those, dropped by the caps (drop_too_long)
    windows: int = 0  # windows that held a request


def check_streamable(sc: Scenario, selection: RequestFilter | None) -> None:
    """Raise ScenarioError (one line) if ``sc``'s requests cannot be read a window at a time."""
    if selection is not None and selection.busiest is not None:
        raise ScenarioError(
            f"scenario {sc.name!r}: --busiest picks its window over the whole selection; "
            "a replay cut by time reads one window at a time (drop --busiest or --shard-warmup)"
        )
    spec = sc.arrivals
    if spec.process != "trace" or spec.time_scale != 1 or spec.rate or spec.num_requests:
        raise ScenarioError(
            f"scenario {sc.name!r}: arrivals, time_scale, rate and num_requests reshape the "
            "whole replay's arrivals; a replay cut by time replays the trace's own (leave "
            "them at their defaults, or cut by replica groups under round_robin)"
        )
    if sc.prefix_warmup_requests:
        raise ScenarioError(
            f"scenario {sc.name!r}: prefix_warmup_requests warms the caches with the first "
            "requests of the whole replay; a replay cut by time warms each window with the "
            "traffic before it (--shard-warmup) instead"
        )


def _us(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def _at(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def arrival_bounds(
    files: list[Path], selection: RequestFilter | None
) -> tuple[int, int, int] | None:
    """The first and last arrival (epoch microseconds) the windows span, the files', within
    the selection's time window, and how many requests the files hold; None when no
    request is left in it."""
    row = (
        _scan(files)
        .select(
            pl.col("arrival_time").min().dt.epoch("us").alias("lo"),
            pl.col("arrival_time").max().dt.epoch("us").alias("hi"),
            pl.len().alias("n"),
        )
        .collect()
        .row(0)
    )
    if row[0] is None:
        return None
    lo, hi, n = int(row[0]), int(row[1]), int(row[2])
    if selection is not None and selection.start is not None:
        lo = max(lo, _us(selection.start))
    if selection is not None and selection.end is not None:
        hi = min(hi, _us(selection.end) - 1)
    return (lo, hi, n) if lo <= hi else None


def read_windows(
    files: list[Path],
    selection: RequestFilter | None,
    sc: Scenario,
    plan: ShardPlan,
    facts: WindowFacts,
) -> Iterator[Cut]:
    """The time windows of ``plan`` read one at a time, each as a cut to replay (its
    ``request_ids`` those of its measured requests). ``facts`` is filled in as the
    windows are read. There is at most one window per ``WINDOW_REQUESTS`` requests of
    the files.

    Raises:
        ScenarioError: a window's requests do not fit the scenario (``prepare``).
        ConfigError: no request selected at all (by the time every window was read).
    """
    assert plan.by == "time"
    bounds = arrival_bounds(files, selection)
    base = selection if selection is not None else RequestFilter()
    if bounds is None:
        _read(files, selection)  # raises the selection's own "nothing selected" error
        return
    lo, hi, n = bounds
    # each window costs a read of the files and a start of the loop (~40 ms): at most one
    # per WINDOW_REQUESTS requests, on average
    shards = max(1, min(plan.shards, n // WINDOW_REQUESTS))
    edges = [lo + (hi + 1 - lo) * k // shards for k in range(shards + 1)]
    warm_us = int(round(plan.warmup_s * 1e6))
    ids = np.arange(sc.replicas, dtype=np.int64)
    t0_us: int | None = None
    offset = 0
    for k in range(shards):
        a_us, b_us = edges[k], edges[k + 1]
        first = t0_us is None
        start = a_us if first else max(lo, a_us - warm_us)
        window = dataclasses.replace(base, start=_at(start), end=_at(b_us))
        frame = _read(files, window, t0_us=t0_us, allow_empty=True)
        if frame.height == 0:
            continue
        us = frame["arrival_time"].dt.epoch("us").to_numpy()
        if t0_us is None:
            t0_us = int(us[0])  # (and the frame's arrival_s counts from it already)
        warm_rows = int(np.searchsorted(us, a_us, side="left"))
        measured_rows = frame.height - warm_rows
        if measured_rows == 0:
            continue
        first_s = (int(us[0]) - t0_us) / 1e6
        prep = prepare(frame, sc, with_groups=False)
        del frame
        # prepare counts a trace's arrivals from its first row: back on the replay's clock
        inp = dataclasses.replace(prep.inp, arrival_s=prep.inp.arrival_s + first_s)
        a_s = (a_us - t0_us) / 1e6
        # rows before a_us arrive >= 1 us before it; a float's error here is ~1e-11 s
        lead = int(np.searchsorted(inp.arrival_s, a_s - 5e-7, side="left"))
        m = len(inp) - lead
        facts.num_read += measured_rows
        facts.num_dropped += measured_rows - m
        if m == 0:
            continue
        facts.windows += 1
        yield Cut(
            np.arange(offset, offset + m, dtype=np.int64),
            inp,
            lead,
            ids,
            -np.inf if first else a_s,
            np.inf if k == shards - 1 else (b_us - t0_us) / 1e6,
            request_ids=prep.request_ids[lead:],
            labels={
                kind: lab.take(np.arange(lead, len(inp))) for kind, lab in prep.classes.items()
            },
            step_base=k * STEP_BASE,
        )
        offset += m
