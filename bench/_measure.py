"""Helpers for benchmarks: run a function in a fresh process, report wall time and peak RSS."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

# Peak resident set of the running process, in MB, as a Python expression for the
# code the benchmarks run in fresh interpreters. Not ``ru_maxrss``: Linux carries a
# process's high-water mark across exec, so a child started by a bench that has a
# big warehouse in memory reports the bench's own peak. ``VmHWM`` is the new
# program's own.
PEAK_RSS_MB = (
    "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]) / 1024"
)


def plain_env() -> dict[str, str]:
    """This environment without the allocator setting tracereplay makes for polars when
    imported (``pipeline/allocator.py``), which child processes inherit: for baselines
    that time polars as it comes."""
    from pipeline import allocator

    env = dict(os.environ)
    conf = allocator.inherited(env)
    env.pop(allocator.MARK, None)
    if conf:
        env[allocator.VARIABLE] = conf
    else:
        env.pop(allocator.VARIABLE, None)
    return env


def child(
    code: str, repeats: int = 3, pythonpath: str | None = None, *, plain: bool = False
) -> dict[str, float]:
    """Run ``code`` (which must print one JSON object) in fresh interpreters.

    Returns the medians of every numeric field over ``repeats`` runs, plus
    ``peak_rss_mb`` of each run's whole process (max over runs). With
    ``pythonpath``, the interpreter runs in that folder with it first on the path
    (to time another version of the package). ``plain``: with ``plain_env()``.
    """
    prog = (
        "import json, resource, time\n"
        "t0 = time.perf_counter()\n"
        f"{code}\n"
        "out['wall_s'] = out.get('wall_s', time.perf_counter() - t0)\n"
        f"out['peak_rss_mb'] = {PEAK_RSS_MB}\n"
        "print(json.dumps(out))\n"
    )
    runs = []
    for _ in range(repeats):
        env = plain_env() if plain else dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        r = subprocess.run(
            [sys.executable, "-c", prog], capture_output=True, text=True, env=env, cwd=pythonpath
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(float(x[k]) for x in runs) for k in runs[0] if _num(runs[0][k])}
    med["peak_rss_mb"] = max(float(x["peak_rss_mb"]) for x in runs)
    return med


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# Hand-written notes of a section start at this line; ``record`` keeps them (and the
# line) after the figures it writes, so re-running a bench does not lose them.
NOTES = "Notes by hand (the bench keeps them when it rewrites this section):"


def record(section: str, command: str, body: str) -> None:
    """Replace (or add) ``## section`` in bench/RESULTS.md with the figures and their command.

    Whatever the old section held from a ``NOTES`` line on is kept after the new figures.
    """
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    block = f"## {section}\n\nCommand: `{command}` ({stamp}, 2-core machine)\n\n{body.strip()}\n"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    old = pattern.search(text)
    if old is None:
        text = text + "\n" + block
    else:
        at = old.group(0).find(NOTES)
        if at >= 0:
            block += "\n" + old.group(0)[at:].rstrip() + "\n"
        text = text[: old.start()] + block + "\n" + text[old.end() :]
    RESULTS.write_text(text.rstrip() + "\n")


def this_command() -> str:
    """The command that runs this bench as it was run (for ``record``)."""
    return " ".join([".venv/bin/python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def checkout(commit: str, prefix: str = "bench-at-") -> str:
    """That commit's ``pipeline`` package in a temporary folder (``git archive``), to time
    it with ``child(..., pythonpath=...)``."""
    folder = tempfile.mkdtemp(prefix=prefix)
    archive = subprocess.run(
        ["git", "archive", commit, "pipeline"],
        cwd=RESULTS.parents[1],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


# Code for a child process: ``prompt`` and ``output`` of {n} requests, Azure conversation
# lengths drawn with replacement from the trace at {azure!r} by ``rng`` (log-normal lengths
# when the trace is not there). Format it with n and azure; it needs ``np`` and ``rng``.
AZURE_LENGTHS = """
azure = Path({azure!r})
if azure.is_file():
    import polars as pl
    df = pl.read_csv(azure)
    idx = rng.integers(0, len(df), {n})
    prompt = df["ContextTokens"].to_numpy()[idx].astype(np.int64)
    output = df["GeneratedTokens"].to_numpy()[idx].astype(np.int64)
else:
    prompt = np.clip(rng.lognormal(6.5, 1.0, {n}), 1, 8000).astype(np.int64)
    output = np.clip(rng.lognormal(5.0, 1.0, {n}), 1, 2000).astype(np.int64)
"""
