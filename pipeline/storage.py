"""When the file system refuses a write: one line naming the path and the fix.

A full disk, an exceeded quota, a read-only mount, a missing permission, a file
past the file-size limit, a directory that is gone or a file where a directory
belongs are the environment, not a bug: a command ends with one line such as ::

    <warehouse>/requests/date=2024-05-01/src-1a2b.parquet: no space left on device;
    free space there or point --warehouse elsewhere, then rerun (nothing from this run landed)

(one line on the terminal), exit 1. Only those errnos are translated, and only
where the path is known (the error's own file name, or the directory the
command writes, ``writing``): any other ``OSError`` is left as it is, with its
traceback, since it may be a bug.

Commands say where they write with ``writing(path, elsewhere)``: the
warehouse lock does it for the warehouse (``--warehouse``), the commands that
write a file of the user's choosing (``sql -o``, ``report -o``, ``profile new
-o``, the calibrated profiles) for that file. An ``OSError`` leaving the block
comes out as a ``StorageError`` (a ``PipelineError``), so library callers get
it too. What a command wrote whole before the failure it reports with
``landed``; the line then says so instead of "nothing from this run landed".

Every file is written under a temporary name and renamed into place
(``write_atomic`` here, ``contracts.write_table`` for tables), and the
temporary file is removed when the write fails: nothing partial is left, and
the space a failed write took is free again.
"""

from __future__ import annotations

import errno as errnos
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

# errno -> (what is wrong, what to do about it there)
REASONS: dict[int, tuple[str, str]] = {
    errnos.ENOSPC: ("no space left on device", "free space there"),
    errnos.EDQUOT: ("disk quota exceeded", "free space under your quota or have it raised"),
    errnos.EROFS: ("read-only file system", "remount it read-write"),
    errnos.EACCES: ("permission denied", "give this user write access to it"),
    errnos.EPERM: ("operation not permitted", "give this user write access to it"),
    errnos.EFBIG: (
        "file too large for the file system or the file-size limit (ulimit -f)",
        "raise the limit",
    ),
    errnos.ENOENT: ("directory does not exist", "create it"),
    errnos.ENOTDIR: ("a file is where a directory belongs", "move the file out of the way"),
}
NOTHING_LANDED = "nothing from this run landed"

# pyarrow and polars put the errno in the message only: "[errno 28] ...", "(os error 28)"
_ERRNO_TEXT = re.compile(r"\[errno (\d+)\]|\(os error (\d+)\)", re.IGNORECASE)
_PATH_TEXT = re.compile(r"file '([^']+)'")
_TEMPORARY = re.compile(r"^\.(.+)\.tmp-[^/]*$")


class StorageError(PipelineError):
    """The file system refused a write (full, read-only, no permission, ...).

    Attributes:
        path: the file or directory named.
        errno: the ``errno`` of the refusal.
        reason: what is wrong, in words.
    """

    def __init__(self, message: str, path: Path, errno: int, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno
        self.reason = reason


@dataclass
class Target:
    """A directory or file a command writes, and how to write elsewhere instead."""

    path: Path
    elsewhere: str
    landed: list[str] = field(default_factory=list)


_targets: ContextVar[tuple[Target, ...]] = ContextVar("storage_targets", default=())


@contextmanager
def writing(path: Path, elsewhere: str) -> Iterator[Target]:
    """Within the block, an ``OSError`` of the environment comes out as a ``StorageError``.

    Args:
        path: what the block writes (a warehouse directory, an output file).
        elsewhere: how to write somewhere else instead, e.g. "point --warehouse elsewhere".
    """
    target = Target(Path(path), elsewhere)
    token = _targets.set((*_targets.get(), target))
    try:
        yield target
    except OSError as exc:
        err = storage_error(exc)
        if err is None:
            raise
        raise err from exc
    finally:
        _targets.reset(token)


def landed(what: str) -> None:
    """Record that ``what`` (a clause: "2 of the 3 files landed whole") is in place, so a
    later failure of the same command says so."""
    targets = _targets.get()
    if targets:
        targets[-1].landed.append(what)


def errno_of(exc: OSError) -> int | None:
    """The errno of ``exc``, also where a library put it in the message only."""
    if exc.errno:
        return exc.errno
    m = _ERRNO_TEXT.search(str(exc))
    return int(m.group(1) or m.group(2)) if m else None


def storage_error(exc: OSError, *, outcome: str | None = None) -> StorageError | None:
    """The one-line error of ``exc`` if the environment caused it, else None (a bug).

    Args:
        exc: what a write raised.
        outcome: what of the run is in place (default: what ``landed`` recorded, else
            "nothing from this run landed").
    """
    if isinstance(exc, StorageError):
        return exc
    code = errno_of(exc)
    if code not in REASONS and code != errnos.EEXIST:
        return None
    targets = _targets.get()
    named = _named_path(exc)
    if code == errnos.EEXIST:  # mkdir(exist_ok=True) on a file: a file in the way
        code = errnos.ENOTDIR
    if code in (errnos.ENOENT, errnos.ENOTDIR):
        if named is None:
            return None
        culprit = _missing_directory(named) if code == errnos.ENOENT else _file_in_the_way(named)
        if culprit is None:  # a file to read that is not there: not ours to explain
            return None
        named = culprit
    if named is None:
        if not targets:
            return None
        named = targets[-1].path
    assert code is not None
    reason, fix = REASONS[code]
    elsewhere = _elsewhere(named, targets)
    if outcome is None:
        done = [w for t in targets for w in t.landed]
        outcome = "; ".join([*done, "nothing else from it did"]) if done else NOTHING_LANDED
    message = f"{named}: {reason}; {fix} or {elsewhere}, then rerun ({outcome})"
    return StorageError(message, named, code, reason)


def _named_path(exc: OSError) -> Path | None:
    """The file ``exc`` is about, its final name when it is a temporary file."""
    name = exc.filename
    if name is None:
        m = _PATH_TEXT.search(str(exc))
        name = m.group(1) if m else None
    if name is None:
        return None
    path = Path(os.fsdecode(name))
    m = _TEMPORARY.match(path.name)
    return path.with_name(m.group(1)) if m else path


def _missing_directory(path: Path) -> Path | None:
    """The directory that should hold ``path`` when it is gone (the top one missing)."""
    parent = path.parent
    if parent.exists():
        return None
    top = parent
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


def _file_in_the_way(path: Path) -> Path | None:
    """The non-directory among the ancestors of ``path``, if any."""
    for up in [path, *path.parents]:
        if up.exists() or up.is_symlink():
            return None if up.is_dir() else up
    return None


def _elsewhere(path: Path, targets: tuple[Target, ...]) -> str:
    for t in reversed(targets):
        if path == t.path or path.is_relative_to(t.path):
            return t.elsewhere
    return targets[-1].elsewhere if targets else "write elsewhere"


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it, flushed and renamed.

    A failed write (or a killed process) never leaves half a file under ``path``; a
    failed one removes its temporary file, so the space it took is free again.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    return path


def discard(path: Path) -> None:
    """Remove a temporary file if it is there, refusing nothing: on a read-only mount even
    removing a missing file fails (EROFS), and that must not hide the error being handled."""
    try:
        Path(path).unlink(missing_ok=True)
    except OSError:
        pass
