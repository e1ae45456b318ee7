"""Fleet speed: one pool of N replicas against two pools (split by prompt length) of N in all.

Workload: ``--requests`` (default 1,000,000) requests with Poisson arrivals, their
prompt and output lengths drawn from the Azure LLM conversation trace (2023) by
the scenario (``arrivals = "poisson"``, ``num_requests``), at 75% of what
``--replicas`` Mistral-7B/H100 replicas of the ``vllm`` scenario sustain
(``RATE_PER_REPLICA`` req/s each). The same requests (the same seed) go to:

- ``one pool``: N replicas, router least_outstanding;
- ``two pools``: prompts up to ``SPLIT_TOKENS`` on one pool, the rest on another,
  the N replicas shared between them in proportion to their tokens (each >= 1);
- ``two pools + 2P2D`` (``disagg_case``): the short pool's replicas as two
  aggregated pools (prompts up to ``MID_TOKENS``, up to ``SPLIT_TOKENS``) and
  the long prompts on a disaggregated pool of 2 prefill and 2 decode workers.

Figures, each the median of 3 rounds with the cases interleaved, each run in a
fresh process: ``loop`` is the simulation alone (``simulate``, or
``simulate_fleet`` with its merge), the requests already prepared; ``replay`` is
the whole ``api.replay`` (read, prepare, simulate, summarise, write
``sim_requests`` and ``sim_steps``), without intervals. Each ratio is the case's
time over one pool's.

Run from the repository root:

    .venv/bin/python bench/fleet_speed.py              # 1M requests, writes bench/RESULTS.md
    .venv/bin/python bench/fleet_speed.py --requests 200000 --no-record
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import child, record  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
PROFILE = "mistral-7b_h100-80gb_tp1"  # 32k context: every Azure prompt fits
RATE_PER_REPLICA = 16.5  # 75% of the 22 req/s one replica serves flat out on these lengths
SPLIT_TOKENS = 2048  # the short pool takes prompts up to this
MID_TOKENS = 1024  # with 2P2D: the first aggregated pool takes prompts up to this
REPLICAS = 8

RUN = """
import time
from pathlib import Path
from pipeline import api
from pipeline.sim.replay_input import prepare, read_requests, select_request_files
from pipeline.sim.replay import load_loop
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.disagg import simulate_disaggregated
from pipeline.warehouse import Warehouse
sc_dict = {scenario!r}
wh = Path({warehouse!r})
sc = build_scenario(sc_dict)
load_loop(sc.engine(), quiet=True)
frame = read_requests(select_request_files(Warehouse(wh)))
prep = prepare(frame, sc, with_groups=False)
t = time.perf_counter()
if sc.pools:
    from pipeline.sim.fleet import simulate_fleet
    res = simulate_fleet(sc, prep).result
else:
    res = simulate(prep.inp, sc.engine())
loop_s = time.perf_counter() - t
n = res.num_requests
del res
pools_s = loop_s
if sc.pools:  # the pools' own loops, without simulate_fleet's shifting and merging
    pools_s = 0.0
    for k, pool in enumerate(sc.pools):
        t = time.perf_counter()
        if pool.scenario.disagg is not None:
            simulate_disaggregated(prep.prepared[k].inp, pool.scenario)
        else:
            simulate(prep.prepared[k].inp, pool.scenario.engine())
        pools_s += time.perf_counter() - t
del prep, frame
t = time.perf_counter()
run = api.replay(sc_dict, warehouse=wh, intervals=False)
replay_s = time.perf_counter() - t
completed = run.scenarios[sc_dict["name"]].summary.completed
out = {{"loop_s": loop_s, "pools_s": pools_s, "replay_s": replay_s, "requests": n}}
out["completed"] = completed
"""


def base(n: int, replicas: int) -> dict[str, Any]:
    return {
        "policy": "vllm",
        "profile": PROFILE,
        "router": "least_outstanding",
        "arrivals": "poisson",
        "rate": RATE_PER_REPLICA * replicas,
        "num_requests": n,
        "seed": 1,
    }


def one_pool(n: int, replicas: int) -> dict[str, Any]:
    return {**base(n, replicas), "name": "one-pool", "replicas": replicas}


def two_pools(n: int, replicas: int, short_share: float) -> dict[str, Any]:
    """The N replicas split by the short pool's share of the tokens."""
    short = min(replicas - 1, max(1, round(replicas * short_share)))
    return {
        **base(n, replicas),
        "name": "two-pools",
        "pool": [
            {"name": "short", "max_prompt_tokens": SPLIT_TOKENS, "replicas": short},
            {"name": "long", "replicas": replicas - short},
        ],
    }


def disagg_case(n: int, replicas: int, shares: tuple[float, float]) -> dict[str, Any]:
    """Two aggregated pools and a disaggregated one of 2 prefill and 2 decode workers
    (2P2D), the same requests: prompts up to ``MID_TOKENS`` and up to ``SPLIT_TOKENS``
    on the aggregated pools (``replicas``, the short pool's of ``two_pools``, shared
    between them by their tokens, ``shares``), the longer ones (the long pool's of
    ``two_pools``) on the 2P2D pool.
    """
    short = min(replicas - 1, max(1, round(replicas * shares[0] / (shares[0] + shares[1]))))
    return {
        **base(n, replicas),
        "name": "2p2d",
        "pool": [
            {"name": "short", "max_prompt_tokens": MID_TOKENS, "replicas": short},
            {"name": "mid", "max_prompt_tokens": SPLIT_TOKENS, "replicas": replicas - short},
            {"name": "pd", "prefill_replicas": 2, "decode_replicas": 2},
        ],
    }


def token_share(max_prompt: int) -> float:
    """The share of the trace's prompt + output tokens in prompts up to ``max_prompt``."""
    import polars as pl

    df = pl.read_csv(AZURE)
    tokens = df["ContextTokens"] + df["GeneratedTokens"]
    short = tokens.filter(df["ContextTokens"] <= max_prompt).to_numpy().sum()
    return float(short / tokens.to_numpy().sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=REPLICAS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    from pipeline import api

    load_at_start = os.getloadavg()[0]

    scratch = Path(tempfile.mkdtemp(prefix="fleet-speed-"))
    wh = scratch / "warehouse"
    try:
        counts = api.ingest(AZURE, warehouse=wh)
        assert counts.ok, counts.errors
        share = token_share(SPLIT_TOKENS)
        mid = token_share(MID_TOKENS)
        cases = {
            "one pool": one_pool(args.requests, args.replicas),
            "two pools": two_pools(args.requests, args.replicas, share),
        }
        n_short = cases["two pools"]["pool"][0]["replicas"]
        cases["two pools + 2P2D"] = disagg_case(args.requests, n_short, (mid, share - mid))
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in cases}
        for r in range(args.rounds):
            for name, sc in cases.items():
                got = child(RUN.format(scenario=sc, warehouse=str(wh)), 1, str(ROOT))
                runs[name].append(got)
                print(f"round {r + 1} {name}: {json.dumps(got)}", flush=True)
                shutil.rmtree(wh / "sim_steps", ignore_errors=True)  # keep the disk small
                shutil.rmtree(wh / "sim_requests", ignore_errors=True)
        body = report(args, cases, runs, share, load_at_start)
        print(body)
        if not args.no_record:
            cmd = "python bench/fleet_speed.py" + (
                f" --requests {args.requests}" if args.requests != 1_000_000 else ""
            )
            record("Fleet speed: one pool against two", cmd, body)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(
    args: argparse.Namespace,
    cases: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, float]]],
    share: float,
    load_at_start: float,
) -> str:
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in runs.items()}
    one = med["one pool"]
    pools = cases["two pools"]["pool"]
    lines = [
        f"{args.requests:,} requests, Poisson at {RATE_PER_REPLICA * args.replicas:g} req/s, "
        f"lengths drawn from the Azure conversation trace; {PROFILE}, vllm, least_outstanding. "
        f"Two pools: prompts <= {SPLIT_TOKENS} tokens on {pools[0]['replicas']} replicas "
        f"({share:.0%} of the tokens), the rest on {pools[1]['replicas']}. Medians of "
        f"{args.rounds} interleaved rounds, fresh processes; load average at the start "
        f"{load_at_start:.1f} (shared machine).",
        "",
        "| case | replicas | loop (s) | ratio | pools' loops alone (s) | whole replay (s) | ratio "
        "| peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in med.items():
        sc = cases[name]
        reps = sc.get("replicas") or sum(
            p.get("replicas", 0) + p.get("prefill_replicas", 0) + p.get("decode_replicas", 0)
            for p in sc["pool"]
        )
        lines.append(
            f"| {name} | {reps} | {m['loop_s']:.2f} | {m['loop_s'] / one['loop_s']:.2f}x | "
            f"{m['pools_s']:.2f} | {m['replay_s']:.1f} | {m['replay_s'] / one['replay_s']:.2f}x | "
            f"{max(x['peak_rss_mb'] for x in runs[name]):,.0f} |"
        )
    p3 = cases["two pools + 2P2D"]["pool"]
    lines += [
        "",
        f"Two pools + 2P2D: prompts <= {MID_TOKENS} tokens on {p3[0]['replicas']} replicas, "
        f"<= {SPLIT_TOKENS} on {p3[1]['replicas']}, the rest on a disaggregated pool of 2 "
        "prefill and 2 decode workers (ib_ndr).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
