"""Peers: a whole ``tracereplay replay`` process against Dynamo's mocker on the same traces.

NVIDIA Dynamo (PyPI ``ai-dynamo``) simulates an engine in Rust (``ai-dynamo-runtime``)
and replays a Mooncake JSONL trace offline with ``dynamo.replay.run_trace_replay``
(its mocker's trace-replay mode; the ``python -m dynamo.mocker`` command serves a
mock engine over the network and replays no trace). This script installs it in a
venv of its own under the user's cache directory (``$XDG_CACHE_HOME``, default
``~/.cache``, ``tracereplay-peers/``), never in the repository, writes seeded
synthetic Mooncake traces (Poisson arrivals, shared prefix groups), ingests each
into a temporary warehouse, and times fresh processes of both, interleaved:

- ``tracereplay replay --warehouse WH --json`` (the default vllm scenario; the
  compiled loop's cache warm: one untimed run first);
- ``python -c "run_trace_replay(trace)"`` in Dynamo's venv (its defaults: one
  aggregated vllm-like worker, round-robin router).

Each tool runs with its own default engine model, so the figures compare the cost
of a replay command, not the latencies it predicts.

``ai-dynamo`` 1.6.1 requires ``aisimulate``, a placeholder on PyPI that downloads its
real wheel from NVIDIA's own index at install time; where that index cannot be
reached the install fails, so the venv gets ``ai-dynamo`` and ``ai-dynamo-runtime``
without their dependencies (plus ``typing_extensions``, which the replay imports):
the offline trace replay needs nothing more.

    .venv/bin/python bench/peers.py              # 1k and 10k requests, writes RESULTS
    .venv/bin/python bench/peers.py --sizes 1000 --repeats 3

Target (issue 26): tracereplay >= 20x faster than the mocker, whole process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import record  # noqa: E402

TRACEREPLAY = str(Path(sys.executable).parent / "tracereplay")
DYNAMO = ["ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1", "typing_extensions"]
MOCKER = (
    "import sys\nfrom dynamo.replay import run_trace_replay\n"
    "r = run_trace_replay(sys.argv[1])\n"
    "assert r.summary['completed_requests'] == int(sys.argv[2]), r.summary\n"
)


def dynamo_python() -> Path:
    """The python of a venv holding Dynamo (made once, then reused)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = cache / "tracereplay-peers" / "dynamo-1.6.1"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", *DYNAMO]
        subprocess.run(pip, check=True)
    return python


def write_trace(path: Path, n: int, rate: float, seed: int = 1) -> None:
    """A Mooncake JSONL trace of ``n`` requests: Poisson arrivals at ``rate`` per second,
    prompts of 1-12 blocks of 512 tokens, half of them sharing a prefix of one of 20
    groups."""
    rng = random.Random(seed)
    t_ms = 0.0
    next_id = 10_000
    with path.open("w") as f:
        for _ in range(n):
            t_ms += rng.expovariate(rate) * 1000
            blocks = rng.randint(1, 12)
            shared = rng.randint(0, blocks) if rng.random() < 0.5 else 0
            group = rng.randrange(20) * 100
            hashes = [group + i for i in range(shared)]
            hashes += list(range(next_id, next_id + blocks - shared))
            next_id += blocks - shared
            row = {
                "timestamp": int(t_ms),
                "input_length": blocks * 512 - rng.randrange(512),
                "output_length": rng.randint(16, 512),
                "hash_ids": hashes,
            }
            f.write(json.dumps(row) + "\n")


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="requests per trace")
    parser.add_argument("--rate", type=float, default=8.0, help="arrivals per second")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = dynamo_python()
    tmp = Path(tempfile.mkdtemp(prefix="tracereplay-peers-"))
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            trace, wh = tmp / f"mooncake_{n}.jsonl", tmp / f"wh_{n}"
            write_trace(trace, n, args.rate)
            subprocess.run(
                [TRACEREPLAY, "ingest", str(trace), "--warehouse", str(wh)],
                check=True,
                capture_output=True,
            )
            ours = [TRACEREPLAY, "replay", "--warehouse", str(wh), "--json"]
            theirs = [str(python), "-c", MOCKER, str(trace), str(n)]
            wall(ours)  # the compiled loop's cache, warm
            wall(theirs)
            times: dict[str, list[float]] = {"ours": [], "theirs": []}
            for _ in range(args.repeats):
                times["ours"].append(wall(ours))
                times["theirs"].append(wall(theirs))
            med = {k: statistics.median(v) for k, v in times.items()}
            ratio = med["theirs"] / med["ours"]
            print(
                f"{n:,} requests: tracereplay replay {med['ours']:.2f} s, Dynamo mocker "
                f"{med['theirs']:.2f} s: tracereplay {ratio:.2f}x the mocker's speed",
                flush=True,
            )
            rows.append(f"| {n:,} | {med['ours']:.2f} | {med['theirs']:.2f} | {ratio:.2f}x | 20x |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"Whole processes, wall seconds, medians of {args.repeats} (interleaved); synthetic "
        f"Mooncake traces at {args.rate:g} requests/s; each tool's default engine model; "
        "ai-dynamo 1.6.1.",
        "",
        "| requests | tracereplay replay s | Dynamo mocker s | speed ratio | target |",
        "|---:|---:|---:|---:|---:|",
        *rows,
    ]
    record("Peers", "python bench/peers.py", "\n".join(lines))


if __name__ == "__main__":
    main()
