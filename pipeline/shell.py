"""The SQL shell of ``tracereplay sql`` with no query: statements and dot commands, read
line by line, against the read-only warehouse views.

A statement runs once a line ends it with ``;`` (outside strings and comments, as
DuckDB's tokenizer reads it), so a statement may span lines. Each statement's result
prints in the current mode (``.mode table|csv|json``); an error prints as one line and
the shell goes on. Dot commands, at the start of a statement only::

    .tables          the views (and any tables), with what each holds
    .schema NAME     NAME's columns, types and descriptions
    .mode [MODE]     table, csv or json (no MODE: say the current one)
    .read FILE       run a SQL file, or sql/<FILE>.sql by its bare name
    .help            these commands
    .quit, .exit     leave (so does Ctrl-D)

``interactive`` reads a terminal, with line editing and a history file
(``history_path``) where Python has ``readline``; Ctrl-C drops the statement being
typed, or cancels the one running. ``script`` reads a stream (stdin that is not a
terminal) the same way, without prompts, runs a last statement that lacks its ``;``,
stops at Ctrl-C, and says whether every statement succeeded.

The connection is ``Warehouse.connect``'s: the shell adds no way to write.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import duckdb
import polars as pl

from pipeline.contracts import CONTRACTS
from pipeline.errors import PipelineError
from pipeline.report.sql import QueryError, format_result, read_query_source, run_statements

MODES = ("table", "csv", "json")
PROMPT = "tracereplay> "
CONTINUE = "        ...> "
HISTORY_LINES = 1000
HELP = """\
.tables          the views (and any tables), with what each holds
.schema NAME     NAME's columns, types and descriptions
.mode [MODE]     how results print: table, csv or json (no MODE: the current one)
.read FILE       run a SQL file, or a query of sql/ by its name (.read throughput)
.help            this list
.quit, .exit     leave (so does Ctrl-D)
SQL runs when a line ends it with ';' (a statement may span lines); Ctrl-C drops the
statement being typed or cancels the one running. The views are read-only.
"""


def history_path() -> Path:
    """Where the shell keeps its history: ``$XDG_STATE_HOME/tracereplay/sql_history``,
    else ``~/.local/state/tracereplay/sql_history`` (never inside a warehouse)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "tracereplay" / "sql_history"


def ends_statement(text: str) -> bool:
    """Whether ``text`` ends with a ``;`` that ends a statement: not one inside a string,
    a quoted name or a comment (DuckDB's tokenizer decides)."""
    try:
        tokens = duckdb.tokenize(text)
    except duckdb.Error:
        return False
    for k in range(len(tokens) - 1, -1, -1):
        pos, kind = tokens[k]
        if kind == duckdb.token_type.comment:
            continue
        end = tokens[k + 1][0] if k + 1 < len(tokens) else len(text)
        return text[pos:end].strip().endswith(";") and kind == duckdb.token_type.operator
    return False


def _blank(text: str) -> bool:
    """Whether ``text`` holds nothing to run: whitespace, comments, lone ``;``."""
    try:
        tokens = duckdb.tokenize(text)
    except duckdb.Error:
        return False
    for k, (pos, kind) in enumerate(tokens):
        if kind == duckdb.token_type.comment:
            continue
        end = tokens[k + 1][0] if k + 1 < len(tokens) else len(text)
        if text[pos:end].strip().strip(";").strip():
            return False
    return True


class Shell:
    """Lines in, results and one-line errors out, over one connection to the views."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        out: TextIO,
        err: TextIO,
        *,
        mode: str = "table",
        max_rows: int = 50,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.con = con
        self.out = out
        self.err = err
        self.mode = mode
        self.max_rows = max_rows
        self.failures = 0  # statements and commands that printed an error
        self.interrupted = False  # Ctrl-C stopped a statement (a script stops there)
        self._lines: list[str] = []

    @property
    def pending(self) -> bool:
        """Whether a statement has begun and not yet ended (the prompt continues it)."""
        return bool(self._lines)

    def discard(self) -> None:
        """Drop the statement being typed (Ctrl-C at the prompt)."""
        self._lines.clear()

    def feed(self, line: str) -> bool:
        """One line of input; returns False when it asks to leave (``.quit``)."""
        if not self._lines:
            if line.strip().startswith("."):
                return self.command(line.strip())
            if _blank(line):
                return True
        self._lines.append(line)
        text = "\n".join(self._lines)
        if ends_statement(text):
            self._lines.clear()
            self.run(text)
        return True

    def finish(self) -> None:
        """The end of the input: run a statement left without its ``;``."""
        text = "\n".join(self._lines)
        self._lines.clear()
        if not _blank(text):
            self.run(text)

    def run(self, sql: str) -> None:
        """Run every statement of ``sql``, printing each result; an error, or Ctrl-C, ends
        the text there and prints one line."""
        with _interrupting(self.con) as interrupted:
            try:
                for df in run_statements(self.con, sql):
                    if interrupted():
                        break
                    if df is not None:
                        self._print(df)
            except PipelineError as exc:
                if not interrupted():
                    self._error(str(exc))
                    return
            except KeyboardInterrupt:  # off the main thread, where no handler is set
                self._interrupted()
                return
            if interrupted():
                self._interrupted()

    def command(self, line: str) -> bool:
        """A dot command; False for ``.quit`` and ``.exit``."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if name in (".quit", ".exit"):
                return False
            if name == ".help":
                self.out.write(HELP)
            elif name == ".tables":
                self._print(self.tables())
            elif name == ".schema":
                if not arg:
                    raise QueryError(".schema takes a name, e.g. .schema sim_requests")
                self._print(self.schema(arg))
            elif name == ".read":
                if not arg:
                    raise QueryError(".read takes a file: .read my.sql, or .read throughput")
                text, _ = read_query_source(arg)
                self.run(text)
            elif name == ".mode":
                if not arg:
                    self.out.write(f"{self.mode}\n")
                elif arg not in MODES:
                    raise QueryError(f".mode {arg}: not a mode; use one of {', '.join(MODES)}")
                else:
                    self.mode = arg
            else:
                raise QueryError(f"unknown command {name}; .help lists the commands")
        except PipelineError as exc:
            self._error(str(exc))
        return True

    def tables(self) -> pl.DataFrame:
        """The views and tables of the session, with each warehouse table's description."""
        rows = self.con.execute(
            "SELECT table_name, lower(replace(table_type, 'BASE ', '')) "
            "FROM information_schema.tables ORDER BY table_name"
        ).fetchall()
        return pl.DataFrame(
            {
                "name": [r[0] for r in rows],
                "kind": [r[1] for r in rows],
                "holds": [CONTRACTS[r[0]].description if r[0] in CONTRACTS else "" for r in rows],
            },
            schema={"name": pl.String, "kind": pl.String, "holds": pl.String},
        )

    def schema(self, name: str) -> pl.DataFrame:
        """``name``'s columns and types, and each column's description where the warehouse
        table declares one (``pipeline.contracts``)."""
        known = self.con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name = ?", [name]
        ).fetchall()
        if not known:
            raise QueryError(f".schema {name}: no view or table of that name; .tables lists them")
        rows = self.con.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = ? ORDER BY ordinal_position",
            [name],
        ).fetchall()
        docs = CONTRACTS[name].docs if name in CONTRACTS else {}
        return pl.DataFrame(
            {
                "column": [r[0] for r in rows],
                "type": [r[1] for r in rows],
                "description": [docs.get(r[0], "") for r in rows],
            },
            schema={"column": pl.String, "type": pl.String, "description": pl.String},
        )

    def _print(self, df: pl.DataFrame) -> None:
        self.out.write(format_result(df, self.mode, self.max_rows))
        self.out.flush()

    def _interrupted(self) -> None:
        self.interrupted = True
        self._error("interrupted (Ctrl-C)")

    def _error(self, message: str) -> None:
        self.failures += 1
        self.err.write(f"Error: {message}\n")
        self.err.flush()


@contextmanager
def _ctrl_c_reaches_the_prompt() -> Iterator[None]:
    """While the body waits at the prompt, a Ctrl-C that another thread took is passed on
    to the main thread, so the line being read is dropped (KeyboardInterrupt).

    # NOTE: the kernel hands a terminal's SIGINT to any thread that does not block it,
    # and DuckDB's and polars' worker threads do not; readline blocks it in the main
    # thread while it redraws the line. A Ctrl-C then was noted by Python, but nothing
    # woke readline's select() on the terminal: the shell sat there until the next key.
    # Python's C handler writes to the wakeup fd from whichever thread it runs on.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_kill"
    ):
        yield
        return
    main = threading.main_thread().ident
    assert main is not None
    handled = threading.Event()  # the main thread's handler ran

    def handler(signum: int, frame: FrameType | None) -> None:
        handled.set()
        raise KeyboardInterrupt

    def forward(wakeups: int) -> None:
        while data := os.read(wakeups, 512):  # b"": the body ended
            if signal.SIGINT in data and not handled.wait(0.2):
                signal.pthread_kill(main, signal.SIGINT)
            handled.clear()

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.signal(signal.SIGINT, handler)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    worker = threading.Thread(target=forward, args=(read_end,), name="sql-shell-ctrl-c")
    worker.daemon = True
    worker.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        os.close(write_end)
        worker.join()
        os.close(read_end)


@contextmanager
def _interrupting(con: duckdb.DuckDBPyConnection) -> Iterator[Callable[[], bool]]:
    """While the body runs, Ctrl-C interrupts ``con``'s query instead of raising in Python;
    yields whether it came. Off the main thread no handler can be set: Ctrl-C raises.

    # NOTE: DuckDB forgets an interrupt that comes between two queries, so once Ctrl-C
    # has come a thread repeats it until the body ends: the query running then, or the
    # one about to start, is stopped either way.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    came = threading.Event()  # Ctrl-C came
    wake = threading.Event()  # Ctrl-C came, or the body ended
    done = threading.Event()

    def repeat() -> None:
        wake.wait()
        while not done.is_set():
            con.interrupt()
            done.wait(0.05)

    def handler(signum: int, frame: FrameType | None) -> None:
        came.set()
        wake.set()

    previous = signal.signal(signal.SIGINT, handler)
    worker = threading.Thread(target=repeat, name="sql-shell-interrupt", daemon=True)
    worker.start()
    try:
        yield came.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
        done.set()
        wake.set()
        worker.join()


def script(shell: Shell, lines: Iterable[str]) -> bool:
    """Run ``lines`` (a stream of SQL and dot commands) through ``shell``; True when
    nothing failed. A failed statement does not stop it; Ctrl-C does."""
    for line in lines:
        if not shell.feed(line.rstrip("\r\n")) or shell.interrupted:
            break
    else:
        shell.finish()
    return shell.failures == 0


def interactive(
    shell: Shell,
    history: Path | None = None,
    read: Callable[[str], str] = input,
) -> None:
    """Prompt for lines until ``.quit``, ``.exit`` or Ctrl-D, with line editing and the
    ``history`` file (default ``history_path()``) where ``readline`` is available."""
    history = history or history_path()
    rl = _readline()
    if rl is not None:
        try:
            rl.read_history_file(history)
        except OSError:  # none yet, or unreadable: start a fresh one
            pass
        rl.set_history_length(HISTORY_LINES)
    shell.out.write('SQL over the warehouse views; ".help" for help, ".quit" or Ctrl-D to leave\n')
    try:
        while True:
            try:
                with _ctrl_c_reaches_the_prompt():
                    line = read(CONTINUE if shell.pending else PROMPT)
            except EOFError:
                shell.out.write("\n")
                break
            except KeyboardInterrupt:
                shell.out.write("^C\n")
                shell.discard()
                continue
            try:
                if not shell.feed(line):
                    break
            except KeyboardInterrupt:  # before the statement's own handler was set
                shell.out.write("^C\n")
                shell.discard()
    finally:
        if rl is not None:
            _save_history(rl, history, shell.err)


def _readline() -> Any:
    try:
        import readline
    except ImportError:  # no line editing on this Python (Windows without pyreadline)
        return None
    return readline


def _save_history(rl: Any, path: Path, err: TextIO) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rl.write_history_file(path)
    except OSError as exc:
        err.write(
            f"warning: cannot keep the shell history in {path} ({exc.strerror or exc}); "
            "set XDG_STATE_HOME to a writable directory\n"
        )


__all__ = ["MODES", "Shell", "ends_statement", "history_path", "interactive", "script"]
