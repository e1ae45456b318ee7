"""Simulated vs live on CPU: calibrate on probes, replay a trace slice live, validate; 3 runs.

    .venv/bin/python bench/live_validation.py [--model tiny] [--runs 3] [--num-requests 120]

1. ``calibrate live`` on the in-process engine (probe shapes only: no request of the trace
   is used for calibration);
2. ``live``: requests ``skip .. skip + sample`` of the bundled Azure conversation sample,
   prompts and outputs capped so a CPU model can serve them, arrivals time-scaled so that
   the engine queues (the waiting queue and TTFT grow during the run);
3. ``validate`` that live run with the calibrated profile.

Steps 2-3 run ``--runs`` times. Printed: per run and as the median over runs, the error
(simulated / live - 1) of TTFT and TPOT p50 and p99 and of the request throughput, the
targets (p50 within 10%, p99 within 20%, throughput within 5%), and the live engine's own
run-to-run spread ((max - min) / median of each live figure over the runs): no simulator
can be held closer to the engine than the engine is to itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIGURES = [
    ("ttft", "p50", 0.10),
    ("ttft", "p99", 0.20),
    ("tpot", "p50", 0.10),
    ("tpot", "p99", 0.20),
    ("request_throughput", "overall", 0.05),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--runs", type=int, default=3)
    # the flags of `tracereplay live` (the old spellings still work)
    ap.add_argument("--num-requests", "--sample", dest="sample", type=int, default=120)
    ap.add_argument("--skip", type=int, default=300)
    ap.add_argument("--time-scale", type=float, default=0.05)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--max-output-tokens", type=int, default=64)
    ap.add_argument("--num-gpu-blocks", "--num-blocks", dest="num_blocks", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument(
        "--max-num-batched-tokens",
        "--max-batch-tokens",
        dest="max_batch_tokens",
        type=int,
        default=256,
    )
    ap.add_argument("--design", default="cpu")
    ap.add_argument("--profile", default=None, help="skip the calibration, use this profile")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()

    from pipeline.calibrate.live import calibrate_live
    from pipeline.ingest import ingest_logs
    from pipeline.live.model import load_model
    from pipeline.live.replay import Selection, run_live
    from pipeline.live.validate import validate_live
    from pipeline.warehouse import Warehouse

    tmp = Path(tempfile.mkdtemp(prefix="live-validation-"))
    wh = tmp / "wh"
    ingest_logs([str(ROOT / "traces" / "azure_conv.csv")], Warehouse(wh))
    loaded = load_model(args.model, device="cpu")
    t0 = time.perf_counter()
    if args.profile is None:
        cal = calibrate_live(
            tmp / "profile.json", design=args.design, loaded=loaded, block_size=args.block_size
        )
        profile = str(cal.output)
        print(
            f"calibrated on {cal.rows.height} probe shapes in {time.perf_counter() - t0:.0f} s; "
            f"fit error {json.dumps(cal.profile['provenance']['fit_error'])}"
        )
    else:
        profile = args.profile
    options = {
        "loaded": loaded,
        "num_blocks": args.num_blocks,
        "block_size": args.block_size,
        "max_batch_tokens": args.max_batch_tokens,
    }
    sel = Selection(
        sample=args.sample,
        skip=args.skip,
        time_scale=args.time_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
    )
    runs = []
    for k in range(args.runs):
        t = time.perf_counter()
        live = run_live(wh, "inprocess", options, selection=sel)
        v = validate_live(wh, live.run_id, profile=profile)
        fig = {
            f"{m}_{s}": (
                v.aggregate.filter(
                    (v.aggregate["metric"] == m) & (v.aggregate["stat"] == s)
                ).to_dicts()[0]
            )
            for m, s, _ in FIGURES
        }
        runs.append(fig)
        print(
            f"run {k + 1}: {time.perf_counter() - t:.0f} s, {live.summary['completed']} "
            f"completed; "
            + ", ".join(
                f"{name} live {f['live']:.4g} sim {f['simulated']:.4g} ({f['error']:+.1%})"
                for name, f in fig.items()
            )
        )
    print()
    print(
        f"{'figure':<28}{'live (median)':>16}{'sim (median)':>16}{'error (median)':>16}"
        f"{'target':>9}{'met':>6}{'live spread':>13}"
    )
    out = {}
    for m, s, target in FIGURES:
        name = f"{m}_{s}"
        lives = [r[name]["live"] for r in runs]
        sims = [r[name]["simulated"] for r in runs]
        errs = [r[name]["error"] for r in runs]
        med_err = statistics.median(errs)
        spread = (max(lives) - min(lives)) / statistics.median(lives)
        met = abs(med_err) <= target
        out[name] = {
            "live": lives,
            "simulated": sims,
            "error": errs,
            "median_error": med_err,
            "live_spread": spread,
            "target": target,
        }
        print(
            f"{name:<28}{statistics.median(lives):>16.4g}{statistics.median(sims):>16.4g}"
            f"{med_err:>+16.1%}{target:>9.0%}{'yes' if met else 'NO':>6}{spread:>13.1%}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
