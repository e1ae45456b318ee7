"""``validate`` evaluates only the rules that can fail in a block (``Rule.reads``).

Checked against every rule evaluated, on blocks whose columns are each all
null, partly null or full of values that break one rule or another: the same
good rows and the same rejects with the same reasons.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from pipeline.ingest.formats import CANONICAL

# the module (the package exports its function ``validate`` under the same name)
validation = importlib.import_module("pipeline.ingest.validate")

# values around every rule's limits, per column (None: missing)
VALUES: dict[str, list[Any]] = {
    "arrival_time": [datetime(2024, 5, 1, tzinfo=UTC), datetime(1969, 12, 31, tzinfo=UTC)],
    "arrival_offset_s": [0.0, 1.5, -1.0, float("nan"), float("inf"), 2e9],
    "prompt_tokens": [1, 0, -3, 512, 2**31],
    "output_tokens": [1, -1, 64, 2**31],
    "max_tokens": [1, 0, 2**31],
    "block_size": [16, 0, 1],
    "prefix_hashes": [[], [1, 2], [1, None], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]],
    "priority": [0, -(2**31), 2**31],
    "turn": [1, 2**31],
    "cached_tokens": [0, 16, -2, 4096],
    "observed_ttft_s": [0.1, -0.1],
    "observed_e2e_s": [1.0, -1.0],
    "observed_queue_s": [0.0, -0.5],
    "_reject": ["status failure (a failed call never ran)"],
}
SHAPE = st.sampled_from(["null", "full", "mixed"])


def _frame(n: int, shapes: dict[str, str], draw: Any) -> pl.DataFrame:
    cols: dict[str, pl.Series] = {}
    for name, values in VALUES.items():
        dtype = CANONICAL.get(name, pl.String())
        shape = shapes[name]
        if shape == "null":
            cells: list[Any] = [None] * n
        else:
            pick = st.sampled_from(values) if shape == "full" else st.sampled_from([*values, None])
            cells = [draw(pick) for _ in range(n)]
        cols[name] = pl.Series(name, cells, dtype=dtype)
    cols["request_id"] = pl.Series([f"r{i}" for i in range(n)], dtype=pl.String)
    cols["source_line"] = pl.Series(range(1, n + 1), dtype=pl.Int64)
    cols["byte_offset"] = pl.Series(range(0, 10 * n, 10), dtype=pl.Int64)
    return pl.DataFrame(cols)


def _every_rule(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``validate`` with no rule skipped (the reference)."""
    every = tuple(range(len(validation._all_rules())))
    applicable = validation._applicable
    validation._applicable = lambda _rows: every  # type: ignore[assignment]
    try:
        return validation.validate(rows)
    finally:
        validation._applicable = applicable  # type: ignore[assignment]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 12), shapes=st.fixed_dictionaries({c: SHAPE for c in VALUES}), data=st.data()
)
def test_skipping_rules_changes_nothing(n: int, shapes: dict[str, str], data: Any) -> None:
    rows = _frame(n, shapes, data.draw)
    good, bad = validation.validate(rows)
    ref_good, ref_bad = _every_rule(rows)
    assert_frame_equal(good, ref_good)
    assert_frame_equal(bad, ref_bad)
    assert good.height + bad.height == n


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("max_tokens", 0, "max_tokens below 1: 0"),
        ("priority", 2**31, "priority out of the 32-bit range: 2147483648"),
        ("observed_queue_s", -0.5, "negative observed latency (end before start)"),
        ("block_size", 0, "block size below 1"),
    ],
)
def test_a_rule_on_a_column_most_formats_lack_still_fires(
    column: str, value: Any, reason: str
) -> None:
    """One value in a column that is otherwise null is enough for its rule to run."""
    rows = _frame(3, dict.fromkeys(VALUES, "null"), lambda _s: None).with_columns(
        pl.lit(datetime(2024, 5, 1, tzinfo=UTC)).alias("arrival_time"),
        pl.lit(10, dtype=pl.Int64).alias("prompt_tokens"),
        pl.lit(5, dtype=pl.Int64).alias("output_tokens"),
    )
    cell = pl.Series(column, [None, value, None], dtype=CANONICAL[column])
    good, bad = validation.validate(rows.with_columns(cell))
    assert bad["reason"].to_list() == [reason]
    assert bad["source_line"].to_list() == [2]
    assert good["source_line"].to_list() == [1, 3]
