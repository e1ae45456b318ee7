"""``tracereplay sql`` writes nothing, however the write is disguised, and its ``-o``
writes nothing into the warehouse, however the path is spelled.

Each attempt runs through the command line in a scratch working directory
next to a copy of a small warehouse; afterwards no file may have appeared or
changed anywhere we can see: the scratch directory, the warehouse, the
system temporary directory and DuckDB's home directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.warehouse import Warehouse
from tests.untouched import snapshot, tmp_entries

# Every one of these must be refused (exit 1, one line) and write nothing.
# {wh} is the warehouse directory, {tmp} the system temporary directory.
ATTEMPTS = [
    # the report's case: a comment that a regex reads differently from DuckDB
    "EXPLAIN ANALYZE /* -- */ COPY (SELECT * FROM requests) TO 'x.parquet' "
    "/* /*\n*/ SELECT 1 -- */",
    "COPY (SELECT * FROM requests) TO 'x.parquet'",
    "COPY requests TO 'x.csv'",
    "COPY (SELECT 1) TO '{tmp}/tracereplay-x.csv'",
    "COPY (SELECT 1) TO '{wh}/requests/date=2024-05-01/evil.parquet'",
    "COPY (SELECT 1) TO '{wh}/runs/evil.parquet' (FORMAT parquet)",
    "COPY requests FROM 'x.csv'",
    "/* SELECT */ COPY (SELECT 1) TO 'x.csv'",
    "-- SELECT\nCOPY (SELECT 1) TO 'x.csv'",
    "SELECT 1; COPY (SELECT 1) TO 'x.csv'",
    "SELECT 1 /* ; */; COPY (SELECT 1) TO 'x.csv' -- ;",
    "SELECT ';'; COPY (SELECT 1) TO 'x.csv'",
    "SELECT 1 AS \"a;b\"; COPY (SELECT 1) TO 'x.csv'",
    "WITH a AS (SELECT 1) SELECT * FROM a; COPY (SELECT 1) TO 'x.csv'",
    "WITH t AS (SELECT 1) INSERT INTO requests SELECT * FROM requests",
    "WITH t AS (SELECT 1) DELETE FROM requests",
    "EXPLAIN COPY (SELECT 1) TO 'x.csv'",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'",
    "EXPLAIN ANALYSE CREATE TABLE t AS SELECT 1",
    "EXPLAIN /* ANALYZE */ ANALYZE -- SELECT\n COPY (SELECT 1) TO 'x.csv'",
    "EXPORT DATABASE 'exported'",
    "EXPORT DATABASE '{wh}/exported' (FORMAT parquet)",
    "IMPORT DATABASE 'exported'",
    "ATTACH 'x.duckdb' AS x",
    "ATTACH ':memory:' AS m; CREATE TABLE m.t AS SELECT 1",
    "DETACH memory",
    "INSTALL httpfs",
    "FORCE INSTALL httpfs",
    "LOAD httpfs",
    "UPDATE EXTENSIONS",
    "SELECT 1; UPDATE EXTENSIONS",
    "SET enable_external_access = true",
    "SET allowed_directories = ['/']",
    "RESET lock_configuration",
    "SET temp_directory = 'spill'",
    "SET profiling_output = 'profile.json'",
    "PRAGMA enable_profiling = 'json'",
    "PRAGMA profiling_output = 'profile.json'",
    "CALL enable_logging(storage = 'file', storage_path = 'logs')",
    "SELECT * FROM enable_logging(storage = 'file', storage_path = '{wh}/logs')",
    "CALL checkpoint()",
    "CHECKPOINT",
    "SELECT * FROM query('COPY (SELECT 1) TO ''x.csv''')",
    "PREPARE p AS COPY (SELECT 1) TO 'x.csv'; EXECUTE p",
    "CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
    "CREATE TABLE t AS SELECT * FROM requests",
    "CREATE OR REPLACE VIEW requests AS SELECT 1",
    "CREATE MACRO m() AS 1",
    "INSERT INTO requests SELECT * FROM requests",
    "UPDATE requests SET prompt_tokens = 0",
    "DELETE FROM requests",
    "DROP VIEW requests",
    "BEGIN; CREATE TABLE t (a INT); COMMIT",
    "VACUUM",
    "SET VARIABLE x = 1; COPY (SELECT getvariable('x')) TO 'x.csv'",
    # reading outside the warehouse is refused too
    "SELECT * FROM read_csv('/etc/passwd', sep = ':')",
    "SELECT * FROM read_text('../../../../etc/hostname')",
    "SELECT * FROM read_parquet('{wh}/../outside.parquet')",
    "SELECT * FROM glob('/*')",
]

# Parameters with quotes are values, never SQL: these run and write nothing.
QUOTED_PARAMS = [
    "x'; COPY (SELECT 1) TO 'x.csv'; --",
    "'); COPY (SELECT 1) TO 'x.csv'; SELECT ('",
    "$$; COPY (SELECT 1) TO 'x.csv'; $$",
]


# -o paths that write into the warehouse ({wh}), however they are spelled.
INSIDE = [
    "{wh}/requests/date=2024-05-01/dup.parquet",
    "{wh}/requests/date=2024-05-03/new.parquet",
    "{wh}/runs/evil.parquet",
    "{wh}/out.csv",
    "{wh}/../wh/requests/date=2024-05-01/dup.parquet",
    "{cwd}/../wh/requests/date=2024-05-01/dup.parquet",
    "{wh}/requests/date=2024-05-01/../date=2024-05-01/dup.parquet",
    "{link}/date=2024-05-01/dup.parquet",  # a directory symlink into the warehouse
    "{file_link}",  # a symlink to a warehouse file
    "{hard_link}",  # another name of a warehouse file
    "wh-rel/requests/date=2024-05-01/dup.parquet",  # relative, through a symlink
]


# what an attempt could write in the temporary directory
ATTEMPT_TMP_NAMES = {
    "tracereplay-x.csv",
    "x.csv",
    "x.parquet",
    "x.duckdb",
    "exported",
    "logs",
}


def _tmp_ours() -> set[str]:
    return tmp_entries(ATTEMPT_TMP_NAMES)


@pytest.fixture
def scratch(
    tiny_warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """(warehouse copy, working directory); ``outside.parquet`` lies beside the warehouse."""
    wh = tmp_path / "wh"
    shutil.copytree(tiny_warehouse.root, wh)
    Warehouse(wh).connect().close()  # the schema files and verdicts `sql` writes first
    shutil.copy(next(wh.glob("requests/*/src-*.parquet")), tmp_path / "outside.parquet")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return wh, cwd


def _sql(wh: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["sql", "--warehouse", str(wh), *args])
    return r.exit_code, r.output


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_write_attempt_is_refused_and_writes_nothing(
    scratch: tuple[Path, Path], tmp_path: Path, attempt: str
) -> None:
    wh, cwd = scratch
    home = Path.home() / ".duckdb"
    before, tmp_before = snapshot(tmp_path, home), _tmp_ours()
    text = attempt.format(wh=wh, tmp=tempfile.gettempdir())
    code, out = _sql(wh, "--", text)  # "--" lets a text start with a dash
    assert code == 1, out
    assert len(out.strip().splitlines()) == 1, out
    assert out.startswith("Error: ")
    assert snapshot(tmp_path, home) == before
    assert _tmp_ours() == tmp_before
    # and the warehouse still answers
    code, out = _sql(wh, "SELECT count(*) AS n FROM requests", "--format", "csv")
    assert (code, out) == (0, "n\n5\n")


@pytest.mark.parametrize("value", QUOTED_PARAMS)
def test_quoted_parameters_are_values(
    scratch: tuple[Path, Path], tmp_path: Path, value: str
) -> None:
    wh, cwd = scratch
    before = snapshot(tmp_path)
    query = "SELECT getvariable('p') AS p"
    code, out = _sql(wh, query, "--param", f"p={value}", "--format", "json")
    assert code == 0, out
    assert value in out.replace('\\"', '"')
    assert snapshot(tmp_path) == before


def test_corpus_size() -> None:
    assert len(ATTEMPTS) + len(QUOTED_PARAMS) >= 40
    assert len(INSIDE) >= 10


def test_reads_that_must_keep_working(scratch: tuple[Path, Path]) -> None:
    wh, _ = scratch
    for text in (
        "EXPLAIN SELECT * FROM requests",
        "EXPLAIN ANALYZE SELECT count(*) FROM sim_requests",
        "SUMMARIZE requests",
        "DESCRIBE runs",
        "SET VARIABLE d = DATE '2024-05-01'; "
        "SELECT count(*) FROM requests WHERE date = getvariable('d')",
        "FROM read_parquet('{wh}/requests/*/*.parquet') SELECT count(*)",
    ):
        code, out = _sql(wh, text.format(wh=wh))
        assert code == 0, (text, out)


@pytest.mark.parametrize("target", INSIDE)
def test_sql_output_inside_the_warehouse_is_refused(
    scratch: tuple[Path, Path], target: str
) -> None:
    wh, cwd = scratch
    (cwd / "link").symlink_to(wh / "requests", target_is_directory=True)
    (cwd / "wh-rel").symlink_to(wh, target_is_directory=True)
    data = next(wh.glob("requests/date=2024-05-01/src-*.parquet"))
    (cwd / "file_link.parquet").symlink_to(data)
    os.link(data, cwd / "hard_link.parquet")
    path = target.format(
        wh=wh,
        cwd=cwd,
        link=cwd / "link",
        file_link=cwd / "file_link.parquet",
        hard_link=cwd / "hard_link.parquet",
    )
    before = snapshot(wh)
    query = "SELECT * FROM requests"
    code, out = _sql(wh, "--format", "parquet", "-o", path, query)
    assert code == 1, out
    assert len(out.strip().splitlines()) == 1, out
    assert "is inside the warehouse" in out
    assert snapshot(wh) == before
    code, out = _sql(wh, "--format", "csv", "SELECT count(*) AS n FROM requests")
    assert (code, out) == (0, "n\n5\n")  # nothing counted twice


def test_sql_output_outside_the_warehouse_still_works(scratch: tuple[Path, Path]) -> None:
    wh, cwd = scratch
    (cwd / "wh-sibling").mkdir()
    for path in ("out.parquet", "wh-sibling/out.parquet", str(wh) + "-copy.parquet"):
        code, out = _sql(wh, "-o", path, "SELECT * FROM requests")
        assert code == 0, out
        assert "wrote 5 rows (parquet)" in out


def test_sql_output_is_checked_against_the_resolved_warehouse(
    scratch: tuple[Path, Path],
) -> None:
    wh, cwd = scratch
    (cwd / "wh-link").symlink_to(wh, target_is_directory=True)
    before = snapshot(wh)
    out_path = str(wh / "requests" / "date=2024-05-01" / "dup.parquet")
    code, out = _sql(cwd / "wh-link", "-o", out_path, "SELECT * FROM requests")
    assert code == 1 and "is inside the warehouse" in out, out
    assert snapshot(wh) == before
