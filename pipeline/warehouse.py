"""The warehouse: a directory of hive-partitioned Parquet tables plus DuckDB views.

Layout (one directory per contract)::

    requests/date=YYYY-MM-DD/src-<source key>.parquet   one file per source file and day
    quarantine/src-<source key>.parquet                 rejected records of one source file
    runs/<run_id>.parquet                               one row per pipeline run
    sim_requests/run_id=<run_id>/<scenario>.parquet
    sim_steps/run_id=<run_id>/<scenario>.parquet
    scenarios/run_id=<run_id>/scenarios.parquet
    live_requests/run_id=<run_id>/<engine>.parquet       one file per live run
    live_metrics/run_id=<run_id>/<engine>.parquet

Each table also holds a zero-row ``_empty.parquet`` so that its DuckDB view
resolves (and has the right column types) before any data lands.

Writes are atomic per file (temporary name, then rename), whether a file is
written at once or in row groups as its rows come (``Warehouse.writer``).
Re-ingesting a source file replaces what that file produced before, so nothing
doubles.

Readers read only files that passed verification (``pipeline.integrity``):
``good_files`` lists them, ``connect`` builds its views over them; a damaged file is
left out, named on stderr, and moved to ``damaged/`` by a command holding the lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from pipeline import integrity, sandbox
from pipeline.contracts import CONTRACTS, Contract, TableWriter, write_table

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:  # loaded when a table is written or a file's schema read (`sql` reads neither)
    from pipeline.lazy import lazy_import

    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
VIEWS_SQL = "views.sql"
# views over the table views (not over files), created after views.sql in this order
DERIVED_VIEWS = ("class_latency.sql", "pool_latency.sql")

_EMPTY_PARTITION = {"date": "1970-01-01", "run_id": "_empty"}


def new_run_id(now: datetime | None = None) -> str:
    """A run id that sorts by start time: 20240501T020000Z-1a2b."""
    now = now or datetime.now(UTC)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def source_key(path: Path | str) -> str:
    """Stable key of a source file: its resolved path (its URI, when it was fetched from
    an object store or is given as one), hashed (16 hex digits)."""
    from pipeline.objectstore import is_remote, source_name

    name = str(path) if is_remote(path) else source_name(Path(path))
    if name == str(path) and not is_remote(name):
        name = str(Path(path).resolve())
    return hashlib.sha1(name.encode()).hexdigest()[:16]


class Warehouse:
    """Paths and atomic writes inside one warehouse directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def table_dir(self, contract: Contract) -> Path:
        return self.root / contract.name

    def init(self) -> None:
        """Create every table directory with its zero-row schema file (idempotent).

        A schema file that lacks columns a contract gained since (``Contract.optional``) is
        written again, so that the views of an older warehouse have those columns too
        (null in its older files) and the queries that read them run.
        """
        # the schema files found complete last time, by their stat, under these contracts:
        # those unchanged are not read again (each read loads pyarrow, for `sql` too)
        stamp = self.root / SCHEMAS_STAMP
        known, seen = _read_stamp(stamp), {}
        for contract in CONTRACTS.values():
            d = self.table_dir(contract)
            for col in contract.partition_by:
                d = d / f"{col}={_EMPTY_PARTITION[col]}"
            path = d / "_empty.parquet"
            rel = str(path.relative_to(self.root))
            key = _stat_key(path)
            if key is None or (
                contract.optional and known.get(rel) != key and not _has_columns(path, contract)
            ):
                try:
                    write_table(contract.schema().empty_table(), contract, path)
                except (FileExistsError, NotADirectoryError, IsADirectoryError):
                    # a file where a directory belongs, or the reverse: damage, which
                    # ``pipeline.integrity`` reports; the table's view has no rows meanwhile
                    continue
                key = _stat_key(path)
            if key is not None:
                seen[rel] = key
        if seen != known:
            try:
                stamp.write_text(json.dumps({"contracts": _contracts_digest(), "files": seen}))
            except OSError:  # a read-only warehouse: the files are read again next time
                pass

    def files(self, contract: Contract) -> list[Path]:
        """Data files of a table (schema placeholders excluded), sorted."""
        d = self.table_dir(contract)
        pattern = "/".join(["*"] * len(contract.partition_by) + ["*.parquet"])
        return sorted(p for p in d.glob(pattern) if p.name != "_empty.parquet")

    def good_files(self, contract: Contract) -> list[Path]:
        """The data files of a table that passed verification, sorted: what a reader may read.

        A damaged file is left out and named on stderr (once per process), and moved to
        ``damaged/`` when this process holds the warehouse lock (``pipeline.integrity``).
        """
        served = integrity.serve(self, [contract])[contract.name]
        return sorted(p for p in served if p.name != "_empty.parquet")

    def partition_path(self, contract: Contract, values: dict[str, str], stem: str) -> Path:
        d = self.table_dir(contract)
        for col in contract.partition_by:
            d = d / f"{col}={values[col]}"
        return d / f"{stem}.parquet"

    def write(self, contract: Contract, table: pa.Table, values: dict[str, str], stem: str) -> Path:
        """Write one file of ``contract`` atomically and return its path."""
        return write_table(table, contract, self.partition_path(contract, values, stem))

    def writer(self, contract: Contract, values: dict[str, str], stem: str) -> TableWriter:
        """A writer of one file of ``contract`` in row groups (atomic, like ``write``)."""
        return TableWriter(contract, self.partition_path(contract, values, stem))

    def remove_stale(self) -> list[Path]:
        """Remove what killed commands left behind; return what was removed.

        - temporary files (``.<name>.tmp-<pid or run id>``) of the tables;
        - the files of runs that never committed: a ``run_id=<id>`` directory
          of a run table whose run has no ``runs`` row (the views never showed
          them);
        - temporary files of reports and nightly manifests whose writing
          process is gone (``remove_orphan_temp_files``).

        Call it only while holding the warehouse lock (``pipeline.lock``): then
        no other command is writing, so every such file is stale.
        """
        removed: list[Path] = []
        runs = self.table_dir(CONTRACTS["runs"])
        committed = {p.stem for p in runs.glob("*.parquet")}
        # a run whose runs row was set aside as damaged keeps its files (hidden): when the
        # runs directory itself was, no run's files can be told stale
        kept = integrity.runs_set_aside(self)
        judge_runs = runs.is_dir() and kept is not None
        committed |= kept or set()
        for contract in CONTRACTS.values():
            d = self.table_dir(contract)
            if not d.is_dir():
                continue
            for tmp in d.rglob(".*.tmp-*"):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
            if "run_id" in contract.partition_by and judge_runs:
                for run_dir in d.glob("run_id=*"):
                    run_id = run_dir.name.split("=", 1)[1]
                    if run_id != _EMPTY_PARTITION["run_id"] and run_id not in committed:
                        shutil.rmtree(run_dir, ignore_errors=True)
                        removed.append(run_dir)
        return removed + self.remove_orphan_temp_files()

    def remove_orphan_temp_files(self) -> list[Path]:
        """Remove temporary files of reports, nightly manifests, the damaged files' manifest
        and the verification verdicts whose writer is gone.

        Safe without the lock (``report`` takes none): a file is removed only
        when the process named in it (``.<name>.tmp-<pid>``) no longer runs.
        """
        removed = []
        temps = [
            *(
                t
                for other in ("reports", "nightly", "damaged")
                for t in (self.root / other).rglob(".*.tmp-*")
            ),
            *self.root.glob(f"{integrity.VERDICTS}.tmp-*"),
        ]
        for tmp in temps:
            pid = tmp.name.rsplit("-", 1)[1]
            if not (pid.isdigit() and _alive(int(pid))):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
        return removed

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A read-only, in-memory DuckDB connection with a view over every table.

        What can run on it is limited by DuckDB's own settings, not by reading
        the SQL (``pipeline.sandbox.connect``): the engine opens files under the
        warehouse directory and nowhere else, installs and loads no extension,
        spills nothing to disk, and its configuration is locked. The session's
        time zone is UTC. What could still write *inside* the warehouse (``COPY
        ... TO`` under it) is refused by statement type before it runs
        (``pipeline.report.sql.check_read_only``).

        The views read only the files that passed verification (``pipeline.integrity``):
        a damaged file is left out (and named on stderr), never an error of the view.

        An object-store warehouse (``pipeline.objectstore``) is read in place, as its
        latest manifest names it, unless this process holds its lock: then the mirror it
        works on is that state and its own writes.
        """
        from pipeline import lock, objectstore

        remote = objectstore.remote_of(self.root)
        if remote is not None and not lock.holds(self.root):
            return objectstore.connect(remote)
        self.init()
        served = integrity.serve(self)
        con = sandbox.connect(directories=[self.root])
        try:
            con.execute(served_views(served))
        except BaseException:
            con.close()
            raise
        return con

    def contains(self, path: Path) -> bool:
        """Whether writing ``path`` would write into the warehouse directory.

        True when ``path``, with symlinks and ``..`` resolved (as far as it exists),
        lies inside the directory, and when it is another name (a hard link) of a
        file inside it.
        """
        root = self.root.resolve()
        target = Path(path).resolve()
        if target.is_relative_to(root):
            return True
        try:
            st = target.stat()
        except OSError:  # nothing there yet
            return False
        if st.st_nlink < 2:
            return False
        key = (st.st_dev, st.st_ino)
        return any((q.st_dev, q.st_ino) == key for q in _stats(root.rglob("*")))


SCHEMAS_STAMP = ".schemas.json"  # (Warehouse.init)


def _contracts_digest() -> str:
    text = repr([(c.name, c.version, c.types) for c in CONTRACTS.values()])
    return hashlib.sha1(text.encode()).hexdigest()


def _read_stamp(path: Path) -> dict[str, list[int]]:
    """The schema files' stats kept by ``Warehouse.init``; none when they were kept under
    other contracts (or cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("contracts") == _contracts_digest()
    files = data.get("files") if ok else None
    return files if isinstance(files, dict) else {}


def _stat_key(path: Path) -> list[int] | None:
    """A file's size, times and inode (None: absent, or not a regular file)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _has_columns(path: Path, contract: Contract) -> bool:
    """Whether a schema file holds every file column of ``contract``."""
    try:
        names = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowInvalid):
        return False
    return set(contract.file_columns) <= names


_READ_PARQUET = re.compile(r"read_parquet\('([^']*)'([^()]*)\)")


def served_views(served: dict[str, list[Path]]) -> str:
    """views.sql with each table's glob replaced by the list of its verified files.

    # NOTE: DuckDB checks a path against ``allowed_directories`` as it is written, not
    # as ``file_search_path`` resolves it, so the read-only connection's views name
    # their files absolutely. A table with no file left to serve (its schema file too
    # is damaged) reads as no rows of the contract's columns.
    """

    def one(table: str, options: str) -> str:
        files = served.get(table, [])
        if not files:
            return f"({_no_rows(CONTRACTS[table])})"
        return f"read_parquet({sandbox.sql_list(sandbox.allowed_path(f) for f in files)}{options})"

    return view_sources(load_sql(VIEWS_SQL), one)


def view_sources(text: str, source: Callable[[str, str], str]) -> str:
    """views.sql with each ``read_parquet('<table>/...', <options>)`` replaced by
    ``source(table, options)``: the table's files, or the name of a registered Arrow
    dataset (which needs no options)."""

    def one(m: re.Match[str]) -> str:
        return source(m.group(1).split("/", 1)[0], m.group(2))

    out, n = _READ_PARQUET.subn(one, text)
    assert n == text.count("read_parquet("), "views.sql: unexpected path form"
    return out + derived_views_sql()


def derived_views_sql() -> str:
    """The text of the ``DERIVED_VIEWS`` files, to run after views.sql."""
    return "".join("\n" + load_sql(name) for name in DERIVED_VIEWS)


_DUCKDB_TYPES = {
    "string": "VARCHAR",
    "double": "DOUBLE",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "bool": "BOOLEAN",
    "date32[day]": "DATE",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
    "list<item: uint64>": "UBIGINT[]",
}


def _no_rows(contract: Contract) -> str:
    """A query of no rows with the table's columns (partitions too) in DuckDB types."""
    cols = ", ".join(f'CAST(NULL AS {_DUCKDB_TYPES[t]}) AS "{n}"' for n, t in contract.types)
    return f"SELECT {cols} WHERE false"


def _stats(paths: Iterable[Path]) -> Iterator[os.stat_result]:
    """The stat of each regular file of ``paths`` (symlinks not followed)."""
    for p in paths:
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            yield st


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def load_sql(name: str) -> str:
    """The text of ``sql/<name>``."""
    from pipeline.errors import UnknownQueryError

    path = SQL_DIR / name
    if not path.exists():
        available = sorted(p.name for p in SQL_DIR.glob("*.sql"))
        raise UnknownQueryError(
            f"no query {name!r} in {SQL_DIR}; available: {', '.join(available)}"
        )
    return path.read_text()


def replace_files(new: Iterable[tuple[Path, Path]], old: Iterable[Path]) -> None:
    """Move each finished temporary file into place, then delete stale files.

    ``new`` pairs (temporary path, final path); a final path that is also in
    ``old`` is replaced, not deleted.
    """
    finals = set()
    for tmp, final in new:
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
        finals.add(final)
    for path in old:
        if path not in finals and path.exists():
            path.unlink()


def iter_partitions(paths: Iterable[Path]) -> Iterator[tuple[dict[str, str], Path]]:
    """Yield the hive partition values of each path (``date=...`` directory names)."""
    for p in paths:
        values = {}
        for part in p.parent.parts:
            if "=" in part:
                k, v = part.split("=", 1)
                values[k] = v
        yield values, p
