"""Where numba keeps the compiled simulator, and the notice when it compiles.

The simulator is compiled by numba on first use (about a minute) and cached on
disk in ``$XDG_CACHE_HOME/tracereplay/numba/<stamp>`` (default
``~/.cache/tracereplay/numba/<stamp>``), where the stamp is a digest of the
compiled sources, numba's and Python's versions and the machine
(``_stamp``): a reinstall, a second clone or a second virtualenv of the same
sources on one machine loads what the first one compiled, and an edit of any
compiled source compiles into a folder of its own (the oldest folders beyond
``KEEP_STAMPS`` go). numba's own index keys every compiled signature by the CPU
it was compiled for. ``digest_locator()`` puts the package's functions there;
when that folder cannot be written, numba's default applies (next to the
sources, ``__pycache__``) and, when the package is read-only too, numba's
user-wide folder under ``$XDG_CACHE_HOME/tracereplay/numba``.
``NUMBA_CACHE_DIR``, when set, wins over both.

``compile_notice`` wraps the first call of the compiled code: when this
machine has not compiled the current sources yet, it prints one line on stderr
and, on a terminal, a bar that moves while numba works.
"""

from __future__ import annotations

import functools
import os
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
    import inspect

    path = Path(inspect.getfile(module)).resolve()
    if path not in _EXTRA:
        _EXTRA.append(path)
        drop_stale_cache()


def _sources_digest() -> str:
    import hashlib  # (here, not at import: `tracereplay --help` imports this module)

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
    if not custom:  # the digest folder (use_digest_cache), else numba's in-tree default
        root = _DIGEST_ROOT[0] if _DIGEST_ROOT else None
        return [root / sub if root else PACKAGE / sub / "__pycache__" for sub in JIT_FOLDERS]
    # numba's user-wide locator: the source folder's path under the cache directory
    return [Path(custom) / _mirrored(PACKAGE / sub) for sub in JIT_FOLDERS]


def _mirrored(folder: Path) -> str:
    """numba's name for a source folder's cache under ``NUMBA_CACHE_DIR``
    (``_CacheLocator.get_suitable_cache_subpath``): its name and a hash of its path."""
    import hashlib

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


def _can_create(folder: Path) -> bool:
    """Whether ``folder`` is, or can be made, a writable folder (its nearest existing
    ancestor is writable)."""
    for f in (folder, *folder.parents):
        if f.exists():
            return f.is_dir() and os.access(f, os.W_OK | os.X_OK)
    return False


def use_writable_cache() -> None:
    """Point numba at the user cache directory when neither the digest folders
    (``use_digest_cache``) nor the package's folders can be written.

    Called when ``pipeline`` is imported, before any compiled function is defined.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    if _can_create(user_cache_dir() / "numba"):  # the digest folders (use_digest_cache)
        return
    if all(_writable(PACKAGE / sub) for sub in JIT_FOLDERS):
        return
    where = str(user_cache_dir() / "numba")
    os.environ["NUMBA_CACHE_DIR"] = where
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba read its settings already
        config.CACHE_DIR = where  # type: ignore[attr-defined]


KEEP_STAMPS = 4  # digest folders kept in the user cache (the newest; the others go)
_DIGEST_ROOT: list[Path] = []  # the digest folder digest_locator() uses, once registered


def digest_root() -> Path:
    """``$XDG_CACHE_HOME/tracereplay/numba/<stamp>``: this tree's compiled simulator."""
    return user_cache_dir() / "numba" / _stamp()


def use_digest_cache() -> None:
    """Put the package's compiled functions in ``digest_root()`` (``digest_locator()``).

    Called when ``pipeline.sim`` is imported, before any of its compiled functions is
    defined (numba picks a function's cache folder when it is decorated). Does nothing
    when ``NUMBA_CACHE_DIR`` is set or the folder cannot be written."""
    if os.environ.get("NUMBA_CACHE_DIR") or _DIGEST_ROOT:
        return
    root = digest_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK):
            return
    except OSError:
        return
    from numba.core import caching

    _DIGEST_ROOT.append(root)
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # type: ignore[attr-defined]
    locators = impl._locator_classes
    locator = digest_locator()
    if locator not in locators:
        locators.insert(0, locator)
    _prune(root)


def _prune(keep: Path) -> None:
    """Drop the oldest digest folders beyond ``KEEP_STAMPS`` (never ``keep``)."""
    try:
        os.utime(keep)  # the newest: this one is in use
        folders = [p for p in keep.parent.iterdir() if p.is_dir() and p != keep]
        folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        import shutil

        for old in folders[KEEP_STAMPS - 1 :]:
            shutil.rmtree(old, ignore_errors=True)
    except OSError:
        pass


@functools.cache
def digest_locator() -> type:
    """numba's cache locator for the package's functions (built on first use: importing
    ``pipeline`` imports no numba)."""
    from numba.core.caching import _CacheLocator

    class _DigestCacheLocator(_CacheLocator):  # type: ignore[misc]
        """numba's cache folder for the package's functions: ``digest_root()``, by the
        function's folder in the package (``sim``, ``sim/policies``). The stamp numba
        checks is the digest of every compiled source, not the function's own file's:
        a function inlines others from other files."""

        def __init__(self, py_func: object, rel: Path) -> None:
            self._lineno = py_func.__code__.co_firstlineno  # type: ignore[attr-defined]
            self._cache_path = str(_DIGEST_ROOT[0] / rel)

        def get_cache_path(self) -> str:
            return self._cache_path

        def get_source_stamp(self) -> str:
            return _DIGEST_ROOT[0].name

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func: object, py_file: str) -> object:
            from numba.core import config

            if getattr(config, "CACHE_DIR", "") or not _DIGEST_ROOT:
                return None
            try:
                rel = Path(py_file).resolve().parent.relative_to(PACKAGE)
            except ValueError:  # not the package's (a registered policy's module)
                return None
            self = cls(py_func, rel)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return _DigestCacheLocator


def cache_root() -> Path:
    """The folder that holds the simulator's compiled code on this machine."""
    custom = os.environ.get("NUMBA_CACHE_DIR")
    if custom:
        return Path(custom)
    if _DIGEST_ROOT:
        return _DIGEST_ROOT[0]
    return PACKAGE / "sim" / "__pycache__"


def _stamp() -> str:
    """What the compiled code depends on: the simulator's sources, numba, Python, the CPU."""
    import hashlib
    import platform
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
