"""End to end at 1M, 5M and 10M requests: read + prepare, and read + replay + write, with peak RSS.

The warehouses are the ones ``sim_speed.py`` builds (Azure conversation lengths,
Poisson arrivals), here at a fixed 16.8 req/s (75% of what the scenario sustains
saturated on one Llama-3-8B/H100 replica, see bench/RESULTS.md, Simulator). The
scenario is ``vllm`` with chunked prefill.

Each size runs in fresh processes (the compiled loop loaded from numba's cache
first, so the figures exclude start-up):
- read + prepare: ``read_requests`` and ``prepare`` alone, in their own process;
- end to end: ``replay()`` (read, prepare, simulate, write sim_requests and
  sim_steps), with its parts: read, prepare, loop (the compiled loop alone),
  and write (the rest: building and writing the tables, whose step rows are
  written as the loop hands them out, and the summary);
- peak RSS of the end-to-end process (whole process, max over runs);
- at the first size, the end to end replay with ``jobs=1`` (the profile term's
  two replays for the intervals one after the other, in this process) against
  ``jobs=2`` (in forked children beside the main replay), alternating.

The end to end replays carry intervals (the default): three replays of the loop,
whose two profile replays are in ``write``.

Run from the repository root:

    .venv/bin/python bench/e2e_scale.py              # 1M, 5M, 10M; writes bench/RESULTS.md
    .venv/bin/python bench/e2e_scale.py --sizes 1    # 1M only; prints, writes nothing

Targets (issue 14): read + prepare of 5M <= 5.5x that of 1M; 1M end to end
<= 5 s and <= 1 GB; 5M <= 25 s and <= 3 GB; 10M replays within 24 GB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import child, record  # noqa: E402
from sim_speed import SCENARIO, make_warehouse  # noqa: E402

RATE = 16.8

PREP = """
import numpy as np
from pathlib import Path
from pipeline.sim.scenario import build_scenario
from pipeline.sim.replay_input import read_requests, prepare
from pipeline.warehouse import Warehouse
from pipeline.contracts import REQUESTS
sc = build_scenario({scenario!r})
t = time.perf_counter()
frame = read_requests(Warehouse(Path({wh!r})).files(REQUESTS))
read_s = time.perf_counter() - t
prep = prepare(frame, sc)
out = {{"read_s": read_s, "prepare_s": time.perf_counter() - t - read_s,
        "read_prepare_s": time.perf_counter() - t}}
"""

E2E = """
import shutil
import numpy as np
from pathlib import Path
import pipeline.sim.replay as rp
from pipeline.sim.scenario import build_scenario
sc = build_scenario({scenario!r})
rp.load_loop(sc.engine(), quiet=True)
parts = {{"read": 0.0, "prepare": 0.0}}
def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            parts[name] += time.perf_counter() - t
    return wrapper
rp.read_window = timed("read", rp.read_window)
rp.prepare = timed("prepare", rp.prepare)
t = time.perf_counter()
result = rp.replay(Path({wh!r}), [sc], quiet=True, run_id="bench-e2e", jobs={jobs})
e2e_s = time.perf_counter() - t
for table in ("sim_requests", "sim_steps", "scenarios"):
    shutil.rmtree(Path({wh!r}) / table / "run_id=bench-e2e", ignore_errors=True)
(Path({wh!r}) / "runs" / "bench-e2e.parquet").unlink(missing_ok=True)
out = {{"e2e_s": e2e_s, "sim_s": result.runs[0].sim_s, "read_s": parts["read"],
        "prepare_s": parts["prepare"],
        "write_s": e2e_s - parts["read"] - parts["prepare"] - result.runs[0].sim_s,
        "completed": result.runs[0].summary["completed"]}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,5,10", help="millions of requests, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size below 10M")
    args = parser.parse_args()
    sizes = [int(float(s) * 1_000_000) for s in args.sizes.split(",")]
    whs = {n: make_warehouse(n, RATE) for n in sizes}
    # read + prepare: the sizes interleaved, so that their ratio sees the same machine load
    preps: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    for k in range(args.repeats):
        for n in sizes:
            if n < 10_000_000 or k == 0:
                preps[n].append(child(PREP.format(scenario=SCENARIO, wh=str(whs[n])), repeats=1))
    rows = []
    for n in sizes:
        prep = {key: statistics.median(r[key] for r in preps[n]) for key in preps[n][0]}
        reps = 1 if n >= 10_000_000 else args.repeats
        e2e = child(E2E.format(scenario=SCENARIO, wh=str(whs[n]), jobs=None), repeats=reps)
        rows.append((n, prep, e2e))
        print(
            f"{n:>10,}: read+prepare {prep['read_prepare_s']:.2f} s (read {prep['read_s']:.2f}, "
            f"prepare {prep['prepare_s']:.2f}); end to end {e2e['e2e_s']:.2f} s (read "
            f"{e2e['read_s']:.2f}, prepare {e2e['prepare_s']:.2f}, loop {e2e['sim_s']:.2f}, "
            f"write {e2e['write_s']:.2f}); peak RSS {e2e['peak_rss_mb']:,.0f} MB",
            flush=True,
        )
    n0 = sizes[0]  # the profile term's replays beside the main one, or one after the other
    side: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for jobs in (1, 2):
            code = E2E.format(scenario=SCENARIO, wh=str(whs[n0]), jobs=jobs)
            side[jobs].append(child(code, repeats=1))
    walls = {j: statistics.median(r["e2e_s"] for r in rs) for j, rs in side.items()}
    pairs = [b["e2e_s"] / a["e2e_s"] for a, b in zip(side[1], side[2], strict=True)]
    print(
        f"{n0:,} end to end with intervals: {walls[1]:.2f} s with --jobs 1, {walls[2]:.2f} s "
        f"with --jobs 2 (the profile replays in forked children): {walls[2] / walls[1]:.2f}x, "
        f"median of {len(pairs)} pairs {statistics.median(pairs):.2f}x; load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    base = rows[0]
    for n, prep, _ in rows[1:]:
        ratio = prep["read_prepare_s"] / base[1]["read_prepare_s"]
        pairs = [  # each round's sizes ran one after the other: their ratio saw one load
            a["read_prepare_s"] / b["read_prepare_s"]
            for a, b in zip(preps[n], preps[base[0]], strict=False)
        ]
        print(
            f"read+prepare {n:,} / {base[0]:,}: {ratio:.2f}x of the medians, "
            f"{statistics.median(pairs):.2f}x the median of {len(pairs)} pairs "
            f"({', '.join(f'{p:.2f}' for p in pairs)}; linear: {n / base[0]:.1f}x)"
        )
    if sizes != [1_000_000, 5_000_000, 10_000_000]:
        return
    lines = [
        f"Scenario: `vllm`, chunked prefill, 1 replica; Azure-conv lengths, Poisson arrivals at "
        f"{RATE} req/s. Fresh processes (read + prepare: the sizes interleaved), the compiled "
        f"loop loaded first; medians of {args.repeats} (10M: 1 run); peak RSS of the "
        "end-to-end process.",
        "",
        "| requests | read + prepare s | ratio to 1M | end to end s | read | prepare | loop "
        "| write | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, prep, e2e in rows:
        lines.append(
            f"| {n:,} | {prep['read_prepare_s']:.2f} | "
            f"{prep['read_prepare_s'] / base[1]['read_prepare_s']:.2f}x | {e2e['e2e_s']:.2f} | "
            f"{e2e['read_s']:.2f} | {e2e['prepare_s']:.2f} | {e2e['sim_s']:.2f} | "
            f"{e2e['write_s']:.2f} | {e2e['peak_rss_mb']:,.0f} |"
        )
    lines += [
        "",
        "Targets: read + prepare 5M <= 5.5x 1M; end to end 1M <= 5 s and <= 1,024 MB, "
        "5M <= 25 s and <= 3,072 MB; 10M within 24 GB. Load average (1 min) at the end: "
        f"{os.getloadavg()[0]:.1f} on 2 cores shared with other work; wall times grow with "
        "it, peak RSS does not. `write`: everything but reading, preparing and the loop "
        "(building the tables, the summary, writing; the step rows are written while the "
        "loop runs).",
    ]
    record("End to end at scale", "python bench/e2e_scale.py", "\n".join(lines))


if __name__ == "__main__":
    main()
