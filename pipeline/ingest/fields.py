"""Shared field parsing for formats: text lines of CSV blocks, timestamps, integers."""

from __future__ import annotations

import numpy as np
import polars as pl

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

    Naive times are taken as UTC. Up to 9 fractional digits are accepted
    (Azure traces have 7). Values that still fail stay null and the validator
    rejects their records. Cheap when nothing failed.
    """
    missing = frame[parsed].is_null() & raw.is_not_null()
    if not missing.any():
        return frame
    s = raw.str.strip_chars()
    out = frame[parsed]
    for fmt in _TS_FORMATS:
        out = out.fill_null(s.str.to_datetime(fmt, time_unit="us", time_zone="UTC", strict=False))
    for fmt in _NAIVE_FORMATS:
        alt = s.str.to_datetime(fmt, time_unit="us", strict=False).dt.replace_time_zone("UTC")
        out = out.fill_null(alt)
    return frame.with_columns(out.alias(parsed))


def parse_timestamp(s: pl.Series) -> pl.Series:
    """Series version of ``timestamp_expr`` + ``fix_timestamps``."""
    frame = pl.DataFrame({"raw": s}).with_columns(timestamp_expr("raw").alias("t"))
    return fix_timestamps(frame, "t", s)["t"].alias(s.name)


def int_expr(e: pl.Expr) -> pl.Expr:
    """Numbers (or numeric strings) to Int64; fractions and junk become null."""
    f = e.cast(pl.Float64, strict=False)
    return pl.when(f.is_finite() & (f == f.floor())).then(f).cast(pl.Int64)


def whole_int(s: pl.Series) -> pl.Series:
    """Series version of ``int_expr``."""
    return pl.select(int_expr(pl.lit(s))).to_series().alias(s.name)


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
    raw = [
        data[a:b] for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(data)], strict=True)
    ]
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
    counts = parts.list.len().to_numpy()
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
