"""Swap versus recompute preemption at increasing KV pressure, on a public trace.

Traffic: the Azure LLM conversation trace (2023), its first ``--requests`` requests at
``--rate`` times their own arrival rate (``spec_study.load``). Scenario: the vllm policy
on the synchronous engine loop (swap is vLLM V0's: no async scheduling, no prefix
caching), one replica of ``--profile``, with the KV cache shrunk to each of
``--blocks`` to raise the pressure. For each size: recompute, then swap with
``--swap-gb`` of host memory per GPU over the GPU's PCIe link (docs/replay.md, "Swap
preemption").

Prints a markdown table (p99 TTFT, p99 TPOT, p99 inter-token latency, output throughput,
preemptions, swaps and the bytes moved); nothing is written to the repository. The
inter-token latency is per decoded token: the duration of the step that decoded it.
Run from the repository root:

    .venv/bin/python bench/swap_study.py
    .venv/bin/python bench/swap_study.py --requests 4000 --rate 2 --blocks 4000 2000 1000
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import numpy as np
from spec_study import load  # the same trace loader (bench/ is on the path)

from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_TOKEN,
    R_OUTPUT,
    R_PREEMPT,
    S_DECODE,
    S_NUM_STEPS,
    SF_DURATION,
    SimInput,
)
from pipeline.sim.summary import summarize


def _itl_p99(st: np.ndarray, stf: np.ndarray) -> float:
    """p99 over decoded tokens of the step time that decoded them (a row of k steps: its
    duration over k each; a decode run's steps differ by a token of context)."""
    per = stf[:, SF_DURATION] / st[:, S_NUM_STEPS]
    order = np.argsort(per)
    weight = np.cumsum((st[:, S_DECODE] * st[:, S_NUM_STEPS])[order])
    return float(per[order][np.searchsorted(weight, 0.99 * weight[-1])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=2.0, help="times the trace's arrival rate")
    ap.add_argument("--profile", default="llama-3-8b_h100-80gb_tp1")
    ap.add_argument("--blocks", type=int, nargs="+", default=[8000, 4000, 3000, 2000])
    ap.add_argument("--swap-gb", type=float, default=4.0)
    args = ap.parse_args()
    inp = load(args.requests)
    inp = SimInput(inp.arrival_s / args.rate, inp.prompt_tokens, inp.output_tokens)
    print(
        f"{args.requests} Azure conversation requests at {args.rate}x, {args.profile}, "
        f"swap space {args.swap_gb} GiB; {datetime.now(UTC):%Y-%m-%d}\n"
    )
    print(
        "| KV blocks | preemption | p99 TTFT s | p99 TPOT ms | p99 ITL ms | output tok/s "
        "| preempted | swaps | GB moved |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for blocks in args.blocks:
        for mode in ("recompute", "swap"):
            values = {
                "policy": "vllm",
                "profile": args.profile,
                "async_scheduling": False,
                "enable_prefix_caching": False,
                "num_gpu_blocks": blocks,
                "drop_too_long": True,
                "preemption_mode": mode,
            }
            if mode == "swap":
                values["swap_space_gb"] = args.swap_gb
            sc = build_scenario(values)
            caps = np.zeros(len(inp), np.int64)
            p, o, keep = sc.cap_lengths(inp.prompt_tokens, inp.output_tokens, caps)
            res = simulate(SimInput(inp.arrival_s[keep], p[keep], o[keep]), sc.engine())
            rq, rqf = res.rq, res.rqf
            ttft = rqf[:, F_FIRST_TOKEN] - rqf[:, F_ARRIVAL]
            many = rq[:, R_OUTPUT] > 1
            tpot = (rqf[many, F_FINISH] - rqf[many, F_FIRST_TOKEN]) / (rq[many, R_OUTPUT] - 1)
            span = rqf[:, F_FINISH].max() - rqf[:, F_ARRIVAL].min()
            itl = _itl_p99(res.st, res.stf)
            swap = summarize(res).get("swap", {})
            moved = (swap.get("swap_out_bytes", 0) + swap.get("swap_in_bytes", 0)) / 1e9
            print(
                f"| {blocks} | {mode} | {np.percentile(ttft, 99):.2f} | "
                f"{1e3 * np.percentile(tpot, 99):.1f} | {1e3 * itl:.0f} | "
                f"{rq[:, R_OUTPUT].sum() / span:.0f} | "
                f"{int(rq[:, R_PREEMPT].sum())} | {swap.get('num_swaps', 0)} | {moved:.1f} |"
            )


if __name__ == "__main__":
    main()
