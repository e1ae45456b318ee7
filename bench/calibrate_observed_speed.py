"""`calibrate observed` on a million logged requests: wall time and what it recovers.

A synthetic day of gateway logs: 1,000,000 requests over 5.6 hours (Poisson arrivals, the
rate rising from 20 to 80 requests per second and falling again, as a day's traffic
does), Azure conversation prompt and output lengths (drawn with replacement, seed 1; log-
normal lengths when the trace is not beside the project), served by 16 replicas of the
default profile (round robin) with a 6 ms front end: the "observed" TTFT and E2E are that
replay's, with 5% log-normal noise per request. The calibration starts from the same
profile with its compute 1.5x, its memory 0.8x and no front end, and runs what `tracereplay
calibrate observed` runs after reading the warehouse: the replays and fits
(``observed.fit_observed``), then the cross-validation by hour (``cross_validate``).

Figures: wall seconds of the fit and of the cross-validation (one process, after a warm-up
replay that compiles nothing new), replays, and the recovered factors and front end
against the truth. Target (issue 20): <= 30 s for the whole calibration of 1M requests.

    .venv/bin/python bench/calibrate_observed_speed.py            # writes bench/RESULTS.md
    .venv/bin/python bench/calibrate_observed_speed.py --quick    # 100k requests, prints
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import record  # noqa: E402

from pipeline.calibrate.observed import (  # noqa: E402
    Latencies,
    cross_validate,
    fit_observed,
    held_out_errors,
)
from pipeline.calibrate.observed_fit import Params  # noqa: E402
from pipeline.sim.frontend import Frontend  # noqa: E402
from pipeline.sim.scenario import build_scenario  # noqa: E402
from pipeline.sim.simulate import simulate  # noqa: E402
from pipeline.sim.state import SimInput  # noqa: E402
from pipeline.sim.summary import request_metrics  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
REPLICAS = 16
TRUTH = Frontend(0.006, 1e-6, 0.0)
WRONG = Params({"compute": 1.5, "memory": 0.8, "step": 1.0, "sequence": 1.0}, 0.0, Frontend())


def workload(n: int) -> tuple[SimInput, np.ndarray]:
    rng = np.random.default_rng(1)
    if AZURE.is_file():
        import polars as pl

        df = pl.read_csv(AZURE)
        idx = rng.integers(0, len(df), n)
        prompt = df["ContextTokens"].to_numpy()[idx].astype(np.int64)
        output = np.maximum(df["GeneratedTokens"].to_numpy()[idx].astype(np.int64), 2)
    else:
        prompt = np.clip(rng.lognormal(6.5, 1.0, n), 1, 8000).astype(np.int64)
        output = np.clip(rng.lognormal(5.0, 1.0, n), 2, 2000).astype(np.int64)
    day = np.linspace(0, np.pi, n)
    rate = 20.0 + 60.0 * np.sin(day)  # req/s: 20 -> 80 -> 20
    arrival = np.cumsum(rng.exponential(1.0 / rate))
    us = (arrival * 1e6).astype(np.int64) + 1_714_521_600_000_000  # 2024-05-01 00:00 UTC
    return SimInput(arrival, np.minimum(prompt, 8000), output), us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k requests; print only")
    args = parser.parse_args()
    n = 100_000 if args.quick else 1_000_000
    inp, us = workload(n)
    base = build_scenario(
        {"policy": "vllm", "replicas": REPLICAS, "max_model_len": 16384, "drop_too_long": True}
    )
    truth = dataclasses.replace(base, frontend=TRUTH)
    rng = np.random.default_rng(2)
    m = request_metrics(simulate(inp, truth.engine()))
    noisy = Latencies(
        m["ttft_s"] * np.exp(rng.normal(0, 0.05, n)), m["tpot_s"] * np.exp(rng.normal(0, 0.05, n))
    )
    wrong = dataclasses.replace(base, cost=WRONG.apply(base.cost), frontend=WRONG.frontend)
    t0 = time.perf_counter()
    stages, fit, rows, converged = fit_observed(inp, wrong, noisy)
    t1 = time.perf_counter()
    held = cross_validate(inp, wrong, noisy, rows, stages[-1].params, stages[-1].simulated, us)
    t2 = time.perf_counter()
    p = stages[-1].params

    class _Cal:  # what held_out_errors reads
        observed = noisy
        before = stages[0]
        held_out = held

    errors = held_out_errors(_Cal())  # type: ignore[arg-type]
    worst = max(abs(e["after"] or 0.0) for e in errors.values())
    body = (
        f"{n:,} requests over {inp.arrival_s[-1] / 3600:.1f} h ({REPLICAS} replicas of the "
        f"default profile, round robin), started from compute x{WRONG.scales['compute']}, "
        f"memory x{WRONG.scales['memory']} and no front end (truth: x1, x1, "
        f"{TRUTH.request_s * 1e3:.0f} ms):\n\n"
        "| part | wall (s) | replays |\n| --- | --- | --- |\n"
        f"| fit (replays and fits) | {t1 - t0:.1f} | {len(stages)} |\n"
        f"| cross-validation ({len(held.folds)} folds by {held.basis}) | {t2 - t1:.1f} | "
        f"{len(held.folds)} |\n"
        f"| **calibration** | **{t2 - t0:.1f}** (target <= 30) | {len(stages) + len(held.folds)} |"
        f"\n\nconverged: {converged}; recovered compute x{p.scales['compute']:.3f} (truth "
        f"{1 / WRONG.scales['compute']:.3f}), memory x{p.scales['memory']:.3f} (truth "
        f"{1 / WRONG.scales['memory']:.3f}), step x{p.scales['step']:.3f}, sequence "
        f"x{p.scales['sequence']:.3f}; front end {p.frontend.request_s * 1e3:.2f} ms + "
        f"{p.frontend.prompt_token_s * 1e6:.2f} us per prompt token; the worst held-out "
        f"p50/p90/p99 TTFT or TPOT error {worst:.1%}."
    )
    print(body)
    if not args.quick:
        record(
            "calibrate observed on a million requests",
            "python bench/calibrate_observed_speed.py",
            body,
        )


if __name__ == "__main__":
    main()
