"""Checks every config parser shares: finite numbers in range, integers a run can hold,
values of the right type, JSON of bounded depth.

Each parser (scenarios, grids, the config file, nightly configs, SLOs, model configs,
GPU specs, profiles) reads a user's value through one of these, so the same mistake
gets the same one-line message everywhere: where (the file, or ``--flag``), the key,
what is allowed, what was given. ``error`` is the PipelineError subclass the caller
raises (ConfigError, ScenarioError, ...).

Numbers are refused before any work starts when they are not finite (``nan``,
``inf``: TOML and JSON can spell both) or outside a documented range, and integers
when they do not fit the int64 arrays the simulator packs them into (or a tighter
bound the key documents), so that nothing deep in a run meets them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pipeline.errors import ConfigError, PipelineError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_COUNT = 2**31 - 1  # token, block, sequence and request counts
MAX_SEED = 2**32 - 1  # seeds (the loops derive per-replica streams from it in int64)
MAX_JSON_DEPTH = 64  # nesting of arrays/objects in a JSON file we read

ErrorType = type[PipelineError]


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def describe_range(
    lo: float | None, hi: float | None, *, lo_open: bool = False, hi_open: bool = False
) -> str:
    """``in [0, 1)``, ``>= 1``, ``> 0``: the allowed range, as messages write it."""
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {_num(hi)}"
    return "any value"


def _shown(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(value: Any) -> str:
    """The TOML/JSON word for a Python value's type (for 'got a table')."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def finite_float(
    value: Any,
    key: str,
    where: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    strings: bool = False,
    error: ErrorType = ConfigError,
) -> float:
    """``value`` as a finite float in the range, else ``error`` naming where, key and range.

    Integers are accepted (and must convert to a finite float); booleans never are;
    numeric strings only with ``strings`` (the scenario keys take ``--set`` text).
    """
    rng = describe_range(lo, hi, lo_open=lo_open, hi_open=hi_open)
    want = f"a finite number {rng}" if lo is not None or hi is not None else "a finite number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise error(f"{where}: {key} must be {want}, got {type_name(value)} ({_shown(value)})")
    if isinstance(value, str) and not strings:
        raise error(f"{where}: {key} must be {want}, got a string ({_shown(value)})")
    try:
        f = float(value)
    except (ValueError, OverflowError):
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}") from None
    if not math.isfinite(f):
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}")
    below = lo is not None and (f <= lo if lo_open else f < lo)
    above = hi is not None and (f >= hi if hi_open else f > hi)
    if below or above:
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}")
    return f


def integer(
    value: Any,
    key: str,
    where: str,
    *,
    lo: int | None = INT64_MIN,
    hi: int | None = INT64_MAX,
    strings: bool = False,
    integral_floats: bool = False,
    error: ErrorType = ConfigError,
) -> int:
    """``value`` as an int in [lo, hi] (within int64 unless tighter), else ``error``.

    Booleans are refused; a float that is a whole number (``1e3``) only with
    ``integral_floats``; a numeric string only with ``strings``. ``lo``/``hi`` None:
    unbounded that side (for a caller that checks the key's own range next).
    """
    want = "an integer" + (" " + describe_range(lo, hi) if lo is not None or hi is not None else "")
    if lo is not None and hi is not None:
        want = f"an integer in [{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise error(f"{where}: {key} must be {want}, got {type_name(value)} ({_shown(value)})")
    if isinstance(value, str) and not strings:
        raise error(f"{where}: {key} must be {want}, got a string ({_shown(value)})")
    if isinstance(value, float) and not integral_floats:
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}")
    n = _as_int(value)
    if n is None:
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}")
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise error(f"{where}: {key} must be {want}, got {_shown(value)}")
    return n


def _as_int(value: int | float | str) -> int | None:
    """The whole number ``value`` spells (``12``, ``1e3``, ``"64"``), else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("+-").isdigit():
            try:
                return int(text)
            except ValueError:  # more digits than Python converts
                return None
    try:
        f = float(value)
    except (ValueError, OverflowError):
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def boolean(
    value: Any, key: str, where: str, *, strings: bool = False, error: ErrorType = ConfigError
) -> bool:
    """``value`` as a bool (true/false; with ``strings`` also "true", "yes", "0", ...)."""
    if isinstance(value, bool):
        return value
    if strings and isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
    raise error(f"{where}: {key} must be true or false, got {type_name(value)} ({_shown(value)})")


def string(
    value: Any, key: str, where: str, *, nonempty: bool = False, error: ErrorType = ConfigError
) -> str:
    """``value`` as a string (not a number, list or table), optionally non-empty."""
    if not isinstance(value, str):
        raise error(f"{where}: {key} must be a string, got {type_name(value)} ({_shown(value)})")
    if nonempty and not value.strip():
        raise error(f"{where}: {key} must be a non-empty string")
    if "\x00" in value:
        raise error(f"{where}: {key} must not contain a NUL character")
    return value


def string_list(
    value: Any,
    key: str,
    where: str,
    *,
    single_ok: bool = True,
    example: str = '["a", "b"]',
    error: ErrorType = ConfigError,
) -> list[str]:
    """A non-empty list of non-empty strings (a lone string with ``single_ok``)."""
    if single_ok and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise error(
            f"{where}: {key} must be a non-empty list of strings, e.g. {key} = {example}; "
            f"got {type_name(value)} ({_shown(value)})"
        )
    out = []
    for i, item in enumerate(value, 1):
        out.append(string(item, f"{key} item {i}", where, nonempty=True, error=error))
    return out


def table(value: Any, key: str, where: str, *, error: ErrorType = ConfigError) -> dict[str, Any]:
    """``value`` as a table (dict)."""
    if not isinstance(value, dict):
        raise error(f"{where}: {key} must be a table, got {type_name(value)} ({_shown(value)})")
    return value


def json_depth_ok(text: str, max_depth: int) -> int | None:
    """The 1-based offset where ``text`` nests arrays/objects deeper than ``max_depth``,
    or None. Iterative, string-aware, so it never recurses whatever the input."""
    depth = 0
    in_string = False
    escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return i + 1
        elif ch in "]}":
            depth -= 1
    return None


def loads_json(
    text: str,
    where: str,
    *,
    max_depth: int = MAX_JSON_DEPTH,
    finite: bool = True,
    error: ErrorType = ConfigError,
) -> Any:
    """``json.loads`` with the nesting bounded (checked before parsing) and, with
    ``finite``, no NaN, Infinity or numbers beyond float range (1e999): the error then
    names the key that holds one.

    Raises:
        error: one line naming ``where``, what is wrong and where in the text.
    """
    at = json_depth_ok(text, max_depth)
    if at is not None:
        raise error(
            f"{where}: JSON nested more than {max_depth} levels deep (at character {at}); "
            "this is not a file of the expected shape"
        )

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"{where}: not valid JSON ({exc})") from None
    if finite and (key := non_finite_key(data)) is not None:
        raise error(
            f"{where}: {key} is not a finite number (NaN, Infinity or past 1e308); "
            "write a finite number there"
        )
    return data


def non_finite_key(data: Any) -> str | None:
    """The dotted key of the first NaN or infinite number inside nested dicts and lists
    (iteratively), or None: what must not be written into a JSON file."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return key or "(the value)"
        if isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
    return None


def loads_toml(text: str, where: str, *, error: ErrorType = ConfigError) -> dict[str, Any]:
    """``tomllib.loads`` whose every failure is one line naming ``where``: invalid TOML
    (with the line), and arrays or inline tables nested so deep that the parser would
    exhaust the stack (it recurses per level; a few hundred levels are fine)."""
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML ({exc})") from None
    except RecursionError:
        raise error(
            f"{where}: arrays or inline tables nested too deeply to read; this is not a "
            "config of the expected shape"
        ) from None


def read_toml_file(path: Any, what: str, *, error: ErrorType = ConfigError) -> dict[str, Any]:
    """A TOML file (``what``: "config file", "scenario file", ...) as a dict; every
    failure (unreadable, not UTF-8, invalid or too deeply nested TOML) is one line."""
    from pathlib import Path

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte {exc.start + 1}); a {what} is a TOML text file"
        ) from None
    return loads_toml(text, str(path), error=error)
