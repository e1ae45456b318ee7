"""Replay speed with issue 25's features off, each on alone, and all on.

Issue 25 adds four features to the simulator: swap preemption, a CPU tier of the KV
cache, the scheduler's CPU time (synchronous and asynchronous engines) and speculative
decoding. Each must leave the replay as fast as before when it is off (within 5% of the
baseline commit), and costs what it costs when on. This times ``simulate`` alone (after
a warm-up call, in fresh processes, the trees interleaved, medians of ``--repeats``,
each the fastest of ``--inner`` replays in its process) on
``--requests`` requests with the Azure conversation trace's lengths (log-normal lengths
when the trace is not there), Poisson arrivals near 75% of one replica's capacity, vLLM
with chunked prefill on one replica, and prints requests replayed per second:

- each feature's scenario overrides (``FEATURES``, one table) against ``off`` in this
  tree: the feature's cost;
- with ``--against REV``, every row also in that commit's tree (as bench/house_speed.py
  does): ``off`` there against ``off`` here is the "feature off within 5%" check.

A feature whose keys a tree's scenario loader rejects (not merged there yet) is reported
as "not available" for that tree; "all on" merges the features this tree has.

Run from the repository root:

    .venv/bin/python bench/feature_speed.py                     # 50k requests, medians of 3
    .venv/bin/python bench/feature_speed.py --against main      # and the same rows at main
    .venv/bin/python bench/feature_speed.py --only off "sched CPU (async)" --requests 20000
    .venv/bin/python bench/feature_speed.py --only off --against eb147df --inner 4 --repeats 7
    .venv/bin/python bench/feature_speed.py --record            # into bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import AZURE_LENGTHS, checkout, child, record  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"

BASE = {"policy": "vllm", "enable_chunked_prefill": True, "max_model_len": 16384}
RATE = 16.8  # req/s, about 75% of one H100 replica of the default profile (house_speed.py)

# feature -> the scenario keys that turn it on (over BASE). Edit a row here when a feature's
# key is named differently once merged; a key the loader rejects reads "not available".
FEATURES: dict[str, dict[str, Any]] = {
    "off": {},
    # swap is vLLM V0's: the synchronous loop without prefix caching (refused otherwise)
    "swap": {
        "preemption_mode": "swap",
        "swap_space_gb": 4.0,
        "async_scheduling": False,
        "enable_prefix_caching": False,
    },
    "CPU KV tier": {"kv_offloading_size_gb": 64.0},
    # the scheduler's CPU time (docs/replay.md): about vLLM's 1.5 ms + 10 us per sequence
    "sched CPU (async)": {"sched_cpu_s": 1.5e-3, "sched_cpu_per_seq_s": 1e-5},
    "sched CPU (sync)": {
        "sched_cpu_s": 1.5e-3,
        "sched_cpu_per_seq_s": 1e-5,
        "async_scheduling": False,
    },
    "speculative decoding": {
        "speculative": {"method": "eagle", "num_tokens": 3, "acceptance": 0.7},
        "async_scheduling": False,
    },
}
ALL_ON = "all on"
# features "all on" leaves out: the asynchronous variant contradicts the synchronous one
# (which speculation needs), and swap and the CPU tier are refused with speculation (and
# with each other: swap needs prefix caching off, the tier needs it on)
NOT_IN_ALL = ("off", "sched CPU (async)", "swap", "CPU KV tier")

LOOP = """
import numpy as np
from pathlib import Path
from pipeline.errors import ScenarioError
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput
try:
    sc = build_scenario({scenario!r})
except ScenarioError as exc:
    sc = None
    out = {{"available": 0}}
if sc is not None:
    eng = sc.engine()
    simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), eng)
    data = np.load({data!r})
    inp = SimInput(data["arrival"], data["prompt"], data["output"])
    loop_s = float("inf")
    for _ in range({inner}):  # the fastest of --inner replays in this process
        t = time.perf_counter()
        res = simulate(inp, eng)
        loop_s = min(loop_s, time.perf_counter() - t)
    out = {{"available": 1, "loop_s": loop_s, "req_per_s": len(inp.arrival_s) / loop_s,
            "steps": res.num_steps}}
"""

WORKLOAD = (
    """
import numpy as np
from pathlib import Path
rng = np.random.default_rng(1)
"""
    + AZURE_LENGTHS
    + """
output = np.maximum(output, 1)
arrival = np.cumsum(rng.exponential(1.0 / {rate}, {n}))
np.savez({path!r}, arrival=arrival, prompt=np.minimum(prompt, 12000), output=output)
out = {{}}
"""
)


def scenarios(only: list[str] | None) -> dict[str, dict[str, Any]]:
    """Each row's full scenario (BASE + its keys); "all on" merges the features but NOT_IN_ALL."""
    rows = {name: {**BASE, **keys} for name, keys in FEATURES.items()}
    merged = dict(BASE)
    for name, keys in FEATURES.items():
        if name not in NOT_IN_ALL:
            merged |= keys
    rows[ALL_ON] = merged
    if only:
        unknown = sorted(set(only) - set(rows))
        if unknown:
            raise SystemExit(f"unknown rows {unknown}; rows are {list(rows)}")
        rows = {k: v for k, v in rows.items() if k in only}
    return rows


def available_features(path: str) -> dict[str, dict[str, Any]]:
    """The features (but NOT_IN_ALL) whose keys the scenario loader of the tree at ``path``
    takes: what "all on" merges there."""
    code = (
        "from pipeline.errors import ScenarioError\n"
        "from pipeline.sim.scenario import build_scenario\n"
        "ok = {}\n"
        f"for name, keys in {FEATURES!r}.items():\n"
        "    try:\n"
        f"        build_scenario({{**{BASE!r}, **keys}})\n"
        "        ok[name] = 1\n"
        "    except ScenarioError:\n"
        "        ok[name] = 0\n"
        "out = ok\n"
    )
    got = child(code, repeats=1, pythonpath=path)
    return {n: FEATURES[n] for n in FEATURES if got.get(n) == 1 and n not in NOT_IN_ALL}


def _fmt(runs: list[dict[str, float]]) -> float | None:
    if not runs or runs[0].get("available") != 1:
        return None
    return statistics.median(r["req_per_s"] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=50_000, help="requests replayed")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per row and tree")
    ap.add_argument("--against", default=None, help="also time every row at this commit")
    ap.add_argument(
        "--inner",
        type=int,
        default=1,
        help="replays per process, the fastest kept (a process's noise is its own: memory "
        "placement moves a replay by 20-40%% on this machine class; use 4 for the 5%% check)",
    )
    ap.add_argument("--only", nargs="+", default=None, help="only these rows (names above)")
    ap.add_argument("--record", action="store_true", help="write bench/RESULTS.md's section")
    args = ap.parse_args()
    trees = {"now": str(ROOT)}
    if args.against:
        trees[args.against] = checkout(args.against)
    tmp = Path(tempfile.mkdtemp(prefix="features-"))
    try:
        data = tmp / "workload.npz"
        child(
            WORKLOAD.format(n=args.requests, rate=RATE, path=str(data), azure=str(AZURE)),
            repeats=1,
        )
        rows = scenarios(args.only)
        per_tree = {name: {**BASE} for name in trees}  # each tree's "all on"
        for name, path in trees.items():
            for keys in available_features(path).values():
                per_tree[name] |= keys
        speed: dict[str, dict[str, float | None]] = {}
        for label, scenario in rows.items():
            speed[label] = {}
            runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
            codes = {
                k: LOOP.format(
                    scenario=per_tree[k] if label == ALL_ON else scenario,
                    data=str(data),
                    inner=args.inner,
                )
                for k in trees
            }
            for k, path in trees.items():  # warm-up: compile (or load) each tree's cache
                child(codes[k], repeats=1, pythonpath=path)
            for _ in range(args.repeats):
                for k, path in trees.items():
                    runs[k].append(child(codes[k], repeats=1, pythonpath=path))
            for k in trees:
                speed[label][k] = _fmt(runs[k])
            print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in speed[label].items()), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for k, path in trees.items():
            if k != "now":
                shutil.rmtree(path, ignore_errors=True)
    body = _table(speed, trees, args.against)
    print(body)
    if args.record:
        record(
            "Issue 25 features: replay speed off, each on, all on",
            "python bench/feature_speed.py"
            + (f" --against {args.against}" if args.against else ""),
            body + f"\n\n{args.requests:,} requests (Azure conversation lengths, Poisson at "
            f"{RATE} req/s), vLLM chunked prefill, one replica; medians of {args.repeats} "
            "fresh processes, trees interleaved. Target: off within 5% of the baseline.",
        )


def _table(
    speed: dict[str, dict[str, float | None]], trees: dict[str, str], against: str | None
) -> str:
    off = speed.get("off", {}).get("now")
    head = "| row | req/s now | vs off now |"
    rule = "|---|---:|---:|"
    if against:
        head += f" req/s at {against} | now / {against} |"
        rule += "---:|---:|"
    lines = [head, rule]
    for label, by_tree in speed.items():
        now = by_tree.get("now")
        cells = [label, _num(now), _ratio(now, off)]
        if against:
            then = by_tree.get(against)
            cells += [_num(then), _ratio(now, then)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "not available" if v is None else f"{v:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.3f}"


if __name__ == "__main__":
    main()
