"""The compiled simulator's cache: the digest folders, the notice on first compile, a
read-only install."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import jit
from pipeline.sim.replay_input import _repeats


def test_notice_once_then_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    with jit.compile_notice(quiet=True):
        pass
    assert capsys.readouterr().err.strip() == jit.NOTICE
    assert jit.compiled_marker().exists()
    with jit.compile_notice(quiet=True):
        pass
    assert capsys.readouterr().err == ""


def test_notice_comes_back_when_the_cache_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    with jit.compile_notice(quiet=True):
        pass
    shutil.rmtree(tmp_path / "cache")
    capsys.readouterr()
    with jit.compile_notice(quiet=True):
        pass
    assert jit.NOTICE in capsys.readouterr().err


def test_writable_package_keeps_numba_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(jit, "_writable", lambda folder: True)
    jit.use_writable_cache()
    assert "NUMBA_CACHE_DIR" not in os.environ


def test_a_writable_user_cache_takes_the_digest_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(jit, "_writable", lambda folder: False)  # even a read-only package
    jit.use_writable_cache()
    assert "NUMBA_CACHE_DIR" not in os.environ


def test_the_package_compiles_into_its_digest_folder() -> None:
    """This process's compiled functions live under the digest of the compiled sources
    (when the tests run without NUMBA_CACHE_DIR), and a function from outside the package
    keeps numba's own locators."""
    if os.environ.get("NUMBA_CACHE_DIR") or not jit._DIGEST_ROOT:
        pytest.skip("NUMBA_CACHE_DIR is set or the user cache is not writable")
    from numba.core import caching

    import pipeline.sim.loop as loop
    from pipeline.sim.policies import vllm

    root = jit.digest_root()
    assert jit._DIGEST_ROOT == [root] and jit.cache_root() == root
    assert root.name == jit._stamp() and root.parent == jit.user_cache_dir() / "numba"
    assert loop.replay_loop._cache._cache_path == str(root / "sim")
    assert vllm.schedule._cache._cache_path == str(root / "sim" / "policies")
    locator = jit.digest_locator()
    assert locator in caching.CacheImpl._locator_classes
    assert locator.from_function(_outside, __file__) is None
    found = locator.from_function(loop.replay_loop.py_func, loop.__file__)
    assert found.get_source_stamp() == root.name


def _outside() -> None:
    pass


def test_a_copy_elsewhere_has_the_same_digest_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second clone or reinstall of the same sources loads what the first compiled; an
    edit of a compiled source gets a folder of its own."""
    before = jit.digest_root()
    copy = tmp_path / "elsewhere" / "pipeline"
    shutil.copytree(Path(pipeline.__file__).parent / "sim", copy / "sim")
    monkeypatch.setattr(jit, "PACKAGE", copy)
    assert jit.digest_root() == before
    path = copy / "sim" / "state.py"
    path.write_text(path.read_text() + "\n# edited\n")
    assert jit.digest_root() != before


def test_old_digest_folders_are_pruned(tmp_path: Path) -> None:
    folders = [tmp_path / f"stamp{k}" for k in range(7)]
    for k, f in enumerate(folders):
        f.mkdir()
        os.utime(f, (1000 + k, 1000 + k))
    jit._prune(folders[0])  # the oldest, in use: kept, with the newest KEEP_STAMPS - 1
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(f.name for f in [folders[0], *folders[-(jit.KEEP_STAMPS - 1) :]])


def test_read_only_package_uses_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(jit, "_writable", lambda folder: False)
    monkeypatch.setattr(jit, "_can_create", lambda folder: False)  # no digest folders either
    import numba.core.config

    before = numba.core.config.CACHE_DIR
    try:
        jit.use_writable_cache()
        assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "tracereplay" / "numba")
        assert numba.core.config.CACHE_DIR == str(tmp_path / "tracereplay" / "numba")
    finally:
        numba.core.config.CACHE_DIR = before


def test_repeats_is_a_duplicate_check() -> None:
    rng = np.random.default_rng(0)
    assert not _repeats(np.arange(10), 10)
    assert not _repeats(np.arange(5), 10)
    assert not _repeats(np.zeros(0, dtype=np.int64), 3)
    assert not _repeats(rng.permutation(10), 10)
    assert _repeats(np.array([0, 1, 1, 3]), 4)
    assert _repeats(np.array([0, 2, 1, 3, 0, 5]), 6)  # starts 0, ends n-1, not an arange
    idx = rng.integers(0, 1000, 500)
    assert _repeats(idx, 1000) == (len(np.unique(idx)) < len(idx))


LOAD = """
import os, pipeline.sim.loop as loop
from pipeline.sim.replay import load_loop
from pipeline.sim.scenario import build_scenario
load_loop(build_scenario({'policy': 'vllm'}).engine(), quiet=True)
hits = sum(loop.replay_loop.stats.cache_hits.values())
print(loop.__file__, os.environ.get('NUMBA_CACHE_DIR'), hits)
"""


@pytest.mark.heavy
def test_read_only_install_compiles_once(tmp_path: Path) -> None:
    """A copy of the package on a read-only folder: compiled once into the user cache.

    Heavy (a full compile: a minute on a quiet machine, 7 on a loaded one); the default
    set checks the parts: test_read_only_package_uses_the_user_cache (where the cache
    goes) and the notice tests above (compiled once, then silent)."""
    pkg = tmp_path / "site"
    shutil.copytree(
        Path(pipeline.__file__).parent,
        pkg / "pipeline",
        ignore=shutil.ignore_patterns("*.nbi", "*.nbc", "tracereplay-compiled-*"),
    )
    env = {**os.environ, "PYTHONPATH": str(pkg), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    python = [sys.executable, "-c", LOAD]
    if os.geteuid() == 0:  # root writes anywhere: mount the copy read-only instead
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare to mount a read-only folder")
        p = str(pkg)
        cmd = ["unshare", "-m", "sh", "-c",
               f'mount --bind "{p}" "{p}" && mount -o remount,bind,ro "{p}" && exec "$@"',
               "sh", *python]  # fmt: skip
        probe = subprocess.run([*cmd[:5], "sh", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("no privilege to mount a read-only folder")
    else:
        for d in [pkg, *pkg.rglob("*")]:
            if d.is_dir():
                d.chmod(0o555)
        cmd = python
    try:
        runs = [
            subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
            for _ in range(2)
        ]
    finally:
        for d in [pkg, *pkg.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755)
    for r in runs:
        assert r.returncode == 0, r.stderr
    user_cache = tmp_path / "cache" / "tracereplay" / "numba"
    assert jit.NOTICE in runs[0].stderr
    assert jit.NOTICE not in runs[1].stderr
    loop_py = str(pkg / "pipeline" / "sim" / "loop.py")
    assert runs[0].stdout.split() == [loop_py, "None", "0"]  # the digest folder, no env
    assert runs[1].stdout.split() == [loop_py, "None", "1"]  # loaded, not compiled
    assert list(user_cache.glob(f"{jit._stamp()}/sim/*.nbi"))
    assert not list(pkg.rglob("*.nbi"))
    # a second install of the same sources elsewhere (a reinstall, another clone): loaded
    other = tmp_path / "other"
    shutil.copytree(pkg, other)
    again = subprocess.run(
        python, env={**env, "PYTHONPATH": str(other)}, capture_output=True, text=True, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert jit.NOTICE not in again.stderr
    assert again.stdout.split() == [str(other / "pipeline" / "sim" / "loop.py"), "None", "1"]


def test_the_compiled_sources_are_every_module_numba_compiles() -> None:
    """One list of what the compiled code depends on: every simulator module that imports
    numba (the njit functions and the intrinsics they inline), none that only mentions it;
    editing any of them invalidates the cache (its stamp changes)."""
    sim = Path(pipeline.__file__).parent / "sim"
    names = {str(p.relative_to(sim)) for p in jit.compiled_sources()}
    assert {"loop.py", "state.py", "borrow.py", "prefetch.py", "policies/vllm.py"} <= names
    assert not names & {"replay.py", "scenario.py", "__init__.py"}  # no numba import there
    for path in sim.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imports = [
            n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in tree.body
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in (n.names if isinstance(n, ast.Import) else n.names[:1])
        ]
        uses = any((m or "").split(".")[0] == "numba" for m in imports)
        assert (str(path.relative_to(sim)) in names) == uses, path
    folders = {str(p.parent.relative_to(sim.parent)) for p in jit.compiled_sources()}
    assert folders == set(jit.JIT_FOLDERS)


def test_editing_an_intrinsic_changes_the_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prefetch.py holds no njit function, only an intrinsic the loop inlines: a change
    to it must still count (it once did not)."""
    copy = tmp_path / "pipeline"
    shutil.copytree(Path(pipeline.__file__).parent / "sim", copy / "sim")
    monkeypatch.setattr(jit, "PACKAGE", copy)
    before = jit._stamp()
    path = copy / "sim" / "prefetch.py"
    path.write_text(path.read_text() + "\n# edited\n")
    assert jit._stamp() != before
    replay = copy / "sim" / "replay.py"
    stamp = jit._stamp()
    replay.write_text(replay.read_text() + "\n# edited\n")
    assert jit._stamp() == stamp  # not compiled: no recompile for it
