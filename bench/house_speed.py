"""The simulator's loop and its cold compile against the code before the named-state round.

Issue 22 rebuilt the compiled loop's inside (named state records instead of
positional arrays, policies reached through a dispatch built from the
registry, traits instead of policy branches) and asked for the loop within 5%
of the speed before and the cold compile within 20%. This times both trees in
one run, in fresh processes, interleaved, medians of 3:

- loop: ``simulate`` alone (after a warm-up call) on 200k requests with the
  Azure conversation trace's lengths, Poisson arrivals near 75% of capacity:
  ``vllm`` chunked prefill on one replica; ``sglang`` on one replica;
  ``vllm`` on 4 replicas behind the least-outstanding router (the lazy path);
- cold compile: the first ``simulate`` call of a fresh process with an empty
  numba cache directory (every kernel of every policy compiles).

Run from the repository root:

    .venv/bin/python bench/house_speed.py                    # writes bench/RESULTS.md
    .venv/bin/python bench/house_speed.py --quick            # 50k, one compile each; prints
    .venv/bin/python bench/house_speed.py --against COMMIT   # another baseline
    .venv/bin/python bench/house_speed.py --compiles 1       # one cold compile per tree
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import checkout, child, record  # noqa: E402

BEFORE = "f6e1994"  # the last commit with positional kernels
AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"

SCENARIOS = {
    "vllm, 1 replica": ({"policy": "vllm", "enable_chunked_prefill": True,
                         "max_model_len": 16384}, 16.8),
    "sglang, 1 replica": ({"policy": "sglang", "max_model_len": 16384}, 16.8),
    "vllm, 4 replicas, least outstanding": ({"policy": "vllm", "enable_chunked_prefill": True,
                                             "max_model_len": 16384, "replicas": 4,
                                             "router": "least_outstanding"}, 4 * 16.8),
}  # fmt: skip

# both trees: simulate moved out of loop.py in this round
IMPORT = """
try:
    from pipeline.sim.simulate import simulate
except ImportError:
    from pipeline.sim.loop import simulate
"""

LOOP = (
    IMPORT
    + """
import numpy as np
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import SimInput
sc = build_scenario({scenario!r})
eng = sc.engine()
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), eng)
data = np.load({data!r})
inp = SimInput(data["arrival"], data["prompt"], data["output"])
t = time.perf_counter()
res = simulate(inp, eng)
out = {{"loop_s": time.perf_counter() - t, "steps": res.num_steps}}
"""
)

COMPILE = (
    IMPORT
    + """
import numpy as np
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import SimInput
eng = build_scenario({"policy": "vllm", "max_model_len": 4096}).engine()
t = time.perf_counter()
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), eng)
out = {"compile_s": time.perf_counter() - t}
"""
)


def workload(n: int, rate: float, path: Path) -> None:
    """n requests with Azure-conv lengths (drawn with replacement, seed 1), Poisson arrivals."""
    import numpy as np
    import polars as pl

    trace = pl.read_csv(AZURE)
    rng = np.random.default_rng(1)
    pick = rng.integers(0, trace.height, n)
    prompt = trace["ContextTokens"].to_numpy()[pick].astype(np.int64)
    output = np.maximum(trace["GeneratedTokens"].to_numpy()[pick].astype(np.int64), 1)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    np.savez(path, arrival=arrival, prompt=np.minimum(prompt, 12000), output=output)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50k requests, one compile each")
    ap.add_argument("--against", default=BEFORE, help="the baseline's commit")
    ap.add_argument("--compiles", type=int, default=3, help="cold compiles per tree")
    args = ap.parse_args()
    n, compiles = (50_000, 1) if args.quick else (200_000, args.compiles)
    base = checkout(args.against)
    tmp = Path(tempfile.mkdtemp(prefix="house-"))
    trees = {"now": str(ROOT), "before": base}
    try:
        rows = []
        for label, (scenario, rate) in SCENARIOS.items():
            data = tmp / f"{len(rows)}.npz"
            workload(n, rate, data)
            code = LOOP.format(scenario=scenario, data=str(data))
            for path in trees.values():  # warm-up: compile (or load) each tree's cache once
                child(code, repeats=1, pythonpath=path)
            runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
            for _ in range(3):
                for name, path in trees.items():
                    runs[name].append(child(code, repeats=1, pythonpath=path))
            assert runs["now"][0]["steps"] == runs["before"][0]["steps"], "not the same replay"
            now = statistics.median(r["loop_s"] for r in runs["now"])
            before = statistics.median(r["loop_s"] for r in runs["before"])
            rows.append(
                f"| loop: {label} ({n:,} requests) | {now:.3f} | {before:.3f} | "
                f"{now / before:.2f}x |"
            )
        times: dict[str, list[float]] = {k: [] for k in trees}
        for i in range(compiles):
            for name, path in trees.items():
                cache = tmp / f"numba-{name}-{i}"
                os.environ["NUMBA_CACHE_DIR"] = str(cache)
                try:
                    times[name].append(child(COMPILE, repeats=1, pythonpath=path)["compile_s"])
                finally:
                    del os.environ["NUMBA_CACHE_DIR"]
                    shutil.rmtree(cache, ignore_errors=True)
        now_c, before_c = (statistics.median(times[k]) for k in ("now", "before"))
        rows.append(
            f"| cold compile (first `simulate`, empty cache) | {now_c:.1f} | {before_c:.1f} | "
            f"{now_c / before_c:.2f}x |"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    body = (
        f"| what | s now (median) | s at {args.against} | ratio |\n|---|---:|---:|---:|\n"
        + "\n".join(rows)
    )
    print(body)
    if not args.quick:
        record(
            "Named state and policy dispatch against the code before",
            "python bench/house_speed.py",
            body + f"\n\nTargets (issue 22): the loop within 5% (ratio <= 1.05), the cold "
            f"compile within 20% (<= 1.20). Fresh processes, the two trees interleaved; loops "
            f"medians of 3, compiles of {compiles}.",
        )


if __name__ == "__main__":
    main()
