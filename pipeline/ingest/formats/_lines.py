"""Cutting a block into lines with their line numbers and byte offsets (shared helper)."""

from __future__ import annotations

import json
import math
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


INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class _NonFiniteError(Exception):
    """NaN, Infinity or a number too large for a double: not JSON (RFC 8259)."""


def _reject_constant(name: str) -> float:
    raise _NonFiniteError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFiniteError("a number beyond the double range")
    return value


def _lone_surrogate(value: Any) -> bool:
    """True when a string (or key) anywhere in ``value`` holds an unpaired surrogate."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def json_kind(value: Any) -> str:
    """How a JSON value is called in messages ("an array", "a number", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return "an object"


def load_json_line(raw: bytes) -> tuple[Any, str | None]:
    """Parse one JSON line strictly: (value, None) or (None, reason).

    Strict means what every reader of the pipeline accepts: UTF-8, no NaN or
    Infinity, no number beyond the double range, no unpaired surrogate
    escape (``"\\ud800"``), nesting a few thousand levels deep at most. The
    reason never quotes content.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, utf8_reason(exc)
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno}); the line may be cut short"
    except _NonFiniteError as exc:
        return None, f"not valid JSON ({exc} is not a JSON number)"
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except ValueError:  # an integer literal beyond Python's digit limit
        return None, "not valid JSON (a number literal too long)"
    if "\\u" in text and _lone_surrogate(value):
        return None, "not valid JSON (an unpaired surrogate escape such as \\ud800)"
    return value, None


def load_json_object(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``load_json_line`` for records: anything but an object is rejected too."""
    value, why = load_json_line(raw)
    if why is not None:
        return None, why
    if not isinstance(value, dict):
        return None, f"not a JSON object ({json_kind(value)}); each line must be one record {{...}}"
    return value, None


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
    """A JSON value as an int; else ValueError.

    The rule of every format: a whole number, written as a JSON number or as a
    string holding one (``12``, ``12.0``, ``"12"``, ``"1e3"``). Values beyond
    the 64-bit range are clipped to it (the validator then rejects them as too
    large, without an overflow on the way). Error messages never quote the
    value: it may be text from a log that holds prompts.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError("a string that is not a number") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        if not value.is_integer():
            raise ValueError(f"a fraction ({value!r})")
        value = int(value)
    if isinstance(value, int):
        return min(max(value, INT64_MIN), INT64_MAX)
    raise ValueError(f"a {type(value).__name__}")


def as_float(value: Any) -> float | None:
    """A JSON value as a finite float: numbers and numeric strings; else ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a boolean")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError("a string that is not a number") from None
    if isinstance(value, int | float):
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise ValueError("not a finite number")
        return out
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
