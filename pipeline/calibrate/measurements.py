"""Measured step times: the file ``tracereplay calibrate`` and ``profile check`` read.

One row per measured engine step, CSV (with a header line) or Parquet:

    phase            prefill | decode
    batch_size       sequences in the step (>= 1)
    prompt_tokens    per sequence, tokens computed in this prefill step (>= 1 for prefill;
                     for decode rows the prompt length, informational, >= 0)
    context_tokens   per sequence, KV tokens already present before the step (0 for a
                     plain prefill; for decode the current sequence length), >= 0
    time_ms          the duration of that one step, milliseconds, > 0
    model, gpu, tensor_parallel   optional: what was measured (must match the profile)

A row whose numbers are well-formed but physically impossible (``PHYSICAL_MAX``: a step
longer than an hour, more than 65,536 sequences, more than 10 million tokens per
sequence; a clock jump or a corrupted counter) is not fitted: it is left out, named in
``Measurements.left_out`` (the commands print one warning line), so that a few such
rows cannot drag the fit; if more than ``MAX_LEFT_OUT_SHARE`` of the rows are such,
the file is refused instead, as a file measuring something else.

``MEASUREMENT_COLUMNS`` below is the one declaration of this schema; docs/calibration.md
describes it for users. Every problem is reported as one line naming the file, the
row (1-based data row; for CSV also the file line, the header being line 1) and the
column, what is wrong and how to fix it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.errors import PipelineError

PHASES = ("prefill", "decode")


class MeasurementError(PipelineError):
    """A measurements file cannot be used; the message names file, row and column."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # phase | count | time | text
    required: bool
    minimum: float  # counts: smallest allowed value (prefill rows may tighten it)
    doc: str


MEASUREMENT_COLUMNS: tuple[Column, ...] = (
    Column("phase", "phase", True, 0, "prefill or decode"),
    Column("batch_size", "count", True, 1, "sequences in the step"),
    Column("prompt_tokens", "count", True, 0, "per sequence: tokens computed in this prefill"),
    Column("context_tokens", "count", True, 0, "per sequence: KV tokens present before"),
    Column("time_ms", "time", True, 0, "duration of the one step, ms"),
    Column("model", "text", False, 0, "model measured (must match the profile's)"),
    Column("gpu", "text", False, 0, "GPU measured (must match the profile's)"),
    Column("tensor_parallel", "count", False, 1, "tensor-parallel degree (must match)"),
)
# beyond these a value is no measured engine step (the row is left out, see the docstring)
PHYSICAL_MAX: dict[str, float] = {
    "batch_size": 65_536,
    "prompt_tokens": 10_000_000,
    "context_tokens": 10_000_000,
    "time_ms": 3_600_000.0,  # one hour
    "tensor_parallel": 4096,
}
MAX_LEFT_OUT_SHARE = 0.1
REQUIRED = tuple(c.name for c in MEASUREMENT_COLUMNS if c.required)
OPTIONAL = tuple(c.name for c in MEASUREMENT_COLUMNS if not c.required)


@dataclass(frozen=True)
class Measurements:
    """The validated rows of one file (arrays in file order)."""

    path: Path
    sha256: str
    is_prefill: npt.NDArray[np.bool_]
    batch_size: npt.NDArray[np.float64]
    prompt_tokens: npt.NDArray[np.float64]
    context_tokens: npt.NDArray[np.float64]
    time_s: npt.NDArray[np.float64]
    model: list[str | None] | None = None
    gpu: list[str | None] | None = None
    tensor_parallel: npt.NDArray[np.float64] | None = None  # NaN where empty
    left_out: tuple[str, ...] = ()  # rows not kept: "row 4 (line 5): time_ms 1e+308 > ..."

    def __len__(self) -> int:
        return len(self.time_s)

    def subset(self, idx: npt.NDArray[np.int64]) -> Measurements:
        """The rows ``idx`` (for cross-validation and hold-out)."""

        def pick(values: list[str | None] | None) -> list[str | None] | None:
            return None if values is None else [values[i] for i in idx]

        tp = self.tensor_parallel
        return Measurements(
            path=self.path,
            sha256=self.sha256,
            is_prefill=self.is_prefill[idx],
            batch_size=self.batch_size[idx],
            prompt_tokens=self.prompt_tokens[idx],
            context_tokens=self.context_tokens[idx],
            time_s=self.time_s[idx],
            model=pick(self.model),
            gpu=pick(self.gpu),
            tensor_parallel=None if tp is None else tp[idx],
            left_out=self.left_out,
        )

    @property
    def phase(self) -> list[str]:
        return ["prefill" if p else "decode" for p in self.is_prefill]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_parquet(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def _read_frame(path: Path) -> tuple[pl.DataFrame, bool]:
    """(every column as text, whether it is CSV); raises MeasurementError if unreadable."""
    if not path.is_file():
        raise MeasurementError(f"{path}: no such file; give a CSV or Parquet measurements file")
    if _is_parquet(path):
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise MeasurementError(f"{path}: cannot read as Parquet ({exc})") from None
        cols = [
            pl.col(c).cast(pl.String) if frame.schema[c] != pl.String else pl.col(c)
            for c in frame.columns
        ]
        return frame.select(cols), False
    try:
        frame = pl.read_csv(path, infer_schema=False, truncate_ragged_lines=False)
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MeasurementError(
            f"{path}: cannot read as CSV ({first}); write a header line "
            f"({', '.join(REQUIRED)}) and one comma-separated row per step, or use Parquet"
        ) from None
    return frame.rename({c: c.strip() for c in frame.columns}), True


def _where(path: Path, row: int, csv: bool, column: str) -> str:
    line = f" (line {row + 1})" if csv else ""
    return f"{path}: row {row}{line}, column {column}"


def read_measurements(path: Path | str) -> Measurements:
    """Read and check a measurements file (CSV or Parquet, see the module docstring).

    Raises:
        MeasurementError: one line naming the file, the row and column of the first
            problem, and how to fix it (and how many more rows are bad).
    """
    path = Path(path)
    frame, csv = _read_frame(path)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise MeasurementError(
            f"{path}: missing column {', '.join(repr(m) for m in missing)}; a measurements "
            f"file needs the columns {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
        )
    if frame.height == 0:
        raise MeasurementError(f"{path}: no rows; add one row per measured step")
    present = [c for c in MEASUREMENT_COLUMNS if c.name in frame.columns]
    values: dict[str, npt.NDArray[np.float64]] = {}
    problems: list[tuple[int, int, str]] = []  # (row index, column order, message)
    phase_text = frame["phase"].str.strip_chars().str.to_lowercase()
    is_prefill = (phase_text == "prefill").fill_null(False).to_numpy()
    for order, col in enumerate(present):
        raw = frame[col.name]
        if col.kind == "text":
            continue
        if col.kind == "phase":
            for i in np.flatnonzero(~phase_text.is_in(list(PHASES)).fill_null(False).to_numpy()):
                shown = (raw[int(i)] or "").strip()
                what = f"unknown phase {shown!r}" if shown else "phase is empty"
                problems.append((int(i), order, f"{what}; use prefill or decode"))
            continue
        stripped = raw.str.strip_chars()
        num = stripped.cast(pl.Float64, strict=False).to_numpy().astype(np.float64)
        empty = stripped.is_null().to_numpy() | (stripped.fill_null("") == "").to_numpy()
        if not col.required:
            num = np.where(empty, np.nan, num)
        values[col.name] = num
        minimum = np.where(is_prefill, 1.0, 0.0) if col.name == "prompt_tokens" else col.minimum
        with np.errstate(invalid="ignore"):
            if col.kind == "time":
                bad = ~(np.isfinite(num) & (num > 0))
            else:
                bad = ~(np.isfinite(num) & (num == np.round(num)) & (num >= minimum))
        if not col.required:
            bad &= ~empty
        for i in np.flatnonzero(bad):
            msg = _check_value(col, raw[int(i)], float(num[i]), bool(empty[i]), is_prefill[i])
            problems.append((int(i), order, msg))
    if problems:
        problems.sort()
        first, order, msg = problems[0]
        rows = len({p[0] for p in problems})
        more = f" ({rows - 1} more bad row{'s' if rows > 2 else ''})" if rows > 1 else ""
        raise MeasurementError(f"{_where(path, first + 1, csv, present[order].name)}: {msg}{more}")

    keep, left_out = _physical(path, csv, values, frame.height)

    def text(name: str) -> list[str | None] | None:
        if name not in frame.columns:
            return None
        cells = [None if v is None or not v.strip() else v.strip() for v in frame[name]]
        return [c for c, k in zip(cells, keep, strict=True) if k]

    tp = values.get("tensor_parallel")
    return Measurements(
        path=path,
        sha256=file_sha256(path),
        is_prefill=is_prefill.astype(bool)[keep],
        batch_size=values["batch_size"][keep],
        prompt_tokens=values["prompt_tokens"][keep],
        context_tokens=values["context_tokens"][keep],
        time_s=values["time_ms"][keep] / 1000.0,
        model=text("model"),
        gpu=text("gpu"),
        tensor_parallel=None if tp is None else tp[keep],
        left_out=tuple(left_out),
    )


def _physical(
    path: Path, csv: bool, values: dict[str, npt.NDArray[np.float64]], n: int
) -> tuple[npt.NDArray[np.bool_], list[str]]:
    """(rows to keep, one line per row left out) under PHYSICAL_MAX.

    Raises:
        MeasurementError: more than MAX_LEFT_OUT_SHARE of the rows are impossible.
    """
    keep = np.ones(n, dtype=bool)
    why: dict[int, str] = {}
    for name, limit in PHYSICAL_MAX.items():
        if name not in values:
            continue
        with np.errstate(invalid="ignore"):
            over = values[name] > limit  # NaN (an empty optional cell) is not over
        for i in np.flatnonzero(over & keep):
            line = f" (line {i + 2})" if csv else ""
            why[int(i)] = f"row {i + 1}{line}: {name} {values[name][i]:g} > {limit:g}"
        keep &= ~over
    if len(why) > MAX_LEFT_OUT_SHARE * n:
        first = why[min(why)]
        raise MeasurementError(
            f"{path}: {len(why)} of {n} rows are beyond what one engine step can be ({first}; "
            f"limits: {', '.join(f'{k} <= {v:g}' for k, v in PHYSICAL_MAX.items())}); check "
            "the units (time_ms is milliseconds) and the columns"
        )
    return keep, [why[i] for i in sorted(why)]


def left_out_warning(m: Measurements) -> str | None:
    """One line saying which rows were left out as impossible, or None."""
    if not m.left_out:
        return None
    shown = "; ".join(m.left_out[:5]) + (
        f"; and {len(m.left_out) - 5} more" if len(m.left_out) > 5 else ""
    )
    return (
        f"warning: {m.path}: {len(m.left_out)} row(s) left out as no engine step can be "
        f"so ({shown}); the fit uses the other {len(m):,}"
    )


def _check_value(col: Column, raw: str | None, v: float, empty: bool, prefill: bool) -> str:
    """What is wrong with one cell (a row the vectorised check flagged)."""
    shown = (raw or "").strip()
    if empty:
        return f"{col.name} is empty; give a number"
    if math.isnan(v):
        return f"{shown!r} is not a number; give a number"
    if not math.isfinite(v):
        return f"{col.name} is {shown}; give a finite number"
    if col.kind == "time":
        return f"time_ms must be > 0, got {shown}; fix the row or drop it"
    if v != int(v):
        return f"{col.name} must be a whole number, got {shown}"
    if v < 0:
        return f"{col.name} is a negative count ({shown}); counts are >= 0"
    if col.name == "prompt_tokens" and prefill:
        return f"prompt_tokens must be >= 1 in a prefill row, got {shown}"
    return f"{col.name} must be >= {col.minimum:g}, got {shown}"
