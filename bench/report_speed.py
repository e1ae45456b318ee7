"""Report build time and HTML size for a 1,000,000-request replay.

The warehouse (built once, kept in bench/out/report/) holds a generated gateway log
of 1,010,101 lines (1% bad, so quarantine has rows; models and tenants), ingested
(1,000,000 requests kept), then replayed through five scenarios on one
Llama-3-8B/H100 replica: vllm at max_num_seqs 64, 128 and 256 (a concurrency
sweep), vllm-256 at half the arrival rate (a rate sweep) and static batching at
256: 5M sim_requests rows.

Figures (medians of 3 runs, each in a fresh process; peak RSS: the max):
- build: wall seconds of ``build_report`` (every query, chart and the HTML);
- CPU: user + system seconds of ``build_report`` over all its threads (DuckDB's
  too): what the build costs whatever else the machine runs;
- with imports: the same plus importing pipeline, DuckDB, polars and Altair;
- the HTML's size, its number of charts and data points;
- the same with an empty cache directory: the first build on a machine also
  bundles Vega's JavaScript (vl-convert, about 2 s), later builds read it from
  the cache;
- the same with ``png=True`` (one PNG per chart), for information.

With ``--against REV`` the report of that git revision (its pipeline/, sql/ and
reports/, exported to a temporary folder) is built on the same warehouse too,
alternately with this one, each in a fresh process: the baseline in the same run.

Run from the repository root:

    .venv/bin/python bench/report_speed.py            # writes the Report section of RESULTS.md
    .venv/bin/python bench/report_speed.py --against f6ad365   # and beside that revision's
    .venv/bin/python bench/report_speed.py --quick    # one run, prints, writes nothing

Targets: build <= 10 s and peak RSS <= 1 GB (and HTML <= 5 MB) for 1M requests x 5
scenarios, aggregated in DuckDB, never materialising sim_requests in Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.gateway_logs
sys.path.insert(0, str(ROOT / "bench"))

from _measure import PEAK_RSS_MB, child, record  # noqa: E402

OUT = ROOT / "bench" / "out" / "report"
WAREHOUSE = OUT / "wh"
N = 1_000_000  # requests replayed
LINES = 1_010_101  # log lines: 1% (10,101) are bad, so exactly N are kept
PROFILE = "llama-3-8b_h100-80gb_tp1"

BUILD = """
import json, os, re, tempfile
from pathlib import Path
if {cold}:  # an empty cache: vl-convert bundles Vega's JavaScript again
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()
from pipeline.report import build_report
from pipeline.warehouse import Warehouse
import resource
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c = cpu()
t = time.perf_counter()
html = build_report(Warehouse(Path({wh!r})), output=Path({out!r}), png={png})
wall = time.perf_counter() - t
cpu_s = cpu() - c
text = html.read_text()
specs = json.loads(re.search(
    r'<script type="application/json" id="chart-specs">(.*?)</script>', text, re.S).group(1))

def count(node):
    if isinstance(node, dict):
        own = len(node["values"]) if isinstance(node.get("values"), list) else 0
        return own + sum(count(v) for k, v in node.items() if k != "values")
    return sum(count(v) for v in node) if isinstance(node, list) else 0

out = {{"wall_s": wall, "cpu_s": cpu_s, "load1": os.getloadavg()[0],
        "with_imports_s": time.perf_counter() - t0,
        "html_mb": html.stat().st_size / 1e6, "charts": len(specs),
        "points": sum(count(s) for s in specs.values())}}
"""


def ensure_warehouse() -> None:
    """Ingest the generated log and replay it, once."""
    if (WAREHOUSE / "scenarios").exists() and any((WAREHOUSE / "scenarios").glob("run_id=2*")):
        return
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.sim.replay import replay
    from pipeline.sim.scenario import build_scenario
    from pipeline.warehouse import Warehouse
    from tests.gateway_logs import write_gateway_log

    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "gateway_1m_bad.jsonl"
    if not log.exists():
        print(f"generating {log.name} ...", flush=True)
        write_gateway_log(log, LINES, seed=1, bad_fraction=0.01, compact=True)
    t = time.perf_counter()
    result = ingest_logs([str(log)], Warehouse(WAREHOUSE), IngestOptions(quiet=True))
    kept = result.total("rows_kept")
    print(f"ingest: {kept:,} kept in {time.perf_counter() - t:.1f} s")
    assert kept == N, kept
    base = {"profile": PROFILE, "drop_too_long": True}
    vllm = {**base, "policy": "vllm"}
    scenarios = [build_scenario({**vllm, "name": f"vllm-{n}", "max_num_seqs": n})
                 for n in (64, 128, 256)]  # fmt: skip
    scenarios.append(
        build_scenario({**vllm, "name": "vllm-256-half-rate", "max_num_seqs": 256,
                        "time_scale": 2.0})
    )  # fmt: skip
    scenarios.append(
        build_scenario({**base, "policy": "static", "name": "static-256", "max_batch_size": 256,
                        "max_wait_s": 0.05, "max_model_len": 4096})
    )  # fmt: skip
    t = time.perf_counter()
    run = replay(WAREHOUSE, scenarios, quiet=True)
    print(f"replay: {len(scenarios)} scenarios in {time.perf_counter() - t:.1f} s ({run.run_id})")


def _one(code: str, pythonpath: str | None) -> dict[str, float]:
    """One build in a fresh interpreter (``pythonpath`` first on the path: a baseline)."""
    prog = (
        "import json, resource, time\n"
        "t0 = time.perf_counter()\n"
        f"{code}\n"
        f"out['peak_rss_mb'] = {PEAK_RSS_MB}\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                       cwd=pythonpath or ROOT)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def against(rev: str, repeats: int) -> list[str]:
    """Build the report of ``rev`` and of this tree alternately; the table's lines."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev, "pipeline", "sql", "reports"],
                                 cwd=ROOT, check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        code = BUILD.format(wh=str(WAREHOUSE), out=str(OUT / "baseline.html"), png=False,
                            cold=False)  # fmt: skip
        base, new = [], []
        for _ in range(repeats):
            base.append(_one(code, tmp))
            new.append(_one(code.replace("baseline.html", "review.html"), None))
    lines = [
        f"Against {rev} (the report before this change), alternately in fresh processes:",
        "",
        "| report | build s, median | runs | CPU s, median | peak RSS MB | load average |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for label, runs in ((rev, base), ("this tree", new)):
        walls = [r["wall_s"] for r in runs]
        lines.append(
            f"| {label} | {statistics.median(walls):.2f} | "
            + ", ".join(f"{w:.2f}" for w in walls)
            + f" | {statistics.median(r['cpu_s'] for r in runs):.2f} "
            f"| {max(r['peak_rss_mb'] for r in runs):.0f} "
            f"| {statistics.median(r['load1'] for r in runs):.1f} |"
        )
    ratio = statistics.median(r["wall_s"] for r in new) / statistics.median(
        r["wall_s"] for r in base
    )
    cpu_ratio = statistics.median(r["cpu_s"] for r in new) / statistics.median(
        r["cpu_s"] for r in base
    )
    lines += ["", f"Ratio of medians (this / {rev}): build {ratio:.2f}, CPU {cpu_ratio:.2f}."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one run, print, write nothing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", metavar="REV", help="also build this git revision's report")
    args = ap.parse_args()
    ensure_warehouse()
    repeats = 1 if args.quick else args.repeats
    html = OUT / "review.html"
    wh = str(WAREHOUSE)
    plain = child(BUILD.format(wh=wh, out=str(html), png=False, cold=False), repeats)
    cold = child(BUILD.format(wh=wh, out=str(html), png=False, cold=True), repeats)
    pngs = child(BUILD.format(wh=wh, out=str(OUT / "png.html"), png=True, cold=False), repeats)
    rows = []
    cases = (
        ("HTML", plain),
        ("HTML, first build on a machine (empty Vega bundle cache)", cold),
        ("HTML + PNG per chart", pngs),
    )
    for label, m in cases:
        rows.append(
            f"| {label} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | {m['with_imports_s']:.2f} "
            f"| {m['html_mb']:.2f} "
            f"| {int(m['charts'])} | {int(m['points']):,} | {m['peak_rss_mb']:.0f} "
            f"| {m['load1']:.1f} |"
        )
    body = "\n".join(
        [
            "A 1,000,000-request replay: a generated gateway log (1% bad lines), ingested, "
            "replayed on one Llama-3-8B/H100 replica through five scenarios (vllm at "
            "max_num_seqs 64/128/256, vllm-256 at half the rate, static-256): 5M sim_requests "
            "rows. Medians of "
            f"{repeats} fresh processes.",
            "",
            "| report | build s | CPU s | with imports s | HTML MB | charts | data points "
            "| peak RSS MB | load average |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Targets: build <= 10 s and peak RSS <= 1 GB (HTML <= 5 MB). CPU s: user + "
            "system time of the build over all threads, which the machine's other jobs do not "
            "change; load average: the 1-minute load when each build ended (median), on 2 cores.",
            *(["", *against(args.against, repeats)] if args.against else []),
        ]
    )
    print(body)
    if not args.quick:
        command = ".venv/bin/python bench/report_speed.py" + (
            f" --against {args.against}" if args.against else ""
        )
        record("Report", command, body)


if __name__ == "__main__":
    main()
