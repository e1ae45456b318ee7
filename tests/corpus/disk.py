"""File-system faults for the disk and permission corpus: real where we may, injected where not.

Real faults:

* ``full``: a small tmpfs mounted at the case's directory and filled to its last
  page (``ENOSPC``), optionally leaving ``slack`` bytes free;
* ``readonly``: a tmpfs remounted read-only (``EROFS``);
* ``notdir``: a regular file where a directory belongs (``ENOTDIR``);
* ``missing``: the directory a command writes is removed while it runs
  (``ENOENT``), by a hook on the first rename into it.

Mounting needs root with CAP_SYS_ADMIN. Where it is not allowed (or with
``TRACEREPLAY_TEST_INJECT=1``), ``full`` and ``readonly`` fall back to the
injection seam below, and so do the faults a test cannot make real here:
``quota`` (``EDQUOT``: no quotas on tmpfs), ``denied`` and ``eperm``
(``EACCES``/``EPERM``: root ignores permission bits) and ``toobig``
(``EFBIG``).

The injection seam: while armed, ``os.replace``, ``os.mkdir`` and ``os.open``
for writing raise the real ``OSError`` of that errno (with the file name, as
the kernel's would) for any path under the directory (``readonly``, ``denied`` and ``eperm`` also
refuse creating a file with ``open``). Every file the
pipeline writes is published by ``os.replace`` (``contracts.write_table``,
``TableWriter``, ``storage.write_atomic``, the ingest's commit), so the
data is written and then refused, which also proves that the temporary file
is removed. ``readonly`` refuses ``os.unlink`` too.

Teardown always disarms and unmounts, even when the case failed.
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ERRNO = {
    "full": errno.ENOSPC,
    "quota": errno.EDQUOT,
    "readonly": errno.EROFS,
    "denied": errno.EACCES,
    "eperm": errno.EPERM,
    "toobig": errno.EFBIG,
    "missing": errno.ENOENT,
    "notdir": errno.ENOTDIR,
}
REASON = {
    "full": "no space left on device",
    "quota": "disk quota exceeded",
    "readonly": "read-only file system",
    "denied": "permission denied",
    "eperm": "operation not permitted",
    "toobig": r"file too large for the file system or the file-size limit \(ulimit -f\)",
    "missing": "directory does not exist",
    "notdir": "a file is where a directory belongs",
}
FIX = {
    "full": "free space there",
    "quota": "free space under your quota or have it raised",
    "readonly": "remount it read-write",
    "denied": "give this user write access to it",
    "eperm": "give this user write access to it",
    "toobig": "raise the limit",
    "missing": "create it",
    "notdir": "move the file out of the way",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (tried once, on a scratch directory)."""
    global _CAN_MOUNT
    if _CAN_MOUNT is None:
        if (
            os.environ.get("TRACEREPLAY_TEST_INJECT")
            or os.geteuid() != 0
            or not shutil.which("mount")
        ):
            _CAN_MOUNT = False
        else:
            import tempfile

            d = tempfile.mkdtemp(prefix="tr-mount-")
            ok = _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d)
            if ok:
                _run("umount", d)
            os.rmdir(d)
            _CAN_MOUNT = ok
    return _CAN_MOUNT


_CAN_MOUNT: bool | None = None


def _run(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


@dataclass
class Fault:
    """One fault of kind ``kind`` on the directory ``root`` (a mount point when real)."""

    kind: str
    root: Path
    size: str = "8m"
    slack: int = 0  # bytes left free by a real ``full``
    spare: Path | None = None  # a directory under root the injected fault leaves writable
    real: bool = False
    armed: bool = False
    _mounted: bool = False
    _saved: dict[str, Any] = field(default_factory=dict)

    @property
    def errno(self) -> int:
        return ERRNO[self.kind]

    def prepare(self) -> Path:
        """Make ``root`` (a tmpfs for a real ``full`` or ``readonly``); return it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.real = self.kind in ("full", "readonly") and can_mount()
        if self.real:
            assert _run("mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.root))
            self._mounted = True
        return self.root

    def arm(self) -> None:
        assert not self.armed
        self.armed = True
        if self.real and self.kind == "full":
            st = os.statvfs(self.root)
            free = st.f_bavail * st.f_frsize
            with open(self.root / ".filler", "wb") as f:
                chunk = b"\0" * (1 << 16)
                left = max(0, free - self.slack)
                try:
                    while left > 0:
                        left -= f.write(chunk[: min(len(chunk), left)])
                except OSError:
                    pass
        elif self.real and self.kind == "readonly":
            assert _run("mount", "-o", "remount,ro", str(self.root))
        elif self.kind == "missing":
            self._patch(missing=True)
        elif self.kind != "notdir":
            self._patch()

    def disarm(self) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.real and self.kind == "full":
            (self.root / ".filler").unlink(missing_ok=True)
        elif self.real and self.kind == "readonly":
            assert _run("mount", "-o", "remount,rw", str(self.root))
        for name, fn in self._saved.items():
            if name == "builtin_open":
                builtins.open = fn
            elif name != "gone":
                setattr(os, name, fn)
        self._saved.clear()

    def teardown(self) -> None:
        self.disarm()
        if self._mounted and not _run("umount", str(self.root)):
            _run("umount", "-l", str(self.root))
        self._mounted = False

    def _under(self, path: object) -> bool:
        try:
            p = Path(os.fsdecode(path)).absolute()  # type: ignore[arg-type]
        except TypeError:
            return False
        if self.spare is not None and (p == self.spare or p.is_relative_to(self.spare)):
            return False
        return p == self.root or p.is_relative_to(self.root)

    def _patch(self, *, missing: bool = False) -> None:
        code = self.errno
        real_replace, real_mkdir, real_open, real_unlink = os.replace, os.mkdir, os.open, os.unlink
        self._saved = {"replace": real_replace, "mkdir": real_mkdir, "open": real_open}

        def refuse(path: object) -> OSError:
            return OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]

        if missing:  # the directory goes away under the command's feet, once

            def replace(src: Any, dst: Any, **kw: Any) -> None:
                if self._under(dst) and self.armed and not self._saved.get("gone"):
                    self._saved["gone"] = True
                    shutil.rmtree(Path(os.fsdecode(dst)).parent, ignore_errors=True)
                real_replace(src, dst, **kw)

            os.replace = replace
            return

        def replace_(src: Any, dst: Any, **kw: Any) -> None:
            if self._under(dst):
                raise refuse(src)
            real_replace(src, dst, **kw)

        refuses_mkdir = self.kind != "toobig"
        refuses_open = self.kind in ("readonly", "denied", "eperm")  # creating, opening

        def mkdir(path: Any, *a: Any, **kw: Any) -> None:
            if refuses_mkdir and self._under(path) and not os.path.isdir(path):
                raise refuse(path)
            real_mkdir(path, *a, **kw)

        def open_(path: Any, flags: int, *a: Any, **kw: Any) -> int:
            if refuses_open and flags & _WRITE_FLAGS and self._under(path):
                raise refuse(path)
            return real_open(path, flags, *a, **kw)

        os.replace, os.mkdir, os.open = replace_, mkdir, open_
        if refuses_open:  # creating a file through open() too
            real_builtin_open = builtins.open
            self._saved["builtin_open"] = real_builtin_open

            def bopen(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
                if isinstance(file, (str, bytes, os.PathLike)) and self._under(file):
                    if any(ch in mode for ch in "wax+"):
                        raise refuse(file)
                return real_builtin_open(file, mode, *a, **kw)

            builtins.open = bopen
        if self.kind == "readonly":
            self._saved["unlink"] = real_unlink

            def unlink(path: Any, *a: Any, **kw: Any) -> None:
                if self._under(path):
                    raise refuse(path)
                real_unlink(path, *a, **kw)

            os.unlink = unlink


@contextmanager
def faults() -> Iterator[Callable[..., Fault]]:
    """``make(kind, root, size=..., slack=...)`` -> a prepared Fault, torn down at exit."""
    made: list[Fault] = []

    def make(kind: str, root: Path, **kw: Any) -> Fault:
        f = Fault(kind, Path(root).absolute(), **kw)
        made.append(f)
        f.prepare()
        return f

    try:
        yield make
    finally:
        for f in reversed(made):
            f.teardown()
