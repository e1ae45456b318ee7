"""Reading a block of JSON lines fast, without losing the bad ones.

The fast path hands the whole block to polars' NDJSON reader with a schema
(type mismatches become nulls, which the validator then rejects). Only when
the block holds lines that are not JSON at all (cut short, bad UTF-8) does it
fall back to checking each line with the standard library, quarantining the
bad lines and parsing the rest in bulk again.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.ingest.formats import REJECT_SCHEMA, Block, Parsed
from pipeline.ingest.reader import line_starts


def _read(data: bytes, schema: dict[str, Any]) -> pl.DataFrame:
    return pl.read_ndjson(io.BytesIO(data), schema=schema, ignore_errors=True)


def _why(line: bytes) -> str | None:
    """Why one line is not a JSON object, or None when it is one."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 at byte {exc.start} of the line; re-export the log as UTF-8"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno}); the line may be cut short"
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, expected an object"
    return None


def read_block(block: Block, schema: dict[str, Any]) -> Parsed:
    """Parse the JSON lines of ``block`` into a frame with ``schema`` plus provenance.

    Blank lines are skipped and not counted as records. The frame gets
    ``source_line`` and ``byte_offset`` of every record; lines that cannot be
    parsed at all go to ``rejects``.
    """
    data = block.data
    starts = line_starts(data)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1:] = len(data)
    nonblank = _nonblank(data, starts, ends)
    try:
        frame = _read(data, schema)
        if frame.height == len(nonblank):
            return Parsed(_with_provenance(frame, block, starts, nonblank), Parsed.no_rejects())
    except pl.exceptions.ComputeError:
        pass
    # NOTE: checking every line with json.loads costs ~3 us a line; lines that
    # are cut short or carry non-ASCII bytes are the usual culprits, so check
    # those first and fall back to every line only if the block still fails.
    for candidates in (_suspicious(data, starts, ends, nonblank), nonblank):
        bad_idx, reasons = _check(data, starts, ends, candidates)
        good = np.setdiff1d(nonblank, bad_idx, assume_unique=True)
        try:
            frame = _read(_without(data, starts, ends, bad_idx), schema)
        except pl.exceptions.ComputeError:
            continue
        if frame.height == len(good):
            break
    else:  # pragma: no cover - json.loads accepted a line polars cannot read
        raise AssertionError("a block polars cannot read although every line is valid JSON")
    rejects = pl.DataFrame(
        {
            "source_line": block.first_line + bad_idx,
            "byte_offset": block.offset + starts[bad_idx],
            "reason": reasons,
        },
        schema=REJECT_SCHEMA,
    )
    return Parsed(_with_provenance(frame, block, starts, good), rejects)


def _suspicious(
    data: bytes,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    lines: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Lines not shaped like ``{...}`` or holding non-ASCII bytes (cheap, vectorised)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    last = ends[lines] - 1
    for _ in range(3):  # step back over "\n", "\r" and trailing spaces
        ws = (buf[last] == 10) | (buf[last] == 13) | (buf[last] == 32)
        last = np.where(ws & (last > starts[lines]), last - 1, last)
    odd = (buf[starts[lines]] != ord("{")) | (buf[last] != ord("}"))
    high = np.flatnonzero(buf >= 0x80)
    flagged = set(lines[odd].tolist())
    if len(high):
        flagged |= set((np.searchsorted(starts, high, side="right") - 1).tolist())
    return np.asarray(sorted(flagged & set(lines.tolist())), dtype=np.int64)


def _check(
    data: bytes,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    candidates: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], list[str]]:
    bad: list[int] = []
    reasons: list[str] = []
    for i in candidates.tolist():
        why = _why(data[starts[i] : ends[i]].rstrip(b"\r\n"))
        if why is not None:
            bad.append(i)
            reasons.append(why)
    return np.asarray(bad, dtype=np.int64), reasons


def _without(
    data: bytes,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    drop: npt.NDArray[np.int64],
) -> bytes:
    """``data`` without the lines in ``drop`` (copied in contiguous runs)."""
    pieces = []
    pos = 0
    for i in drop.tolist():
        pieces.append(data[pos : starts[i]])
        pos = int(ends[i])
    pieces.append(data[pos:])
    out = b"".join(pieces)
    return out if out.endswith(b"\n") or not out else out + b"\n"


def _nonblank(
    data: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Indices of lines that hold something besides whitespace."""
    lengths = ends - starts
    idx = np.flatnonzero(lengths > 2)  # anything longer than "\r\n" has content (JSON)
    short = np.flatnonzero(lengths <= 2)
    keep = [i for i in short.tolist() if data[starts[i] : ends[i]].strip()]
    if keep:
        idx = np.sort(np.concatenate([idx, np.asarray(keep, dtype=np.int64)]))
    # whitespace-only long lines are rare; drop them too
    if len(idx) and (lengths[idx] < 64).any():
        idx = np.asarray(
            [i for i in idx.tolist() if lengths[i] >= 64 or data[starts[i] : ends[i]].strip()],
            dtype=np.int64,
        )
    return idx


def _with_provenance(
    frame: pl.DataFrame,
    block: Block,
    starts: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
) -> pl.DataFrame:
    return frame.with_columns(
        pl.Series("source_line", block.first_line + rows, dtype=pl.Int64),
        pl.Series("byte_offset", block.offset + starts[rows], dtype=pl.Int64),
    )
