"""Fuzzing the live client's stream parser: whatever a server sends, an answer, never a raise.

Arbitrary bytes, arbitrary JSON values in ``data:`` lines and chunks shaped like a
completion's with arbitrary values in every field each give an ``Event`` that is either
a failure with a one-line reason or a chunk whose fields have the types and ranges the
client counts on. A request's whole stream then ends as a completion (every token asked,
at least one streamed) or a failure with a reason.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.live.http import _Timing
from pipeline.live.stream import (
    MAX_COUNT,
    MAX_DEPTH,
    Event,
    StreamError,
    lines,
    loads_bounded,
    parse_chunk,
    parse_line,
    too_deep,
)

settings.register_profile("live-fuzz", max_examples=150, deadline=None, derandomize=True)
FUZZ = settings.get_profile("live-fuzz")

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
fields = st.one_of(
    json_values, st.sampled_from(["ka", "", None, 0, 3, -1, 2**40, 1.5, 3.0, True, [], {}])
)


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    """A completion chunk with arbitrary values where vLLM puts its fields."""
    choice: dict[str, Any] = {}
    for key in ("index", "text", "finish_reason", "logprobs"):
        if draw(st.booleans()):
            choice[key] = draw(fields)
    chunk: dict[str, Any] = {}
    if draw(st.booleans()):
        chunk["choices"] = draw(st.sampled_from([[choice], [], [choice, choice], choice]))
    if draw(st.booleans()):
        usage = {
            k: draw(fields) for k in ("completion_tokens", "prompt_tokens") if draw(st.booleans())
        }
        chunk["usage"] = draw(st.sampled_from([usage, [usage], None]))
    if draw(st.booleans()):
        chunk["error"] = draw(fields)
    return chunk


def check(ev: Event) -> None:
    """The parser's promise: a reason, or fields of the right type and range."""
    assert isinstance(ev, Event)
    if ev.error is not None:
        assert isinstance(ev.error, str) and ev.error and "\n" not in ev.error
        assert ev == Event(error=ev.error)
        return
    assert isinstance(ev.done, bool) and isinstance(ev.chunk, bool) and isinstance(ev.token, bool)
    assert not (ev.done and ev.chunk)
    assert ev.finish_reason is None or (isinstance(ev.finish_reason, str) and ev.finish_reason)
    for n in (ev.completion_tokens, ev.prompt_tokens):
        assert n is None or (type(n) is int and 0 <= n <= MAX_COUNT)
    if not ev.chunk:
        assert not ev.token and ev.finish_reason is None and ev.completion_tokens is None


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(line: bytes) -> None:
    check(parse_line(line))
    check(parse_line(b"data: " + line))
    check(parse_line(b"data:" + line.replace(b"\n", b"")))


@FUZZ
@given(json_values)
def test_arbitrary_json_values(value: Any) -> None:
    check(parse_line("data: " + json.dumps(value)))
    check(parse_chunk(value))


@FUZZ
@given(chunks())
def test_completion_shaped_chunks(chunk: dict[str, Any]) -> None:
    check(parse_line("data: " + json.dumps(chunk)))


@FUZZ
@given(json_values, st.integers(min_value=0, max_value=80), st.integers(1, 80))
def test_depth_scan_agrees_with_the_parser(value: Any, wrap: int, limit: int) -> None:
    """Any JSON (brackets in strings too), wrapped in ``wrap`` arrays or objects."""
    text = json.dumps(value)
    for k in range(wrap):
        text = f"[{text}]" if k % 2 else f'{{"[{{": {text}}}'
    parsed = json.loads(text)
    assert too_deep(text, limit) == (depth(parsed) > limit)
    if depth(parsed) <= MAX_DEPTH:
        assert loads_bounded(text) == parsed


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@FUZZ
@given(st.integers(min_value=MAX_DEPTH - 2, max_value=MAX_DEPTH + 2), st.sampled_from("[{"))
def test_depth_is_bounded_at_exactly_the_limit(n: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    inner = '{"a": ' if opener == "{" else "["
    text = inner * n + "1" + closer * n if opener == "{" else "[" * n + "]" * n
    try:
        loads_bounded(text)
        assert n <= MAX_DEPTH
    except ValueError as exc:
        assert n > MAX_DEPTH and str(exc) == f"JSON nested deeper than {MAX_DEPTH} levels"


stream_lines = st.lists(
    st.one_of(
        st.sampled_from(["data: [DONE]", ": ping", "", "event: x"]),
        chunks().map(lambda c: "data: " + json.dumps(c)),
        st.binary(max_size=40),
    ),
    max_size=12,
)


@FUZZ
@given(stream_lines, st.integers(min_value=1, max_value=6))
def test_a_whole_stream_ends_as_a_completion_or_a_reason(
    stream: list[str | bytes], want: int
) -> None:
    t = _Timing(want=want)
    for line in stream:
        if t.on_line(line):
            break
    outcome = t.outcome()
    if outcome is None:
        assert t.chunks >= 1 and t.received == want and t.error is None
    else:
        assert isinstance(outcome, str) and outcome and "\n" not in outcome


@FUZZ
@given(st.lists(st.binary(max_size=50), max_size=20), st.integers(min_value=8, max_value=64))
def test_lines_are_split_as_sent_and_bounded(pieces: list[bytes], limit: int) -> None:
    async def feed() -> Any:
        for p in pieces:
            yield p

    async def collect() -> list[bytes]:
        return [line async for line in lines(feed(), limit)]

    whole = b"".join(pieces)
    expected = [x.rstrip(b"\r") for x in whole.split(b"\n")]
    if expected and expected[-1] == b"" and whole.endswith(b"\n"):
        expected.pop()
    if whole == b"":
        expected = []
    try:
        got = asyncio.run(collect())
    except StreamError:
        longest = max(len(x) for x in whole.split(b"\n"))
        assert longest > limit
        return
    assert got == expected
    assert all(len(x) <= limit + 50 for x in got)
