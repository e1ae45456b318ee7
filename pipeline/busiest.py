"""The busiest window of the selected requests (``--busiest 1h``), and its warm-up.

    selected requests (sorted) ──find_window──▶ [start, start + D) ──cut──▶
        warm-up rows (flagged WARMUP_COLUMN) + the window's rows

- The candidates are the windows [t_i, t_i + D) that start at a request's arrival t_i:
  a window that starts anywhere else holds no more than the one that starts at the next
  arrival. A window's value is the number of requests that arrive in it (``arrivals``)
  or their prompt + output tokens (``tokens``). Every candidate is valued at once, with
  cumulative sums and a ``searchsorted`` over the sorted arrival times.
- Ties go to the earliest start.
- The mean window: the selection's value over its span (first to last arrival) times D;
  the window's ratio to it says how much busier it is.
- The warm-up: the selected requests that arrive in [start - W, start) are replayed
  first, so the engine holds the queue and the running batch the trace had at the
  window's start; they are left out of every figure and table (``simulate.LeadInput``).
  It starts no earlier than the first selected request.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.errors import ConfigError

BY = ("arrivals", "tokens")
DEFAULT_WARMUP_S = 300.0  # --busiest-warmup
WARMUP_COLUMN = "busiest_warmup"  # frame column: True for a warm-up row (replayed, unmeasured)

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|inf)\s*(ms|s|min|m|h|d)?\s*")


def parse_duration(value: str | float, *, zero: bool = False, inf: bool = False) -> float:
    """Seconds of a duration: a number of seconds, or with a unit (500ms, 90s, 15m, 1h, 1d).

    Raises:
        ValueError: not a duration, or not > 0 (>= 0 with ``zero``; ``inf`` only with
            ``inf``); the message says what is expected.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = _DURATION.fullmatch(str(value))
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"] if m else math.nan
    least = "0 or more" if zero else "more than 0"
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"{value!r}: expected a duration {least}, e.g. 90s, 15m, 1h")
    if math.isinf(seconds) and not inf:
        raise ValueError(f"{value!r}: expected a finite duration, e.g. 90s, 15m, 1h")
    return seconds


def format_duration(seconds: float) -> str:
    """'1h', '15m', '90s', '1h30m', '2.5s': the unit that reads."""
    if seconds >= 60 and float(seconds).is_integer():
        s = int(seconds)
        parts = [(s // 3600, "h"), (s % 3600 // 60, "m"), (s % 60, "s")]
        return "".join(f"{n}{u}" for n, u in parts if n) or "0s"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Busiest:
    """What to look for: the busiest ``duration_s`` by ``by``, warmed up ``warmup_s``.

    Raises:
        ConfigError: (on construction) a duration not > 0, a warm-up < 0, an unknown ``by``.
    """

    duration_s: float
    by: str = "arrivals"
    warmup_s: float = DEFAULT_WARMUP_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ConfigError(f"--busiest must be a duration more than 0, got {self.duration_s}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ConfigError(f"--busiest-warmup must be a duration >= 0, got {self.warmup_s}")
        if self.by not in BY:
            raise ConfigError(f"--busiest-by must be one of {', '.join(BY)}, got {self.by!r}")

    def describe(self) -> str:
        return f"the busiest {format_duration(self.duration_s)} by {self.by}"


@dataclass(frozen=True)
class BusiestWindow:
    """The window that was picked, and how it compares."""

    spec: Busiest
    start: datetime  # UTC, a request's arrival
    end: datetime  # start + duration (exclusive)
    num_requests: int  # arrivals in the window
    tokens: int  # their prompt + output tokens
    mean: float  # the mean window's value (arrivals or tokens, as ``spec.by``)
    warmup_start: datetime  # the first warm-up request's arrival (start when none)
    num_warmup: int  # requests replayed before the window, left out of the figures
    selection_start: datetime  # the first and last selected arrival
    selection_end: datetime

    @property
    def value(self) -> int:
        return self.num_requests if self.spec.by == "arrivals" else self.tokens

    @property
    def ratio(self) -> float | None:
        return self.value / self.mean if self.mean > 0 else None

    @property
    def warmup_used_s(self) -> float:
        """The warm-up span the selection held: at most ``spec.warmup_s``."""
        return min(self.spec.warmup_s, (self.start - self.selection_start).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        return {
            "duration_s": self.spec.duration_s,
            "by": self.spec.by,
            "start": iso(self.start),
            "end": iso(self.end),
            "num_requests": self.num_requests,
            "tokens": self.tokens,
            "value": self.value,
            "mean_window_value": self.mean,
            "ratio_to_mean": self.ratio,
            "warmup_s": self.spec.warmup_s,
            "warmup_used_s": self.warmup_used_s,
            "warmup_start": iso(self.warmup_start),
            "num_warmup_requests": self.num_warmup,
            "selection_start": iso(self.selection_start),
            "selection_end": iso(self.selection_end),
        }

    def line(self) -> str:
        """One line for a command's text output (``window_line``)."""
        return window_line(self.to_dict())


def window_line(window: dict[str, Any]) -> str:
    """One line of a window (``BusiestWindow.to_dict``, as a run records it): which, how
    busy against the mean window, and its warm-up."""
    d = format_duration(window["duration_s"])
    ratio = window["ratio_to_mean"]
    shown = f"{ratio:.2f}x" if ratio is not None else "n/a"
    asked, used = window["warmup_s"], window["warmup_used_s"]
    warm = format_duration(asked)
    if window["num_warmup_requests"] and used < asked:
        warm = f"{format_duration(used)} of the {warm} asked (the selection starts there)"
    lead = (
        f"warm-up {warm}: {window['num_warmup_requests']:,} requests replayed before it, "
        "not measured (--busiest-warmup)"
        if asked > 0
        else "no warm-up (--busiest-warmup 0)"
    )
    return (
        f"busiest {d} by {window['by']}: {window['start']} to {window['end']}, "
        f"{window['num_requests']:,} arrivals, {window['tokens']:,} tokens ({shown} the mean "
        f"{d} window's {window['mean_window_value']:,.1f} {window['by']}); {lead}"
    )


def selection_lines(record: dict[str, Any]) -> list[str]:
    """What a command prints of its run's selection (``replay.selection_record``): the
    busiest window's line, or nothing."""
    window = record.get("busiest")
    return [window_line(window)] if window else []


def iso(t: datetime) -> str:
    """'2024-05-01T18:00:00Z' (with microseconds only where it has them)."""
    text = t.astimezone(UTC).replace(tzinfo=None).isoformat()
    return text + "Z"


def find_window(
    t: npt.NDArray[np.int64], span: int, weights: npt.NDArray[np.int64] | None = None
) -> tuple[int, int, int]:
    """The busiest window of length ``span`` over the sorted times ``t``.

    Returns:
        (first, end, value): the window holds rows first..end-1 (it starts at
        ``t[first]``), and ``value`` is their count, or the sum of their ``weights``.
        Ties go to the earliest start.
    """
    n = len(t)
    assert n > 0 and span > 0
    ends = np.searchsorted(t, t + span, side="left")  # first row at or after t_i + span
    starts = np.arange(n)
    if weights is None:
        values = ends - starts
    else:
        c = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
        values = c[ends] - c[starts]
    k = int(np.argmax(values))  # the first maximum: the earliest start
    return k, int(ends[k]), int(values[k])


def cut(frame: pl.DataFrame, spec: Busiest) -> tuple[pl.DataFrame, BusiestWindow]:
    """The rows of the busiest window and of its warm-up, of ``frame`` (sorted by
    arrival_time), with ``WARMUP_COLUMN`` and arrival_s counted from the first kept row.

    Raises:
        ConfigError: the window is longer than the selection's span.
    """
    us = frame["arrival_time"].dt.epoch("us").to_numpy().astype(np.int64)
    first, last = _at(int(us[0])), _at(int(us[-1]))
    span_us = int(us[-1] - us[0])
    duration_us = max(1, round(spec.duration_s * 1e6))
    if duration_us > span_us:
        raise ConfigError(
            f"--busiest {format_duration(spec.duration_s)} is longer than the selected "
            f"requests' span ({format_duration(span_us / 1e6)}: {frame.height:,} requests from "
            f"{iso(first)} to {iso(last)}); give a shorter window or select more requests"
        )
    tokens = (
        frame["prompt_tokens"].fill_null(0).cast(pl.Int64) + frame["output_tokens"].fill_null(0)
    ).to_numpy()
    weights = tokens if spec.by == "tokens" else None
    k, end, value = find_window(us, duration_us, weights)
    total = frame.height if weights is None else int(tokens.sum())
    w0 = int(np.searchsorted(us, us[k] - round(spec.warmup_s * 1e6), side="left"))
    kept = frame[w0:end]
    seconds = (us[w0:end] - us[w0]).astype(np.float64) / 1e6
    flags = np.zeros(end - w0, dtype=bool)
    flags[: k - w0] = True
    kept = kept.with_columns(pl.Series("arrival_s", seconds), pl.Series(WARMUP_COLUMN, flags))
    start = _at(int(us[k]))
    window = BusiestWindow(
        spec=spec,
        start=start,
        end=start + timedelta(microseconds=duration_us),
        num_requests=end - k,
        tokens=int(tokens[k:end].sum()),
        mean=total * duration_us / span_us,
        warmup_start=_at(int(us[w0])),
        num_warmup=k - w0,
        selection_start=first,
        selection_end=last,
    )
    assert window.value == value
    return kept, window


def _at(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


__all__ = [
    "BY",
    "DEFAULT_WARMUP_S",
    "WARMUP_COLUMN",
    "Busiest",
    "BusiestWindow",
    "cut",
    "find_window",
    "format_duration",
    "iso",
    "parse_duration",
    "selection_lines",
    "window_line",
]
