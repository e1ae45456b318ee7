"""Two reliability counts: concurrent ingests against sequential ones, and SQL writes refused.

1. Concurrent ingests: two ``tracereplay ingest`` processes started together
   on one warehouse, over two gateway logs of 3,000 requests sharing 1,500
   ids, ``--trials`` times; each end state (rows, distinct ids, checksum of
   id, file and lengths) must equal one of the two sequential orders'.
2. SQL: every write attempt of ``tests/report/test_sql_read_only.py`` through
   ``tracereplay sql`` on a copy of a small warehouse; each must exit 1 and
   leave every file under the scratch folder as it was.

Run from the repository root:

    .venv/bin/python bench/concurrency_and_sql.py --trials 10
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _measure import record  # noqa: E402

from tests.gateway_logs import gateway_lines  # noqa: E402
from tests.test_lock import requests_state  # noqa: E402


def ingest(wh: Path, log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "ingest", str(log), "--warehouse", str(wh), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def concurrent_trials(work: Path, trials: int) -> tuple[int, int, float]:
    """(trials, trials equal to a sequential order, median wall s of a concurrent pair)."""
    a, b = work / "a.jsonl", work / "b.jsonl"
    a.write_text(gateway_lines(range(0, 3000)))
    b.write_text(gateway_lines(range(1500, 4500)))
    sequential = []
    for order in ((a, b), (b, a)):
        wh = work / f"seq-{order[0].stem}"
        for f in order:
            assert ingest(wh, f).wait() == 0
        sequential.append(requests_state(wh))
    same, walls = 0, []
    for i in range(trials):
        wh = work / f"concurrent-{i}"
        t0 = time.perf_counter()
        procs = [ingest(wh, f) for f in (a, b)]
        codes = [p.wait() for p in procs]
        walls.append(time.perf_counter() - t0)
        same += int(codes == [0, 0] and requests_state(wh) in sequential)
        shutil.rmtree(wh)
    return trials, same, sorted(walls)[len(walls) // 2]


def sql_attempts(work: Path) -> tuple[int, int]:
    """(attempts, refused with exit 1 and nothing written)."""
    from tests.report.conftest import build
    from tests.report.test_sql_read_only import ATTEMPTS, _snapshot

    wh = work / "wh"
    build(wh).init()
    shutil.copy(next(wh.glob("requests/*/src-*.parquet")), work / "outside.parquet")
    cwd = work / "cwd"
    cwd.mkdir()
    refused = 0
    for attempt in ATTEMPTS:
        before = _snapshot(work)
        text = attempt.format(wh=wh, tmp=tempfile.gettempdir())
        r = subprocess.run(
            [sys.executable, "-m", "pipeline", "sql", "--warehouse", str(wh), "--", text],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        ok = r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
        refused += int(ok and _snapshot(work) == before)
    return len(ATTEMPTS), refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        n, same, wall = concurrent_trials(Path(tmp), args.trials)
    with tempfile.TemporaryDirectory() as tmp:
        attempts, refused = sql_attempts(Path(tmp))
    body = (
        f"Concurrent ingests: {n} trials of two `tracereplay ingest` processes started "
        "together on one warehouse (two gateway logs of 3,000 requests sharing 1,500 ids); "
        f"{same} of {n} ended exactly as one of the two sequential orders (4,500 rows, "
        f"4,500 distinct ids, same checksum); median wall time of a pair {wall:.1f} s (the "
        "second waits for the warehouse lock).\n\n"
        f"SQL: {refused} of {attempts} write attempts through `tracereplay sql` refused "
        "(exit 1, one line) with no file created or changed under the scratch folder "
        "(the corpus of tests/report/test_sql_read_only.py: comment tricks, EXPLAIN "
        "ANALYZE, CTEs, COPY, EXPORT, ATTACH, INSTALL/LOAD, SET, PRAGMA, CALL, table "
        "functions, multiple statements, reads outside the warehouse)."
    )
    print(body)
    if not args.no_record:
        record(
            "Concurrent ingests and read-only SQL",
            f".venv/bin/python bench/concurrency_and_sql.py --trials {args.trials}",
            body,
        )
    if same != n or refused != attempts:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
