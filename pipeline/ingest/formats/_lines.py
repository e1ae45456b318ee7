"""Cutting a block into lines with their line numbers and byte offsets (shared helper)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import polars as pl

from pipeline.ingest.formats import REJECT_SCHEMA

BOM = b"\xef\xbb\xbf"


@dataclass
class Lines:
    """The lines of a block: raw bytes (without ``\\n``), 1-based numbers, byte offsets."""

    raw: list[bytes]
    numbers: np.ndarray  # int64, 1-based line number of each line
    offsets: np.ndarray  # int64, byte offset of each line's first byte


def split_lines(data: bytes, first_line: int, offset: int) -> Lines:
    """Split ``data`` at ``\\n``; a final line without newline counts, an empty tail does not.

    A trailing ``\\r`` stays on the line (callers strip it where it matters).
    """
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    n = len(raw)
    lens = np.fromiter(map(len, raw), dtype=np.int64, count=n) + 1
    offsets = np.empty(n, dtype=np.int64)
    if n:
        offsets[0] = offset
        np.cumsum(lens[:-1], out=offsets[1:])
        offsets[1:] += offset
    numbers = np.arange(first_line, first_line + n, dtype=np.int64)
    return Lines(raw, numbers, offsets)


def utf8_reason(exc: UnicodeDecodeError) -> str:
    return f"invalid UTF-8 (byte 0x{exc.object[exc.start]:02x} at position {exc.start})"


def load_json_line(raw: bytes) -> tuple[Any, str | None]:
    """Parse one JSON line: (value, None) or (None, reason). The reason never quotes content."""
    try:
        return json.loads(raw), None
    except UnicodeDecodeError as exc:
        return None, utf8_reason(exc)
    except json.JSONDecodeError as exc:
        return None, f"corrupt JSON: {exc.msg} at column {exc.colno}"
    except RecursionError:
        return None, "corrupt JSON: nested too deeply"


class Rejects:
    """Collects rejected records."""

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.offsets: list[int] = []
        self.reasons: list[str] = []

    def add(self, line: int, offset: int, reason: str) -> None:
        self.lines.append(int(line))
        self.offsets.append(int(offset))
        self.reasons.append(reason)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"source_line": self.lines, "byte_offset": self.offsets, "reason": self.reasons},
            schema=REJECT_SCHEMA,
        )


T = TypeVar("T")


def lenient(convert: Callable[[Any], T | None], value: Any) -> T | None:
    """``convert(value)``, or None when the value has the wrong type or form."""
    try:
        return convert(value)
    except ValueError:
        return None


def as_int(value: Any) -> int | None:
    """A JSON value as an int: ints, integral floats and integer strings; else ValueError.

    Error messages never quote the value: it may be text from a log that holds prompts.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError(f"a fraction ({value!r})")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("a string that is not an integer") from None
    raise ValueError(f"a {type(value).__name__}")


def as_float(value: Any) -> float | None:
    """A JSON value as a float: numbers and numeric strings; else ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ValueError("a string that is not a number") from None
    raise ValueError(f"a {type(value).__name__}")


def as_str(value: Any) -> str | None:
    """A JSON scalar as a string (ids may be numbers); None stays None; else ValueError."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise ValueError("a boolean")
    if isinstance(value, int | float):
        return str(value)
    raise ValueError(f"a {type(value).__name__}")
