"""Replay speed with the v2 cost model against v1, in one run.

The same 100k requests (Azure conversation lengths drawn with replacement, seed 1, or
log-normal lengths when the trace is not there; the same Poisson gaps scaled to 75% of
each cost's own saturated throughput) go through ``loop.simulate`` with two costs: the default
profile (cost model v2: per-sequence cost, GEMM half-efficiency floor, overlap), and the
same profile with the three v2 terms set to 0, which is exactly the v1 formula. They
alternate in one process, 5 times each after a warm-up; the figure is the median loop
time of each and their ratio (target: v2 within 10% of v1). Each runs at the same share
of its own capacity so that both replay comparable batches; the step counts are printed.

Run from the repository root:

    .venv/bin/python bench/cost_model_speed.py            # writes bench/RESULTS.md
    .venv/bin/python bench/cost_model_speed.py --quick    # 20k requests, prints only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import AZURE_LENGTHS, child, record  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SCENARIO = {"policy": "vllm", "enable_chunked_prefill": True, "max_model_len": 16384}

CODE = """
import dataclasses, statistics
from pathlib import Path
import numpy as np
from pipeline.sim.cost_model import StepCost, V2_COEFFICIENTS
from pipeline.sim.loop import simulate
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import SimInput
from pipeline.sim.summary import summarize

v2 = build_scenario({scenario!r})
v1 = dataclasses.replace(v2, cost=StepCost.from_dict(
    {{k: v for k, v in v2.cost.to_dict().items() if k not in V2_COEFFICIENTS}}))
rng = np.random.default_rng(1)
{lengths}
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), v2.engine())
gaps = rng.exponential(1.0, {n})
inputs, rate = {{}}, {{}}
for name, sc in (("v1", v1), ("v2", v2)):  # each at 75% of its own saturated throughput
    sat = simulate(SimInput(np.zeros(20_000), prompt[:20_000], output[:20_000]), sc.engine())
    rate[name] = 0.75 * summarize(sat)["request_throughput"]
    inputs[name] = SimInput(np.cumsum(gaps / rate[name]), prompt, output)
times = {{"v1": [], "v2": []}}
steps = {{}}
for _ in range(5):
    for name, sc in (("v1", v1), ("v2", v2)):
        t = time.perf_counter()
        res = simulate(inputs[name], sc.engine())
        times[name].append(time.perf_counter() - t)
        steps[name] = res.num_steps
med = {{k: statistics.median(v) for k, v in times.items()}}
out = {{"v1_rate": rate["v1"], "v2_rate": rate["v2"],
        "v1_s": med["v1"], "v2_s": med["v2"], "ratio": med["v2"] / med["v1"],
        "v1_req_per_s": {n} / med["v1"], "v2_req_per_s": {n} / med["v2"],
        "v1_steps": steps["v1"], "v2_steps": steps["v2"]}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k requests; print only")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000
    lengths = AZURE_LENGTHS.format(azure=str(AZURE), n=n)
    code = CODE.format(scenario=SCENARIO, lengths=lengths, n=n)
    r = child(code, repeats=1)
    lengths = "Azure conversation lengths" if AZURE.is_file() else "log-normal lengths"
    body = (
        f"{n:,} requests ({lengths}; the same Poisson gaps scaled to 75% of each cost "
        "model's own saturated throughput), vllm with chunked prefill, one "
        "llama-3-8b_h100-80gb_tp1 replica; `loop.simulate` alone, median of 5 alternating "
        "runs in one process:\n\n"
        "| cost model | arrivals (req/s) | loop (s) | requests/s | steps |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"| v1 (v2 terms = 0) | {r['v1_rate']:.1f} | {r['v1_s']:.3f} | "
        f"{r['v1_req_per_s']:,.0f} | {int(r['v1_steps']):,} |\n"
        f"| v2 (default) | {r['v2_rate']:.1f} | {r['v2_s']:.3f} | "
        f"{r['v2_req_per_s']:,.0f} | {int(r['v2_steps']):,} |\n\n"
        f"v2 / v1 loop time: **{r['ratio']:.3f}** (target <= 1.10); per step "
        f"{r['v1_s'] / r['v1_steps'] * 1e6:.2f} us (v1) and "
        f"{r['v2_s'] / r['v2_steps'] * 1e6:.2f} us (v2)."
    )
    print(body)
    if not args.quick:
        record("Cost model v2 replay speed", "python bench/cost_model_speed.py", body)


if __name__ == "__main__":
    main()
