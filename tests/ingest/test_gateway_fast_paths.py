"""The gateway reader's fast paths give what the general rules give, value for value.

* counts read as JSON numbers (``jsonl.read_block(..., numbers=...)``) against
  every value read as text and converted with ``fields.to_number``;
* the tenant and failed-call columns taken as they are after a cheap check,
  against the general expressions (``gateway.TENANT``, ``gateway.FAILED_CALL``);
* ``fields.none_blank`` never says "no blank value" when there is one;
* ``fields.whole_int``'s numpy path against ``fields.int_expr``;
* the shape screen of JSON lines (``jsonl._odd``) against its rule written per line.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from pipeline.ingest import jsonl
from pipeline.ingest.fields import int_expr, none_blank, to_number, whole_int
from pipeline.ingest.formats import Block
from pipeline.ingest.formats import gateway as gw
from pipeline.ingest.jsonl import _nonblank, _odd, read_block
from pipeline.ingest.reader import line_starts
from tests.ingest.records import gateway

MISSING = object()
COUNT = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(0, 5000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(0, 5000).map(float),
    st.integers(-5, 5000).map(lambda i: f"{i}"),
    st.integers(0, 5000).map(lambda i: f" {i}.0 "),
    st.sampled_from(["", "abc", "1e3", "12.5", "0x10", "-0"]),
    st.booleans(),
    st.none(),
    st.just(MISSING),
    st.just([1]),
    st.just({"x": 1}),
)
TEXT = st.one_of(
    st.none(),
    st.just(MISSING),
    st.sampled_from(["", " ", "\t", "a", " a", "team-a", "\u3000", "\u00a0x", "é", "~", "!x"]),
    st.text(max_size=4),
)
STATUS = st.one_of(
    st.none(), st.just(MISSING), st.sampled_from(["success", "SUCCESS", "ok", "", "failure", " x"])
)


def _record(i: int, fields: dict[str, Any]) -> dict[str, Any]:
    rec = gateway(i)
    for k, v in fields.items():
        if v is MISSING:
            rec.pop(k, None)
        else:
            rec[k] = v
    return rec


def _block(records: list[dict[str, Any]]) -> Block:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    return Block(data, 1, 0)


COUNTS = st.fixed_dictionaries({k: COUNT for k in gw._NUMBERS})


@settings(max_examples=150, deadline=None)
@given(st.lists(COUNTS, min_size=1, max_size=12))
def test_counts_read_as_numbers_equal_counts_read_as_text(counts: list[dict[str, Any]]) -> None:
    block = _block([_record(i, c) for i, c in enumerate(counts)])
    fast = read_block(block, gw.SCHEMA, numbers=gw._NUMBERS)
    slow = read_block(block, gw.SCHEMA)
    slow_rows = slow.rows.with_columns(to_number(slow.rows[c]) for c in gw._NUMBERS)
    assert_frame_equal(fast.rows, slow_rows)
    assert_frame_equal(fast.rejects, slow.rejects)


def test_counts_read_as_numbers_after_a_first_line_of_numbers() -> None:
    """The first line holds numbers, later ones text, junk and nothing: each is read again."""
    values: list[Any] = [7, "12", " 3 ", "x", MISSING, None, True, 2**64, 1e3, "1e3", [2]]
    block = _block([_record(i, {"prompt_tokens": v}) for i, v in enumerate(values)])
    fast = read_block(block, gw.SCHEMA, numbers=gw._NUMBERS).rows["prompt_tokens"]
    assert fast.to_list() == [7.0, 12.0, 3.0, None, None, None, None, 2.0**64, 1e3, 1e3, None]


def test_counts_fall_back_to_text_when_a_re_read_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    block = _block([_record(0, {}), _record(1, {"prompt_tokens": "12"})])
    slow = read_block(block, gw.SCHEMA)
    monkeypatch.setattr(jsonl, "_numbers", lambda *args: None)
    fast = read_block(block, gw.SCHEMA, numbers=gw._NUMBERS)
    assert_frame_equal(
        fast.rows, slow.rows.with_columns(to_number(slow.rows[c]) for c in gw._NUMBERS)
    )
    assert fast.rows["prompt_tokens"].to_list() == [100.0, 12.0]


RECORD_TEXT = st.fixed_dictionaries(
    {"team_id": TEXT, "user": TEXT, "end_user": TEXT, "status": STATUS}
)


@settings(max_examples=150, deadline=None)
@given(st.lists(RECORD_TEXT, min_size=1, max_size=12))
def test_tenant_and_failed_call_fast_paths_equal_the_general_rules(
    fields: list[dict[str, Any]],
) -> None:
    f = read_block(_block([_record(i, x) for i, x in enumerate(fields)]), gw.SCHEMA).rows
    line = pl.col("source_line")  # a column beside a literal, as in gateway.parse
    assert_frame_equal(
        f.select(line, gw._tenant(f).alias("t")), f.select(line, gw.TENANT.alias("t"))
    )
    assert_frame_equal(
        f.select(line, gw._failed_call(f["status"]).alias("r")),
        f.select(line, gw.FAILED_CALL.alias("r")),
    )


def test_tenant_fast_path_is_taken_for_plain_team_ids() -> None:
    f = read_block(_block([_record(i, {}) for i in range(3)]), gw.SCHEMA).rows
    assert str(gw._tenant(f)) == str(pl.col("team_id"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=20))
def test_none_blank_never_misses_a_blank_value(values: list[str | None]) -> None:
    s = pl.Series("s", values, dtype=pl.String)
    if none_blank(s):
        assert not (s.str.strip_chars() == "").any()
    if all(v is None or ("!" <= v[:1] <= "~") for v in values):
        assert none_blank(s)


NUMBER = st.one_of(
    st.integers(-(2**60), 2**60).map(float),
    st.integers(0, 5000).map(float),
    st.floats(),
    st.sampled_from([2.0**53, -(2.0**53), 2.0**53 - 1, 2.0**63, -0.0, 0.5]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(NUMBER, max_size=20), st.booleans())
def test_whole_int_equals_int_expr(values: list[float], with_null: bool) -> None:
    s = pl.Series("n", [*values, None] if with_null else values, dtype=pl.Float64)
    want = pl.select(int_expr(pl.lit(to_number(s)))).to_series().alias("n")
    assert_frame_equal(whole_int(s).to_frame(), want.to_frame())


def _odd_reference(line: bytes) -> bool:
    """Not shaped like {...}: the first byte, and the last after stepping back over up to
    three newlines, carriage returns or spaces."""
    j, steps = len(line) - 1, 0
    while steps < 3 and j > 0 and line[j] in b"\n\r ":
        j, steps = j - 1, steps + 1
    return line[0] != ord("{") or line[j] != ord("}")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([b"{", b"}", b" ", b"\r", b"a", b'"x"']), max_size=6)))
def test_odd_lines_fast_path_equals_the_rule_per_line(parts: list[list[bytes]]) -> None:
    data = b"".join(b"".join(p) + b"\n" for p in parts)
    data = data[:-1] if len(parts) % 2 else data  # with and without a final newline
    if not data:
        return
    starts = line_starts(data)
    ends = np.append(starts[1:], len(data))
    lines = _nonblank(data, starts, ends)
    want = [i for i in lines.tolist() if _odd_reference(data[starts[i] : ends[i]])]
    assert _odd(data, starts, ends, lines).tolist() == want
