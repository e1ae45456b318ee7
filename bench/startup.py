"""Start-up: the command line's fixed costs, against DuckDB's, in fresh processes.

Figures (wall seconds; medians of 5 fresh processes unless said):
- ``tracereplay --help``;
- ``tracereplay sql "select 1"`` on an empty warehouse, against the baseline
  ``duckdb -c "select 1"`` (the DuckDB shell) or, without the shell, Python's
  ``import duckdb; duckdb.sql("select 1")``; and the floor of what the command
  must import (click and duckdb), for the record;
- a whole ``tracereplay replay`` process of the same 1,000 requests, the numba
  cache warm (one untimed run first), against the baseline
  ``python -c "import polars"``, interleaved;
- a replay of 1,000 requests in a warm process (``replay()`` again and again
  after the compiled loop is loaded; median of 5 calls);
- the first replay of a second install of the same sources (the package copied to a
  temporary folder, as a reinstall or a second clone has it): it loads what the first
  compiled (``pipeline/jit.py``'s digest folders); one run, with or without the notice;
- the first replay after a fresh install: ``tracereplay replay`` of the same
  1,000 requests with an empty numba cache (a temporary ``NUMBA_CACHE_DIR``):
  wall seconds, whether the compile notice was printed, and the second run's
  wall seconds (loaded from that cache). One run each: the compile takes a
  minute.

Run from the repository root:

    .venv/bin/python bench/startup.py            # all, writes bench/RESULTS.md
    .venv/bin/python bench/startup.py --no-cold  # the same without the fresh-install compile

Targets (issue 26): --help <= 0.1 s; sql "select 1" <= 0.3 s; a whole replay
process of 1k requests <= 2x ``python -c "import polars"``. Issue 14's still hold:
warm replay of 1k requests <= 1 s; the first replay compiles with a visible
notice, once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import child, record  # noqa: E402

BIN = Path(sys.executable).parent
TRACEREPLAY = str(BIN / "tracereplay")
REPEATS = 5
NOTICE = "compiling the simulator once"

WARM = """
import shutil
from pathlib import Path
from pipeline.sim.replay import load_loop, replay
from pipeline.sim.scenario import build_scenario
sc = build_scenario({{"policy": "vllm"}})
load_loop(sc.engine(), quiet=True)
times = []
for k in range(5):
    t = time.perf_counter()
    replay(Path({wh!r}), [sc], quiet=True, run_id=f"bench-warm-{{k}}")
    times.append(time.perf_counter() - t)
for k in range(5):
    for table in ("sim_requests", "sim_steps", "scenarios"):
        shutil.rmtree(Path({wh!r}) / table / f"run_id=bench-warm-{{k}}", ignore_errors=True)
    (Path({wh!r}) / "runs" / f"bench-warm-{{k}}.parquet").unlink(missing_ok=True)
times.sort()
out = {{"replay_s": times[2]}}
"""


def wall(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, str]:
    """Wall seconds of one run of ``cmd`` (must succeed) and its stderr."""
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")
    return took, r.stderr


def median_wall(cmds: dict[str, list[str]]) -> dict[str, float]:
    """Median wall seconds of each command over REPEATS rounds, the commands interleaved."""
    runs: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(REPEATS):
        for name, cmd in cmds.items():
            runs[name].append(wall(cmd)[0])
    return {name: statistics.median(v) for name, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-install compile")
    args = parser.parse_args()
    # as a user's Python does, the commands keep their bytecode (a shell that forbids it
    # makes every command compile the package's sources again, about 0.1 s)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    from sim_speed import make_warehouse

    from pipeline.warehouse import Warehouse

    tmp = Path(tempfile.mkdtemp(prefix="tracereplay-startup-"))
    try:
        empty = tmp / "empty_wh"
        Warehouse(empty).init()
        shell = shutil.which("duckdb")
        baseline_name = "duckdb shell" if shell else "python duckdb"
        baseline = (
            [shell, "-c", "select 1"]
            if shell
            else [sys.executable, "-c", "import duckdb; duckdb.sql('select 1').fetchall()"]
        )
        floor = "import click, duckdb; duckdb.sql('select 1').fetchall()"
        wh = make_warehouse(1000, 16.8)
        replay_cmd = [TRACEREPLAY, "replay", "--warehouse", str(wh), "--json"]
        wall(replay_cmd)  # the numba cache, warm
        med = median_wall(
            {
                "python": [sys.executable, "-c", "pass"],
                "help": [TRACEREPLAY, "--help"],
                "sql": [TRACEREPLAY, "sql", "--warehouse", str(empty), "select 1"],
                "baseline": baseline,
                "floor": [sys.executable, "-c", floor],
                "polars": [sys.executable, "-c", "import polars"],
                "replay": replay_cmd,
            }
        )
        print(
            f"python -c pass {med['python']:.2f} s; tracereplay --help {med['help']:.2f} s; "
            f"sql 'select 1' {med['sql']:.2f} s vs {baseline_name} {med['baseline']:.2f} s "
            f"({med['sql'] / med['baseline']:.1f}x; imports it needs: {med['floor']:.2f} s)",
            flush=True,
        )
        print(
            f"tracereplay replay of 1,000 requests (whole process, numba cache warm) "
            f"{med['replay']:.2f} s vs python -c 'import polars' {med['polars']:.2f} s "
            f"({med['replay'] / med['polars']:.1f}x)",
            flush=True,
        )
        warm = child(WARM.format(wh=str(wh)), repeats=1)
        print(f"replay of 1,000 requests in a warm process: {warm['replay_s']:.2f} s", flush=True)
        # a second install of the same sources elsewhere (a reinstall, another clone or
        # virtualenv): its first replay loads what this one compiled (pipeline/jit.py)
        clone = tmp / "clone"
        shutil.copytree(
            ROOT / "pipeline",
            clone / "pipeline",
            ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"),
        )
        clone_env = {**os.environ, "PYTHONPATH": str(clone)}
        clone_env.pop("NUMBA_CACHE_DIR", None)
        clone_cmd = [sys.executable, "-m", "pipeline", "replay", "--warehouse", str(wh), "--json"]
        reinstall, err0 = wall(clone_cmd, clone_env, cwd=tmp)  # (not ROOT: -m looks there)
        print(
            f"first replay of a copy of the package elsewhere: {reinstall:.1f} s (notice "
            f"printed: {NOTICE in err0})",
            flush=True,
        )
        cold: dict[str, object] = {}
        if not args.no_cold:
            env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp / "numba")}
            cmd = [TRACEREPLAY, "replay", "--warehouse", str(wh), "--json"]
            first, err1 = wall(cmd, env)
            second, err2 = wall(cmd, env)
            cold = {"first": first, "notice": NOTICE in err1, "second": second,
                    "again": NOTICE in err2}  # fmt: skip
            print(
                f"first replay with an empty numba cache: {first:.1f} s (notice printed: "
                f"{cold['notice']}); second: {second:.1f} s (notice again: {cold['again']})",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"Wall seconds, medians of {REPEATS} fresh processes (the commands interleaved).",
        "",
        "| what | s | target | baseline |",
        "|---|---:|---:|---|",
        f"| `python -c pass` | {med['python']:.2f} | | |",
        f"| `tracereplay --help` | {med['help']:.2f} | 0.1 | |",
        f'| `tracereplay sql "select 1"` | {med["sql"]:.2f} | 0.3 | {baseline_name} '
        f"{med['baseline']:.2f} s ({med['sql'] / med['baseline']:.1f}x) |",
        f"| imports `sql` needs (click, duckdb) | {med['floor']:.2f} | | |",
        f'| `python -c "import polars"` | {med["polars"]:.2f} | | |',
        f"| `tracereplay replay`, 1,000 requests, whole process, numba cache warm | "
        f"{med['replay']:.2f} | 2x polars | {med['replay'] / med['polars']:.1f}x "
        "`import polars` |",
        f"| replay of 1,000 requests, warm process (median of 5 calls) | "
        f"{warm['replay_s']:.2f} | 1.0 | |",
    ]
    lines.append(
        f"| first replay of a copy of the package elsewhere (a reinstall, a second clone), "
        f"1 run | {reinstall:.1f} | 15 | notice: {'yes' if NOTICE in err0 else 'no'} |"
    )
    if cold:
        lines += [
            f"| first `tracereplay replay` (1,000 requests), empty numba cache, 1 run | "
            f"{cold['first']:.1f} | notice: {'yes' if cold['notice'] else 'NO'} | |",
            f"| second `tracereplay replay`, same cache, 1 run | {cold['second']:.1f} | "
            f"notice again: {'yes' if cold['again'] else 'no'} | |",
        ]
    else:
        lines += ["", "The first replay after a fresh install: not measured (`--no-cold`)."]
    command = "python bench/startup.py" + (" --no-cold" if args.no_cold else "")
    record("Start-up", command, "\n".join(lines))


if __name__ == "__main__":
    main()
