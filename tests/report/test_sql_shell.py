"""``tracereplay sql`` with no query: the shell, fed on stdin and driven through a terminal.

The tiny warehouse's figures are worked out in tests/helpers.py's ``build``: five
requests, the latest run's four scenarios.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.cli.run import sql_shell_command
from pipeline.shell import ends_statement
from pipeline.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]


def feed(wh: Warehouse, script: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner(env={"COLUMNS": "120"}).invoke(
        cli, ["sql", "--warehouse", str(wh.root), *args], input=script
    )
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("SELECT 1;", True),
        ("SELECT 1; -- a comment", True),
        ("SELECT 1 -- not the end;", False),
        ("SELECT ';'", False),
        ("SELECT 'a;", False),
        ("SELECT 1 /* ; */", False),
        ("SELECT count(*)\n  FROM requests", False),
        ("SELECT count(*)\n  FROM requests;", True),
        ('SELECT 1 AS "x;"', False),
    ],
)
def test_a_statement_ends_at_a_semicolon_outside_strings_and_comments(
    text: str, ends: bool
) -> None:
    assert ends_statement(text) is ends


def test_multi_line_statements_each_print_their_result(tiny_warehouse: Warehouse) -> None:
    code, out, err = feed(
        tiny_warehouse,
        "SELECT count(*) AS n\n  FROM requests\n  WHERE date = DATE '2024-05-01';\n"
        "SELECT max(prompt_tokens) AS top FROM requests; SELECT 'x;y' AS s;\n",
        "--format",
        "csv",
    )
    assert (code, err) == (0, "")
    assert out == "n\n4\ntop\n800\ns\nx;y\n"


def test_an_error_is_one_line_and_the_next_query_still_runs(tiny_warehouse: Warehouse) -> None:
    code, out, err = feed(
        tiny_warehouse,
        "SELECT no_such_column FROM requests;\nSELECT count(*) AS n FROM quarantine;\n"
        "DROP VIEW requests;\nSELECT count(*) AS n FROM requests;\n",
        "--format",
        "csv",
    )
    assert code == 1  # scripted: a failed statement makes the exit status 1
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("Error: binder error: ") and "no_such_column" in lines[0]
    assert lines[1].startswith("Error: read-only: the statement is a DROP")
    assert out == "n\n4\nn\n5\n"  # the views are still there after the refused DROP


def test_dot_commands(tiny_warehouse: Warehouse) -> None:
    code, out, err = feed(
        tiny_warehouse, ".mode csv\n.tables\n.schema sim_steps\n.mode\n.mode json\n.mode\n"
    )
    assert (code, err) == (0, "")
    tables_end = out.index("column,type,description")
    tables = list(csv.DictReader(io.StringIO(out[:tables_end])))
    names = [t["name"] for t in tables]
    assert {"requests", "quarantine", "runs", "sim_requests", "sim_steps", "scenarios"} <= set(
        names
    )
    assert names == sorted(names)
    assert {t["kind"] for t in tables} == {"view"}
    holds = {t["name"]: t["holds"] for t in tables}
    assert holds["quarantine"].startswith("One row per input record that ingest rejected")
    schema_text, _, modes = out[tables_end:].rpartition("csv\n")
    schema = list(csv.DictReader(io.StringIO(schema_text)))
    columns = {c["column"]: c for c in schema}
    assert columns["num_preemptions"]["type"] == "INTEGER"
    assert columns["run_id"]["type"] == "VARCHAR"  # the partition column is there too
    assert all(c["description"] for c in schema)
    assert modes == "json\n"


def test_dot_command_errors_name_the_fix(tiny_warehouse: Warehouse) -> None:
    code, out, err = feed(
        tiny_warehouse, ".schema nope\n.schema\n.mode xml\n.frobnicate\n.read\nSELECT 7 AS n;\n"
    )
    assert code == 1
    assert err.splitlines() == [
        "Error: .schema nope: no view or table of that name; .tables lists them",
        "Error: .schema takes a name, e.g. .schema sim_requests",
        "Error: .mode xml: not a mode; use one of table, csv, json",
        "Error: unknown command .frobnicate; .help lists the commands",
        "Error: .read takes a file: .read my.sql, or .read throughput",
    ]
    assert "│ 7   │" in out


def test_read_runs_a_query_of_sql_by_its_name(tiny_warehouse: Warehouse) -> None:
    code, out, err = feed(tiny_warehouse, ".mode json\n.read trace_summary\n")
    assert (code, err) == (0, ""), err
    (row,) = json.loads(out)
    assert row["num_requests"] == 5


def test_quit_stops_reading_and_a_last_statement_needs_no_semicolon(
    tiny_warehouse: Warehouse,
) -> None:
    code, out, _ = feed(
        tiny_warehouse, "SELECT 1 AS a;\n.quit\nSELECT 2 AS b;\n", "--format", "csv"
    )
    assert (code, out) == (0, "a\n1\n")
    code, out, _ = feed(tiny_warehouse, "SELECT 3 AS c", "--format", "csv")
    assert (code, out) == (0, "c\n3\n")


def test_shell_refuses_options_that_take_a_query(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    for args, says in [
        (["-o", str(tmp_path / "x.csv")], "-o FILE takes a query"),
        (["--format", "parquet"], "parquet takes a query and -o"),
        (["--param", "run_id=x"], "SET VARIABLE name = value;"),
    ]:
        code, _, err = feed(tiny_warehouse, "SELECT 1;\n", *args)
        assert code == 2 and says in err


class Terminal:
    """A child process on a pseudo-terminal (its controlling terminal, so Ctrl-C is a
    SIGINT from the terminal), read until an expected text shows up."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.chdir(ROOT)
            os.execve(argv[0], argv, env)
        self.seen = b""

    def expect(self, text: str, deadline_s: float = 120.0) -> str:
        """Everything up to and including ``text``; the deadline only ends a test that hangs."""
        end = time.monotonic() + deadline_s
        want = text.encode()
        while want not in self.seen:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"never saw {text!r}; the terminal showed {self.seen!r}")
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"exited before {text!r}; the terminal showed {self.seen!r}")
            self.seen += chunk
        i = self.seen.index(want) + len(want)
        out, self.seen = self.seen[:i], self.seen[i:]
        return out.decode(errors="replace").replace("\r\n", "\n")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, grace_s: float = 10.0) -> int:
        """The child's exit status; one still running after ``grace_s`` is killed (SIGKILL)."""
        end = time.monotonic() + grace_s
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() >= end:
                os.kill(self.pid, signal.SIGKILL)
                _, status = os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """End a child the test gave up on (it may be stuck), so nothing is left on a pty."""
        os.kill(self.pid, signal.SIGKILL)


def test_the_shell_on_a_terminal(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {
        **os.environ,
        "TERM": "dumb",
        "XDG_STATE_HOME": str(state),
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "120",
    }
    argv = [sys.executable, "-m", "pipeline", "sql", "--warehouse", str(tiny_warehouse.root)]
    term = Terminal(argv, env)
    try:
        term.expect("tracereplay> ")
        term.send("SELECT count(*) AS n\n")
        term.expect("...> ")  # the statement goes on
        term.send("FROM requests;\n")
        assert "│ 5   │" in term.expect("tracereplay> ")
        term.send(".tables\n")
        assert "sim_requests" in term.expect("tracereplay> ")
        term.send("SELECT nope FROM requests;\n")
        shown = term.expect("tracereplay> ")
        assert shown.count("Error: ") == 1 and "nope" in shown
        # Ctrl-C while typing drops the statement ...
        term.send("SELECT 'dropped'")
        term.expect("'dropped'")
        term.send("\x03")
        assert "^C" in term.expect("tracereplay> ")
        # ... and while one runs, cancels it: 'started' prints before the endless sum runs
        # (its cell, not the echo of the line typed, which comes before the line runs)
        term.send("SELECT 'started' AS s; SELECT sum(i) FROM range(9223372036854775807) t(i);\n")
        term.expect("│ started │")
        term.send("\x03")
        assert "Error: interrupted (Ctrl-C)" in term.expect("tracereplay> ")
        term.send("SELECT 42 AS answer;\n")
        shown = term.expect("tracereplay> ")
        assert "│ 42     │" in shown and "dropped" not in shown
        term.send(".quit\n")
    except BaseException:
        term.kill()  # the failure (it says what the terminal showed) is raised, not a hang
        raise
    finally:
        code = term.wait()
    assert code == 0
    history = (state / "tracereplay" / "sql_history").read_text().splitlines()
    assert history[:2] == ["SELECT count(*) AS n", "FROM requests;"]
    assert "SELECT 42 AS answer;" in history and ".quit" in history
    assert not any(tiny_warehouse.root.rglob("*history*"))


def test_run_prints_a_shell_command_that_works(tiny_warehouse: Warehouse) -> None:
    hint = sql_shell_command(tiny_warehouse.root)
    assert "duckdb" not in hint
    argv = shlex.split(hint)
    done = subprocess.run(
        argv,
        input="SELECT count(*) AS n FROM requests;\n",
        capture_output=True,
        text=True,
        cwd=Path.cwd(),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert "│ 5   │" in done.stdout


def test_ctrl_c_stops_a_script(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    script = tmp_path / "long.sql"
    script.write_text(
        "SELECT 'started' AS s; SELECT sum(i) FROM range(9223372036854775807) t(i);\n"
        "SELECT 'after' AS a;\n"
    )
    argv = [sys.executable, "-m", "pipeline", "sql", "--warehouse", str(tiny_warehouse.root)]
    with script.open() as stdin:
        child = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
        )
        try:
            assert child.stdout is not None
            seen = ""
            while "started" not in seen:  # the endless sum runs once this is out
                line = child.stdout.readline()
                assert line, f"exited before 'started': {seen!r}"
                seen += line
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
    assert child.returncode == 1
    assert err == "Error: interrupted (Ctrl-C)\n"
    assert "after" not in out  # the script stopped there
