"""A fleet's day on one machine: 10M, 30M and 100M requests streamed through the loop.

The workload is synthetic: 64 replicas of the default ``vllm`` scenario (one
Llama-3-8B on one H100 each), Poisson arrivals at ``RATE_PER_REPLICA`` per replica
(a day of 100M requests across the fleet is 1,157 req/s), prompts and outputs drawn
from log-normals (medians ``PROMPT_MEDIAN`` and ``OUTPUT_MEDIAN`` tokens). The
requests are made a window of ``WINDOW`` requests at a time (``windows``: its own
seeded generator per window) and streamed into the loop with
``pipeline.sim.shard.run_windows``: each window replayed after the ``WARMUP_S``
seconds of traffic before it, its sim_requests and sim_steps rows written to
Parquet as it ends, and only the summary's totals kept (``RequestTotals`` in
float32: 20 bytes a request). So the whole day never lives in memory, and neither
does any window's output.

Each size runs in a fresh process, under ``round_robin`` and ``least_outstanding``;
peak RSS is that process's own (``VmHWM``), imports included. ``--compare`` also
replays the smallest size whole (one loop over every request, the same requests)
and prints how far the windowed figures are from it: the error of the cut.

Run from the repository root:

    .venv/bin/python bench/day_scale.py                         # 10M, 30M, 100M; RESULTS.md
    .venv/bin/python bench/day_scale.py --sizes 10000000 --compare --no-record
    .venv/bin/python bench/day_scale.py --warehouse 10000000   # the product's path

Target (issue 26): 100M requests with peak memory <= 4 GB in <= 8 min.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import PEAK_RSS_MB, record, this_command  # noqa: E402

REPLICAS = 64
RATE_PER_REPLICA = 100_000_000 / 86_400 / REPLICAS  # req/s: 100M a day across the fleet
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MAX = 600, 1.0, 8000
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MAX = 120, 0.8, 2000
WINDOW = 2_000_000  # requests per window
WARMUP_S = 60.0
SEED = 26
SIZES = (10_000_000, 30_000_000, 100_000_000)
ROUTERS = ("round_robin", "least_outstanding")
TARGET_MB, TARGET_S = 4 * 1024, 8 * 60
FIGURES = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "request_throughput")


def scenario(router: str) -> Any:
    from pipeline.sim.scenario import build_scenario

    return build_scenario(
        {"name": f"day-{router}", "policy": "vllm", "replicas": REPLICAS, "router": router}
    )


def windows(n: int, seed: int = SEED) -> Iterator[Any]:
    """The day's ``n`` requests, ``WINDOW`` at a time, on one clock (each window's own
    generator, so a window is the same whoever asks for it)."""
    from pipeline.sim.state import SimInput

    rate = RATE_PER_REPLICA * REPLICAS
    t = 0.0
    for k, a in enumerate(range(0, n, WINDOW)):
        m = min(WINDOW, n - a)
        rng = np.random.default_rng([seed, k])
        arrival = t + np.cumsum(rng.exponential(1.0 / rate, m))
        t = float(arrival[-1])
        prompt = rng.lognormal(np.log(PROMPT_MEDIAN), PROMPT_SIGMA, m)
        output = rng.lognormal(np.log(OUTPUT_MEDIAN), OUTPUT_SIGMA, m)
        yield SimInput(
            arrival,
            np.clip(prompt, 1, PROMPT_MAX).astype(np.int64),
            np.clip(output, 1, OUTPUT_MAX).astype(np.int64),
        )


def streamed(n: int, router: str, out: Path) -> dict[str, Any]:
    """Replay ``n`` requests window by window, writing sim_requests and sim_steps to
    ``out``; the summary and the seconds it took."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.contracts import SIM_REQUESTS, SIM_STEPS, BackgroundWriter, TableWriter
    from pipeline.progress import progress
    from pipeline.sim.replay import load_loop
    from pipeline.sim.replay_tables import CHUNK_ROWS, sim_requests_table, sim_steps_table
    from pipeline.sim.shard import run_windows
    from pipeline.sim.state import C_NUM_BLOCKS
    from pipeline.sim.summary import RequestTotals, StepTotals, summarize_totals

    sc = scenario(router)
    load_loop(sc.engine(), quiet=True)
    blocks = sc.engine().get(C_NUM_BLOCKS)
    totals, steps = RequestTotals(dtype=np.float32), StepTotals()
    t0 = time.perf_counter()
    write_s = 0.0  # converting the rows to tables, in this thread (writing runs beside)
    with (
        progress(f"day {router}", total=n) as bar,
        TableWriter(SIM_STEPS, out / "sim_steps.parquet") as steps_out,
        TableWriter(SIM_REQUESTS, out / "sim_requests.parquet") as requests_out,
        BackgroundWriter(steps_out, depth=8) as bg,  # both files, encoded beside the loop
    ):

        def on_steps(st: Any, stf: Any) -> None:
            nonlocal write_s
            t = time.perf_counter()
            bg.write(sim_steps_table(sc.name, st, stf, blocks))
            write_s += time.perf_counter() - t

        seen = [0]

        def on_progress(k: int) -> None:
            bar.advance(k - seen[0])
            seen[0] = k

        for sh in run_windows(
            windows(n), sc, warmup_s=WARMUP_S, on_steps=on_steps, on_progress=on_progress
        ):
            t = time.perf_counter()
            totals.add(sh.result)
            steps.merge(sh.steps)
            ids = pc.cast(pa.array(sh.rows), pa.string())
            for a in range(0, sh.result.num_requests, CHUNK_ROWS):
                bg.write(
                    sim_requests_table(sc.name, ids, sh.result, slice(a, a + CHUNK_ROWS)),
                    to=requests_out,
                )
            write_s += time.perf_counter() - t
        tail_at = time.perf_counter()
    tail_s = time.perf_counter() - tail_at  # the writers' last tables
    wall_s = time.perf_counter() - t0
    summary = summarize_totals(totals, steps)
    return {
        "wall_s": wall_s,
        "write_s": write_s,
        "tail_s": tail_s,
        "requests_rows": requests_out.rows,
        "steps_rows": steps_out.rows,
        "parquet_mb": sum(p.stat().st_size for p in out.glob("*.parquet")) / 2**20,
        **{k: summary[k] for k in (*FIGURES, "num_requests", "completed", "max_queue_depth")},
    }


def whole(n: int, router: str) -> dict[str, Any]:
    """The same ``n`` requests replayed in one loop (the baseline of the cut's error)."""
    from pipeline.sim.replay import load_loop
    from pipeline.sim.simulate import simulate
    from pipeline.sim.state import SimInput
    from pipeline.sim.summary import StepTotals, summarize

    parts = list(windows(n))
    inp = SimInput(
        np.concatenate([w.arrival_s for w in parts]),
        np.concatenate([w.prompt_tokens for w in parts]),
        np.concatenate([w.output_tokens for w in parts]),
    )
    del parts
    sc = scenario(router)
    load_loop(sc.engine(), quiet=True)
    steps = StepTotals()
    t0 = time.perf_counter()
    res = simulate(inp, sc.engine(), on_steps=lambda st, stf: steps.add(st, stf))
    wall_s = time.perf_counter() - t0
    summary = summarize(res, steps)
    return {"wall_s": wall_s, **{k: summary[k] for k in (*FIGURES, "max_queue_depth")}}


# The product's path: `tracereplay replay` of a warehouse's requests, whole and cut by
# time (``--shards --shard-warmup``: read a window at a time), in fresh processes.
FROM_WAREHOUSE = """
import shutil
from pathlib import Path
from pipeline.sim.scenario import build_scenario
from pipeline.sim.replay import replay
sc = build_scenario({{"name": "wh", "policy": "vllm", "replicas": {replicas},
                      "router": "least_outstanding", "max_model_len": 16384}})
t = time.perf_counter()
r = replay(Path({wh!r}), [sc], quiet=True, run_id="bench", intervals=False, jobs=1, {kw})
stage_s = time.perf_counter() - t
for table in ("sim_requests", "sim_steps"):
    shutil.rmtree(Path({wh!r}) / table / "run_id=bench")
s = r.runs[0].summary
out = {{"stage_s": stage_s, "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
        "e2e_p99_s": s["e2e_p99_s"], "completed": s["completed"]}}
"""
WAREHOUSE_RATE_PER_REPLICA = 8.0  # req/s (Azure conversation lengths: bench/sim_speed.py)


def from_warehouse(n: int, shards: int) -> list[str]:
    """``replay`` of a warehouse of ``n`` requests whole and cut into ``shards`` time
    windows read one at a time: the table's lines."""
    from _measure import child
    from sim_speed import make_warehouse

    wh = make_warehouse(n, WAREHOUSE_RATE_PER_REPLICA * REPLICAS)
    rows = {}
    for name, kw in (
        ("whole", ""),
        (f"{shards} time windows, read one at a time", f"shards={shards}, shard_warmup_s=60.0"),
    ):
        code = FROM_WAREHOUSE.format(wh=str(wh), replicas=REPLICAS, kw=kw)
        rows[name] = child(code, repeats=1)
        print(f"warehouse {n:,} {name}: {rows[name]}", flush=True)
    lines = [
        "",
        f"The product's path, `replay()` of a warehouse of {n:,} requests (Azure conversation "
        f"lengths, {WAREHOUSE_RATE_PER_REPLICA * REPLICAS:g} req/s over {REPLICAS} replicas, "
        "least_outstanding; read, prepare, replay, write), whole and cut by time "
        "(`--shards --shard-warmup 60s`), one fresh process each:",
        "",
        "| replay | process s | stage s | peak RSS MB | TTFT p50 ms | TTFT p99 ms | E2E p99 s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {r['stage_s']:.1f} | {r['peak_rss_mb']:,.0f} "
            f"| {r['ttft_p50_s'] * 1e3:.1f} | {r['ttft_p99_s'] * 1e3:.1f} | {r['e2e_p99_s']:.2f} |"
        )
    return lines


def in_child(mode: str, n: int, router: str) -> dict[str, Any]:
    """Run ``mode`` ("streamed" or "whole") in a fresh interpreter; its figures and peak RSS."""
    code = (
        "import json, sys, tempfile; from pathlib import Path\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
        "import day_scale\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        f"    out = day_scale.{mode}({n}, {router!r}"
        + (", Path(d))\n" if mode == "streamed" else ")\n")
        + f"out['peak_rss_mb'] = {PEAK_RSS_MB}\n"
        "print(json.dumps(out))\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} {n:,} {router} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    ap.add_argument("--compare", action="store_true", help="the smallest size whole too")
    ap.add_argument(
        "--warehouse",
        type=int,
        default=0,
        metavar="N",
        help="instead: replay a warehouse of N requests whole and read a window at a time",
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.warehouse:
        body = "\n".join(from_warehouse(args.warehouse, 8)).strip()
        print(body)
        if not args.no_record:
            record("Replay of a warehouse read a window at a time", this_command(), body)
        return
    rows = []
    for n in args.sizes:
        for router in args.routers:
            r = in_child("streamed", n, router)
            r["load"] = f"{os.getloadavg()[0]:.2f}"
            rows.append((n, router, r))
            print(
                f"{n:>12,} {router:<18} process {r['process_s']:7.1f} s  loop+write "
                f"{r['wall_s']:7.1f} s (write {r['write_s']:.1f})  peak {r['peak_rss_mb']:7,.0f} MB"
                f"  {n / r['wall_s']:,.0f} req/s  TTFT p99 {r['ttft_p99_s'] * 1e3:.1f} ms"
                f"  load {r['load']}",
                flush=True,
            )
    lines = [
        "| requests | router | process s | replay + write s | of which writing s | "
        "req/s | peak RSS MB | bytes per request | sim_requests + sim_steps rows | "
        "Parquet MB | TTFT p99 ms | target |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, router, r in rows:
        ok = r["peak_rss_mb"] <= TARGET_MB and r["process_s"] <= TARGET_S
        target = ("met" if ok else "missed") if n >= 100_000_000 else ""
        lines.append(
            f"| {n:,} | {router} | {r['process_s']:.1f} | {r['wall_s']:.1f} | {r['write_s']:.1f} "
            f"| {n / r['wall_s']:,.0f} | {r['peak_rss_mb']:,.0f} "
            f"| {r['peak_rss_mb'] * 2**20 / n:.0f} "
            f"| {r['requests_rows']:,} + {r['steps_rows']:,} | {r['parquet_mb']:,.0f} "
            f"| {r['ttft_p99_s'] * 1e3:.1f} | {target} |"
        )
    lines.append("")
    lines.append(
        "Load average (1 min) at the end of each run: "
        + ", ".join(r["load"] for *_, r in rows)
        + "."
    )
    if args.compare:
        n = min(args.sizes)
        lines += [
            "",
            f"The cut's error at {n:,} requests: the windowed replay against the same "
            "requests replayed in one loop (fresh processes):",
            "",
            "| router | figure | one loop | windows | error |",
            "|---|---|---:|---:|---:|",
        ]
        for router in args.routers:
            w = in_child("whole", n, router)
            s = next(r for m, ro, r in rows if m == n and ro == router)
            print(f"whole {n:,} {router}: {w['wall_s']:.1f} s, peak {w['peak_rss_mb']:,.0f} MB")
            for key in FIGURES:
                err = s[key] / w[key] - 1.0
                lines.append(f"| {router} | {key} | {w[key]:.6g} | {s[key]:.6g} | {err:+.2%} |")
            lines.append(
                f"| {router} | peak RSS MB | {w['peak_rss_mb']:,.0f} | {s['peak_rss_mb']:,.0f} | |"
            )
    body = "\n".join(lines)
    print(body)
    if not args.no_record:
        record("A fleet's day on one machine", this_command(), body)


if __name__ == "__main__":
    main()
