"""Ingest speed and memory: a generated gateway log (~350 bytes a line) of 1M (clean and
1% bad) and 5M records, beside a plain polars NDJSON read of the same file, and every
real public trace.

Run from the repository root:

    .venv/bin/python bench/ingest_speed.py            # all figures, writes bench/RESULTS.md
    .venv/bin/python bench/ingest_speed.py --quick    # 1M only, prints
    .venv/bin/python bench/ingest_speed.py --quick --against f6ad365  # and that commit's ingest

Each figure is the median of 3 runs in fresh processes, ingest and the polars read
interleaved (ingest, read, ingest, read, ...) so that both see the same machine load;
CPU s is user + system time of the process (all threads); peak RSS is the max.
Targets: 1M clean <= 2 s and <= 2.5x the polars read in the same run (issue 14);
<= 1 GB; memory flat from 1M to 5M.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.gateway_logs
sys.path.insert(0, str(ROOT / "bench"))

from _measure import checkout, child, record  # noqa: E402

OUT = ROOT / "bench" / "out"
TRACES_RAW = ROOT.parent / "shared" / "traces_raw"

CPU = "r = resource.getrusage(resource.RUSAGE_SELF); cpu0 = r.ru_utime + r.ru_stime"
CPU_END = (
    "r = resource.getrusage(resource.RUSAGE_SELF); out['cpu_s'] = r.ru_utime + r.ru_stime - cpu0"
)

INGEST = """
import shutil, tempfile
from pathlib import Path
try:  # the allocator setting ``tracereplay ingest`` makes (older versions: none)
    from pipeline.allocator import configure
    configure("ingest")
except ImportError:
    pass
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse
wh = Path(tempfile.mkdtemp(dir={out!r}))
{cpu}
t = time.perf_counter()
r = ingest_logs([{path!r}], Warehouse(wh), IngestOptions(quiet=True))
wall = time.perf_counter() - t
d = r.to_dict()
out = {{"wall_s": wall, "rows_read": d["rows_read"], "rows_kept": d["rows_kept"],
        "rows_quarantined": d["rows_quarantined"], "rows_duplicate": d["rows_duplicate"]}}
{cpu_end}
shutil.rmtree(wh)
"""

SCAN = """
import polars as pl
{cpu}
t = time.perf_counter()
n = pl.scan_ndjson({path!r}).collect().height
out = {{"wall_s": time.perf_counter() - t, "rows": n}}
{cpu_end}
"""


def interleaved(
    codes: dict[str, str], repeats: int, paths: dict[str, str] | None = None
) -> dict[str, dict[str, float]]:
    """Medians of ``repeats`` fresh-process runs of each code, run in turn (a, b, a, b, ...).

    ``paths`` names the package folder a code runs against (default: this checkout).
    Each runs without the allocator setting this process inherited from importing the
    package (``_measure.plain_env``): the polars read as polars comes, each version of
    the package with the setting it makes itself.
    """
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in codes}
    for _ in range(repeats):
        for name, code in codes.items():
            runs[name].append(child(code, 1, (paths or {}).get(name), plain=True))
    out = {}
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        med["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rs)
        med["walls"] = rs  # type: ignore[assignment]
        out[name] = med
    return out


def ensure_log(n: int, bad_fraction: float, suffix: str = "") -> Path:
    """The generated gateway log of n records (kept in bench/out; ``suffix``: ".zst", ".gz")."""
    from tests.gateway_logs import write_gateway_log

    OUT.mkdir(parents=True, exist_ok=True)
    kind = "bad" if bad_fraction else "clean"
    path = OUT / f"gateway_{n // 1_000_000}m_{kind}.jsonl{suffix}"
    if not path.exists():
        print(f"generating {path.name} ...", flush=True)
        write_gateway_log(path, n, seed=1, bad_fraction=bad_fraction, compact=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1M records only, no RESULTS.md")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--against",
        metavar="COMMIT",
        help="also time that git commit's ingest in the same run (its pipeline/ on the path)",
    )
    args = ap.parse_args()
    before = checkout(args.against, "ingest-at-") if args.against else None
    cases = [(1_000_000, 0.0), (1_000_000, 0.01)] + ([] if args.quick else [(5_000_000, 0.0)])
    fmt = {"cpu": CPU, "cpu_end": CPU_END, "out": str(OUT)}
    lines = [
        "| log | size | ingest wall s | ingest CPU s | ingest peak RSS MB | polars read wall s "
        "| polars CPU s | polars RSS MB | ratio wall (CPU); median of the pairs "
        "| read = kept + quarantined + dup |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for n, bad in cases:
        path = ensure_log(n, bad)
        size_mb = path.stat().st_size / 1e6
        codes = {"ingest": INGEST.format(path=str(path), **fmt)}
        if not bad:
            codes["scan"] = SCAN.format(path=str(path), **fmt)
        paths = {}
        if before:
            codes[f"ingest at {args.against}"] = codes["ingest"]
            paths[f"ingest at {args.against}"] = before
        m = interleaved(codes, args.repeats, paths)
        ing, scan = m["ingest"], m.get("scan")
        for name, r in m.items():
            each = ", ".join(f"{x['wall_s']:.2f}" for x in r["walls"])  # type: ignore[attr-defined]
            print(f"  {n / 1e6:g}M {'bad' if bad else 'clean'} {name}: wall {each}", flush=True)
        counts = (
            f"{int(ing['rows_read']):,} = {int(ing['rows_kept']):,} + "
            f"{int(ing['rows_quarantined']):,} + {int(ing['rows_duplicate']):,}"
        )
        head = (
            f"| {n / 1e6:g}M {'1% bad' if bad else 'clean'} | {size_mb:.0f} MB "
            f"| {ing['wall_s']:.2f} | {ing['cpu_s']:.2f} | {ing['peak_rss_mb']:.0f} "
        )
        pairs = (  # each round's ingest and read ran one after the other: one load
            [a["wall_s"] / b["wall_s"] for a, b in zip(ing["walls"], scan["walls"], strict=True)]  # type: ignore[call-overload]
            if scan
            else []
        )
        tail = (
            f"| {scan['wall_s']:.2f} | {scan['cpu_s']:.2f} | {scan['peak_rss_mb']:.0f} "
            f"| {ing['wall_s'] / scan['wall_s']:.2f}x ({ing['cpu_s'] / scan['cpu_s']:.2f}x); "
            f"pairs {statistics.median(pairs):.2f}x "
            if scan
            else "| (fails on bad lines) | | | "
        )
        lines.append(head + tail + f"| {counts} |")
        print(lines[-1], flush=True)
        if before and scan:
            old = m[f"ingest at {args.against}"]
            print(
                f"  at {args.against}: wall {old['wall_s']:.2f} s "
                f"({old['wall_s'] / scan['wall_s']:.2f}x polars), CPU {old['cpu_s']:.2f} s "
                f"({old['cpu_s'] / scan['cpu_s']:.2f}x), kept {int(old['rows_kept']):,}",
                flush=True,
            )
    real = ["| real trace | rows kept | ingest wall s |", "|---|---|---|"]
    for rel in (
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "mooncake/conversation_trace.jsonl",
    ):
        p = TRACES_RAW / rel
        if not p.exists():
            continue
        r = child(INGEST.format(path=str(p), **fmt), args.repeats)
        real.append(f"| {rel} | {int(r['rows_kept']):,} | {r['wall_s']:.2f} |")
        print(real[-1], flush=True)
    load = os.getloadavg()[0]
    body = (
        "\n".join(lines)
        + "\n\n"
        + "\n".join(real)
        + (
            f"\n\nLoad average (1 min) at the end: {load:.1f} on 2 cores. The polars read is "
            "`pl.scan_ndjson(path).collect()` with no schema and no checks. "
            "The other files in the traces folder (ServeGen, the arXiv length table) are "
            "distributions, not request logs, and are not ingested. Peak RSS grows by about "
            "10-20 bytes per request id from 1M to 5M records: the dedupe id set (sorted "
            "arrays of 8-byte hashes, a bit filter of 2-4 bytes an id); everything else is "
            "per 16 MiB block."
        )
    )
    if not args.quick:
        record("Ingest", "python bench/ingest_speed.py", body)


if __name__ == "__main__":
    main()
