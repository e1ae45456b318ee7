"""Replay speed with the v3 cost model against v2 and v1, in one run.

The same 100k requests (Azure conversation lengths drawn with replacement, seed 1, or
log-normal lengths when the trace is not there; the same Poisson gaps scaled to 75% of
each cost's own saturated throughput) go through ``simulate`` with three costs: the
default profile (cost model v3: attention apart, the lm head per sequence), the same
profile with the two v3 terms set to 0 (exactly the v2 formula), and with the v2 terms
set to 0 as well (exactly v1). They alternate in one process, 5 times each after a
warm-up; the figure is the median loop time of each and the ratios (target: v3 within 10%
of v2). Each runs at the same share of its own capacity so that all replay comparable
batches; the step counts are printed.

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
from pipeline.sim.cost_model import StepCost, OPTIONAL_COEFFICIENTS, V3_COEFFICIENTS
from pipeline.sim.simulate import simulate
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import SimInput
from pipeline.sim.summary import summarize

v3 = build_scenario({scenario!r})
v2 = dataclasses.replace(v3, cost=StepCost.from_dict(
    {{k: v for k, v in v3.cost.to_dict().items() if k not in V3_COEFFICIENTS}}))
v1 = dataclasses.replace(v3, cost=StepCost.from_dict(
    {{k: v for k, v in v3.cost.to_dict().items() if k not in OPTIONAL_COEFFICIENTS}}))
MODELS = (("v1", v1), ("v2", v2), ("v3", v3))
rng = np.random.default_rng(1)
{lengths}
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), v3.engine())
gaps = rng.exponential(1.0, {n})
inputs, rate = {{}}, {{}}
for name, sc in MODELS:  # each at 75% of its own saturated throughput
    sat = simulate(SimInput(np.zeros(20_000), prompt[:20_000], output[:20_000]), sc.engine())
    rate[name] = 0.75 * summarize(sat)["request_throughput"]
    inputs[name] = SimInput(np.cumsum(gaps / rate[name]), prompt, output)
times = {{name: [] for name, _ in MODELS}}
steps = {{}}
for _ in range(5):
    for name, sc in MODELS:
        t = time.perf_counter()
        res = simulate(inputs[name], sc.engine())
        times[name].append(time.perf_counter() - t)
        steps[name] = res.num_steps
med = {{k: statistics.median(v) for k, v in times.items()}}
out = {{"v3_over_v2": med["v3"] / med["v2"], "v2_over_v1": med["v2"] / med["v1"]}}
for name, _ in MODELS:
    out[name + "_rate"] = rate[name]
    out[name + "_s"] = med[name]
    out[name + "_req_per_s"] = {n} / med[name]
    out[name + "_steps"] = steps[name]
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
    labels = {"v1": "v1 (v2 and v3 terms = 0)", "v2": "v2 (v3 terms = 0)", "v3": "v3 (default)"}
    rows = "".join(
        f"| {labels[m]} | {r[m + '_rate']:.1f} | {r[m + '_s']:.3f} | "
        f"{r[m + '_req_per_s']:,.0f} | {int(r[m + '_steps']):,} |\n"
        for m in ("v1", "v2", "v3")
    )
    per_step = ", ".join(f"{r[m + '_s'] / r[m + '_steps'] * 1e6:.2f} us ({m})" for m in labels)
    body = (
        f"{n:,} requests ({lengths}; the same Poisson gaps scaled to 75% of each cost "
        "model's own saturated throughput), vllm with chunked prefill, one "
        "llama-3-8b_h100-80gb_tp1 replica; `simulate` alone, median of 5 alternating "
        "runs in one process:\n\n"
        "| cost model | arrivals (req/s) | loop (s) | requests/s | steps |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"{rows}\n"
        f"v3 / v2 loop time: **{r['v3_over_v2']:.3f}** (target <= 1.10); v2 / v1 "
        f"{r['v2_over_v1']:.3f}; per step {per_step}."
    )
    print(body)
    if not args.quick:
        record("Cost model replay speed", "python bench/cost_model_speed.py", body)


if __name__ == "__main__":
    main()
