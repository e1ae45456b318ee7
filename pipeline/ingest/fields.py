"""Shared field parsing for formats: text lines of CSV blocks, timestamps, integers."""

from __future__ import annotations

import math
import re

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.formats import REJECT_SCHEMA, Block
from pipeline.ingest.reader import line_starts

_TS_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f%#z",
    "%Y-%m-%d %H:%M:%S%.f%#z",
    "%Y-%m-%dT%H:%M:%S%#z",
    "%Y-%m-%d %H:%M:%S%#z",
)
_NAIVE_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
)


def timestamp_expr(col: str) -> pl.Expr:
    """ISO-8601-ish strings in ``col`` to Datetime(us, UTC), format inferred; junk -> null.

    Use ``fix_timestamps`` afterwards for values written in another layout
    than the first one in the column.
    """
    return (
        pl.col(col).str.strip_chars().str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
    )


def fix_timestamps(frame: pl.DataFrame, parsed: str, raw: pl.Series) -> pl.DataFrame:
    """Retry the values of column ``parsed`` that failed, with every known layout.

    A number is an epoch time whose unit follows from its size (``epoch_us``).
    Naive times are taken as UTC. Up to 9 fractional digits are accepted
    (Azure traces have 7). Values that still fail stay null and the validator
    rejects their records. Only the values that failed are parsed again.
    """
    missing = frame[parsed].is_null() & raw.is_not_null()
    if not missing.any():
        return frame
    idx = missing.arg_true()
    s = raw.gather(idx).str.strip_chars()
    out = epoch_number(s)
    for fmt in _TS_FORMATS:
        out = out.fill_null(s.str.to_datetime(fmt, time_unit="us", time_zone="UTC", strict=False))
    for fmt in _NAIVE_FORMATS:
        alt = s.str.to_datetime(fmt, time_unit="us", strict=False).dt.replace_time_zone("UTC")
        out = out.fill_null(alt)
    return frame.with_columns(frame[parsed].clone().scatter(idx, out).alias(parsed))


# Epoch times by magnitude: below 1e11 seconds (until the year 5138), below 1e14
# milliseconds, below 1e17 microseconds, else nanoseconds. Today is about 1.7e9 s =
# 1.7e12 ms = 1.7e15 us = 1.7e18 ns, and each unit's range is far from the next one's.
EPOCH_SECONDS_BELOW = 1e11
EPOCH_MILLIS_BELOW = 1e14
EPOCH_MICROS_BELOW = 1e17


def epoch_us(value: float | int) -> int | None:
    """An epoch time in s, ms, us or ns (told apart by magnitude) as microseconds.

    None when the value is not finite or lies beyond the 64-bit microsecond range.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    a = abs(value)
    if a < EPOCH_SECONDS_BELOW:
        us = round(value * 1_000_000)
    elif a < EPOCH_MILLIS_BELOW:
        us = round(value * 1000)
    elif a < EPOCH_MICROS_BELOW:
        us = round(value)
    elif isinstance(value, int):
        us = value // 1000
    else:
        us = round(value / 1000)
    return us if -(2**63) <= us < 2**63 else None


def epoch_number(s: pl.Series) -> pl.Series:
    """Numeric strings in ``s`` as epoch times (unit by magnitude, see ``epoch_us``); else null."""
    f = s.str.strip_chars().cast(pl.Float64, strict=False)
    a = f.abs()
    us = (
        pl.when(a < EPOCH_SECONDS_BELOW)
        .then(f * 1e6)
        .when(a < EPOCH_MILLIS_BELOW)
        .then(f * 1e3)
        .when(a < EPOCH_MICROS_BELOW)
        .then(f)
        .when(a.is_finite())
        .then(f / 1e3)
    )
    out = pl.select(
        pl.when(us.abs() < 2.0**62).then(us.round().cast(pl.Int64, strict=False)).alias("t")
    ).to_series()
    return out.cast(pl.Datetime("us", "UTC"))


# The common ISO-8601 layouts, each valid value of which polars' parsing (``timestamp_expr``
# then ``fix_timestamps``) and Arrow's cast read as the same instant; years 1900-2999.
_ISO_DATE_TIME = (
    r"^(19|2[0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
)
_ISO_ZONED = _ISO_DATE_TIME + r"(Z|[+-][0-9]{2}:[0-9]{2})$"
_ISO_NAIVE = _ISO_DATE_TIME + "$"


def iso_timestamps(s: pl.Series) -> pl.Series | None:
    """Fast path of ``parse_timestamp``: a column written in one common ISO-8601 layout.

    When every value (nulls aside) has the layout ``_ISO_ZONED`` (or every value
    ``_ISO_NAIVE``, taken as UTC), Arrow's ISO-8601 cast parses the column about
    ten times faster than polars' format inference. Returns None when the column
    has another layout, or any value Arrow refuses (an invalid date or time, a
    leap second, an offset of 24 hours or more): the caller then parses it the
    slow way, which gives the same instants for the values both accept
    (``tests/ingest/test_timestamps.py`` checks that).
    """
    if s.dtype != pl.String or s.null_count() == len(s):
        return None
    raw = _arrow(s)
    first = s[0] if not s.null_count() else None
    for pattern, unit in ((_ISO_ZONED, pa.timestamp("us", tz="UTC")), (_ISO_NAIVE, None)):
        if (
            first is not None
            and re.fullmatch(pattern[1:-1], first)
            and _same_layout(raw, first.encode())
        ) or s.str.contains(pattern).fill_null(True).all():
            try:
                arr = pc.cast(raw, unit or pa.timestamp("us"))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
            out = pl.Series(s.name, arr)
            return out if unit is not None else out.dt.replace_time_zone("UTC")
    return None


def _same_layout(arr: pa.Array, first: bytes) -> bool:
    """True when every value of a null-free string array is laid out like ``first``.

    Same length, digits where ``first`` has digits, the same other characters (``-``,
    ``T``, ``:``, ``.``, ``Z``, ``+``) at the same places, years 1900-2999: with
    ``first`` matching a layout's regex, every value then matches it too. Checked on
    the raw bytes with numpy (~1 ms for 100k values, a quarter of the regex's time).
    """
    if arr.null_count:
        return False
    rows = _layout_rows(arr, first)
    return rows is not None and bool(rows.all())


def _arrow(s: pl.Series) -> pa.Array:
    """The series as one Arrow array."""
    arr = s.to_arrow()
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _string_buffers(
    arr: pa.Array,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]] | None:
    """A large-string array's value offsets (``len(arr) + 1``) and data bytes, read in
    place; None for another type."""
    if not pa.types.is_large_string(arr.type):
        return None
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    return offsets, np.frombuffer(arr.buffers()[2], dtype=np.uint8)


def none_blank(s: pl.Series) -> bool:
    """True when no non-null value of a String series is blank (empty or whitespace only).

    A cheap sufficient check for skipping ``str.strip_chars() != ""``: every value
    starts with a printable ASCII character other than a space (``!`` to ``~``).
    False can also mean "not known" (a value that starts otherwise), never a wrong True.
    Checked on the raw Arrow buffers with numpy (~0.05 ms for 25k values, a sixth of
    stripping them).
    """
    if s.dtype != pl.String:
        return False
    arr = _arrow(s)
    n = len(arr)
    if not n or arr.null_count == n:
        return True
    buffers = _string_buffers(arr)
    if buffers is None:
        return False
    offsets, data = buffers
    starts, lengths = offsets[:-1], np.diff(offsets)
    if arr.null_count:
        valid = np.asarray(arr.is_valid())
        starts, lengths = starts[valid], lengths[valid]
    if not len(starts) or (lengths == 0).any():
        return not len(starts)
    first = data[starts]
    return bool(((first >= ord("!")) & (first <= ord("~"))).all())


def parse_timestamp(s: pl.Series) -> pl.Series:
    """Series version of ``timestamp_expr`` + ``fix_timestamps`` (``iso_timestamps`` first)."""
    fast = iso_timestamps(s)
    if fast is None:
        fast = _mostly_iso(s)
    return fast if fast is not None else slow_timestamps(s)


def _mostly_iso(s: pl.Series) -> pl.Series | None:
    """A column in one ISO-8601 layout but for some values (bad records, other layouts).

    The values laid out like the first one take Arrow's cast, the others the slow
    path (after the first value, from which it infers a format): a few bad
    timestamps in a block no longer send all of it the slow way (~14 ms a block of
    24k records). None when the first value has no common
    layout, or Arrow refuses one of the values laid out like it.
    """
    if s.dtype != pl.String or s.null_count() == len(s):
        return None
    raw = _arrow(s)
    first = s.drop_nulls()[0]
    for pattern, unit in ((_ISO_ZONED, pa.timestamp("us", tz="UTC")), (_ISO_NAIVE, None)):
        if not re.fullmatch(pattern[1:-1], first):
            continue
        rows = _layout_rows(raw, first.encode())
        if rows is None or not rows.any():
            return None
        try:
            arr = pc.cast(raw.filter(pa.array(rows)), unit or pa.timestamp("us"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        fast = pl.Series(s.name, arr)
        fast = fast if unit is not None else fast.dt.replace_time_zone("UTC")
        out = pl.Series(s.name, [None] * len(s), dtype=pl.Datetime("us", "UTC"))
        out.scatter(np.flatnonzero(rows), fast)
        rest = np.flatnonzero(~rows)
        if len(rest):
            # with the column's first value in front: the slow path infers its format from it
            lead = s.gather([int(np.flatnonzero(rows)[0])])
            out.scatter(rest, slow_timestamps(pl.concat([lead, s.gather(rest)]))[1:])
        return out
    return None


def _layout_rows(arr: pa.Array, first: bytes) -> npt.NDArray[np.bool_] | None:
    """Per value, whether it is laid out like ``first`` (``_same_layout``'s test; nulls:
    False); None for an array it cannot read."""
    buffers = _string_buffers(arr)
    if buffers is None:
        return None
    offsets, data = buffers
    width, n = len(first), len(arr)
    ok = np.diff(offsets) == width
    if arr.null_count:
        ok &= np.asarray(arr.is_valid())
    if ok.all():  # every value has the width: the bytes are the rows, in place
        rows = data[offsets[0] : offsets[-1]].reshape(n, width)
    else:
        rows = data[offsets[np.flatnonzero(ok)][:, None] + np.arange(width)]
    tmpl = np.frombuffer(first, dtype=np.uint8)
    digit = (tmpl >= ord("0")) & (tmpl <= ord("9"))
    d = rows[:, digit]
    good = ((d >= ord("0")) & (d <= ord("9"))).all(axis=1)
    good &= (rows[:, ~digit] == tmpl[~digit]).all(axis=1)
    good &= (rows[:, 0] == ord("2")) | ((rows[:, 0] == ord("1")) & (rows[:, 1] == ord("9")))
    ok[ok] = good
    return ok


def slow_timestamps(s: pl.Series) -> pl.Series:
    """``parse_timestamp`` without the fast path (every layout; the reference for tests)."""
    frame = pl.DataFrame({"raw": s}).with_columns(timestamp_expr("raw").alias("t"))
    return fix_timestamps(frame, "t", s)["t"].alias(s.name)


def int_expr(e: pl.Expr) -> pl.Expr:
    """Numbers (or numeric strings) to Int64; fractions and junk become null.

    The same rule as ``formats._lines.as_int``: ``12``, ``12.0``, ``"12"`` and
    ``"1e3"`` are whole numbers. Whole values beyond the 64-bit range are
    clipped to it, so the validator rejects them as too large.
    """
    f = e.cast(pl.Float64, strict=False)
    whole = f.is_finite() & (f == f.floor())
    return (
        pl.when(whole & (f.abs() < 2.0**63))
        .then(f.cast(pl.Int64, strict=False))
        .when(whole & (f > 0))
        .then(pl.lit(2**63 - 1, dtype=pl.Int64))
        .when(whole)
        .then(pl.lit(-(2**63), dtype=pl.Int64))
    )


def to_number(s: pl.Series) -> pl.Series:
    """Text (or numbers) as Float64, surrounding spaces ignored; junk becomes null.

    NOTE: ``int_expr`` refers to its input several times, and polars does not
    always share a cast between them: cast text once with this first. Only
    values that fail as they are get stripped and cast again (cheap when none do).
    """
    if s.dtype != pl.String:
        return s.cast(pl.Float64, strict=False)
    out = s.cast(pl.Float64, strict=False)
    if out.null_count() > s.null_count():  # some values failed (a null stays null)
        out = out.fill_null(s.str.strip_chars().cast(pl.Float64, strict=False))
    return out


def whole_int(s: pl.Series) -> pl.Series:
    """Series version of ``int_expr``.

    A column of whole numbers without nulls (most count columns) is cast straight,
    after a check with numpy (a tenth of ``int_expr``'s ten passes over it).
    """
    f = to_number(s)
    if not f.null_count():
        a = f.to_numpy()
        if len(a) and np.abs(a).max() < 2.0**53:  # NaN fails the test too
            i = a.astype(np.int64)
            if np.array_equal(i, a):
                return pl.Series(s.name, i, dtype=pl.Int64)
    return pl.select(int_expr(pl.lit(f))).to_series().alias(s.name)


def split_csv_block(
    block: Block, num_fields: tuple[int, ...]
) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Split a block of simple CSV lines (no quoting) into string fields.

    Returns (frame with columns f0..fN-1 plus source_line and byte_offset,
    rejects, number of fields). Lines whose field count is not in
    ``num_fields`` and lines that are not UTF-8 are rejected; blank lines are
    skipped. The most common accepted field count decides N; rows with fewer
    fields get nulls in the missing ones.
    """
    data = block.data
    starts = line_starts(data)
    ends = [*starts[1:].tolist(), len(data)] if len(starts) else []
    raw = [data[a:b] for a, b in zip(starts.tolist(), ends, strict=True)]
    texts: list[str | None] = []
    bad_lines: list[int] = []
    reasons: list[str] = []
    for i, line in enumerate(raw):
        try:
            texts.append(line.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as exc:
            texts.append(None)
            bad_lines.append(i)
            reasons.append(f"invalid UTF-8 at byte {exc.start} of the line; re-export as UTF-8")
    lines = pl.Series("line", texts, dtype=pl.String)
    parts = lines.str.split(",")
    counts = parts.list.len().fill_null(0).to_numpy()  # a line that is not UTF-8 has none
    blank = (lines.str.strip_chars() == "").fill_null(False).to_numpy()
    valid_text = lines.is_not_null().to_numpy()
    accepted = np.isin(counts, np.asarray(num_fields)) & valid_text & ~blank
    wrong = valid_text & ~blank & ~accepted
    for i in np.flatnonzero(wrong).tolist():
        bad_lines.append(i)
        reasons.append(f"{counts[i]} fields, expected {' or '.join(str(n) for n in num_fields)}")
    width = max(num_fields)
    keep = np.flatnonzero(accepted)
    kept = parts.gather(keep)
    frame = pl.DataFrame(
        {f"f{j}": kept.list.get(j, null_on_oob=True).str.strip_chars() for j in range(width)}
    ).with_columns(
        pl.Series("source_line", block.first_line + keep, dtype=pl.Int64),
        pl.Series("byte_offset", block.offset + starts[keep], dtype=pl.Int64),
    )
    order = np.argsort(np.asarray(bad_lines, dtype=np.int64), kind="stable")
    bad = np.asarray(bad_lines, dtype=np.int64)[order]
    rejects = pl.DataFrame(
        {
            "source_line": block.first_line + bad,
            "byte_offset": block.offset + starts[bad] if len(bad) else np.zeros(0, np.int64),
            "reason": [reasons[k] for k in order.tolist()],
        },
        schema=REJECT_SCHEMA,
    )
    common = int(np.bincount(counts[keep]).argmax()) if len(keep) else width
    return frame, rejects, common
