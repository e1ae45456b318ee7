"""``table_fetch``: a small result of plain columns prints without polars exactly as
``format_result`` prints the polars frame of the same query."""

from __future__ import annotations

import random

import duckdb
import polars as pl
import pytest

from pipeline.report.sql import Rows, format_result, table_fetch

TYPES = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "UBIGINT", "BOOLEAN", "VARCHAR"]


def _literal(rng: random.Random, sql_type: str) -> str:
    if rng.random() < 0.15:
        return f"CAST(NULL AS {sql_type})"
    if sql_type == "BOOLEAN":
        return rng.choice(["true", "false"])
    if sql_type == "VARCHAR":
        n = rng.choice([1, 3, 12, 40, 80])
        text = "".join(rng.choice("abcXYZ019 -_,.;:'\"|") for _ in range(n)).strip() or "x"
        return "'" + text.replace("'", "''") + "'"
    top = {"TINYINT": 127, "SMALLINT": 32767, "INTEGER": 2**31 - 1, "UTINYINT": 255}.get(
        sql_type, 10**12
    )
    low = 0 if sql_type.startswith("U") else -top
    return f"CAST({rng.randint(low, top)} AS {sql_type})"


@pytest.mark.parametrize("seed", range(40))
def test_plain_results_print_as_polars_prints_them(seed: int) -> None:
    rng = random.Random(seed)
    types = [rng.choice(TYPES) for _ in range(rng.randint(1, 5))]
    words = ["a", "value", "n_requests", "p99 ttft"]
    cols = [(t, rng.choice(words) + str(i)) for i, t in enumerate(types)]
    rows = [
        "SELECT " + ", ".join(f'{_literal(rng, t)} AS "{n}"' for t, n in cols)
        for _ in range(rng.randint(0, 8))
    ] or ["SELECT " + ", ".join(f'CAST(NULL AS {t}) AS "{n}"' for t, n in cols) + " WHERE false"]
    sql = " UNION ALL ".join(rows)
    con = duckdb.connect()
    result = table_fetch(50)(con.sql(sql))
    assert isinstance(result, Rows), sql
    assert format_result(result, "table") == format_result(con.sql(sql).pl(), "table"), sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1.5 AS x",  # a decimal: polars formats it
        "SELECT 2.5::DOUBLE AS x",
        "SELECT [1, 2] AS l",
        "SELECT DATE '2026-01-01' AS d",
        "SELECT ' padded ' AS s",  # whitespace at an end
        "SELECT 'é' AS s",  # not ASCII
        "SELECT '' AS s",
        "SELECT repeat('x', 81) AS s",  # polars shortens it
        "SELECT range AS i FROM range(51)",  # more rows than shown
        "SELECT " + ", ".join(f"repeat('x', 60) AS c{i}" for i in range(4)),  # too wide
    ],
)
def test_other_results_are_polars_frames(sql: str) -> None:
    con = duckdb.connect()
    result = table_fetch(50)(con.sql(sql))
    assert isinstance(result, pl.DataFrame)
    assert result.equals(con.sql(sql).pl())
