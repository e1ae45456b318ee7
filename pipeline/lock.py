"""The warehouse lock: commands that write the warehouse run one at a time.

``ingest``, ``replay``, ``sweep``, ``capacity``, ``run`` and ``nightly`` take
an exclusive ``flock`` on ``<warehouse>/.lock`` for their whole run, so that
concurrent commands end exactly as if they had run one after the other (an
ingest's duplicate check, for one, reads the ids already stored under the
lock, so two ingests of overlapping logs cannot both keep the same request).
The holder writes its pid, command line and start time into the lock file; a
command that finds the lock taken prints what it waits for and gives up after
``--lock-timeout-s`` seconds with a one-line error. The kernel drops the lock
when its holder dies, however it dies, so a killed command never leaves the
warehouse locked.

Right after taking the lock a command removes what killed commands left
behind (``Warehouse.remove_stale``): no writer can be running then. A command
that fails (a full disk, a read-only mount, ...) does the same before it lets
go, so that nothing of it stays; the lock file names the warehouse in the
command's one-line error (``pipeline.storage``) and is released however it
ends.

The library functions that write runs (``replay``, ``sweep``,
``run_capacity``) take the lock themselves (``with_warehouse_lock``), so a
script calling them is safe beside the command line too.

``sql`` and ``report`` only read and take no lock: the views show only
committed runs, and every file is replaced atomically.

A warehouse at ``s3://...`` is locked by a lease object in the store, with the
same waiting, messages and timeout (``pipeline.objectstore.session``); the local
lock is then taken on its mirror as well.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pipeline import storage
from pipeline.errors import PipelineError

LOCK_FILE = ".lock"
DEFAULT_TIMEOUT_S = 600.0
POLL_S = 0.1

# Warehouses this process holds (resolved root -> depth): the lock is re-entrant,
# so `run` (ingest, then replay) and the library functions it calls can each take it.
_held: dict[Path, int] = {}

T = TypeVar("T")


class LockTimeoutError(PipelineError):
    """Another command held the warehouse lock for longer than we would wait."""


def command_line() -> str:
    """This process's command line, as the lock file records it."""
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else ["python"]
    text = " ".join(args)
    return text if len(text) <= 200 else text[:197] + "..."


def holder(root: Path) -> dict[str, object] | None:
    """What the lock file says about its holder (pid, command, since), if anything."""
    try:
        data = json.loads((root / LOCK_FILE).read_text() or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _describe(info: dict[str, object] | None) -> str:
    if not info:
        return "another command"
    host = f" on {info['host']}" if info.get("host") else ""  # a bucket's lease names it
    return f"pid {info.get('pid')}{host} ({info.get('command')}, since {info.get('since')})"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def warehouse_lock(
    root: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    command: str | None = None,
    on_wait: Callable[[str], None] = _stderr,
    clean: bool = True,
) -> Iterator[None]:
    """Hold the exclusive lock of the warehouse at ``root`` for the ``with`` block.

    Args:
        root: the warehouse directory (created if missing).
        timeout_s: give up after waiting this long (0: do not wait).
        command: what to record as the holder (default: this command line).
        on_wait: told once, in one line, what we wait for.
        clean: remove what killed commands left (``Warehouse.remove_stale``).

    Raises:
        LockTimeoutError: the lock stayed taken for ``timeout_s``.
    """
    root = Path(root)
    key = root.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    from pipeline import objectstore

    remote = objectstore.remote_of(root)
    if remote is not None:
        # an object-store warehouse: its lease object first, with the local mirror
        # brought to the last commit; the block's changes are committed when it ends
        with objectstore.session(
            remote,
            root,
            timeout_s=timeout_s,
            command=command or command_line(),
            on_wait=on_wait,
            describe=_describe,
            timeout_error=LockTimeoutError,
            clean=clean,
        ):
            with _local_lock(root, key, timeout_s, command, on_wait, clean):
                yield
        return
    with _local_lock(root, key, timeout_s, command, on_wait, clean):
        yield


@contextmanager
def _local_lock(
    root: Path,
    key: Path,
    timeout_s: float,
    command: str | None,
    on_wait: Callable[[str], None],
    clean: bool,
) -> Iterator[None]:
    """The ``flock`` of ``<root>/.lock`` (``warehouse_lock``)."""
    # A full disk, a read-only mount, a missing permission: one line naming the path
    # and the fix (pipeline.storage), and what the command wrote so far removed.
    with storage.writing(root, "point --warehouse elsewhere"):
        if root.exists() and not root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(root))
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _acquire(fd, root, timeout_s, on_wait)
            _record(fd, command)
            _held[key] = 1
            try:
                if clean:
                    from pipeline.warehouse import Warehouse

                    Warehouse(root).remove_stale()
                yield
            except BaseException:
                _clean_after_failure(root)
                raise
            finally:
                del _held[key]
                try:
                    os.ftruncate(fd, 0)
                except OSError:  # the kernel drops the lock all the same
                    pass
        finally:
            os.close(fd)  # releases the lock


def _acquire(fd: int, root: Path, timeout_s: float, on_wait: Callable[[str], None]) -> None:
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            info = holder(root)
            if time.monotonic() >= deadline:
                raise LockTimeoutError(
                    f"warehouse {root} is locked by {_describe(info)}; gave up after "
                    f"{timeout_s:g} s: wait for it to finish, or pass a longer "
                    "--lock-timeout-s"
                ) from None
            if not told:
                on_wait(
                    f"waiting for the warehouse lock of {root}, held by {_describe(info)}; "
                    f"giving up after {timeout_s:g} s (--lock-timeout-s)"
                )
                told = True
            time.sleep(POLL_S)


def _record(fd: int, command: str | None) -> None:
    """Write who holds the lock into the lock file. Only a courtesy to whoever waits: on a
    full disk the command goes on without it (and fails, if it must, on its own writes)."""
    record = {
        "pid": os.getpid(),
        "command": command or command_line(),
        "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError:
        pass


def _clean_after_failure(root: Path) -> None:
    """Remove what a failed command left (temporary files, the files of its uncommitted
    run) while it still holds the lock, so that nothing partial stays and the space it
    took is free. Best effort: the command's own error is what matters."""
    from pipeline.warehouse import Warehouse

    try:
        Warehouse(root).remove_stale()
    except OSError:
        pass


def holds(root: Path) -> bool:
    """Whether this process holds the lock of the warehouse at ``root`` now."""
    return Path(root).resolve() in _held


def with_warehouse_lock(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a library function whose first argument is the warehouse directory so
    that it runs holding the lock (a no-op when the caller already holds it)."""
    import functools

    @functools.wraps(fn)
    def wrapper(warehouse: Path, *args: Any, **kwargs: Any) -> T:
        with warehouse_lock(Path(warehouse)):
            return fn(warehouse, *args, **kwargs)

    return wrapper
