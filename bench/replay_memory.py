"""Peak memory of a long replay: 10M requests through the replay stage.

The workload is bench/sim_speed.py's: Azure conversation lengths (drawn with
replacement, seed 1) and Poisson arrivals at 75% of what the scenario
sustains saturated; the scenario is ``vllm`` with chunked prefill on one
Llama-3-8B/H100 replica, every step recorded. The replay runs as
``replay()`` does for ``tracereplay replay``: read the Parquet, prepare, run,
write sim_requests and sim_steps. Peak RSS is the child process's maximum
resident set (``ru_maxrss``), imports included; one run per size (the 10M run
takes minutes).

Run from the repository root:

    .venv/bin/python bench/replay_memory.py              # 1M and 10M, writes bench/RESULTS.md
    .venv/bin/python bench/replay_memory.py --sizes 1000000 --no-record

Target (issue 12): a replay of 10M requests within 3 GB peak RSS.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import child, record  # noqa: E402
from sim_speed import SCENARIO, STAGE, capacity, make_warehouse  # noqa: E402

TARGET_MB = 3 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    cap = capacity()
    rate = 0.75 * cap
    print(f"capacity {cap:.1f} req/s; Poisson arrivals at {rate:.1f} req/s", flush=True)
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
    if args.no_record:
        return
    lines = [
        "Scenario: `vllm`, chunked prefill, 1 replica, llama-3-8b_h100-80gb_tp1; Azure-conv "
        f"lengths, Poisson arrivals at {rate:.1f} req/s (75% of saturation), as in the "
        "Simulator section. One fresh process per size; peak RSS includes the imports.",
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
    lines += ["", "Target: a 10M-request replay within 3 GB peak RSS."]
    record(
        "Replay memory (10M requests)",
        ".venv/bin/python bench/replay_memory.py",
        "\n".join(lines),
    )
    print("recorded in bench/RESULTS.md")


if __name__ == "__main__":
    main()
