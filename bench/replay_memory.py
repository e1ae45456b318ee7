"""Peak memory of a long replay: 10M requests through the replay stage.

The workload is bench/e2e_scale.py's (the same warehouses): Azure conversation
lengths (drawn with replacement, seed 1) and Poisson arrivals at a fixed
16.8 req/s; the scenario is ``vllm`` with chunked prefill on one
Llama-3-8B/H100 replica, every step recorded. The replay runs as
``replay()`` does for ``tracereplay replay``: read the Parquet, prepare, run,
write sim_requests and sim_steps. Peak RSS is the child process's maximum
resident set (``VmHWM``; see ``_measure.PEAK_RSS_MB``), imports included; one
run per size (the 10M run takes minutes).

Run from the repository root:

    .venv/bin/python bench/replay_memory.py              # 1M and 10M, writes bench/RESULTS.md
    .venv/bin/python bench/replay_memory.py --sizes 1000000 --no-record

Target (issue 12): a replay of 10M requests within 3 GB peak RSS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import PEAK_RSS_MB, child, record  # noqa: E402
from e2e_scale import RATE  # noqa: E402
from sim_speed import SCENARIO, STAGE, make_warehouse  # noqa: E402

TARGET_MB = 3 * 1024

# The replay stage as ``replay()`` runs it, in one process: its steps are wrapped to
# note the resident set after each and the peak so far, and the size of what
# the step made.
BREAKDOWN = """
import numpy as np
from pathlib import Path
import pipeline.sim.replay as rp
from pipeline.sim.scenario import build_scenario

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
def peak_mb():
    return {peak}
sc = build_scenario({scenario!r})
rp.load_loop(sc.engine(), quiet=True)
out = {{"imports": rss_mb(), "imports_peak": peak_mb()}}
def noted(name, fn, made=None):
    def wrapper(*a, **k):
        r = fn(*a, **k)
        out[name], out[name + "_peak"] = rss_mb(), peak_mb()
        if made is not None:
            out[name + "_made"] = made(r)
        return r
    return wrapper
rp.read_window = noted("read", rp.read_window, lambda r: r[0].estimated_size() / 2**20)
rp.prepare = noted("prepare", rp.prepare)
# (the stage's own helper: it hands the loop an input that nothing else holds, so the
# loop can free it; a wrapper of simulate() itself would keep it alive)
rp._simulate = noted(
    "simulate", rp._simulate, lambda r: (r[0].rq.nbytes + r[0].rqf.nbytes) / 2**20
)
rp.summarize = noted("summarize", rp.summarize)
rp.uncertainty.summary_intervals = noted("intervals", rp.uncertainty.summary_intervals)
rp.write_sim_requests = noted("requests_written", rp.write_sim_requests)
result = rp.replay(Path({wh!r}), [sc], quiet=True, run_id="bench-mem")
out["done"], out["done_peak"] = rss_mb(), peak_mb()
import shutil
for table in ("sim_requests", "sim_steps", "scenarios"):
    shutil.rmtree(Path({wh!r}) / table / "run_id=bench-mem", ignore_errors=True)
(Path({wh!r}) / "runs" / "bench-mem.parquet").unlink(missing_ok=True)
out["step_rows"] = result.runs[0].summary["num_step_rows"]
"""
STEPS = (
    ("imports", "interpreter, imports, compiled loop", None),
    ("read", "read and sort the requests (polars frame)", "read_made"),
    ("prepare", "prepare: arrivals, lengths, ids (SimInput; frame still held)", None),
    (
        "simulate",
        "simulate, step rows written as they fill (frame and input dropped; rq/rqf made)",
        "simulate_made",
    ),
    ("summarize", "summary", None),
    (
        "intervals",
        "the summary's 90% intervals (bootstrap; the profile term's replays forked)",
        None,
    ),
    ("requests_written", "sim_requests written, a row group at a time", None),
    ("done", "replay() returned (runs and scenarios rows written)", None),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    # a fixed rate: the warehouses are cached by size only, and shared with e2e_scale.py
    rate = RATE
    rows = []
    for n in args.sizes:
        wh = make_warehouse(n, rate)
        m = child(STAGE.format(scenario=SCENARIO, wh=str(wh)), repeats=1)
        rows.append((n, m))
        print(
            f"{n:>11,} requests: stage {m['stage_s']:.1f} s, process {m['wall_s']:.1f} s, "
            f"peak RSS {m['peak_rss_mb']:,.0f} MB, completed {m['completed']:,.0f}",
            flush=True,
        )
    n_big, _ = rows[-1]
    wh = str(make_warehouse(n_big, rate))
    code = BREAKDOWN.format(scenario=SCENARIO, wh=wh, peak=PEAK_RSS_MB)
    b = child(code, repeats=1)
    print(json.dumps(b, indent=1), flush=True)
    if args.no_record:
        return
    lines = [
        "Scenario: `vllm`, chunked prefill, 1 replica, llama-3-8b_h100-80gb_tp1; Azure-conv "
        f"lengths, Poisson arrivals at {rate:.1f} req/s, as in the End to end at scale "
        "section (the same warehouses). One fresh process per size; peak RSS includes the "
        "imports.",
        "",
        "| requests | stage s | process s | peak RSS MB | bytes per request | within 3 GB |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for n, m in rows:
        lines.append(
            f"| {n:,} | {m['stage_s']:.1f} | {m['wall_s']:.1f} | {m['peak_rss_mb']:,.0f} | "
            f"{m['peak_rss_mb'] * 2**20 / n:,.0f} | "
            f"{'yes' if m['peak_rss_mb'] <= TARGET_MB else 'NO'} |"
        )
    lines += [
        "",
        f"Where the memory of the {n_big:,}-request replay goes (one process running "
        "`replay()`, its steps wrapped: resident set after each step, the peak so far, "
        f"and the size of what the step made; {b['step_rows']:,.0f} step rows):",
        "",
        "| after | RSS MB | peak so far MB | made MB |",
        "|---|---:|---:|---:|",
    ]
    for key, what, made in STEPS:
        extra = f"{b[made]:,.0f}" if made else ""
        lines.append(f"| {what} | {b[key]:,.0f} | {b[key + '_peak']:,.0f} | {extra} |")
    big = rows[-1][1]["peak_rss_mb"]
    lines += [
        "",
        f"Target: a 10M-request replay within 3 GB peak RSS: "
        f"**{'met' if big <= TARGET_MB else 'not met'}** ({big:,.0f} MB). The step "
        "timeline never lives whole: the loop hands it out in chunks of 131,072 rows "
        "that are converted and written as row groups of sim_steps as they fill; "
        "sim_requests is built and written a row group at a time from the per-request "
        "state; the request frame is dropped before the loop runs, and the scenario's "
        "input (arrivals and lengths) once the loop has copied it. Most of what is left "
        "is the loop's per-request state (`rq`/`rqf`, the `made` figure of the simulate "
        "row: 36 int32 and 4 float64 per request, 176 bytes) and the request ids.",
    ]
    record(
        "Replay memory (10M requests)",
        ".venv/bin/python bench/replay_memory.py",
        "\n".join(lines),
    )
    print("recorded in bench/RESULTS.md")


if __name__ == "__main__":
    main()
