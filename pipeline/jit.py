"""Where numba keeps the compiled simulator, and the notice when it compiles.

The simulator is compiled by numba on first use (about a minute) and cached on
disk, next to the sources (``__pycache__``) when the installed package is
writable. When it is not (a read-only site-packages, a system install), the
cache goes to ``$XDG_CACHE_HOME/tracereplay/numba`` (default
``~/.cache/tracereplay/numba``) instead, so that a machine compiles once, not
in every process. ``NUMBA_CACHE_DIR``, when set, wins.

``compile_notice`` wraps the first call of the compiled code: when this
machine has not compiled the current sources yet, it prints one line on stderr
and, on a terminal, a bar that moves while numba works.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOTICE = "compiling the simulator once (~1 min); later runs start in seconds"
PACKAGE = Path(__file__).resolve().parent
# Folders whose modules hold cached numba functions (numba writes <folder>/__pycache__):
# the folders of ``compiled_sources()``, kept here so that importing ``pipeline`` reads
# no source file (a test holds the two together).
JIT_FOLDERS = ("sim", "sim/policies")
_IMPORTS_NUMBA = re.compile(rb"^(?:from|import) numba\b", re.MULTILINE)


def compiled_sources() -> list[Path]:
    """The simulator's modules that numba compiles, sorted: those that import numba (the
    ``njit`` functions and the intrinsics they call, ``borrow.py``, ``prefetch.py``).
    What the compiled code depends on, so the one list both the cache's stamp and the
    removal of stale cache files read."""
    return sorted(
        p for p in (PACKAGE / "sim").rglob("*.py") if _IMPORTS_NUMBA.search(p.read_bytes())
    )


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tracereplay`` (default ``~/.cache/tracereplay``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracereplay"


def _writable(folder: Path) -> bool:
    pycache = folder / "__pycache__"
    return os.access(pycache if pycache.is_dir() else folder, os.W_OK)


def use_writable_cache() -> None:
    """Point numba at the user cache directory when the package's folders are read-only.

    Called when ``pipeline`` is imported, before any compiled function is defined.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    if all(_writable(PACKAGE / sub) for sub in JIT_FOLDERS):
        return
    where = str(user_cache_dir() / "numba")
    os.environ["NUMBA_CACHE_DIR"] = where
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba read its settings already
        config.CACHE_DIR = where  # type: ignore[attr-defined]


def cache_root() -> Path:
    """The folder that holds the simulator's compiled code on this machine."""
    custom = os.environ.get("NUMBA_CACHE_DIR")
    return Path(custom) if custom else PACKAGE / "sim" / "__pycache__"


def _stamp() -> str:
    """What the compiled code depends on: the simulator's sources, numba, Python, the CPU."""
    from importlib.metadata import version

    digest = hashlib.sha1()
    for path in compiled_sources():  # only compiled modules: editing replay.py compiles nothing
        digest.update(path.read_bytes())
    digest.update(f"{version('numba')} {sys.version} {platform.machine()}".encode())
    return digest.hexdigest()[:16]


def compiled_marker() -> Path:
    """The file whose presence says this machine compiled the current simulator."""
    return cache_root() / f"tracereplay-compiled-{_stamp()}"


@contextmanager
def compile_notice(*, quiet: bool = False, loaded: bool = False) -> Iterator[None]:
    """Around the first call of the compiled simulator: say so when it will compile.

    The line is printed even when ``quiet`` (it appears once per machine); the
    moving bar only on a terminal and when not ``quiet``. ``loaded``: this
    process has the compiled code already (nothing to say, but remember it).
    """
    marker = compiled_marker()
    if marker.exists() or loaded:
        yield
        _remember(marker)
        return
    from pipeline.progress import progress

    print(NOTICE, file=sys.stderr, flush=True)
    with progress("compiling the simulator", total=None, quiet=quiet):
        yield
    _remember(marker)


def _remember(marker: Path) -> None:
    if marker.exists():
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the simulator's numba cache in this folder is complete\n")
    except OSError:  # nowhere to write: the notice shows again next time, nothing worse
        pass
