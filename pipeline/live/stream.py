"""The stream parser: a server's bytes -> what each line of a completion stream says.

Nothing a server sends raises out of here. A line of the event stream becomes an
``Event``: a chunk (a token or not, a finish reason, usage counts), ``[DONE]``, nothing
(a comment or another SSE field), or a failure with its one-line reason. The checks are
those a misbehaving server has needed:

* JSON is parsed with a bounded nesting depth (``MAX_DEPTH``), counted before
  ``json.loads`` runs, so a chunk nested 50,000 arrays deep is a reason, not a
  ``RecursionError``; ``NaN``/``Infinity`` and numbers past a double are refused.
* every field read has its type checked: ``choices`` a list of objects, ``text`` and
  ``finish_reason`` strings, usage counts whole numbers in ``0..MAX_COUNT`` (so
  ``"completion_tokens": Infinity`` or ``1e30`` fails the request, not the run).
* a line is UTF-8 and at most ``MAX_LINE_BYTES`` long (``lines``), so a server that never
  sends a newline cannot grow the client's memory without end.

``loads_bounded`` is the same bounded parse for any JSON a server answers
(``/v1/models``, ``/info``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # nesting of arrays and objects in one JSON answer
MAX_LINE_BYTES = 2**20  # one line of the event stream (a chunk is well under 1 KiB)
MAX_COUNT = 2**31 - 1  # a token count (the tables store int32)
REASON_CHARS = 200  # of a server's text quoted in a reason

# the depth scan: the next quote or bracket, and the rest of a string after its quote
_MARK = re.compile(r'["\[\]{}]')
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


class StreamError(ValueError):
    """The stream itself is unreadable (a line too long); the message is the reason."""


def quote(text: str, limit: int = REASON_CHARS) -> str:
    """A server's text for a reason: one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``text`` nests arrays/objects deeper than ``limit`` (no recursion, linear)."""
    if text.count("[") + text.count("{") <= limit:  # the common case: no scan at all
        return False
    depth, pos = 0, 0
    while (m := _MARK.search(text, pos)) is not None:
        c, pos = m.group(), m.end()
        if c == '"':  # skip the string: brackets in it do not nest
            rest = _STRING_REST.match(text, pos)
            if rest is None:  # unterminated: json.loads fails there, no deeper than now
                return False
            pos = rest.end()
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise ValueError(f"number {s[:40]} is past a double")
    return x


def _small_int(s: str) -> int:
    if len(s.lstrip("-")) > 30:  # past any count or id; int() of 5,000 digits is refused
        raise ValueError(f"an integer of {len(s.lstrip('-')):,} digits")
    return int(s)


def loads_bounded(data: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for a server's answer: depth bounded, numbers finite.

    Raises:
        ValueError: naming what is wrong (not UTF-8, too deep, not JSON, NaN/Infinity,
            a number past a double or with too many digits).
    """
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 (byte {data[exc.start]:#04x} at {exc.start})") from None
    if too_deep(data, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(
            data,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_small_int,
        )
    except RecursionError:  # not reached after the depth check; kept for safety
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at {exc.pos})") from None


@dataclass(frozen=True)
class Event:
    """What one line of the stream says.

    ``error`` set: the request failed, for that reason (nothing else is set). Else
    ``done`` ([DONE]), or a chunk: ``token`` (its text is not empty), ``finish_reason``
    and usage counts where it had them; all unset: a line that says nothing (a comment,
    an ``event:``/``id:`` field, a blank line).
    """

    error: str | None = None
    done: bool = False
    chunk: bool = False
    token: bool = False
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


NOTHING = Event()
DONE = Event(done=True)


def _fail(reason: str) -> Event:
    return Event(error=reason)


def _count(value: Any, name: str) -> int | str:
    """A token count from a server, or the reason it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} is {quote(json.dumps(value))[1:-1]}, not a token count"
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return f"{name} is {value!r}, not a whole token count"
        value = int(value)
    if not 0 <= value <= MAX_COUNT:
        shown = f"{value:.3g}" if abs(value) >= 1e6 else str(value)
        return f"{name} is {shown}, outside 0..{MAX_COUNT}"
    return value


def parse_chunk(chunk: Any) -> Event:
    """The event of one decoded ``data:`` payload (any JSON value)."""
    if not isinstance(chunk, dict):
        return _fail(f"bad stream chunk: a JSON {type(chunk).__name__}, not an object")
    if "error" in chunk:
        err = chunk["error"]
        text = err.get("message", err) if isinstance(err, dict) else err
        return _fail(f"server error: {quote(str(text))[1:-1]}")
    choices = chunk.get("choices")
    token, finish = False, None
    if choices is not None:
        if not isinstance(choices, list):
            return _fail(f"bad stream chunk: choices is a JSON {type(choices).__name__}")
        if choices:
            first = choices[0]
            if not isinstance(first, dict):
                return _fail(f"bad stream chunk: choices[0] is a JSON {type(first).__name__}")
            index = first.get("index")
            if index is not None and (index != 0 or isinstance(index, bool)):
                return _fail(f"bad stream chunk: choice index {quote(str(index))}, one was asked")
            text = first.get("text")
            if text is not None and not isinstance(text, str):
                return _fail(f"bad stream chunk: choices[0].text is a JSON {type(text).__name__}")
            token = bool(text)
            finish = first.get("finish_reason")
            if finish is not None and not isinstance(finish, str):
                return _fail(f"bad stream chunk: finish_reason is a JSON {type(finish).__name__}")
            finish = finish[:40] if finish else None
    counts: dict[str, int | None] = {"completion_tokens": None, "prompt_tokens": None}
    usage = chunk.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return _fail(f"bad stream chunk: usage is a JSON {type(usage).__name__}")
        for name in counts:
            if usage.get(name) is not None:
                got = _count(usage[name], f"usage.{name}")
                if isinstance(got, str):
                    return _fail(f"bad stream chunk: {got}")
                counts[name] = got
    return Event(
        chunk=True,
        token=token,
        finish_reason=finish,
        completion_tokens=counts["completion_tokens"],
        prompt_tokens=counts["prompt_tokens"],
    )


def parse_line(line: bytes | str) -> Event:
    """The event of one line of the stream (its line end removed). Never raises."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _fail(f"stream line is not UTF-8 (byte {line[exc.start]:#04x} at {exc.start})")
    if not line.startswith("data:"):
        return NOTHING
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    try:
        chunk = loads_bounded(data)
    except ValueError as exc:  # every error loads_bounded has; the message says which
        return _fail(f"bad stream chunk: {exc}: {quote(data, 80)}")
    except Exception as exc:  # noqa: BLE001 - no server's bytes may end the run
        return _fail(f"bad stream chunk: {type(exc).__name__}: {quote(data, 80)}")
    return parse_chunk(chunk)


async def lines(
    pieces: AsyncIterator[bytes], max_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[bytes]:
    """The lines of a body read in pieces (line ends removed, ``\\r\\n`` or ``\\n``).

    Raises:
        StreamError: a line is longer than ``max_bytes``.
    """
    buf = bytearray()
    async for piece in pieces:
        buf += piece
        start = 0
        while (end := buf.find(b"\n", start)) != -1:
            yield bytes(buf[start:end]).rstrip(b"\r")
            start = end + 1
        del buf[:start]
        if len(buf) > max_bytes:
            raise StreamError(f"a stream line longer than {max_bytes:,} bytes")
    if buf:  # a body need not end with a line end
        yield bytes(buf).rstrip(b"\r")
