"""Loop speed before and after vLLM's async scheduling was modelled, in one run.

Three versions of ``simulate`` replay the same requests, alternating in fresh
processes so that the machine's load falls on all of them alike:

- before: the ``pipeline`` package of a baseline commit (``--baseline``, default
  ``main``), which has only the synchronous loop;
- after, ``async_scheduling = false``: this tree, the synchronous loop;
- after, ``async_scheduling = true``: this tree, the default.

Two workloads, each ``vllm`` with chunked prefill on one llama-3-8b_h100-80gb_tp1
replica: the one of ``bench/sim_speed.py`` and ``bench/cost_model_speed.py`` (Azure
conversation lengths drawn with replacement, Poisson arrivals at 75% of the
saturated throughput), and the same requests at 25% (low load, where the loop
skips the most). Each process warms the compiled loop on a tiny input, then times
one replay; the figure is the median over the rounds, and the ratios are after /
before.

Run from the repository root:

    .venv/bin/python bench/async_speed.py              # 100k requests, 5 rounds, writes RESULTS.md
    .venv/bin/python bench/async_speed.py --quick      # 20k requests, 3 rounds, prints only
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import AZURE_LENGTHS, checkout, child, record  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SCENARIO = {"policy": "vllm", "enable_chunked_prefill": True, "max_model_len": 16384}

CODE = """
import numpy as np
from pathlib import Path
from pipeline.sim.simulate import simulate
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import SimInput
from pipeline.sim.summary import summarize
values = {values!r}
sc = build_scenario({values!r})
rng = np.random.default_rng(1)
{lengths}
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), sc.engine())
if {rate} == 0:  # all at once: the saturated throughput
    res = simulate(SimInput(np.zeros(len(prompt)), prompt, output), sc.engine())
    out = {{"capacity": summarize(res)["request_throughput"]}}
else:
    gaps = rng.exponential(1.0, len(prompt))
    inp = SimInput(np.cumsum(gaps / {rate}), prompt, output)
    t = time.perf_counter()
    res = simulate(inp, sc.engine())
    loop_s = time.perf_counter() - t
    out = {{"loop_s": loop_s, "steps": res.num_steps, "rows": len(res.st),
            "ttft_p50_s": summarize(res)["ttft_p50_s"]}}
"""


def run(path: str, values: dict[str, object], n: int, rate: float) -> dict[str, float]:
    """One replay in a fresh process with the ``pipeline`` package at ``path``."""
    lengths = AZURE_LENGTHS.format(azure=str(AZURE), n=n)
    return child(CODE.format(values=values, lengths=lengths, rate=rate), 1, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="revision before (default: main)")
    parser.add_argument("--quick", action="store_true", help="20k requests, 3 rounds; print only")
    args = parser.parse_args()
    n, rounds = (20_000, 3) if args.quick else (100_000, 5)
    base = checkout(args.baseline, "async-speed-")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    variants = {
        "before": (base, SCENARIO),
        "after, async off": (str(ROOT), {**SCENARIO, "async_scheduling": False}),
        "after, async on": (str(ROOT), {**SCENARIO, "async_scheduling": True}),
    }
    cap = run(base, SCENARIO, 20_000, 0)["capacity"]
    loads = {"75%": 0.75 * cap, "25%": 0.25 * cap}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(rounds):
        for load, rate in loads.items():
            for name, (path, values) in variants.items():
                runs.setdefault((load, name), []).append(run(path, values, n, rate))
    lines = [
        f"{n:,} requests (Azure conversation lengths, Poisson arrivals), `vllm` with chunked "
        f"prefill, one llama-3-8b_h100-80gb_tp1 replica (saturated: {cap:.1f} req/s); "
        f"`simulate` alone, median of {rounds} rounds alternating the versions in fresh "
        f"processes; before = `{commit}`.",
        "",
        "| load | version | loop s | requests/s | steps (rows) | TTFT p50 | loop / before |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for load in loads:
        before = statistics.median(r["loop_s"] for r in runs[(load, "before")])
        for name in variants:
            rs = runs[(load, name)]
            loop_s = statistics.median(r["loop_s"] for r in rs)
            lines.append(
                f"| {load} | {name} | {loop_s:.3f} | {n / loop_s:,.0f} | "
                f"{rs[0]['steps']:,.0f} ({rs[0]['rows']:,.0f}) | "
                f"{rs[0]['ttft_p50_s'] * 1e3:.1f} ms | {loop_s / before:.3f} |"
            )
    body = "\n".join(lines)
    print(body)
    if not args.quick:
        record("Async scheduling: loop speed before and after", "python bench/async_speed.py", body)


if __name__ == "__main__":
    main()
