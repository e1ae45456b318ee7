"""``tracereplay sql``: read-only SQL against the warehouse views."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.report.sql import (
    QueryError,
    Rows,
    connect_views,
    format_result,
    read_query_source,
    run_sql,
    table_fetch,
)
from pipeline.warehouse import SQL_DIR, VIEWS_SQL, Warehouse, derived_views_sql

if TYPE_CHECKING:
    import polars as pl

FORMATS = ("table", "csv", "json", "parquet")


def views_sql(root: Path) -> str:
    """views.sql, preceded by the SET that makes its relative paths point at ``root``."""
    path = str(root.resolve()).replace("'", "''")
    return (
        f"-- tracereplay views over the warehouse {root.resolve()}\n"
        f"SET file_search_path = '{path}';\n"
        + (SQL_DIR / VIEWS_SQL).read_text()
        + derived_views_sql()
    )


def _parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: expected name=value", param_hint="--param")
        params[name.strip()] = value
    return params


def _read_sql(sql: str | None, file: str | None) -> tuple[str, str]:
    """(SQL text, where it came from)."""
    if sql is not None and file is not None:
        raise click.UsageError("give the SQL inline or with -f FILE, not both")
    if sql is not None:
        return sql, "inline SQL"
    assert file is not None
    if file == "-":
        return sys.stdin.read(), "stdin"
    return read_query_source(file)


def _emit(df: pl.DataFrame | Rows, fmt: str, output: Path | None, max_rows: int) -> None:
    if fmt != "parquet":
        _write_text(format_result(df, fmt, max_rows), output)
        return
    if output is None and sys.stdout.isatty():
        raise click.UsageError("parquet is binary: pass -o FILE or redirect stdout")
    assert not isinstance(df, Rows)  # only a table is fetched as Rows
    buf = io.BytesIO()
    df.write_parquet(buf)
    if output is None:
        sys.stdout.buffer.write(buf.getvalue())
    else:
        _write_file(output, buf.getvalue())


def _write_text(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text, nl=False)
    else:
        _write_file(output, text)


def _write_file(output: Path, data: bytes | str) -> None:
    """Write -o whole or not at all; a full disk or a read-only directory is one line."""
    from pipeline.storage import write_atomic, writing

    with writing(output, "give -o another path"):
        write_atomic(output, data)


@click.command()
@click.argument("sql", required=False)
@click.option(
    "-f",
    "--file",
    "file",
    default=None,
    help="Read the SQL from FILE ('-' for stdin; a bare name runs sql/<name>.sql).",
)
@click.option(
    "--param",
    "-p",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a query parameter (a DuckDB variable read with getvariable('NAME')); repeatable.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Output format [default: from the -o suffix, else table].",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the result to FILE instead of stdout (not inside the warehouse).",
)
@click.option(
    "--max-rows",
    type=opt.BoundedInt(1, 10**9),
    default=50,
    show_default=True,
    help="Rows a table shows.",
)
@click.option("--views", is_flag=True, help="Print the SQL that creates the views and exit.")
@opt.warehouse
@opt.config_file
@click.option("--json", "as_json", cls=opt.DeprecatedOption, use="--format json", is_flag=True)
@opt.quiet
def sql(
    sql: str | None,
    file: str | None,
    params: tuple[str, ...],
    fmt: str | None,
    output: Path | None,
    max_rows: int,
    views: bool,
    warehouse: Path | None,
    config_file: Path | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Run a read-only SQL query against the warehouse views (requests, quarantine,
    runs, sim_requests, sim_steps, scenarios, capacity_search).

    The queries in sql/ take parameters as DuckDB variables: pass them with
    --param, or leave them out for the defaults their header names. Statements
    that write (CREATE, INSERT, COPY, ATTACH, ...) are refused, and so is an
    -o FILE inside the warehouse. --views prints the SQL that creates the views,
    for the duckdb shell.

    With no query it opens a SQL shell over the views: statements end with ';'
    and may span lines; .tables, .schema NAME, .mode table|csv|json, .help,
    .quit (or Ctrl-D); history in $XDG_STATE_HOME/tracereplay/sql_history
    (default ~/.local/state). When stdin is not a terminal it runs the SQL
    and dot commands read from it, printing each result, and exits 1 if any
    failed.

    Example:

    \b
        tracereplay sql                                   # the shell
        tracereplay sql < queries.sql                     # the same, scripted
        tracereplay sql "SELECT scenario, count(*) FROM sim_requests GROUP BY ALL"
        tracereplay sql -f sql/slo_capacity.sql --param slo_ttft_s=0.5
        tracereplay sql -f throughput --format csv -o throughput.csv   # says what it wrote
        tracereplay sql -f latency_percentiles --format json
        tracereplay sql --views > views.sql && duckdb -init views.sql
    """
    root = warehouse_path(str(warehouse) if warehouse else None, load_config(config_file))
    if views:
        click.echo(views_sql(root), nl=False)
        return
    if as_json and fmt not in (None, "json"):
        raise QueryError(f"--json and --format {fmt} disagree: give one of them")
    if as_json:  # the deprecated spelling of --format json
        fmt = "json"
    if sql is None and file is None:
        _shell(root, fmt, output, max_rows, params)
        return
    text, where = _read_sql(sql, file)
    values: dict[str, Any] = _parse_params(params)
    if fmt is None:
        suffix = output.suffix.lstrip(".").lower() if output else ""
        fmt = suffix if suffix in FORMATS else "table"
    if output is not None and Warehouse(root).contains(output):
        raise QueryError(
            f"-o {output}: that is inside the warehouse {root}, whose files only the "
            "pipeline writes (a file there would join its views); write the result "
            "outside it, e.g. -o result.parquet"
        )
    con = connect_views(root)
    try:
        # a small table of plain columns prints without importing polars
        fetch = {"fetch": table_fetch(max_rows)} if fmt == "table" else {}
        df = run_sql(con, text, where, values, text_values=True, **fetch)
    finally:
        con.close()
    if df is None:
        click.echo("(no result)", err=True)
        return
    _emit(df, fmt, output, max_rows)
    if output is not None and not quiet:
        click.echo(f"wrote {df.height:,} rows ({fmt}) to {output}")


def _shell(
    root: Path, fmt: str | None, output: Path | None, max_rows: int, params: tuple[str, ...]
) -> None:
    """No query: the SQL shell on a terminal, else the SQL (and dot commands) on stdin."""
    if output is not None:
        raise click.UsageError("-o FILE takes a query: give it inline or with -f FILE")
    if fmt == "parquet":
        raise click.UsageError("the shell prints table, csv or json; parquet takes a query and -o")
    if params:
        raise click.UsageError(
            "--param takes a query; in the shell set one with SET VARIABLE name = value;"
        )
    from pipeline import shell

    con = connect_views(root)
    try:
        session = shell.Shell(con, sys.stdout, sys.stderr, mode=fmt or "table", max_rows=max_rows)
        if sys.stdin.isatty():
            shell.interactive(session)
        elif not shell.script(session, sys.stdin):
            raise SystemExit(1)
    finally:
        con.close()
