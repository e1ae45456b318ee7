"""Progress bars on a terminal, silence under cron.

A bar is shown only when stderr is a terminal and the caller did not ask for
quiet; otherwise every call is a no-op, so batch logs stay clean.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    def advance(self, amount: float = 1) -> None: ...

    def describe(self, text: str) -> None: ...


class _Silent:
    def advance(self, amount: float = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class _Bar:
    def __init__(self, progress: object, task: object) -> None:
        self._p = progress
        self._t = task

    def advance(self, amount: float = 1) -> None:
        self._p.advance(self._t, amount)  # type: ignore[attr-defined]

    def describe(self, text: str) -> None:
        self._p.update(self._t, description=text)  # type: ignore[attr-defined]


def enabled(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress(description: str, total: float | None, *, quiet: bool = False) -> Iterator[Progress]:
    """A progress bar over ``total`` units (bytes, requests, ...), or a silent stand-in."""
    if not enabled(quiet):
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    with RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as p:
        yield _Bar(p, p.add_task(description, total=total))
