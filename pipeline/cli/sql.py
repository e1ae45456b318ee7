"""``tracereplay sql``: read-only SQL against the warehouse views."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import click
import polars as pl

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.errors import PipelineError
from pipeline.report.sql import (
    QueryError,
    flat_for_csv,
    load_query,
    parse_header,
    run_read_only,
    set_params,
    split_statements,
    variables_used,
)
from pipeline.warehouse import SQL_DIR, VIEWS_SQL, Warehouse, derived_views_sql

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


def _auto_type(value: str) -> Any:
    """A --param value for a query that declares no types: integer, float or text."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _read_sql(sql: str | None, file: str | None) -> tuple[str, str]:
    """(SQL text, where it came from)."""
    if sql is not None and file is not None:
        raise click.UsageError("give the SQL inline or with -f FILE, not both")
    if sql is not None:
        return sql, "inline SQL"
    if file is None:
        raise click.UsageError("give a query: inline, or -f FILE (or --views)")
    if file == "-":
        return sys.stdin.read(), "stdin"
    path = Path(file)
    if not path.exists():
        # -f throughput runs sql/throughput.sql
        return load_query(file).text, f"sql/{Path(file).stem}.sql"
    return path.read_text(), str(path)


def _emit(df: pl.DataFrame, fmt: str, output: Path | None, max_rows: int) -> None:
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
        _write_text(text + "\n", output)
    elif fmt == "csv":
        _write_text(flat_for_csv(df).write_csv(), output)
    elif fmt == "json":
        _write_text(df.write_json() + "\n", output)
    else:
        if output is None and sys.stdout.isatty():
            raise click.UsageError("parquet is binary: pass -o FILE or redirect stdout")
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

    Example:

    \b
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
    text, where = _read_sql(sql, file)
    values = _parse_params(params)
    header = parse_header(where, Path(where), text)
    if header.params:
        unknown = sorted(set(values) - set(header.params))
        if unknown:
            raise QueryError(
                f"{where} has no parameter {', '.join(unknown)}; "
                f"it takes: {', '.join(header.params)}"
            )
    if as_json and fmt not in (None, "json"):
        raise QueryError(f"--json and --format {fmt} disagree: give one of them")
    if as_json:  # the deprecated spelling of --format json
        fmt = "json"
    if fmt is None:
        suffix = output.suffix.lstrip(".").lower() if output else ""
        fmt = suffix if suffix in FORMATS else "table"
    if not root.is_dir():
        raise PipelineError(
            f"no warehouse at {root}: run `tracereplay ingest` first or pass --warehouse"
        )
    if output is not None and Warehouse(root).contains(output):
        raise QueryError(
            f"-o {output}: that is inside the warehouse {root}, whose files only the "
            "pipeline writes (a file there would join its views); write the result "
            "outside it, e.g. -o result.parquet"
        )
    con = Warehouse(root).connect()
    try:
        split_statements(con, text)  # a syntax error is reported before anything runs
        declared = {n: p.sql_type for n, p in header.params.items()}
        typed: dict[str, Any] = {
            n: (v if n in declared else _auto_type(v)) for n, v in values.items()
        }
        # Unset declared parameters are NULL, hence their defaults.
        for name in header.params or variables_used(text):
            typed.setdefault(name, None)
        set_params(con, typed, declared)
        df = run_read_only(con, text)
    finally:
        con.close()
    if df is None:
        click.echo("(no result)", err=True)
        return
    _emit(df, fmt, output, max_rows)
    if output is not None and not quiet:
        click.echo(f"wrote {df.height:,} rows ({fmt}) to {output}")
