"""The one way the pipeline opens DuckDB on SQL it did not write: a sandboxed connection.

``tracereplay sql`` (through ``Warehouse.connect``) and ``--where`` predicates
(``pipeline.selection``) both run text that a person, a config file or a
scheduled job supplied. They run it on a connection from ``connect``, whose
limits are DuckDB's own settings, not a reading of the SQL:

- in memory: no database file, nothing spilled to disk (no ``temp_directory``);
- files: only the directories and files it is given (``enable_external_access
  = false`` with ``allowed_directories`` and ``allowed_paths``); everything
  else, reading or writing, is a permission error;
- no extension is installed or loaded, even one DuckDB knows;
- the configuration is locked, so no ``SET`` gives any of it back;
- the session's time zone is UTC.

NOTE: DuckDB checks a path against ``allowed_directories`` and ``allowed_paths``
as it is written in the SQL, so the SQL run here must name files by the same
absolute paths (``allowed_path`` gives them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import duckdb


def allowed_path(path: Path) -> str:
    """``path`` as the sandbox allows it: absolute, symlinks and ``..`` resolved."""
    return str(Path(path).resolve())


def connect(
    directories: Iterable[Path] = (),
    files: Iterable[Path] = (),
    datasets: Mapping[str, object] | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that can open only ``directories`` and ``files``.

    Args:
        directories: open anything under these.
        files: open these files.
        datasets: Arrow datasets (or tables) to register under these names before the
            configuration is locked (an object-store warehouse's tables: Arrow reads them,
            the connection itself still opens no file).

    "Open" is DuckDB's word: reading, and writing too, so SQL that must not write
    is kept to reading statements besides (``tracereplay sql`` by statement type,
    ``--where`` by being one checked expression).
    """
    dirs = [allowed_path(d).rstrip("/") + "/" for d in directories]
    paths = [allowed_path(f) for f in files]
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    try:
        for name, data in (datasets or {}).items():
            con.register(name, data)
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET temp_directory = ''")
        con.execute(f"SET allowed_directories = {sql_list(dirs)}::VARCHAR[]")
        con.execute(f"SET allowed_paths = {sql_list(paths)}::VARCHAR[]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def sql_quote(s: str) -> str:
    """``s`` as the inside of a single-quoted SQL string."""
    return s.replace("'", "''")


def sql_list(items: Iterable[str]) -> str:
    """``items`` as a SQL list of string literals: ``['a', 'it''s']``."""
    return "[" + ", ".join(f"'{sql_quote(s)}'" for s in items) + "]"


__all__ = ["allowed_path", "connect", "sql_list", "sql_quote"]
