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
import inspect
import os
import platform
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

NOTICE = "compiling the simulator once (~1 min); later runs start in seconds"
PACKAGE = Path(__file__).resolve().parent
# Folders whose modules hold cached numba functions (numba writes <folder>/__pycache__):
# the folders of ``compiled_sources()``, kept here so that importing ``pipeline`` reads
# no source file (a test holds the two together).
JIT_FOLDERS = ("sim", "sim/policies")
_IMPORTS_NUMBA = re.compile(rb"^(?:from|import) numba\b", re.MULTILINE)


_EXTRA: list[Path] = []  # sources of policies registered from outside the package


def compiled_sources() -> list[Path]:
    """The simulator's modules that numba compiles, sorted: those that import numba (the
    ``njit`` functions and the intrinsics they call, ``borrow.py``, ``prefetch.py``), and
    the modules of policies registered from outside the package (``policies.register``).
    What the compiled code depends on, so the one list both the cache's stamp and the
    removal of stale cache files read."""
    ours = [p for p in (PACKAGE / "sim").rglob("*.py") if _IMPORTS_NUMBA.search(p.read_bytes())]
    return sorted(ours) + _EXTRA


def add_source(module: ModuleType) -> None:
    """A registered policy's module: the compiled loop now depends on it too.

    Drops the cache files that no longer match (``drop_stale_cache``)."""
    path = Path(inspect.getfile(module)).resolve()
    if path not in _EXTRA:
        _EXTRA.append(path)
        drop_stale_cache()


def _sources_digest() -> str:
    digest = hashlib.sha1()
    for path in compiled_sources():
        digest.update(path.read_bytes())
    return digest.hexdigest()


def drop_stale_cache() -> None:
    """Drop this package's numba cache files when any compiled source changed.

    numba checks only each function's own file, not the files of the functions it
    calls (or inlines), so a cached loop would outlive an edit of a policy. The
    digest of ``compiled_sources()`` is kept beside the cache; when it differs, every
    cache file of the simulator's folders goes. Runs when ``pipeline.sim`` is imported,
    before anything is compiled or loaded.
    """
    value = _sources_digest()
    root = cache_root()
    stamp = root / "sim-sources.sha1"
    try:
        if stamp.exists() and stamp.read_text() == value:
            return
        for folder in _cache_folders():
            for f in [*folder.glob("*.nbi"), *folder.glob("*.nbc")]:
                f.unlink(missing_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        stamp.write_text(value)
    except OSError:  # read-only install: numba caches elsewhere, or not at all
        pass


def _cache_folders() -> list[Path]:
    """Where numba keeps the cache files of the simulator's folders."""
    custom = os.environ.get("NUMBA_CACHE_DIR")
    if not custom:
        return [PACKAGE / sub / "__pycache__" for sub in JIT_FOLDERS]
    # numba's user-wide locator: the source folder's path under the cache directory
    return [Path(custom) / _mirrored(PACKAGE / sub) for sub in JIT_FOLDERS]


def _mirrored(folder: Path) -> str:
    """numba's name for a source folder's cache under ``NUMBA_CACHE_DIR``
    (``_CacheLocator.get_suitable_cache_subpath``): its name and a hash of its path."""
    path = os.path.abspath(folder)
    return f"{os.path.basename(path)}_{hashlib.sha1(path.encode()).hexdigest()}"


def loop_compiled() -> bool:
    """Whether this process has compiled or loaded the replay loop already."""
    loop = sys.modules.get("pipeline.sim.loop")
    return bool(loop is not None and loop.replay_loop.signatures)


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

    digest = hashlib.sha1(_sources_digest().encode())  # editing replay.py compiles nothing
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
