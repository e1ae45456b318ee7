"""Does disaggregating prefill from decode pay on real traces? x:y against aggregated.

The question (the disaggregation issue's seed claim, after DistServe and
Splitwise): at equal GPUs, does a fleet of x prefill and y decode workers serve
more requests within a tight TTFT + TPOT objective than x + y aggregated
engines with chunked prefill, and when does it not?

Traffic, real traces (loaded with ``bench/fleet_split.py``'s ``mixed_trace``):

- ``mooncake``: the Mooncake conversation trace (Kimi; long prompts), its first
  ``--window-s`` seconds, less the requests longer than Mistral-7B's context;
- ``azure``: the Azure LLM conversation trace (2023), the same window;
- ``mix``: both together, each from its own start (fleet_split's chat + batch).

Loads: each trace time-scaled (``time_scale = 1 / load``), the same requests.

Scenario: Mistral-7B on H100 (32k context: Llama-3-8B's 8k would drop most
Mooncake prompts), vllm policy with its defaults (chunked prefill, budget 8192,
prefix caching), ``least_outstanding`` for the prefill (and aggregated) router,
``least_outstanding`` for the decode router, links ``ib_ndr`` and ``eth_100g``.
``plan_disaggregation`` (``pipeline/plan/disagg_plan.py``) finds the fewest
workers x + y for which some split meets every SLO, the best-goodput split
there, the fewest aggregated replicas, and aggregated at x + y.

SLO pairs (p99, every request): ``tight`` TTFT 2 s + TPOT 50 ms (DistServe's
regime for long prompts), ``mid`` TTFT 2 s + TPOT 100 ms, ``loose`` TTFT 10 s
+ TPOT 200 ms, ``decode`` TTFT 10 s + TPOT 50 ms (only the decode side tight).

Two figures per row compare the layouts. ``plan_disaggregation``'s goodput per
GPU at the same GPUs (x + y both ways) is requests/s meeting every SLO over
GPUs at the trace's offered load: where both layouts meet the p99 objectives
nearly every request is good either way, so it moves little. The fewest GPUs
meeting the SLOs at that load (disaggregated x + y against aggregated) is the
sharper one, and ``req/s/GPU`` is the offered rate over those fewest GPUs, both
ways (DistServe's per-GPU goodput, at the load of the row).

Everything prints as markdown tables; nothing is written to the repository
(docs/fleets.md holds the figures). Run from the repository root (about 4
minutes on 2 cores):

    .venv/bin/python bench/disagg_study.py             # the study of docs/fleets.md
    .venv/bin/python bench/disagg_study.py --quick     # mooncake, load 1, tight, ib_ndr
    .venv/bin/python bench/disagg_study.py --traces azure --loads 1,2 --max-workers 6
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fleet_split import mixed_trace, ms, table  # noqa: E402

from pipeline.plan.disagg_plan import DisaggPlan, Probe, plan_disaggregation  # noqa: E402
from pipeline.plan.slo import parse_slos  # noqa: E402
from pipeline.sim.replay import load_loop  # noqa: E402
from pipeline.sim.replay_input import prepare, read_requests  # noqa: E402
from pipeline.sim.scenario import build_scenario  # noqa: E402

PROFILE = "mistral-7b_h100-80gb_tp1"
SLO_PAIRS = {
    "tight": ["ttft_p99=2s", "tpot_p99=50ms"],
    "mid": ["ttft_p99=2s", "tpot_p99=100ms"],
    "loose": ["ttft_p99=10s", "tpot_p99=200ms"],
    "decode": ["ttft_p99=10s", "tpot_p99=50ms"],
}
TRACES = {"mooncake": ["batch"], "azure": ["chat"], "mix": ["chat", "batch"]}


def scenario(name: str, load: float, link: str, profile: str, drop: bool) -> dict[str, Any]:
    """A 1P1D disaggregated scenario (the search sets x and y)."""
    return {
        "name": name,
        "drop_too_long": drop,
        "policy": "vllm",
        "profile": profile,
        "router": "least_outstanding",
        "decode_router": "least_outstanding",
        "prefill_replicas": 1,
        "decode_replicas": 1,
        "kv_link": link,
        "time_scale": 1.0 / load,
    }


def rel(p: Probe | None) -> str:
    if p is None:
        return "-"
    return f"{p.goodput_per_gpu:.2f}" if p.goodput_per_gpu is not None else "-"


def row(trace: str, load: float, slo: str, link: str, plan: DisaggPlan, rate: float) -> list[str]:
    b, amin, same = plan.best, plan.aggregated_min, plan.aggregated_same
    gain = "-"
    if b and same and b.goodput_per_gpu and same.goodput_per_gpu:
        gain = f"{b.goodput_per_gpu / same.goodput_per_gpu:.2f}x"
    per = f"{rate / b.gpus:.2f}" if b else "-"
    per += " / " + (f"{rate / amin.gpus:.2f}" if amin else "-")
    return [
        trace,
        f"x{load:g}",
        slo,
        link,
        f"{b.prefill}:{b.decode}" if b else "none",
        str(b.gpus) if b else "-",
        str(amin.gpus) if amin else "none",
        per,
        f"{rel(b)} / {rel(same)}",
        gain,
        f"{ms(b.ttft_p99_s) if b else '-'} / {ms(same.ttft_p99_s) if same else '-'}",
        f"{ms(b.tpot_p99_s) if b else '-'} / {ms(same.tpot_p99_s) if same else '-'}",
        ms(b.kv_transfer_p99_s) if b else "-",
        str(len(plan.probes)),
    ]


HEAD = [
    "trace",
    "load",
    "SLOs",
    "link",
    "best x:y",
    "its GPUs",
    "agg fewest GPUs",
    "req/s/GPU disagg / agg",
    "goodput/GPU disagg / agg at x+y",
    "ratio",
    "TTFT p99 disagg / agg at x+y",
    "TPOT p99 disagg / agg at x+y",
    "KV xfer p99",
    "replays",
]


def summary(plans: dict[tuple[str, float, str, str], DisaggPlan], links: list[str]) -> str:
    """One line per trace, load and SLO pair: the fewest GPUs each way."""
    order = {name: i for i, name in enumerate(SLO_PAIRS)}
    keys = sorted({k[:3] for k in plans}, key=lambda k: (k[0], order[k[2]], k[1]))
    lines = []
    for trace, load, slo in keys:
        cells = []
        agg = None
        for link in links:
            plan = plans.get((trace, load, slo, link))
            b = plan.best if plan else None
            cells.append(f"{b.prefill}:{b.decode} = {b.gpus}" if b else "none")
            if plan is not None and plan.aggregated_min is not None:
                agg = plan.aggregated_min
        lines.append(
            [trace, slo, f"x{load:g}", *cells, str(agg.gpus) if agg else "none",
             ms(agg.tpot_p99_s) if agg else "-"]
        )  # fmt: skip
    head = ["trace", "SLOs", "load", *(f"disagg {k}" for k in links), "aggregated"]
    return table([*head, "agg TPOT p99 at its fewest"], lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=1800.0, help="seconds of each trace")
    ap.add_argument("--traces", default="mooncake,azure,mix")
    ap.add_argument("--loads", default="0.5,1,2,4,8", help="time-scale multipliers")
    ap.add_argument("--slos", default="tight,mid,loose,decode", help=f"of {', '.join(SLO_PAIRS)}")
    ap.add_argument("--links", default="ib_ndr,eth_100g")
    ap.add_argument("--max-workers", type=int, default=24, help="top of the x+y search")
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument(
        "--lpt",
        type=int,
        default=None,
        help="long_prefill_token_threshold of every engine (aggregated and prefill) [none]",
    )
    ap.add_argument(
        "--drop-too-long", action="store_true", help="leave out prompts over the model's context"
    )
    ap.add_argument("--quick", action="store_true", help="mooncake, load 1, tight, ib_ndr")
    args = ap.parse_args()
    traces = ["mooncake"] if args.quick else args.traces.split(",")
    loads = [1.0] if args.quick else [float(x) for x in args.loads.split(",")]
    slo_names = ["tight"] if args.quick else args.slos.split(",")
    links = ["ib_ndr"] if args.quick else args.links.split(",")
    t0 = time.perf_counter()
    out = Path(tempfile.mkdtemp(prefix="disagg-study-"))
    try:
        mix = mixed_trace(out, args.window_s)
        frame = read_requests([mix["path"]])
        lpt = "" if args.lpt is None else f", long_prefill_token_threshold {args.lpt}"
        print(
            f"traces: the first {args.window_s:.0f} s of each; {args.profile}, vllm defaults "
            f"(chunked prefill, budget 8192, prefix caching{lpt}), least_outstanding routers; "
            f"x+y searched up to {args.max_workers} workers"
        )
        for t, tenant in (("azure", "chat"), ("mooncake", "batch")):
            f = mix[tenant]
            print(
                f"  {t}: {f['requests']:,} requests ({f['rate']:.2f} req/s at load 1), prompt "
                f"mean/p50/p99 {f['prompt_mean']:,.0f}/{f['prompt_p50']:,.0f}/"
                f"{f['prompt_p99']:,.0f}, output mean {f['output_mean']:,.0f}"
            )
        for s in slo_names:
            print(f"  SLOs {s}: {', '.join(SLO_PAIRS[s])} (p99 over every request)")
        lines: list[list[str]] = []
        plans: dict[tuple[str, float, str, str], DisaggPlan] = {}
        loaded = False
        for trace in traces:
            part = frame.filter(pl.col("tenant").is_in(TRACES[trace]))
            for load in loads:
                for link in links:
                    sc_dict = scenario(
                        f"{trace}-{load:g}-{link}", load, link, args.profile, args.drop_too_long
                    )
                    if args.lpt is not None:
                        sc_dict["long_prefill_token_threshold"] = args.lpt
                    sc = build_scenario(sc_dict)
                    if not loaded:
                        load_loop(sc.engine(), quiet=True)
                        loaded = True
                    prep = prepare(part, sc)
                    rate = len(prep.inp.arrival_s) / args.window_s * load
                    if prep.num_dropped:
                        print(f"  {trace} x{load:g}: {prep.num_dropped} too long, left out")
                    for s in slo_names:
                        t1 = time.perf_counter()
                        plan = plan_disaggregation(
                            sc, prep, parse_slos(SLO_PAIRS[s]), max_workers=args.max_workers
                        )
                        line = row(trace, load, s, link, plan, rate)
                        lines.append(line)
                        plans[(trace, load, s, link)] = plan
                        print(
                            f"  {' | '.join(line)}  ({time.perf_counter() - t1:.0f} s)",
                            flush=True,
                        )
        print()
        print(table(HEAD, lines))
        print(
            "\ngoodput/GPU: requests/s meeting every SLO per GPU; gain: disaggregated over "
            "aggregated at the same GPUs (x+y); 'none': no split (or aggregated count) of up "
            f"to {args.max_workers} workers meets the SLOs"
        )
        print("\nfewest GPUs meeting both SLOs, disaggregated (best x:y) per link, and aggregated:")
        print(summary(plans, links))
        print(f"\n{time.perf_counter() - t0:.0f} s in all")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
