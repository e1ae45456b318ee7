"""A sharded replay on local workers and on a Ray cluster, against the whole replay.

The workload: ``N`` requests (Azure conversation lengths, Poisson arrivals at
``RATE_PER_REPLICA`` per replica, bench/sim_speed.py's warehouse) through 64
replicas of the default ``vllm`` scenario under ``round_robin``, so that the parts
are replica groups (exact: the same rows as one replay). Variants, each in fresh
processes through ``replay()`` as ``tracereplay replay`` runs it (read, prepare,
replay, write), interleaved, medians of ``--repeats``:

- whole: one replay (``--no-intervals``);
- 16 shards, 1 job: the parts one after the other in the command's process;
- 16 shards, 2 jobs: on 2 forked workers;
- 16 shards on Ray: a local Ray cluster of 2 worker CPUs (``ray start --head
  --num-cpus=2``), started once, outside the timings.

The profile (one more process) replays the 64 one-replica parts one at a time and
times, per part, the worker's share (``replay_sharded.replay_shard``: the loop, its
tables and their Parquet files) and the driver's (writing the files, adding up the
totals), to extrapolate
the wall time on W workers: the fixed cost (imports, reading and preparing, loading
the loop) + ceil(64 / W) parts' worker time + every part's driver time (the driver
writes them one after the other, so that part does not shrink with W).

Run from the repository root:

    .venv/bin/python bench/shard_speed.py              # writes bench/RESULTS.md
    .venv/bin/python bench/shard_speed.py --requests 1000000 --repeats 1 --no-record

Target (issue 26): the speed-up on a local Ray cluster of 2 workers, measured, and
extrapolated to 16 and 64 workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import child, record, this_command  # noqa: E402
from sim_speed import make_warehouse  # noqa: E402

N = 4_000_000  # (--requests)
REPLICAS = 64
RATE_PER_REPLICA = 8.0
SHARDS = 16

RUN = """
import shutil
from pathlib import Path
from pipeline.sim.scenario import build_scenario
from pipeline.sim.replay import replay
sc = build_scenario({{"name": "shards", "policy": "vllm", "replicas": {replicas},
                      "router": "round_robin", "max_model_len": 16384}})
t = time.perf_counter()
r = replay(Path({wh!r}), [sc], quiet=True, run_id="bench", intervals=False, {kw})
stage_s = time.perf_counter() - t
for table in ("sim_requests", "sim_steps"):
    shutil.rmtree(Path({wh!r}) / table / "run_id=bench")
s = r.runs[0].summary
out = {{"stage_s": stage_s, "ttft_p99_s": s["ttft_p99_s"], "completed": s["completed"]}}
"""

PROFILE = """
import tempfile
from pathlib import Path
import numpy as np
from pipeline.contracts import write_bytes
from pipeline.sim.replay import load_loop
from pipeline.sim.replay_input import prepare, read_window, select_request_files
from pipeline.sim.replay_sharded import ShardTask, replay_shard, whole_input_parts
from pipeline.sim.scenario import build_scenario
from pipeline.sim.shard import plan_shards
from pipeline.sim.summary import RequestTotals, StepTotals
from pipeline.warehouse import Warehouse
sc = build_scenario({{"name": "shards", "policy": "vllm", "replicas": {replicas},
                      "router": "round_robin", "max_model_len": 16384}})
frame, _ = read_window(select_request_files(Warehouse(Path({wh!r}))), None)
prep = prepare(frame, sc, with_groups=False)
del frame
load_loop(sc.engine(), quiet=True)
fixed_s = time.perf_counter() - t0
worker, driver = [], []
totals, steps = RequestTotals(), StepTotals()
with tempfile.TemporaryDirectory() as d:
    parts = whole_input_parts(prep.inp, prep.request_ids, sc, plan_shards(sc, {replicas}))
    for k, cut in enumerate(parts):
        task = ShardTask(sc, cut, 1 << 17)
        t = time.perf_counter()
        part = replay_shard(task)
        worker.append(time.perf_counter() - t)
        t = time.perf_counter()
        totals.merge(part.totals)
        steps.merge(part.steps)
        for name, data in part.files.items():
            write_bytes(data, Path(d) / f"{{name}}.part-{{k:05d}}.parquet")
        driver.append(time.perf_counter() - t)
out = {{"fixed_s": fixed_s, "parts": len(worker), "worker_s": sum(worker),
        "driver_s": sum(driver), "worker_part_s": float(np.median(worker)),
        "driver_part_s": float(np.median(driver))}}
"""


def variants(ray_address: str | None) -> dict[str, str]:
    out = {
        "whole": "",
        f"{SHARDS} shards, 1 job": f"shards={SHARDS}, jobs=1",
        f"{SHARDS} shards, 2 jobs": f"shards={SHARDS}, jobs=2",
    }
    if ray_address is not None:
        out[f"{SHARDS} shards, Ray (2 CPUs)"] = f"shards={SHARDS}, ray_address={ray_address!r}"
    return out


def start_ray() -> tuple[subprocess.Popen[bytes], str, str]:
    """A local Ray head with 2 worker CPUs; its process, its address and its folder."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp}", "--block"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    import time

    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the Ray head did not start") from None
            time.sleep(0.2)
    time.sleep(2.0)  # (its raylet registers after the GCS port opens)
    return proc, f"127.0.0.1:{port}", tmp


def stop_ray(proc: subprocess.Popen[bytes], tmp: str) -> None:
    import os
    import shutil
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=N)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    n = args.requests
    wh = make_warehouse(n, RATE_PER_REPLICA * REPLICAS)
    ray = None if args.no_ray else start_ray()
    try:
        runs: dict[str, list[dict[str, Any]]] = {}
        named = variants(None if ray is None else ray[1])
        for _ in range(args.repeats):
            for name, kw in named.items():
                r = child(RUN.format(wh=str(wh), replicas=REPLICAS, kw=kw), repeats=1)
                r["load"] = os.getloadavg()[0]
                runs.setdefault(name, []).append(r)
                print(f"{name:<26} process {r['wall_s']:6.2f} s  stage {r['stage_s']:6.2f} s")
        prof = child(PROFILE.format(wh=str(wh), replicas=REPLICAS), repeats=1)
    finally:
        if ray is not None:
            stop_ray(ray[0], ray[2])

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    base = med("whole", "wall_s")
    lines = [
        f"{n:,} requests, {REPLICAS} replicas under round_robin (parts: replica groups, "
        f"exact), medians of {args.repeats} fresh processes each, interleaved:",
        "",
        "| variant | process s | stage s | whole / variant | TTFT p99 ms | load |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in named:
        lines.append(
            f"| {name} | {med(name, 'wall_s'):.2f} | {med(name, 'stage_s'):.2f} "
            f"| {base / med(name, 'wall_s'):.2f}x | {med(name, 'ttft_p99_s') * 1e3:.1f} "
            f"| {max(r['load'] for r in runs[name]):.1f} |"
        )
    parts = int(prof["parts"])
    lines += [
        "",
        f"Profile, {parts} one-replica parts replayed one at a time in one process: fixed cost "
        f"(imports, read, prepare, load the loop) {prof['fixed_s']:.2f} s; per part "
        f"{prof['worker_part_s'] * 1e3:.0f} ms in the worker (the loop, its tables and "
        f"their Parquet files; {prof['worker_s']:.2f} s for all) and "
        f"{prof['driver_part_s'] * 1e3:.1f} ms in the driver (writing the files, adding up "
        f"the totals; {prof['driver_s']:.2f} s for all).",
        "",
        "Extrapolated wall time on W workers, from the profile: fixed + ceil(parts / W) x "
        "worker time per part + all parts' driver time (the driver writes the parts one "
        "after the other); shipping each part's input to its worker and its files back, and "
        "a worker's start (a Ray worker imports tracereplay and loads the compiled loop), "
        "are not counted:",
        "",
        "| workers | parts | extrapolated s | whole / extrapolated |",
        "|---:|---:|---:|---:|",
    ]
    for w in (1, 2, 16, 64):
        t = prof["fixed_s"] + -(-parts // w) * prof["worker_part_s"] + prof["driver_s"]
        lines.append(f"| {w} | {parts} | {t:.2f} | {base / t:.2f}x |")
    body = "\n".join(lines)
    print(body)
    if not args.no_record:
        record("Sharded replay: local workers and Ray", this_command(), body)


if __name__ == "__main__":
    main()
