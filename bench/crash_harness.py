"""Crash safety: kill -9 ingest, replay, sweep, capacity and report at random moments.

Each trial copies a prepared warehouse, starts one command on it as its own
process, kills it with SIGKILL after a random delay (up to the command's clean
wall time), and then checks:

1. no partial run is visible through the views: every run that
   ``sim_requests``, ``sim_steps``, ``scenarios`` or ``capacity_search`` shows
   has all of its scenarios in ``sim_requests`` and a capacity run has its
   search rows;
2. ``tracereplay sql`` works;
3. no worker process of the killed command is left;
4. the same command, run again, succeeds and leaves no temporary file and no
   uncommitted run behind (the next command cleans up);
5. its result is identical to the same command's on a clean copy: row counts
   and an order-independent checksum (rows sorted, then hashed) of what it
   wrote, run ids left out.

Run from the repository root:

    .venv/bin/python bench/crash_harness.py --trials 25     # prints, writes bench/RESULTS.md
    .venv/bin/python bench/crash_harness.py --trials 5 --no-record

``tests/test_crash_safety.py`` runs one trial per command.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.warehouse import Warehouse  # noqa: E402
from tests.gateway_logs import gateway_lines  # noqa: E402

COMMANDS = ("ingest", "replay", "sweep", "capacity", "report")
RUN_TABLES = ("sim_requests", "sim_steps", "scenarios", "capacity_search")

SCENARIO = 'name = "prod"\npolicy = "vllm"\nmax_num_seqs = 32\n'
GRID = """name = "grid"
[base]
policy = "vllm"
[axes]
concurrency = [4, 8, 16, 32]
"""
CAPACITY = """[base]
policy = "vllm"
name = "cap"
[slo]
ttft_p99 = "300ms"
[search.concurrency]
max = 64
[search.rate]
tolerance = 0.05
"""


@dataclass
class Fixture:
    work: Path
    logs: list[Path]
    files: dict[str, Path]
    ingested: Path  # a warehouse with the logs ingested and one replay run
    clean: dict[str, Any] = field(default_factory=dict)  # command -> state of a clean run
    wall_s: dict[str, float] = field(default_factory=dict)  # command -> clean wall seconds


@dataclass
class Trial:
    command: str
    delay_s: float
    finished_before_kill: bool
    partial_runs: list[str]
    sql_ok: bool
    orphans: int
    stale_after_kill: int
    stale_after_rerun: int
    rerun_ok: bool
    identical: bool

    @property
    def ok(self) -> bool:
        return (
            not self.partial_runs
            and self.sql_ok
            and self.orphans == 0
            and self.stale_after_rerun == 0
            and self.rerun_ok
            and self.identical
        )


def tracereplay(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def argv(command: str, fx: Fixture, wh: Path) -> list[str]:
    w = ["--warehouse", str(wh)]
    if command == "ingest":
        return tracereplay("ingest", *map(str, fx.logs), *w, "--quiet")
    if command == "replay":
        return tracereplay("replay", "--scenario", str(fx.files["scenario"]), *w, "--quiet")
    if command == "sweep":
        return tracereplay("sweep", str(fx.files["grid"]), "--jobs", "2", *w, "--quiet")
    if command == "capacity":
        return tracereplay("capacity", str(fx.files["capacity"]), *w, "--quiet")
    if command == "report":
        return tracereplay("report", *w)
    raise ValueError(command)


def prepare(work: Path, requests_per_file: int = 1500) -> Fixture:
    """Logs (four gateway files over two days, some ids in two files), the scenario,
    grid and capacity files, an ingested warehouse, and each command's clean result."""
    work.mkdir(parents=True, exist_ok=True)
    logs = []
    n = requests_per_file
    for k in range(4):
        path = work / f"log{k}.jsonl"
        ids = range(k * n - (n // 5 if k else 0), (k + 1) * n)  # a fifth shared with the last
        path.write_text(gateway_lines(ids, day=k // 2, spacing_s=0.4, seed=k))
        logs.append(path)
    files = {}
    for name, text in (("scenario", SCENARIO), ("grid", GRID), ("capacity", CAPACITY)):
        files[name] = work / f"{name}.toml"
        files[name].write_text(text)
    fx = Fixture(work, logs, files, work / "ingested")
    # the starting warehouse of the other commands, and the clean ingest
    t0 = time.perf_counter()
    _run(argv("ingest", fx, fx.ingested))
    fx.wall_s["ingest"] = time.perf_counter() - t0
    fx.clean["ingest"] = state(fx.ingested, "ingest")
    _run(argv("replay", fx, fx.ingested))
    for command in COMMANDS[1:]:
        wh = start(fx, command, work / f"clean-{command}")
        t0 = time.perf_counter()
        _run(argv(command, fx, wh))
        fx.wall_s[command] = time.perf_counter() - t0
        fx.clean[command] = state(wh, command)
    return fx


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed: {r.stderr.strip()[-1500:]}")


def start(fx: Fixture, command: str, wh: Path) -> Path:
    """The warehouse a command starts from: empty for ingest, else the ingested one."""
    if wh.exists():
        shutil.rmtree(wh)
    if command != "ingest":
        shutil.copytree(fx.ingested, wh, ignore=shutil.ignore_patterns(".lock"))
    return wh


def _digest(rows: list[tuple[Any, ...]]) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def state(wh: Path, command: str) -> Any:
    """What ``command`` produced, run ids left out: (table, rows, checksum) triples."""
    con = Warehouse(wh).connect()
    try:
        if command == "ingest":
            out = []
            for table, sql in (
                ("requests", "SELECT * FROM requests"),
                ("quarantine", "SELECT * EXCLUDE (run_id) FROM quarantine"),
            ):
                got = con.execute(f"{sql} ORDER BY ALL").fetchall()
                out.append((table, len(got), _digest(got)))
            return out
        if command == "report":
            reports = sorted((wh / "reports").rglob("*.html"))
            return [p.relative_to(wh).as_posix() for p in reports]
        run = con.execute(
            "SELECT max(run_id) FROM runs WHERE command = ? AND status = 'ok'", [command]
        ).fetchone()
        run_id = run[0] if run else None
        out = []
        queries = {
            "sim_requests": "SELECT * EXCLUDE (run_id) FROM sim_requests",
            "sim_steps": "SELECT * EXCLUDE (run_id) FROM sim_steps",
            # the summary holds wall-clock figures; the configuration does not
            "scenarios": "SELECT scenario, policy, config_json FROM scenarios",
            "capacity_search": "SELECT * EXCLUDE (run_id) FROM capacity_search",
        }
        for table, sql in queries.items():
            got = con.execute(f"{sql} WHERE run_id = ? ORDER BY ALL", [run_id]).fetchall()
            out.append((table, len(got), _digest(got)))
        return out
    finally:
        con.close()


def partial_runs(wh: Path) -> list[str]:
    """Runs the views show that are not whole."""
    con = Warehouse(wh).connect()
    try:
        bad = con.execute(
            """
            WITH visible AS (
                SELECT run_id FROM sim_requests UNION SELECT run_id FROM sim_steps
                UNION SELECT run_id FROM scenarios UNION SELECT run_id FROM capacity_search),
            expected AS (SELECT run_id, count(*) AS n FROM scenarios GROUP BY run_id),
            landed AS (SELECT run_id, count(DISTINCT scenario) AS n FROM sim_requests
                       GROUP BY run_id),
            kind AS (SELECT run_id, command FROM runs)
            SELECT v.run_id
            FROM visible v
            LEFT JOIN expected e USING (run_id)
            LEFT JOIN landed l USING (run_id)
            LEFT JOIN kind k USING (run_id)
            WHERE k.command IS NULL
               OR e.n IS NULL
               OR (k.command <> 'capacity' AND coalesce(l.n, 0) <> e.n)
               OR (k.command = 'capacity'
                   AND v.run_id NOT IN (SELECT run_id FROM capacity_search))
            ORDER BY 1
            """
        ).fetchall()
        return [r[0] for r in bad]
    finally:
        con.close()


def stale(wh: Path) -> int:
    """Temporary files, and run directories without a runs row."""
    committed = {p.stem for p in (wh / "runs").glob("*.parquet")}
    n = sum(1 for _ in wh.rglob(".*.tmp-*"))
    for table in RUN_TABLES:
        for d in (wh / table).glob("run_id=*"):
            if d.name != "run_id=_empty" and d.name.split("=", 1)[1] not in committed:
                n += 1
    return n


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p and child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def trial(fx: Fixture, command: str, delay_s: float, wh: Path) -> Trial:
    start(fx, command, wh)
    proc = subprocess.Popen(
        argv(command, fx, wh), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + delay_s
    kids: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        kids |= _descendants(proc.pid)
        time.sleep(0.05)
    finished = proc.poll() is not None
    if not finished:
        kids |= _descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()
    t_end = time.monotonic() + 5
    while any(_alive(k) for k in kids) and time.monotonic() < t_end:
        time.sleep(0.1)
    orphans = sum(1 for k in kids if _alive(k))
    for k in kids:  # never leave them running, whatever the verdict
        if _alive(k):
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
    partial = partial_runs(wh)
    sql = subprocess.run(
        tracereplay("sql", "SELECT count(*) FROM requests", "--warehouse", str(wh)),
        capture_output=True,
    )
    stale_after_kill = stale(wh)
    rerun = subprocess.run(argv(command, fx, wh), capture_output=True, text=True)
    return Trial(
        command=command,
        delay_s=delay_s,
        finished_before_kill=finished,
        partial_runs=partial,
        sql_ok=sql.returncode == 0,
        orphans=orphans,
        stale_after_kill=stale_after_kill,
        stale_after_rerun=stale(wh),
        rerun_ok=rerun.returncode == 0,
        identical=rerun.returncode == 0 and state(wh, command) == fx.clean[command],
    )


def run_trials(fx: Fixture, trials: int, seed: int = 0) -> list[Trial]:
    """``trials`` kills, the commands in turn, each at a random moment of its clean run."""
    rng = random.Random(seed)
    out = []
    for i in range(trials):
        command = COMMANDS[i % len(COMMANDS)]
        # most of a short command's time is interpreter start and imports: aim at the rest
        wall = fx.wall_s[command]
        delay = rng.uniform(0.3 * wall, 1.05 * wall)
        for _ in range(4):  # a command that ended before its kill is tried again, earlier
            t = trial(fx, command, delay, fx.work / f"trial-{i}")
            shutil.rmtree(fx.work / f"trial-{i}", ignore_errors=True)
            if not t.finished_before_kill:
                break
            delay *= rng.uniform(0.3, 0.9)
        out.append(t)
    return out


def summary(trials: list[Trial]) -> str:
    lines = [
        "| command | trials | killed mid-run | partial runs visible | sql failed | orphan "
        "workers | stale files after the kill | stale after the rerun | differing reruns |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for command in (*COMMANDS, "all"):
        ts = [t for t in trials if command in (t.command, "all")]
        lines.append(
            f"| {command} | {len(ts)} | {sum(not t.finished_before_kill for t in ts)} | "
            f"{sum(bool(t.partial_runs) for t in ts)} | {sum(not t.sql_ok for t in ts)} | "
            f"{sum(t.orphans for t in ts)} | {sum(t.stale_after_kill for t in ts)} | "
            f"{sum(t.stale_after_rerun for t in ts)} | "
            f"{sum(not (t.rerun_ok and t.identical) for t in ts)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "crash")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    t0 = time.perf_counter()
    fx = prepare(args.work)
    trials = run_trials(fx, args.trials, args.seed)
    table = summary(trials)
    walls = ", ".join(f"{c} {fx.wall_s[c]:.1f} s" for c in COMMANDS)
    body = (
        f"{len(trials)} kill -9 trials (seed {args.seed}), the five commands in turn, each "
        f"killed after a random delay of 30% to 105% of its clean wall time ({walls}; "
        "a command that ended first is run again with a shorter delay, up to 4 times), "
        "on 4 gateway "
        "logs of 1,500 requests (2 days, a fifth of the ids in two files); the sweep has "
        f"4 scenarios on 2 worker processes. Harness wall time "
        f"{time.perf_counter() - t0:.0f} s.\n\n{table}\n\n"
        "Stale files after the kill are what the killed command left (temporary files, "
        "files of an uncommitted run): invisible in the views, and removed by the next "
        "command. A rerun is identical when the row counts and the checksum of every row "
        "it wrote (run ids left out) equal a clean run's."
    )
    print(body)
    if not args.no_record:
        sys.path.insert(0, str(ROOT / "bench"))
        from _measure import record

        record(
            "Crash safety (kill -9)",
            f".venv/bin/python bench/crash_harness.py --trials {args.trials}",
            body,
        )
    if not all(t.ok for t in trials):
        for t in trials:
            if not t.ok:
                print("FAILED:", t, file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
