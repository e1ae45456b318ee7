"""Contracts: declared once, checked on write and read, views over every table."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contracts import (
    CONTRACTS,
    QUARANTINE,
    REQUESTS,
    RUNS,
    check_file,
    conform,
    write_table,
)
from pipeline.errors import ContractError
from pipeline.warehouse import SQL_DIR, Warehouse


def _runs_row() -> dict[str, list[object]]:
    return {
        "run_id": ["r1"],
        "command": ["ingest"],
        "started_at": [pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py()],
        "finished_at": [pa.scalar(1, pa.timestamp("us", tz="UTC")).as_py()],
        "status": ["ok"],
        "inputs": ["[]"],
        "rows_read": [1],
        "rows_kept": [1],
        "rows_quarantined": [0],
        "rows_duplicate": [0],
        "details": ["{}"],
        "version": ["0"],
    }


def test_names_unique_and_nullable_are_columns() -> None:
    for c in CONTRACTS.values():
        names = c.column_names
        assert len(names) == len(set(names)), c.name
        assert c.nullable <= set(names), c.name
        assert set(c.partition_by) <= set(names), c.name
        assert set(c.primary_key) <= set(names), c.name
        assert set(c.docs) == set(names), c.name


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    path = write_table(pa.table(_runs_row()), RUNS, tmp_path / "runs.parquet")
    pf = check_file(path, RUNS)
    meta = pf.schema_arrow.metadata
    assert meta[b"tracereplay.table"] == b"runs"
    assert meta[b"tracereplay.schema_version"] == str(RUNS.version).encode()
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_missing_column_names_table_column_and_file(tmp_path: Path) -> None:
    row = _runs_row()
    del row["status"]
    with pytest.raises(ContractError) as exc:
        write_table(pa.table(row), RUNS, tmp_path / "x.parquet")
    msg = str(exc.value)
    assert "table runs" in msg and "'status'" in msg and "x.parquet" in msg
    assert not (tmp_path / "x.parquet").exists()


def test_wrong_type_and_nulls_are_reported(tmp_path: Path) -> None:
    row = _runs_row()
    row["rows_read"] = ["many"]
    row["command"] = [None]
    with pytest.raises(ContractError) as exc:
        write_table(pa.table(row), RUNS, tmp_path / "x.parquet")
    msg = str(exc.value)
    assert "'rows_read' has type string, expected int64" in msg
    assert "'command' has 1 nulls" in msg


def test_read_checks_table_version_and_columns(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with pytest.raises(ContractError, match="expected a 'runs' file"):
        check_file(foreign, RUNS)
    old = tmp_path / "old.parquet"
    table = pa.table(_runs_row()).replace_schema_metadata(
        {b"tracereplay.table": b"runs", b"tracereplay.schema_version": b"0"}
    )
    pq.write_table(table, old)
    with pytest.raises(ContractError, match="schema version 0"):
        check_file(old, RUNS)
    short = tmp_path / "short.parquet"
    t = pa.table(_runs_row()).drop_columns(["details"])
    pq.write_table(t.replace_schema_metadata(RUNS.schema().metadata), short)
    with pytest.raises(ContractError, match=r"short\.parquet.*missing column 'details'"):
        check_file(short, RUNS)


def test_views_file_covers_every_table(tmp_path: Path) -> None:
    sql = (SQL_DIR / "views.sql").read_text()
    views = set(re.findall(r"CREATE OR REPLACE VIEW (\w+)", sql))
    assert views == set(CONTRACTS)
    con = Warehouse(tmp_path).connect()
    for c in CONTRACTS.values():
        cols = {r[0]: r[1] for r in con.execute(f"DESCRIBE {c.name}").fetchall()}
        assert set(cols) == set(c.column_names), c.name
        assert con.execute(f"SELECT count(*) FROM {c.name}").fetchone() == (0,)


def test_requests_never_has_a_text_column() -> None:
    assert not {"prompt", "messages", "text", "response"} & set(REQUESTS.column_names)
    assert "raw_excerpt" in QUARANTINE.nullable


def test_an_optional_column_is_nullable_and_written_as_nulls_when_absent(tmp_path: Path) -> None:
    for c in CONTRACTS.values():
        assert c.optional <= c.nullable, c.name
    assert REQUESTS.optional == {"output_hashes"}
    table = pa.table({n: pa.array([], t) for n, t in REQUESTS.columns if n != "output_hashes"})
    written = conform(table, REQUESTS, "test")
    assert written.column_names == REQUESTS.file_columns
    assert written.schema.field("output_hashes").type == pa.list_(pa.uint64())


def test_every_type_a_contract_names_is_the_arrow_type_of_that_name() -> None:
    from pipeline.contracts import CONTRACTS, arrow_type

    for contract in CONTRACTS.values():
        for (name, text), (same, arrow) in zip(contract.types, contract.columns, strict=True):
            assert name == same and str(arrow) == text and arrow == arrow_type(text)
    with pytest.raises(KeyError):
        arrow_type("int31")
