"""``tracereplay sql`` and ``tracereplay report`` through Click."""

from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.warehouse import Warehouse
from tests.helpers import R1, R2


def run(wh: Warehouse, *args: str) -> tuple[int, str]:
    r = CliRunner(env={"COLUMNS": "120"}).invoke(cli, ["sql", "--warehouse", str(wh.root), *args])
    return r.exit_code, r.output


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("CREATE TABLE t AS SELECT 1", "a CREATE"),
        ("INSERT INTO requests SELECT * FROM requests", "an INSERT"),
        ("COPY (SELECT 1) TO 'x.csv'", "a COPY"),
        ("ATTACH 'other.duckdb'", "an ATTACH"),
        ("DROP VIEW requests", "a DROP"),
        ("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1", "an EXPLAIN"),
        ("SET threads = 1", "a SET"),
        ("INSTALL httpfs", "a LOAD"),
    ],
)
def test_writes_are_refused(tiny_warehouse: Warehouse, statement: str, kind: str) -> None:
    code, out = run(tiny_warehouse, statement)
    assert code == 1
    assert out.startswith(f"Error: read-only: the statement is {kind} (")
    assert len(out.strip().splitlines()) == 1


def test_a_write_after_a_select_is_refused_before_anything_runs(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    target = tmp_path / "out.csv"
    code, out = run(tiny_warehouse, f"SELECT 1; COPY (SELECT 1) TO '{target}'")
    assert code == 1 and "statement 2 is a COPY" in out
    assert not target.exists()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELEC 1", 'syntax error at or near "SELEC" (line 1, column 1)\n'),
        ("SELECT 1,\n  2 +;", 'syntax error at or near ";" (line 2, column 6)\n'),
        ("SELECT 1;\n\nSELECT FROM WHERE", "(line 3, column"),
    ],
)  # fmt: skip
def test_syntax_errors_are_one_line_with_the_position(
    tiny_warehouse: Warehouse, sql: str, message: str
) -> None:
    code, out = run(tiny_warehouse, sql)
    assert code == 1
    assert message in out
    assert len(out.strip().splitlines()) == 1


def test_select_prints_a_table(tiny_warehouse: Warehouse) -> None:
    code, out = run(
        tiny_warehouse, "SELECT run_id, count(*) AS n FROM scenarios GROUP BY 1 ORDER BY 1"
    )
    assert code == 0, out
    assert R1 in out and R2 in out and "│ n" in out.replace("┆", "│")


def test_query_file_with_parameters_as_csv(tiny_warehouse: Warehouse) -> None:
    code, out = run(tiny_warehouse, "-f", "sql/throughput.sql", "--param", "slo_ttft_s=0.1",
                    "--format", "csv")  # fmt: skip
    assert code == 0, out
    df = pl.read_csv(io.StringIO(out))
    assert df.filter(pl.col("scenario") == "vllm-2")["goodput_per_s"].item() == pytest.approx(0.2)


def test_query_by_name_to_json_and_parquet_files(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    code, out = run(tiny_warehouse, "-f", "run_scenarios", "-p", f"run_id={R1}")
    assert code == 0 and "old" in out and "vllm-4" not in out
    code, out = run(tiny_warehouse, "-f", "latency_percentiles", "--format", "json")
    assert code == 0
    assert [r["scenario"] for r in json.loads(out)][:2] == ["static-4", "vllm-2"]
    target = tmp_path / "x.parquet"
    code, out = run(tiny_warehouse, "-f", "throughput", "-o", str(target))
    assert code == 0, out
    assert pl.read_parquet(target).height == 4


def test_inline_parameter(tiny_warehouse: Warehouse) -> None:
    code, out = run(tiny_warehouse, "--format", "csv", "-p", "n=41",
                    "SELECT getvariable('n') + 1 AS answer")  # fmt: skip
    assert code == 0 and out == "answer\n42\n"


def test_unknown_parameter_of_a_file(tiny_warehouse: Warehouse) -> None:
    code, out = run(tiny_warehouse, "-f", "throughput", "-p", "slo=1")
    assert code == 1
    assert "has no parameter slo; it takes: run_id, slos, slo_ttft_s" in out


def test_views_sql_works_in_a_fresh_duckdb(tiny_warehouse: Warehouse) -> None:
    code, out = run(tiny_warehouse, "--views")
    assert code == 0
    con = duckdb.connect()
    con.execute(out)  # what `duckdb -init` does, from any directory
    assert con.execute("SELECT count(*) FROM sim_requests").fetchone() == (17,)


def test_missing_warehouse(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["sql", "--warehouse", str(tmp_path / "nope"), "SELECT 1"])
    assert r.exit_code == 1 and "no warehouse at" in r.output


def test_report_command(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = CliRunner().invoke(
        cli,
        ["report", R2, "--warehouse", str(tiny_warehouse.root), "-o", str(out), "--json",
         "--slo", "ttft_p99=500ms"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["html"] == str(out) and summary["bytes"] == out.stat().st_size
    assert "ttft_p99 &lt;= 500ms (given to the report (--slo))" in out.read_text()
    r = CliRunner().invoke(cli, ["report", "nope", "--warehouse", str(tiny_warehouse.root)])
    assert r.exit_code == 1 and "no replay run 'nope'" in r.output


def test_report_slo_syntax_and_deprecated_flag(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    base = ["report", R2, "--warehouse", str(tiny_warehouse.root), "-o", str(out)]
    r = CliRunner().invoke(cli, [*base, "--slo-ttft-ms", "250", "--quiet"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out)  # --quiet: the path alone
    assert "deprecated; use --slo ttft_p99=<N>ms" in r.stderr
    assert "ttft_p99 &lt;= 250ms (given to the report (--slo))" in out.read_text()
    # any SLO, scoped too: the header lists them and nothing stands in for a p99 TTFT
    r = CliRunner().invoke(cli, [*base, "--slo", "tpot_p99=40ms", "--slo",
                                 "ttft_p50@tenant=t1=150ms"])  # fmt: skip
    assert r.exit_code == 0, r.output
    html = out.read_text()
    header = html[html.index('<dd id="slos"') :]
    header = header[: header.index("</dd>")]
    assert "tpot_p99 &lt;= 40ms; ttft_p50 of tenant=t1 &lt;= 150ms (given" in header
    assert "200ms" not in html.split('id="chart-specs"')[0] and "example" not in header
    assert "tpot_p99 &lt;= 40ms" in html and "ttft_p50 of tenant=t1 &lt;= 150ms" in html
    r = CliRunner().invoke(cli, [*base, "--slo", "ttft_p99=200"])
    assert r.exit_code == 1 and "give a unit" in r.output


def test_sql_says_what_it_wrote_and_takes_quiet_and_the_deprecated_json(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    target = tmp_path / "t.csv"
    code, out = run(tiny_warehouse, "-f", "throughput", "-o", str(target))
    assert code == 0 and out.strip() == f"wrote 4 rows (csv) to {target}"
    code, out = run(tiny_warehouse, "-f", "throughput", "-o", str(target), "--quiet")
    assert code == 0 and out == ""
    # --json, the spelling of --format json kept for one release: the JSON, and one line
    r = CliRunner().invoke(
        cli, ["sql", "--warehouse", str(tiny_warehouse.root), "-f", "latency_percentiles", "--json"]
    )
    assert r.exit_code == 0
    assert [row["scenario"] for row in json.loads(r.stdout)][:2] == ["static-4", "vllm-2"]
    assert r.stderr == "warning: --json is deprecated; use --format json\n"
    code, out = run(tiny_warehouse, "-f", "throughput", "--json", "--format", "csv")
    assert code == 1 and "--json and --format csv disagree" in out
