"""A replay beside the main one: a function run in a forked child, its small result sent back.

A replay with intervals runs the scenario three times: once for its tables and
twice more at a scaled step cost for the profile term (``uncertainty.py``).
The two extra replays need nothing the main one makes, so on a machine with
cores to spare they run in forked children while the parent runs the main
replay: a child inherits the compiled loop and the prepared input as they are
(copy on write: nothing is pickled on the way in) and sends back only what it
computed (a few statistics).

``start(fn, *args)`` forks at once and returns a ``Forked``; ``Forked.result()``
waits for the child and returns what ``fn`` returned. When the child could not
run or died (killed, out of memory), ``result()`` runs ``fn`` here instead, so
a lost child costs time, never the answer; the caller keeps ``args`` alive
until then. A child dies with its parent (``PR_SET_PDEATHSIG``), writes
nothing and prints nothing.

# NOTE: a child must not use polars: its thread pool does not survive a fork
# (``plan/executor.py`` says the same of the sweeps' workers). The replays use
# numba and numpy only.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from pipeline.processes import default_jobs, die_with_parent

R = TypeVar("R")

# below this many requests a replay takes milliseconds: forking costs more than it saves
MIN_REQUESTS = 20_000
# bytes a child's replay makes per request (state, results; bench/RESULTS.md, Replay
# memory: 229-627 bytes a request end to end), with room: a child starts only when the
# machine's free memory holds it
BYTES_PER_REQUEST = 400


def worth_forking(num_requests: int, children: int, jobs: int | None = None) -> bool:
    """Whether ``children`` side replays of ``num_requests`` should run in forked children:
    a core to spare (``jobs``, default every core), enough requests to pay for the fork,
    free memory for their state, and a platform that forks."""
    if (jobs or default_jobs()) < 2 or num_requests < MIN_REQUESTS:
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not on Linux: no way to tell, so no
        return False
    return free > children * num_requests * BYTES_PER_REQUEST


class Forked(Generic[R]):
    """A function running in a forked child (``start``)."""

    def __init__(self, fn: Callable[..., R], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(os.getpid(), send, fn, args), daemon=True)
        try:
            self._proc.start()
        except OSError:  # no fork (out of processes or memory): run it in result()
            self._proc = None  # type: ignore[assignment]
        send.close()

    def result(self) -> R:
        """What the function returned: from the child, or computed here if the child failed."""
        got: tuple[bool, Any] | None = None
        if self._proc is not None:
            try:
                got = self._recv.recv()
            except (EOFError, OSError):  # the child died before it sent anything
                got = None
            self._proc.join()
        self._recv.close()
        if got is not None and got[0]:
            return got[1]  # type: ignore[no-any-return]
        return self._fn(*self._args)  # the child failed (or raised): here, as if never forked


def start(fn: Callable[..., R], *args: Any) -> Forked[R]:
    """Run ``fn(*args)`` in a forked child now; ``.result()`` gets what it returned."""
    return Forked(fn, args)


def _child(parent: int, send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    die_with_parent(parent)
    try:
        send.send((True, fn(*args)))
    except Exception:  # the parent computes it again and raises it there, with its traceback
        send.send((False, None))
    finally:
        send.close()
