"""What does speculative decoding do to TPOT and throughput on a public trace?

Traffic: the Azure LLM conversation trace (2023; ``shared/traces_raw/azure_llm_2023``),
its first ``--requests`` requests at their own arrival times. Scenario: Llama-3-8B on
H100 (the ``llama-3-8b_h100-80gb_tp1`` profile), vllm policy, synchronous engine loop
(``async_scheduling = false``: speculation is modelled there only), one replica.
Speculation: EAGLE with ``--k`` draft tokens at acceptance 0.5 / 0.7 / 0.9 against off.
Also times each replay (speculation turns decode-run skipping off; the brief allows 2x).

Prints a markdown table; nothing is written to the repository (docs/replay.md holds the
figures). Run from the repository root:

    .venv/bin/python bench/spec_study.py
    .venv/bin/python bench/spec_study.py --requests 2000 --k 4 --method draft_model
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.sim.scenario import build_scenario  # noqa: E402
from pipeline.sim.simulate import simulate  # noqa: E402
from pipeline.sim.state import F_ARRIVAL, F_FINISH, F_FIRST_TOKEN, R_OUTPUT, SimInput  # noqa: E402
from pipeline.sim.summary import summarize  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def load(n: int) -> SimInput:
    df = pl.read_csv(TRACE, n_rows=n).with_columns(
        pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f")
    )
    t = (df["TIMESTAMP"] - df["TIMESTAMP"].min()).dt.total_microseconds().to_numpy() / 1e6
    return SimInput(
        t.astype(np.float64),
        df["ContextTokens"].to_numpy().astype(np.int64),
        df["GeneratedTokens"].to_numpy().astype(np.int64),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--method", default="eagle")
    args = ap.parse_args()
    inp = load(args.requests)
    base = {
        "policy": "vllm",
        "profile": "llama-3-8b_h100-80gb_tp1",
        "async_scheduling": False,
        "drop_too_long": True,
    }
    print(
        f"{args.requests} requests of the Azure conversation trace; {args.method}, "
        f"k = {args.k}; {datetime.now(UTC):%Y-%m-%d}\n"
    )
    head = "| acceptance | TPOT median ms | TPOT p99 ms | output tok/s | accepted/draft | wall s |"
    print(head)
    print("|---|---|---|---|---|---|")
    for acc in (None, 0.5, 0.7, 0.9):
        values = dict(base)
        if acc is not None:
            values["speculative"] = {"method": args.method, "num_tokens": args.k, "acceptance": acc}
        sc = build_scenario(values)
        caps = np.zeros(len(inp), np.int64)
        p, o, keep = sc.cap_lengths(inp.prompt_tokens, inp.output_tokens, caps)
        run = SimInput(inp.arrival_s[keep], p[keep], o[keep])
        simulate(run, sc.engine())  # compile outside the timing
        t0 = time.perf_counter()
        res = simulate(run, sc.engine())
        wall = time.perf_counter() - t0
        rq, rqf = res.rq, res.rqf
        many = rq[:, R_OUTPUT] > 1
        tpot = (rqf[many, F_FINISH] - rqf[many, F_FIRST_TOKEN]) / (rq[many, R_OUTPUT] - 1)
        span = rqf[:, F_FINISH].max() - rqf[:, F_ARRIVAL].min()
        s = summarize(res)
        rate = s.get("spec_acceptance_rate")
        print(
            f"| {'off' if acc is None else acc} | {1e3 * np.median(tpot):.2f} | "
            f"{1e3 * np.percentile(tpot, 99):.2f} | {rq[:, R_OUTPUT].sum() / span:.0f} | "
            f"{'-' if rate is None else f'{rate:.3f}'} | {wall:.3f} |"
        )


if __name__ == "__main__":
    main()
