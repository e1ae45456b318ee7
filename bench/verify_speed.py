"""What checking the warehouse on read costs: a 1M-request warehouse (one requests file
of ~1M rows, ingested from the generated gateway log) and a warehouse of 500 small files.

Run from the repository root:

    .venv/bin/python bench/verify_speed.py            # prints, writes bench/RESULTS.md
    .venv/bin/python bench/verify_speed.py --quick    # 200k requests, prints only
    .venv/bin/python bench/verify_speed.py --against COMMIT   # the baseline's code (default:
                                                      # the last commit without the checks)

Figures, each the median of 3 fresh processes, run interleaved so that they see the
same machine load:

- ``verify``: ``pipeline.integrity.verify`` of the big requests file (page checksums,
  footer, contract types and value ranges), beside ``pq.read_table`` of the same file
  with no checks (the baseline: what any reader pays to read it once);
- ``sql, first``: ``tracereplay sql "SELECT count(*) FROM requests"`` on a warehouse
  whose verdicts are not yet kept (every file verified), and ``sql, kept`` once they
  are (each file only stat-ed), beside the same command of the code before the checks
  (``--against``) on the same warehouse.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.gateway_logs
sys.path.insert(0, str(ROOT / "bench"))

from _measure import child, record  # noqa: E402

OUT = ROOT / "bench" / "out"

VERIFY = """
from pathlib import Path
from pipeline.contracts import CONTRACTS
from pipeline.integrity import verify
t = time.perf_counter()
problem = verify(Path({path!r}), CONTRACTS["requests"])
assert problem is None, problem
out = {{"s": time.perf_counter() - t}}
"""
READ = """
import pyarrow.parquet as pq
t = time.perf_counter()
pq.read_table({path!r})
out = {{"s": time.perf_counter() - t}}
"""
SQL = """
import subprocess, sys
from pathlib import Path
wh = Path({wh!r})
if {fresh!r}:
    (wh / ".verified.json").unlink(missing_ok=True)
t = time.perf_counter()
r = subprocess.run([sys.executable, "-m", "pipeline", "sql", "--warehouse", str(wh),
                    "--format", "csv", "SELECT count(*) AS n FROM requests"],
                   capture_output=True, text=True, check=True)
out = {{"s": time.perf_counter() - t, "n": int(r.stdout.split()[1])}}
"""
BEFORE = "4bcdbde"  # the last commit whose readers checked nothing


def checkout_with_sql(commit: str) -> str:
    """That commit's ``pipeline`` and ``sql`` folders in a temporary folder."""
    folder = tempfile.mkdtemp(prefix="bench-at-")
    archive = subprocess.run(
        ["git", "archive", commit, "pipeline", "sql"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def build_big(n: int, base: Path) -> Path:
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.warehouse import Warehouse
    from tests.gateway_logs import write_gateway_log

    log = base / "big.jsonl"
    write_gateway_log(log, n, seed=1, bad_fraction=0.0, compact=True)
    wh = base / "big-wh"
    ingest_logs([str(log)], Warehouse(wh), IngestOptions(quiet=True))
    log.unlink()
    return wh


def build_many(files: int, base: Path) -> Path:
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.warehouse import Warehouse
    from tests.gateway_logs import write_gateway_log

    logs = base / "many-logs"
    logs.mkdir()
    for i in range(files):
        write_gateway_log(logs / f"{i:04d}.jsonl", 50, seed=i, bad_fraction=0.0, compact=True)
    wh = base / "many-wh"
    ingest_logs([str(logs)], Warehouse(wh), IngestOptions(quiet=True))
    return wh


def interleaved(
    codes: dict[str, str | tuple[str, str]], repeats: int = 3
) -> dict[str, dict[str, float]]:
    """Each code (or (code, pythonpath)) run ``repeats`` times in turn; the medians."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in codes}
    for _ in range(repeats):
        for name, code in codes.items():
            text, path = code if isinstance(code, tuple) else (code, None)
            runs[name].append(child(text, repeats=1, pythonpath=path))
    return {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k requests, 100 files; print only")
    ap.add_argument("--against", default=BEFORE, help="the baseline's commit")
    args = ap.parse_args()
    before = checkout_with_sql(args.against)
    n, files = (200_000, 100) if args.quick else (1_000_000, 500)
    import pyarrow.parquet as pq

    OUT.mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="verify-", dir=OUT))
    try:
        big = build_big(n, base)
        path = max((big / "requests").glob("*/src-*.parquet"), key=lambda p: p.stat().st_size)
        rows = pq.ParquetFile(path).metadata.num_rows
        mb = path.stat().st_size / 1e6
        many = build_many(files, base)
        one = interleaved({"verify": VERIFY.format(path=str(path)),
                           "read": READ.format(path=str(path))})  # fmt: skip
        lines = [
            f"| verify the biggest requests file ({rows:,} rows, {mb:.0f} MB) | "
            f"{one['verify']['s']:.2f} | `pq.read_table` of it: {one['read']['s']:.2f} | "
            f"{one['verify']['s'] / one['read']['s']:.2f}x |"
        ]
        for label, wh, count in (
            (f"`sql` count, {rows:,}-row warehouse", big, rows),
            (f"`sql` count, {files} small files", many, None),
        ):
            got = interleaved({
                "first": SQL.format(wh=str(wh), fresh=True),
                "kept": SQL.format(wh=str(wh), fresh=False),
                "before": (SQL.format(wh=str(wh), fresh=False), before),
            })  # fmt: skip
            assert count is None or got["first"]["n"] == count
            assert got["first"]["n"] == got["kept"]["n"] == got["before"]["n"]
            b = got["before"]["s"]
            lines.append(
                f"| {label}: verdicts not kept / kept | {got['first']['s']:.2f} / "
                f"{got['kept']['s']:.2f} | the same command at {args.against}: {b:.2f} | "
                f"{got['first']['s'] / b:.2f}x / {got['kept']['s'] / b:.2f}x |"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(before, ignore_errors=True)
    body = "| what | s (median of 3) | baseline s | ratio |\n|---|---:|---|---:|\n" + "\n".join(
        lines
    )
    print(body)
    if not args.quick:
        record(
            "Warehouse checks on read",
            "python bench/verify_speed.py",
            body
            + "\n\nVerified once per file: the verdict is kept in `<warehouse>/.verified.json` "
            "(by size, mtime, ctime and inode), so the second command only stats each file. "
            "A read-only warehouse keeps no verdicts and verifies on every command.",
        )


if __name__ == "__main__":
    main()
