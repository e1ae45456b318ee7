"""Sweep and capacity-search speed on the whole Azure conversation trace.

- sweep: a 64-scenario grid (policy static / orca / vllm / sarathi x concurrency
  cap 8 / 32 / 128 / 512 x rate scale 1 / 2 / 3 / 4) over the whole trace
  (19,366 requests), with 1 job (in one process) and with 2 jobs (two forked
  workers), every result written to the warehouse;
- capacity: the seed lab's searches (``examples/seed_lab/capacity.toml``:
  p99 TTFT <= 200 ms; the highest max_num_seqs, the highest rate, the fewest
  replicas for 4x the traffic): replays needed and wall time.

Every figure is the median of 3 fresh processes. "process s" is the whole
command from the first import (reading the requests, checking the grid,
loading the compiled loop, running, writing); "stage s" leaves out the
imports. The compiled loop is in numba's cache already (one untimed run first).

Run from the repository root:

    .venv/bin/python bench/sweep_speed.py            # all figures, writes bench/RESULTS.md
    .venv/bin/python bench/sweep_speed.py --quick    # 1 run each, prints, writes nothing

Target (issue): the 64-scenario sweep <= 15 s with 2 jobs.
"""

from __future__ import annotations

import argparse
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
import shutil
from pathlib import Path
from pipeline.plan.capacity import load_capacity_file, run_capacity
wh = Path({wh!r})
base, slos, specs = load_capacity_file(Path({cfile!r}))
r = run_capacity(wh, base, slos, specs, quiet=True)
out = {{"stage_s": r.wall_s, "replays": r.num_replays}}
for s in r.searches:
    out[s.spec.kind] = s.answer if s.answer is not None else -1
    out[s.spec.kind + "_probes"] = len(s.probes)
out["wall_s"] = time.perf_counter() - t0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run each; print, do not record")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    repeats = 1 if args.quick else 3
    OUT.mkdir(parents=True, exist_ok=True)
    grid = OUT / "grid.toml"
    grid.write_text(GRID)
    wh = azure_warehouse()
    child(SWEEP.format(wh=str(wh), grid=str(grid), jobs=1), repeats=1)  # warm numba's cache
    sweeps = {}
    for jobs in (1, 2):
        m = child(SWEEP.format(wh=str(wh), grid=str(grid), jobs=jobs), repeats=repeats)
        sweeps[jobs] = m
        print(
            f"sweep, {jobs} job(s): process {m['wall_s']:.1f} s, stage {m['stage_s']:.1f} s, "
            f"CPU {m['cpu_s']:.1f} s, {m['written']:.0f} written, {m['failed']:.0f} failed, "
            f"peak RSS {m['peak_rss_mb']:,.0f} MB, load average {m['load_1m']:.1f}",
            flush=True,
        )
    cap = child(CAPACITY_RUN.format(wh=str(wh), cfile=str(CAPACITY)), repeats=repeats)
    print(
        f"capacity: {cap['replays']:.0f} replays (concurrency {cap['concurrency_probes']:.0f}, "
        f"rate {cap['rate_probes']:.0f}, replicas {cap['replicas_probes']:.0f}); process "
        f"{cap['wall_s']:.1f} s, stage {cap['stage_s']:.1f} s; answers: max_num_seqs "
        f"{'none' if cap['concurrency'] < 0 else int(cap['concurrency'])}, rate "
        f"{cap['rate']:.2f} req/s, replicas {cap['replicas']:.0f}",
        flush=True,
    )
    if args.quick:
        return
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
        "Capacity search on the whole Azure conversation trace "
        "(`examples/seed_lab/capacity.toml`: p99 TTFT <= 200 ms, vllm on one H100): "
        f"{cap['replays']:.0f} replays (concurrency {cap['concurrency_probes']:.0f}, rate "
        f"{cap['rate_probes']:.0f}, replicas {cap['replicas_probes']:.0f}), process "
        f"{cap['wall_s']:.1f} s, stage {cap['stage_s']:.1f} s. Answers: highest "
        f"max_num_seqs {'none' if cap['concurrency'] < 0 else int(cap['concurrency'])}, "
        f"highest rate {cap['rate']:.2f} req/s, fewest replicas for 4x the traffic "
        f"{cap['replicas']:.0f}.",
        "",
        "Target: the 64-scenario sweep <= 15 s with 2 jobs.",
    ]
    record("Sweeps and capacity", ".venv/bin/python bench/sweep_speed.py", "\n".join(lines))
    print("recorded in bench/RESULTS.md")


if __name__ == "__main__":
    main()
