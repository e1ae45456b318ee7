"""Which requests a replay, sweep or capacity search reads: models, tenants, a predicate,
a time window.

The warehouse's day partitions are picked first (``--from``/``--to`` days);
this module narrows the requests inside them: ``--model`` and ``--tenant``
(repeatable, exact names), ``--where`` (a SQL predicate on the requests
columns, e.g. ``prompt_tokens > 4000 AND tenant <> 'batch'``) and a time of
day on ``--from`` (inclusive) and ``--to`` (exclusive when it has a time; a bare
day on ``--to`` means the whole day). Arrival seconds are then counted from the
first selected request, as for a whole day.

``--busiest 1h`` then keeps the busiest hour of those requests, by arrivals or by
prompt + output tokens, and the requests of a warm-up before it (``pipeline.busiest``).

A predicate is checked when the filter is made (``pipeline.predicate``: one
boolean expression over the requests columns, scalar functions of an
allow-list, nothing that reads or writes) and runs on a sandboxed connection
that can open only the requests files it filters (``pipeline.sandbox``).

``--requests FILE`` accepts any Parquet file with the requests columns (for
example one written by ``tracereplay sql --format parquet``): its columns are
checked, not its footer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import sandbox
from pipeline.busiest import Busiest
from pipeline.contracts import REQUESTS
from pipeline.errors import ConfigError
from pipeline.predicate import check_predicate, quoted, statement


@dataclass(frozen=True)
class RequestFilter:
    """Rows of the requests files to keep (every field optional).

    Raises:
        PredicateError: (on construction) ``where`` is not a predicate that may run
            (``pipeline.predicate``), naming ``where_origin``.
    """

    models: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    where: str | None = None  # a SQL predicate on the requests columns (checked)
    start: datetime | None = None  # arrival_time >= start (UTC)
    end: datetime | None = None  # arrival_time < end (UTC)
    where_origin: str = "--where"  # where the predicate came from: an option or a config key
    busiest: Busiest | None = None  # then the busiest window of the rows kept (and its warm-up)

    def __post_init__(self) -> None:
        where = self.where
        if isinstance(where, str) and not where.strip():  # blank: every request, as None
            where = None
        elif where is not None:
            where = check_predicate(where, self.where_origin)
        object.__setattr__(self, "where", where)

    @property
    def filters(self) -> bool:
        """Whether the rows are filtered (``read``); ``busiest`` comes after."""
        return bool(self.models or self.tenants or self.where or self.start or self.end)

    @property
    def active(self) -> bool:
        return self.filters or self.busiest is not None

    def describe(self) -> str:
        chosen = self.describe_filters()
        return f"{self.busiest.describe()} of {chosen}" if self.busiest else chosen

    def describe_filters(self) -> str:
        """The filters of ``read``, without ``busiest``."""
        parts = []
        if self.models:
            parts.append(f"model in ({', '.join(self.models)})")
        if self.tenants:
            parts.append(f"tenant in ({', '.join(self.tenants)})")
        if self.start:
            parts.append(f"arrival >= {self.start:%Y-%m-%d %H:%M:%S} UTC")
        if self.end:
            parts.append(f"arrival < {self.end:%Y-%m-%d %H:%M:%S} UTC")
        if self.where:
            parts.append(f"({self.where})")
        return " and ".join(parts) or "every request"

    def read(self, files: list[Path], *, allow_empty: bool = False) -> pa.Table:
        """The kept rows of ``files`` (every column); ``allow_empty``: none is no error
        (one time window of a replay read a window at a time).

        Raises:
            ConfigError: a predicate that fails as it runs (a bad cast, a type mismatch;
                with the columns it may use), or nothing left (with the models, tenants
                and days the files hold).
        """
        clauses: list[str] = []
        params: list[object] = []
        if self.models:
            clauses.append(f"model IN ({', '.join('?' for _ in self.models)})")
            params += list(self.models)
        if self.tenants:
            clauses.append(f"tenant IN ({', '.join('?' for _ in self.tenants)})")
            params += list(self.tenants)
        if self.start:
            clauses.append("arrival_time >= ?")
            params.append(self.start)
        if self.end:
            clauses.append("arrival_time < ?")
            params.append(self.end)
        # union_by_name: files written before an optional column was added lack it
        paths = sandbox.sql_list(sandbox.allowed_path(f) for f in files)
        source = f"read_parquet({paths}, hive_partitioning = false, union_by_name = true)"
        rows = f"SELECT * FROM {source} WHERE {' AND '.join(clauses) or 'true'}"
        con = sandbox.connect(files=files)
        try:
            try:
                table: pa.Table = con.sql(
                    statement(self.where, rows) if self.where else rows, params=params
                ).to_arrow_table()
            except duckdb.Error as exc:
                first = str(exc).strip().splitlines()[0]
                if not self.where:
                    raise ConfigError(f"cannot read the requests files: {first}") from None
                cols = ", ".join(REQUESTS.file_columns)
                raise ConfigError(
                    f"{self.where_origin} {quoted(self.where)}: {first}; the predicate may use: "
                    + cols
                ) from None
            if table.num_rows == 0 and not allow_empty:
                raise ConfigError(
                    f"no request matches {self.describe_filters()}; {_present(con, source)}"
                )
        finally:
            con.close()
        return table


def _present(con: duckdb.DuckDBPyConnection, source: str) -> str:
    """'the files hold models a, b; tenants t1; days 2024-05-01 to 2024-05-02'."""
    models, tenants, first, last = con.execute(
        f"SELECT string_agg(DISTINCT model, ', ' ORDER BY model), "
        f"string_agg(DISTINCT tenant, ', ' ORDER BY tenant), "
        f"min(arrival_time)::VARCHAR, max(arrival_time)::VARCHAR FROM {source}"
    ).fetchone() or (None, None, None, None)
    return (
        f"the selected files hold models: {models or 'none recorded'}; tenants: "
        f"{tenants or 'none recorded'}; arrivals from {first} to {last}"
    )


def check_request_columns(path: Path) -> None:
    """A requests file from anywhere: every requests column present with a usable type.

    Raises:
        ConfigError: unreadable, or a column missing or of a type that cannot be cast,
            naming the file and the column and how to make one.
    """
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"{path}: not a readable Parquet file ({exc})") from None
    how = (
        "write one with `tracereplay sql --format parquet -o FILE "
        '"SELECT * FROM requests WHERE ..."`'
    )
    for name, want in REQUESTS.columns:
        if name in REQUESTS.partition_by:
            continue
        if name not in schema.names:
            if name in REQUESTS.optional:  # a file from before the column: read as nulls
                continue
            raise ConfigError(f"{path}: column {name!r} is missing; {how}")
        got = schema.field(name).type
        if not _compatible(got, want):
            raise ConfigError(f"{path}: column {name!r} has type {got}, expected {want}; {how}")


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    """Same kind of value: any integer width for an integer, any string, any timestamp."""
    t = pa.types
    if t.is_integer(want):
        return bool(t.is_integer(got))
    if t.is_floating(want):
        return bool(t.is_floating(got) or t.is_integer(got))
    if t.is_timestamp(want):
        return bool(t.is_timestamp(got))
    if t.is_string(want) or t.is_large_string(want):
        return bool(t.is_string(got) or t.is_large_string(got))
    if t.is_list(want):
        return bool(
            (t.is_list(got) or t.is_large_list(got))
            and _compatible(got.value_type, want.value_type)
        )
    return bool(got.equals(want))


__all__ = ["RequestFilter", "check_request_columns"]
