"""Load the hand-written queries in ``sql/`` and run them, read-only, against the views.

Every query file starts with a comment header that people and this module both read::

    -- throughput.sql
    -- How much does each scenario serve ...?            <- what it answers
    -- Reads:   sim_requests, scenarios
    -- Params:  run_id      VARCHAR  the replay run (NULL: the latest run)
    --          slo_ttft_s  DOUBLE   TTFT objective for goodput, seconds (NULL: 0.2)
    -- Grain:   one row per scenario
    -- Columns: ...

NOTE: parameters are DuckDB session variables read with ``getvariable('name')``,
not prepared-statement ``$name`` placeholders, so that every file pastes into
the ``duckdb`` shell as it is: there a parameter is ``SET VARIABLE run_id =
'...';`` or simply left unset, which gives the default the header names. The
runner sets every parameter a file declares (NULL when not given) before it
runs the file, so values never leak from one query into the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from pipeline.errors import PipelineError, UnknownQueryError
from pipeline.warehouse import DERIVED_VIEWS, SQL_DIR, VIEWS_SQL

if TYPE_CHECKING:
    import polars as pl
else:  # `tracereplay sql "select 1"` prints a small table without importing polars
    from pipeline.lazy import lazy_import

    pl = lazy_import("polars")

_PARAM_LINE = re.compile(r"^--\s+(?:Params:\s+)?([a-z_][a-z0-9_]*)\s+([A-Z]+)\s+(.*)$")
_GETVARIABLE = re.compile(r"getvariable\('([a-z_][a-z0-9_]*)'\)")

# Statement types that cannot change anything. EXPLAIN is checked separately (EXPLAIN
# ANALYZE runs its statement) and SET only as SET/RESET VARIABLE.
_READ_ONLY = {"SELECT"}


class QueryError(PipelineError):
    """A query failed: bad SQL, a write in a read-only session, or a bad parameter."""


@dataclass(frozen=True)
class Param:
    """One parameter a query file declares in its header."""

    name: str
    sql_type: str  # DuckDB type name, e.g. VARCHAR, DOUBLE, INTEGER
    doc: str


@dataclass(frozen=True)
class QueryFile:
    """A ``sql/<name>.sql`` file and the facts its header states."""

    name: str
    path: Path
    text: str
    purpose: str  # the header's question, one line
    params: dict[str, Param] = field(default_factory=dict)


def available() -> list[str]:
    """Names of the query files (without ``.sql``), the files of views left out."""
    views = {VIEWS_SQL, *DERIVED_VIEWS}
    return sorted(p.stem for p in SQL_DIR.glob("*.sql") if p.name not in views)


def parse_header(name: str, path: Path, text: str) -> QueryFile:
    """Read a query file's header: its question (second line) and its parameters."""
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    purpose_lines = []
    for line in header[1:]:
        if re.match(r"^-- [A-Z][a-z]+:", line):
            break
        purpose_lines.append(line.lstrip("- ").strip())
    purpose = " ".join(purpose_lines)
    found: dict[str, tuple[str, list[str]]] = {}
    in_params = False
    for line in header:
        if line.startswith("-- Params:"):
            in_params = True
        elif re.match(r"^-- [A-Z][a-z]+:", line):
            in_params = False
        if not in_params:
            continue
        m = _PARAM_LINE.match(line)
        if m:
            found[m.group(1)] = (m.group(2), [m.group(3).strip()])
        elif found:  # a continuation line of the last parameter's description
            next(reversed(found.values()))[1].append(line.lstrip("- ").strip())
    params = {n: Param(n, t, " ".join(doc)) for n, (t, doc) in found.items()}
    return QueryFile(name=name, path=path, text=text, purpose=purpose, params=params)


def load_query(name: str) -> QueryFile:
    """The query ``sql/<name>.sql``.

    Raises:
        UnknownQueryError: no such file; the message lists the available names.
    """
    stem = name.removesuffix(".sql")
    path = SQL_DIR / f"{stem}.sql"
    if f"{stem}.sql" in DERIVED_VIEWS:
        raise UnknownQueryError(
            f"{stem} is a view, not a query: SELECT * FROM {stem} (its columns: sql/{stem}.sql)"
        )
    if stem == Path(VIEWS_SQL).stem or not path.exists():
        raise UnknownQueryError(f"no query {name!r} in sql/; available: {', '.join(available())}")
    return parse_header(stem, path, path.read_text())


def variables_used(text: str) -> set[str]:
    """Names of the session variables a SQL text reads with getvariable()."""
    return set(_GETVARIABLE.findall(text))


def set_params(
    con: duckdb.DuckDBPyConnection, params: dict[str, Any], types: dict[str, str] | None = None
) -> None:
    """``SET VARIABLE`` each parameter (bound, never formatted into SQL); None sets NULL.

    ``types`` casts a value to the declared DuckDB type, so that ``--param
    slo_ttft_s=0.1`` arrives as a DOUBLE.
    """
    types = types or {}
    for name, value in params.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise QueryError(f"bad parameter name {name!r}: use letters, digits and _")
        sql_type = types.get(name)
        try:
            if value is None:
                con.execute(f"SET VARIABLE {name} = NULL")
            elif sql_type:
                con.execute(f"SET VARIABLE {name} = CAST(? AS {sql_type})", [value])
            else:
                con.execute(f"SET VARIABLE {name} = ?", [value])
        except duckdb.Error as exc:
            raise QueryError(
                f"parameter {name}: cannot use {value!r} as {sql_type or 'a value'} "
                f"({one_line(str(exc))})"
            ) from exc


def query(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> pl.DataFrame:
    """Run ``sql/<name>.sql`` against the views and return the result as a polars frame.

    Every parameter the file declares is set (to None, hence its default, when not
    given).

    Raises:
        UnknownQueryError: no such query.
        QueryError: a parameter the file does not declare, or the query failed.
    """
    q = load_query(name)
    unknown = sorted(set(params) - set(q.params))
    if unknown:
        raise QueryError(
            f"query {q.name} has no parameter {', '.join(unknown)}; "
            f"it takes: {', '.join(q.params) or 'none'}"
        )
    values = {p: params.get(p) for p in q.params}
    set_params(con, values, {p.name: p.sql_type for p in q.params.values()})
    try:
        return con.sql(q.text).pl()
    except duckdb.Error as exc:
        raise QueryError(f"{q.path.name}: {describe_error(exc, q.text)}") from exc


def connect_views(root: Path) -> duckdb.DuckDBPyConnection:
    """The read-only connection over the views of the warehouse at ``root``
    (``Warehouse.connect``).

    Raises:
        PipelineError: no warehouse there.
    """
    from pipeline.warehouse import Warehouse

    if not Path(root).is_dir():
        raise PipelineError(
            f"no warehouse at {root}: run `tracereplay ingest` first or pass --warehouse"
        )
    return Warehouse(Path(root)).connect()


def one_line(message: str) -> str:
    """The first line of a DuckDB error, without its 'Xxx Error: ' prefix."""
    first = message.strip().splitlines()[0] if message.strip() else message
    return re.sub(r"^[A-Za-z ]+ Error: ", "", first)


def describe_error(exc: BaseException, sql: str, line_offset: int = 0) -> str:
    """A DuckDB error as one line, with the line and column it points at.

    DuckDB marks the spot as ``LINE n: <text>`` followed by a caret line;
    ``line_offset`` shifts the line number when ``sql`` is one statement of a
    longer text.
    """
    message = str(exc)
    lines = message.splitlines()
    where = ""
    for i, line in enumerate(lines):
        m = re.match(r"^LINE (\d+): ", line)
        if m and i + 1 < len(lines) and "^" in lines[i + 1]:
            column = lines[i + 1].index("^") - len(m.group(0)) + 1
            where = f" (line {int(m.group(1)) + line_offset}, column {max(column, 1)})"
            break
    kind = re.match(r"^([A-Za-z ]+) Error: ", message.strip())
    prefix = f"{kind.group(1).lower()} error: " if kind else ""
    return f"{prefix}{one_line(message)}{where}"


@dataclass(frozen=True)
class Statement:
    """One statement of a SQL text, with the line it starts on (0-based)."""

    text: str
    kind: str  # DuckDB StatementType name: SELECT, INSERT, ...
    line_offset: int


def split_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[Statement]:
    """Parse ``sql`` into statements with DuckDB's own parser.

    Raises:
        QueryError: a syntax error, as one line with its position, or a statement
            of a kind this DuckDB client cannot name (``UPDATE EXTENSIONS``).
    """
    try:
        parsed = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(describe_error(exc, sql)) from exc
    out: list[Statement] = []
    cursor = 0
    for i, st in enumerate(parsed, 1):
        try:
            kind = st.type.name
        except ValueError as exc:
            # NOTE: the Python client raises ValueError ("29 is not a valid
            # StatementType") for statement kinds its enum lacks (UPDATE EXTENSIONS).
            where = f"statement {i}" if len(parsed) > 1 else "the statement"
            raise QueryError(
                f"read-only: {where} is of a kind that is not a query ({exc}); the warehouse "
                "can only be queried here, with SELECT (and SET VARIABLE)"
            ) from None
        text = st.query
        at = sql.find(text, cursor)
        if at < 0:  # DuckDB normalised the text; positions are per statement then
            at = cursor
        else:
            cursor = at + len(text)
        # DuckDB counts a statement's lines from its own first character.
        leading = len(text) - len(text.lstrip())
        out.append(Statement(text, kind, sql.count("\n", 0, at + leading)))
    return out


def _tokens(sql: str) -> list[tuple[int, str]]:
    """(position, text) of each token of ``sql`` as DuckDB's tokenizer sees it, no comments."""
    toks = duckdb.tokenize(sql)
    out = []
    for k, (pos, kind) in enumerate(toks):
        if kind == duckdb.token_type.comment:
            continue
        end = toks[k + 1][0] if k + 1 < len(toks) else len(sql)
        out.append((pos, sql[pos:end].strip()))
    return out


def _is_set_variable(text: str) -> bool:
    words = [w.upper() for _, w in _tokens(text)[:2]]
    return len(words) == 2 and words[0] in ("SET", "RESET") and words[1] == "VARIABLE"


def _explained_kinds(con: duckdb.DuckDBPyConnection, text: str) -> list[str]:
    """The statement kinds an EXPLAIN [ANALYZE] statement explains (and, with ANALYZE, runs)."""
    toks = _tokens(text)
    i = 1
    if len(toks) > i and toks[i][1].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    if len(toks) <= i:
        return []
    try:
        return [s.type.name for s in con.extract_statements(text[toks[i][0] :])]
    except (duckdb.Error, ValueError):
        return []


def check_read_only(con: duckdb.DuckDBPyConnection, statements: list[Statement]) -> None:
    """Refuse any statement that is not a query, by the kind DuckDB's parser gives it.

    Allowed: SELECT (with FROM-first, DESCRIBE, SHOW, SUMMARIZE, which DuckDB
    parses as SELECT), EXPLAIN [ANALYZE] of one SELECT, and SET/RESET VARIABLE.
    Keywords are read with DuckDB's tokenizer, so comments and string literals
    cannot disguise a statement. This is the second line of defence: the
    connection itself cannot reach files outside the warehouse
    (``Warehouse.connect``).

    Raises:
        QueryError: naming the statement and its kind.
    """
    for i, st in enumerate(statements, 1):
        if st.kind in _READ_ONLY:
            continue
        if st.kind == "SET" and _is_set_variable(st.text):
            continue
        if st.kind == "EXPLAIN" and _explained_kinds(con, st.text) == ["SELECT"]:
            continue
        where = f"statement {i}" if len(statements) > 1 else "the statement"
        body = " ".join(w for _, w in _tokens(st.text)[:4])
        raise QueryError(
            f"read-only: {where} is {_article(st.kind)} {st.kind} "
            f"({_first_words(body)}); the warehouse can only be queried here, with "
            "SELECT (and SET VARIABLE). To save a result use --format csv|json|parquet -o FILE"
        )


def _first_words(sql: str) -> str:
    words = " ".join(sql.split()[:4])
    return words[:60]


def _article(word: str) -> str:
    return "an" if word[:1] in "AEIOU" else "a"


def _frame(rel: duckdb.DuckDBPyRelation) -> pl.DataFrame:
    return rel.pl()


def run_statements(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    every: bool = True,
    fetch: Callable[[duckdb.DuckDBPyRelation], Any] = _frame,
) -> Iterator[Any]:
    """Run a SQL text of one or more statements read-only, yielding each one's result.

    Every statement is parsed and checked (``check_read_only``) before the first
    runs. A statement that returns no rows (e.g. SET VARIABLE) yields None. With
    ``every=False`` only the last statement's result is fetched and yielded; the
    others run unfetched. ``fetch`` turns a statement's relation into its result
    (default: a polars frame; ``table_fetch`` for a table printed without polars).

    Raises:
        QueryError: a write, a syntax error or a failing statement, as one line.
    """
    statements = split_statements(con, sql)
    if not statements:
        raise QueryError("no SQL statement given")
    check_read_only(con, statements)
    for i, st in enumerate(statements):
        try:
            if not every and i < len(statements) - 1:
                con.execute(st.text)
                continue
            rel = con.sql(st.text)
            result = None if rel is None else fetch(rel)
        except duckdb.Error as exc:
            where = f"statement {i + 1}: " if len(statements) > 1 else ""
            raise QueryError(where + describe_error(exc, st.text, st.line_offset)) from exc
        yield result


def run_read_only(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    fetch: Callable[[duckdb.DuckDBPyRelation], Any] = _frame,
) -> Any:
    """Run a SQL text of one or more statements read-only; the last result as a frame.

    Returns None when the last statement returns no rows (e.g. SET VARIABLE).

    Raises:
        QueryError: a write, a syntax error or a failing statement, as one line.
    """
    results = list(run_statements(con, sql, every=False, fetch=fetch))
    return results[-1] if results else None


def read_query_source(file: str) -> tuple[str, str]:
    """(SQL text, where it came from) of a query file: a path, or a bare name of
    ``sql/<name>.sql`` (``throughput`` runs sql/throughput.sql).

    Raises:
        UnknownQueryError: neither a file nor a query name; lists the names.
        QueryError: the file cannot be read as text.
    """
    path = Path(file)
    if not path.exists():
        return load_query(file).text, f"sql/{path.stem}.sql"
    try:
        return path.read_text(), str(path)
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise QueryError(f"{file}: cannot read the SQL ({why}); give a SQL text file") from None


def run_sql(
    con: duckdb.DuckDBPyConnection,
    text: str,
    where: str,
    params: dict[str, Any] | None = None,
    *,
    text_values: bool = False,
    fetch: Callable[[duckdb.DuckDBPyRelation], Any] = _frame,
) -> Any:
    """Run a SQL text (inline, or a query file's) read-only with its parameters; the last
    statement's result (None: it returns no rows): a polars frame, or what ``fetch``
    makes of the relation.

    A text whose header declares parameters (``-- Params:``) takes only those, cast to
    their declared types; every parameter the text reads and is not given is set to
    NULL, hence its default, so no value leaks in from an earlier query on ``con``.
    ``text_values``: the values are text from a command line, and one the header does
    not type is read as an integer or a float where it is one.

    Raises:
        QueryError: a parameter the header does not declare, a bad value, a write,
            a syntax error or a failing statement; one line naming ``where``'s problem.
    """
    values = dict(params or {})
    header = parse_header(where, Path(where), text)
    if header.params:
        unknown = sorted(set(values) - set(header.params))
        if unknown:
            raise QueryError(
                f"{where} has no parameter {', '.join(unknown)}; "
                f"it takes: {', '.join(header.params)}"
            )
    split_statements(con, text)  # a syntax error is reported before anything runs
    if text_values:
        values = {n: v if n in header.params else _number_or_text(v) for n, v in values.items()}
    for name in header.params or variables_used(text):
        values.setdefault(name, None)
    set_params(con, values, {n: p.sql_type for n, p in header.params.items()})
    return run_read_only(con, text, fetch)


def _number_or_text(value: Any) -> Any:
    """A command line's value for a parameter no header types: integer, float or text."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def format_result(df: pl.DataFrame | Rows, fmt: str, max_rows: int = 50) -> str:
    """A result as text: ``table`` (at most ``max_rows`` rows, and how many there were),
    ``csv`` (nested columns as JSON, ``flat_for_csv``) or ``json`` (one array of rows).
    ``Rows`` (``table_fetch``) print as a table only."""
    if isinstance(df, Rows):
        if fmt != "table":
            raise ValueError(f"Rows print as a table, not {fmt}")
        return df.table()
    if fmt == "table":
        with pl.Config(
            tbl_rows=max_rows,
            tbl_cols=-1,
            fmt_str_lengths=80,
            tbl_hide_dataframe_shape=True,
            tbl_width_chars=240,
        ):
            text = str(df)
        if df.height > max_rows:
            text += f"\n{df.height:,} rows ({max_rows} shown; --max-rows to see more)"
        return text + "\n"
    if fmt == "csv":
        return flat_for_csv(df).write_csv()
    if fmt == "json":
        return df.write_json() + "\n"
    raise ValueError(f"not a text format: {fmt}")


def flat_for_csv(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with every column CSV cannot hold (lists, arrays, structs, binary) as text:
    nested values as JSON (``[1, 2]``, ``{"a": 1}``; dates and other scalars inside as
    their text), binary as hex. So ``--format csv`` writes the result of any query."""
    import json

    def nested(dtype: pl.DataType) -> bool:
        return isinstance(dtype, pl.List | pl.Array | pl.Struct | pl.Object)

    out = []
    for name, dtype in df.schema.items():
        col = df[name]
        if nested(dtype):
            texts = [
                None if v is None else json.dumps(v, default=str, ensure_ascii=False)
                for v in col.to_list()
            ]
            out.append(pl.Series(name, texts, dtype=pl.String))
        elif dtype == pl.Binary:
            out.append(pl.Series(name, [None if v is None else v.hex() for v in col.to_list()]))
        else:
            out.append(col)
    return pl.DataFrame(out) if out else df


# The polars names of the DuckDB types whose values ``Rows`` prints as polars would.
_PLAIN_TYPES = {
    "TINYINT": "i8",
    "SMALLINT": "i16",
    "INTEGER": "i32",
    "BIGINT": "i64",
    "UTINYINT": "u8",
    "USMALLINT": "u16",
    "UINTEGER": "u32",
    "UBIGINT": "u64",
    "BOOLEAN": "bool",
    "VARCHAR": "str",
    "NULL": "null",
}
_TABLE_WIDTH = 200  # narrower than format_result's 240 characters: polars wraps none


@dataclass(frozen=True)
class Rows:
    """A small result of plain columns (integers, booleans, short ASCII text), fetched and
    printed without polars, as ``format_result`` prints the same frame as a table."""

    columns: list[str]
    dtypes: list[str]  # polars' short names: i32, str, bool, ...
    cells: list[list[str]]  # each row's values as polars prints them

    @property
    def height(self) -> int:
        return len(self.cells)

    def table(self) -> str:
        widths = [
            max(len(name), 3, len(dtype), *(len(row[i]) for row in self.cells))
            for i, (name, dtype) in enumerate(zip(self.columns, self.dtypes, strict=True))
        ]

        def rule(left: str, fill: str, mid: str, right: str) -> str:
            return left + mid.join(fill * (w + 2) for w in widths) + right

        def line(values: list[str]) -> str:
            return "│" + "┆".join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + "│"

        lines = [
            rule("┌", "─", "┬", "┐"),
            line(self.columns),
            line(["---"] * len(widths)),
            line(self.dtypes),
            rule("╞", "═", "╪", "╡"),
            *(line(row) for row in self.cells),
            rule("└", "─", "┴", "┘"),
        ]
        return "\n".join(lines) + "\n"


def _plain_text(text: str) -> bool:
    """Text that polars prints as it is in a table cell: printable ASCII, no space at
    either end, at most 80 characters (format_result's fmt_str_lengths)."""
    return 0 < len(text) <= 80 and text.isascii() and text.isprintable() and text == text.strip()


def _cell(value: Any) -> str | None:
    """A plain value as polars prints it in a table; None: not plain."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and _plain_text(value):
        return value
    return None


def table_fetch(max_rows: int) -> Callable[[duckdb.DuckDBPyRelation], Rows | pl.DataFrame]:
    """A ``fetch`` for results printed as a table: ``Rows`` when the result is at most
    ``max_rows`` rows of plain columns that fit the width, else the polars frame."""

    def fetch(rel: duckdb.DuckDBPyRelation) -> Rows | pl.DataFrame:
        columns = list(rel.columns)
        dtypes = [_PLAIN_TYPES.get(str(t)) for t in rel.types]
        if columns and all(dtypes) and all(_plain_text(c) for c in columns):
            rows = rel.limit(max_rows + 1).fetchall()
            cells = [[_cell(v) for v in row] for row in rows]
            if len(rows) <= max_rows and all(c is not None for row in cells for c in row):
                result = Rows(columns, [str(d) for d in dtypes], cells)  # type: ignore[arg-type]
                if len(result.table().partition("\n")[0]) <= _TABLE_WIDTH:
                    return result
        return rel.pl()

    return fetch
