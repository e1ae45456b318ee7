"""Sweep and capacity-search speed on the whole Azure conversation trace.

- sweep: a 64-scenario grid (policy static / orca / vllm / sarathi x concurrency
  cap 8 / 32 / 128 / 512 x rate scale 1 / 2 / 3 / 4) over the whole trace
  (19,366 requests), with 1 job (in one process) and with 2 jobs (two forked
  workers), every result written to the warehouse;
- capacity: the seed lab's searches (``examples/seed_lab/capacity.toml``:
  p99 TTFT <= 200 ms; the highest max_num_seqs, the highest rate, the fewest
  replicas for 4x the traffic): replays needed and wall time, without the
  answers' 90% intervals (``--no-intervals``), with them in one process
  (``jobs=1``) and with their independent replays on 2 forked workers
  (``jobs=2``), then each probe in 2 parts (``--shards 2 --jobs 2``) without
  and with intervals (each of their replays in 2 parts too), alternating in one
  run, and the ratios to the first.

Every figure is the median of 3 fresh processes. "process s" is the whole
command from the first import (reading the requests, checking the grid,
loading the compiled loop, running, writing); "stage s" leaves out the
imports. The compiled loop is in numba's cache already (one untimed run first).

Run from the repository root:

    .venv/bin/python bench/sweep_speed.py            # all figures, writes bench/RESULTS.md
    .venv/bin/python bench/sweep_speed.py --quick    # 1 run each, prints, writes nothing
    .venv/bin/python bench/sweep_speed.py --capacity-only   # the capacity section only

Targets (issues): the 64-scenario sweep <= 15 s with 2 jobs; capacity with
intervals (their independent replays on 2 worker processes) within 2x the time of
capacity without.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import child, record  # noqa: E402

OUT = ROOT / "bench" / "out" / "sweep"
AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
CAPACITY = ROOT / "examples" / "seed_lab" / "capacity.toml"

GRID = """\
name = "bench"

[base]
profile = "llama-3-8b_h100-80gb_tp1"
drop_too_long = true

[axes]
policy = ["static", "orca", "vllm", "sarathi"]
concurrency = [8, 32, 128, 512]
rate_scale = [1, 2, 3, 4]
"""

SWEEP = """
import shutil
from pathlib import Path
from pipeline.plan.grid import load_grid
from pipeline.plan.sweep import sweep
wh = Path({wh!r})
r = sweep(wh, load_grid(Path({grid!r})), jobs={jobs}, quiet=True)
out = {{"stage_s": r.wall_s, "written": len(r.runs), "failed": len(r.failures)}}
out["wall_s"] = time.perf_counter() - t0
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
out["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
out["load_1m"] = __import__("os").getloadavg()[0]
for table in ("sim_requests", "sim_steps", "scenarios"):
    shutil.rmtree(wh / table / f"run_id={{r.run_id}}", ignore_errors=True)
(wh / "runs" / f"{{r.run_id}}.parquet").unlink()
"""

CAPACITY_RUN = """
import os
import shutil
from pathlib import Path
from pipeline.plan.capacity import load_capacity_file, run_capacity
wh = Path({wh!r})
base, slos, specs = load_capacity_file(Path({cfile!r}))
r = run_capacity(
    wh, base, slos, specs, quiet=True, intervals={intervals}, jobs={jobs}, shards={shards}
)
out = {{"stage_s": r.wall_s, "replays": r.num_replays, "extra": r.num_interval_replays}}
for s in r.searches:
    out[s.spec.kind] = s.answer if s.answer is not None else -1
    out[s.spec.kind + "_probes"] = len(s.probes) + len(s.interval_probes)
    if s.interval is not None:
        out[s.spec.kind + "_lo"] = s.interval.lo if s.interval.lo is not None else -1
        out[s.spec.kind + "_hi"] = s.interval.hi if s.interval.hi is not None else -1
        out[s.spec.kind + "_safe"] = float(s.interval.safe)
out["wall_s"] = time.perf_counter() - t0
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the intervals' worker processes
out["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
out["load_1m"] = os.getloadavg()[0]
for table in ("sim_requests", "sim_steps", "scenarios", "capacity_search"):
    shutil.rmtree(wh / table / f"run_id={{r.run_id}}", ignore_errors=True)
(wh / "runs" / f"{{r.run_id}}.parquet").unlink()
"""


def azure_warehouse() -> Path:
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.warehouse import Warehouse

    wh = OUT / "wh_azure_conv"
    if not (wh / "requests").exists():
        ingest_logs([str(AZURE)], Warehouse(wh), IngestOptions(quiet=True))
    return wh


CAPACITY_VARIANTS = {  # label: (intervals, jobs, shards)
    "without intervals": (False, 1, None),
    "with intervals, 1 job": (True, 1, None),
    "with intervals, 2 jobs": (True, 2, None),
    "in 2 parts, without intervals": (False, 2, 2),
    "in 2 parts, with intervals": (True, 2, 2),
}
PARTS = ("in 2 parts, without intervals", "in 2 parts, with intervals")


def capacity_side_by_side(wh: Path, repeats: int) -> dict[str, dict[str, float]]:
    """The capacity searches without intervals, and with them in one process and with 2
    worker processes for the intervals' replays, alternating in fresh processes (so that a
    busy spell of the machine falls on all alike); medians of each."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in CAPACITY_VARIANTS}
    for _ in range(repeats):
        for label, (intervals, jobs, shards) in CAPACITY_VARIANTS.items():
            code = CAPACITY_RUN.format(
                wh=str(wh), cfile=str(CAPACITY), intervals=intervals, jobs=jobs, shards=shards
            )
            runs[label].append(child(code, repeats=1))
    return {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}


def answers(m: dict[str, float]) -> str:
    """The three answers with their intervals, as the command prints them."""

    def span(kind: str, fmt: str) -> str:
        if kind + "_lo" not in m:
            return ""
        lo, hi = m[kind + "_lo"], m[kind + "_hi"]
        ends = f"{'none' if lo < 0 else format(lo, fmt)}-{'none' if hi < 0 else format(hi, fmt)}"
        safe = "safe" if m[kind + "_safe"] else "not safe"
        return f" ({ends} within the 90% interval; {safe} at 90%)"

    conc = "none" if m["concurrency"] < 0 else f"{m['concurrency']:.0f}"
    return (
        f"highest max_num_seqs {conc}{span('concurrency', '.0f')}, highest rate "
        f"{m['rate']:.2f} req/s{span('rate', '.2f')}, fewest replicas for 4x the traffic "
        f"{m['replicas']:.0f}{span('replicas', '.0f')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run each; print, do not record")
    parser.add_argument(
        "--capacity-only", action="store_true", help="only the capacity searches; do not record"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    repeats = 1 if args.quick else 3
    OUT.mkdir(parents=True, exist_ok=True)
    grid = OUT / "grid.toml"
    grid.write_text(GRID)
    wh = azure_warehouse()
    warm = CAPACITY_RUN.format(
        wh=str(wh), cfile=str(CAPACITY), intervals=False, jobs=1, shards=None
    )
    if not args.capacity_only:
        warm = SWEEP.format(wh=str(wh), grid=str(grid), jobs=1)
    child(warm, repeats=1)  # warm numba's cache
    sweeps = {}
    for jobs in () if args.capacity_only else (1, 2):
        m = child(SWEEP.format(wh=str(wh), grid=str(grid), jobs=jobs), repeats=repeats)
        sweeps[jobs] = m
        print(
            f"sweep, {jobs} job(s): process {m['wall_s']:.1f} s, stage {m['stage_s']:.1f} s, "
            f"CPU {m['cpu_s']:.1f} s, {m['written']:.0f} written, {m['failed']:.0f} failed, "
            f"peak RSS {m['peak_rss_mb']:,.0f} MB, load average {m['load_1m']:.1f}",
            flush=True,
        )
    caps = capacity_side_by_side(wh, repeats)
    cap = caps["without intervals"]
    for label, m in caps.items():
        print(
            f"capacity {label}: {m['replays']:.0f} replays (concurrency "
            f"{m['concurrency_probes']:.0f}, rate {m['rate_probes']:.0f}, replicas "
            f"{m['replicas_probes']:.0f}) and {m['extra']:.0f} for the intervals; process "
            f"{m['wall_s']:.1f} s, stage {m['stage_s']:.1f} s, CPU {m['cpu_s']:.1f} s, "
            f"load average {m['load_1m']:.1f}",
            flush=True,
        )
    for label in ("with intervals, 1 job", "with intervals, 2 jobs"):
        ratio = caps[label]["wall_s"] / cap["wall_s"]
        print(f"capacity {label} / without: process {ratio:.2f}x (target <= 2x)", flush=True)
    ratio = caps[PARTS[1]]["wall_s"] / caps[PARTS[0]]["wall_s"]
    print(f"capacity in 2 parts, with intervals / without: process {ratio:.2f}x", flush=True)
    print(f"answers: {answers(caps['with intervals, 2 jobs'])}", flush=True)
    print(f"answers in 2 parts: {answers(caps[PARTS[1]])}", flush=True)
    if args.quick:
        return
    if not args.capacity_only:
        record("Sweeps", ".venv/bin/python bench/sweep_speed.py", sweep_lines(sweeps))
    record(
        "Capacity with intervals",
        ".venv/bin/python bench/sweep_speed.py --capacity-only",
        "\n".join(capacity_lines(caps, repeats)),
    )
    print("recorded in bench/RESULTS.md")


def sweep_lines(sweeps: dict[int, dict[str, float]]) -> str:
    s1, s2 = sweeps[1], sweeps[2]
    lines = [
        "Sweep: 64 scenarios (policy static/orca/vllm/sarathi x concurrency cap "
        "8/32/128/512 x rate scale 1/2/3/4) over the whole Azure conversation trace "
        "(19,366 requests each, Llama-3-8B on one H100), every result written "
        "(sim_requests and sim_steps per scenario). Medians of 3 fresh processes; "
        "process = from the first import to the last file written.",
        "",
        "| jobs | process s | stage s | CPU s (all processes) | scenarios written | "
        "peak RSS MB (parent) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| 1 (this process) | {s1['wall_s']:.1f} | {s1['stage_s']:.1f} | {s1['cpu_s']:.1f} | "
        f"{s1['written']:.0f} | {s1['peak_rss_mb']:,.0f} |",
        f"| 2 (forked workers) | {s2['wall_s']:.1f} | {s2['stage_s']:.1f} | "
        f"{s2['cpu_s']:.1f} | {s2['written']:.0f} | {s2['peak_rss_mb']:,.0f} |",
        "",
        f"Load average (1 min) at the end of the runs: {s1['load_1m']:.1f} and "
        f"{s2['load_1m']:.1f} (2 cores shared with other work: figures vary from run to run, "
        "and 2 jobs gain only while a core is free).",
        "",
        "Target: the 64-scenario sweep <= 15 s with 2 jobs.",
    ]
    return "\n".join(lines)


def capacity_lines(caps: dict[str, dict[str, float]], repeats: int) -> list[str]:
    cap, full = caps["without intervals"], caps["with intervals, 2 jobs"]
    parts = caps[PARTS[1]]["wall_s"] / caps[PARTS[0]]["wall_s"]
    loads = ", ".join(f"{m['load_1m']:.1f}" for m in caps.values())
    return [
        "Capacity search on the whole Azure conversation trace "
        "(`examples/seed_lab/capacity.toml`: p99 TTFT <= 200 ms, vllm on one H100), without "
        "the answers' 90% intervals (`--no-intervals`), with them replayed in this process "
        "(`--jobs 1`) and with the intervals' independent replays (each answer's bootstrap, "
        "replicates and cost-scaled replays; the ends' cost-scaled replays) on 2 forked "
        f"workers (`--jobs 2`); then each probe in 2 parts (`--shards 2 --jobs 2`: the "
        "replicas search's probes in replica groups, the others' in time windows, one replica "
        "each), without intervals and with them (each of the intervals' replays in 2 parts "
        f"too); alternating, medians of {repeats} fresh processes each; CPU s counts the "
        "workers:",
        "",
        "| capacity | replays | for the intervals | process s | stage s | CPU s | "
        "process / without |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {label} | {m['replays']:.0f} | {m['extra']:.0f} | {m['wall_s']:.1f} | "
            f"{m['stage_s']:.1f} | {m['cpu_s']:.1f} | {m['wall_s'] / cap['wall_s']:.2f}x |"
            for label, m in caps.items()
        ),
        "",
        f"Load average (1 min) at the end of each variant's last run: {loads}.",
        "",
        f"Answers: {answers(full)}. Probes for the ends are summarized, not written. In 2 "
        f"parts: {answers(caps[PARTS[1]])}.",
        "",
        "Target (issue 26): capacity with intervals <= 2x the wall time of capacity without; "
        f"in 2 parts, with intervals / without: {parts:.2f}x.",
    ]


if __name__ == "__main__":
    main()
