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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from pipeline.errors import PipelineError, UnknownQueryError
from pipeline.warehouse import DERIVED_VIEWS, SQL_DIR, VIEWS_SQL

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


def run_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame | None:
    """Run a SQL text of one or more statements read-only; the last result as a frame.

    Returns None when the last statement returns no rows (e.g. SET VARIABLE).

    Raises:
        QueryError: a write, a syntax error or a failing statement, as one line.
    """
    statements = split_statements(con, sql)
    if not statements:
        raise QueryError("no SQL statement given")
    check_read_only(con, statements)
    for i, st in enumerate(statements):
        try:
            if i < len(statements) - 1:
                con.execute(st.text)
                continue
            rel = con.sql(st.text)
            return None if rel is None else rel.pl()
        except duckdb.Error as exc:
            where = f"statement {i + 1}: " if len(statements) > 1 else ""
            raise QueryError(where + describe_error(exc, st.text, st.line_offset)) from exc
    return None


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
