"""Plain-text tables for command output and the library functions that format it (no
heavy imports: quick commands use it too)."""

from __future__ import annotations

import math


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; the first left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


DASH = "\u2014"  # what a missing value prints as
# (unit, seconds per unit, where the next unit takes over, in seconds)
_DURATION_UNITS = (
    ("\u00b5s", 1e-6, 1e-3),
    ("ms", 1e-3, 1.0),
    ("s", 1.0, 60.0),
    ("min", 60.0, 3600.0),
    ("h", 3600.0, math.inf),
)


def format_duration(seconds: float | None) -> str:
    """A duration in the unit that reads: ``'183 ms'``, ``'12.5 s'``, ``'4.2 min'``,
    ``'7.7 h'`` (``'850 µs'`` under a millisecond); one decimal at most, none from 100 up,
    thousands separated; a value that rounds up to the next unit takes it (59.97 s is
    ``'1 min'``). None and NaN print as a dash, infinities as ``'∞'``; the sign is kept."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return DASH
    x = float(seconds)
    if math.isinf(x):
        return "\u221e" if x > 0 else "-\u221e"
    sign, x = ("-" if x < 0 else ""), abs(x)
    if x == 0:
        return "0 ms"
    for unit, scale, upto in _DURATION_UNITS:
        text = _decimal(x / scale)
        if float(text.replace(",", "")) * scale < upto:
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable: the last unit has no upper bound")


def _decimal(v: float) -> str:
    """One decimal under 100 (a trailing .0 dropped), none from 100 up."""
    if round(v, 1) >= 100:
        return f"{v:,.0f}"
    text = f"{v:,.1f}"
    return text[:-2] if text.endswith(".0") else text


def format_count(n: float | None) -> str:
    """A count as an integer with thousands separators (``3``, not ``3.000``; ``1,024``);
    a float count is rounded. None and NaN print as a dash."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return DASH
    return f"{round(float(n)):,}"


def format_number(x: float | None, digits: int = 4) -> str:
    """At most ``digits`` significant digits, thousands separated, trailing zeros dropped
    (``11.64``, ``3``, ``1,024``, ``0.0125``); None and NaN print as a dash."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def seconds(x: float | None) -> str:
    """0.183 s as '183 ms', 12.5 s as '12.5 s', 27,867 s as '7.7 h'; None as '-'."""
    return "-" if x is None else format_duration(x)


def number(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"
