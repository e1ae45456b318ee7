"""Does autoscaling pay over a day? Autoscaled pools against the fixed pool that meets a TTFT SLO.

The question (the autoscaler issue): over a replayed day whose load rises and
falls, how many GPU-hours does a pool whose replica count follows the load
(``[autoscale]``, docs/replay.md) save against the fewest FIXED replicas that
meet the same SLO, and when does the start-up delay of new replicas make it
miss the SLO?

Traffic: no public per-request log here spans a day with its load pattern
(Azure's and Mooncake's are one hour each, close to steady), so the day's
SHAPE comes from ServeGen (alibaba/ServeGen, ``language/m-large``: per-client
request rates in 600 s windows over 14 days): the rates of its two clients
summed, over day ``--day``. Arrivals are Poisson within each window at that
rate, scaled so the day's mean is ``--mean-rate`` req/s. The day is replayed
whole by default (86,400 s); ``--compress C`` shortens it C times (a 600 s
window then lasts 600 / C s), so its ramps are C times steeper than the real
ones and the start-up delay costs more than over a real day. The rate changes
from one window to the next in a step, as ServeGen gives it. The requests' prompt and
output lengths are the Azure LLM conversation trace's (2023), in its order,
cycled if the day needs more.

Compared (Llama-3-8B on H100, vLLM policy, least_outstanding routers):

- ``fixed``: the fewest replicas meeting ``--ttft-ms`` p99 (the capacity
  replicas search, ``plan/autoscale_plan.py``), paid for the whole span;
- ``auto-m<M>-t<T>-s<S>``: an autoscaled pool (M to the fixed count x 2
  replicas; ``--mins``) at each target T (``--targets``, outstanding requests
  per replica) and start-up delay S (``--startups``, seconds), interval 30 s,
  cooldown 300 s,
  each replayed once: its GPU-hours, the SLO, the requests that arrived while
  replicas were starting and how many of those were over the limit.

Prints markdown tables; nothing is written to the repository (docs/fleets.md,
Autoscaling, holds the figures). Run from the repository root:

    .venv/bin/python bench/autoscale_study.py               # the study of docs/fleets.md
    .venv/bin/python bench/autoscale_study.py --quick       # a 576x shorter day (150 s)
    .venv/bin/python bench/autoscale_study.py --compress 24 # the day in an hour
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import api  # noqa: E402
from pipeline.plan.autoscale_plan import (  # noqa: E402
    autoscaled_replay,
    compare,
    fixed_values,
)
from pipeline.plan.capacity import SearchSpec, run_capacity  # noqa: E402
from pipeline.plan.slo import parse_slos  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces_raw"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SERVEGEN = TRACES / "servegen" / "language_m-large"
WINDOW_S = 600.0  # ServeGen's window
BASE = datetime(2024, 1, 1, tzinfo=UTC)


def day_rates(day: int) -> np.ndarray:
    """Requests/s per 600 s window of ServeGen day ``day``, both clients summed."""
    total = np.zeros(int(86_400 / WINDOW_S))
    for f in sorted(SERVEGEN.glob("chunk-*-trace.csv")):
        t = pl.read_csv(f, has_header=False, new_columns=["start", "rate", "cv", "pat", "a", "b"])
        w = (t["start"].to_numpy() // WINDOW_S).astype(int) - day * len(total)
        keep = (w >= 0) & (w < len(total))
        np.add.at(total, w[keep], t["rate"].to_numpy()[keep])
    return total


def make_trace(out: Path, day: int, mean_rate: float, compress: float, seed: int) -> dict[str, Any]:
    """The requests file: ServeGen's day shape, Azure's lengths (module docstring)."""
    rates = day_rates(day)
    shape = rates / rates.mean()
    win = WINDOW_S / compress
    rng = np.random.default_rng(seed)
    arrivals = []
    for i, s in enumerate(shape):
        n = rng.poisson(s * mean_rate * win)
        arrivals.append(np.sort(rng.uniform(i * win, (i + 1) * win, n)))
    arr = np.concatenate(arrivals)
    scratch = out / "ingest"
    shutil.rmtree(scratch, ignore_errors=True)
    counts = api.ingest([AZURE], warehouse=scratch)
    if not counts.ok:
        raise SystemExit(f"ingest failed: {counts.errors}")
    rows = api.query(
        "SELECT * EXCLUDE (date) FROM requests ORDER BY arrival_time", warehouse=scratch
    )
    reps = math.ceil(len(arr) / rows.height)
    rows = pl.concat([rows] * reps).head(len(arr))
    rows = rows.with_columns(
        pl.Series("request_id", [f"day-{i}" for i in range(len(arr))]),
        (pl.lit(BASE) + pl.duration(microseconds=pl.Series((arr * 1e6).astype(np.int64)))).alias(
            "arrival_time"
        ),
        pl.Series("arrival_s", arr),
    )
    path = out / "day.parquet"
    rows.write_parquet(path)
    shutil.rmtree(scratch, ignore_errors=True)
    per_window = shape * mean_rate
    return {
        "path": path,
        "requests": len(arr),
        "span_s": len(shape) * win,
        "peak_rate": float(per_window.max()),
        "trough_rate": float(per_window.min()),
        "idle_windows": int((rates == 0).sum()),
    }


def table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    out += ["| " + " | ".join(x) + " |" for x in lines]
    return "\n".join(out)


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.0f} ms" if v < 10 else f"{v:,.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--day", type=int, default=7, help="ServeGen day (0-13) [7: the busiest]")
    ap.add_argument("--mean-rate", type=float, default=10.0, help="the day's mean req/s")
    ap.add_argument("--compress", type=float, default=1.0, help="time compression of the day")
    ap.add_argument("--ttft-ms", type=float, default=500.0, help="the p99 TTFT SLO")
    ap.add_argument(
        "--targets", default="16,32,64", help="autoscale targets (outstanding requests per replica)"
    )
    ap.add_argument("--startups", default="30,120", help="start-up delays, s")
    ap.add_argument("--mins", default="1,2", help="min_replicas values")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="compress 576x (a 150 s day)")
    ap.add_argument("--out", type=Path, default=None, help="scratch folder [a temporary one]")
    args = ap.parse_args()
    compress = 576.0 if args.quick else args.compress
    out = args.out or Path(tempfile.mkdtemp(prefix="autoscale-study-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trace = make_trace(out, args.day, args.mean_rate, compress, args.seed)
    print(
        f"day {args.day} of ServeGen m-large (two clients' rates, 600 s windows) compressed "
        f"{compress:g}x to {trace['span_s']:,.0f} s; {trace['requests']:,} requests, mean "
        f"{args.mean_rate:g} req/s, peak window {trace['peak_rate']:.1f} req/s, trough "
        f"{trace['trough_rate']:.1f} req/s ({trace['idle_windows']} idle windows); lengths of "
        "the Azure conversation trace"
    )
    slos = parse_slos([f"ttft_p99={args.ttft_ms:g}ms"])
    base = {
        "name": "day",
        "policy": "vllm",
        "profile": "llama-3-8b_h100-80gb_tp1",
        "router": "least_outstanding",
        "drop_too_long": True,
    }
    targets = [float(x) for x in args.targets.split(",")]
    startups = [float(x) for x in args.startups.split(",")]
    mins = [int(x) for x in args.mins.split(",")]
    wh = out / "warehouse"
    rows: list[list[str]] = []

    def step(ctx: Any, result: Any) -> dict[str, Any]:
        search = result.searches[0]
        n = int(search.answer) if search.answer is not None else 16
        for lo, s, t in ((lo, s, t) for lo in mins for s in startups for t in targets):
            auto = {
                "min_replicas": lo,
                "max_replicas": 2 * n,
                "target": t,
                "interval_s": 30.0,
                "cooldown_s": 300.0,
                "startup_s": s,
            }
            values = {**base, "replicas": lo, "autoscale": auto}
            o = autoscaled_replay(ctx, values, None, name=f"auto-m{lo}-t{t:g}-s{s:g}")
            c = compare(search, o, slos)
            d = c.during_scale_ups
            key = slos[0].key
            rows.append(
                [
                    f"autoscaled, min {lo}, target {t:g}, start-up {s:g} s",
                    f"{c.autoscale['mean_active']:.2f} (peak {c.autoscale['peak_active']})",
                    f"{c.gpu_hours:.2f}",
                    f"{c.saved_share:+.0%}" if c.saved_share is not None else "-",
                    ms(c.slo[key]["measured_s"]),
                    "yes" if c.all_met else "no",
                    f"{c.autoscale['scale_ups']}/{c.autoscale['scale_downs']}",
                    f"{d.get('num_requests', 0):,}",
                    f"{(d.get('over_limit') or {}).get(key, 0):,}",
                ]
            )
        fixed_head.append(c)  # the last comparison carries the fixed figures
        return {}

    fixed_head: list[Any] = []
    result = run_capacity(
        wh,
        fixed_values(base),
        slos,
        [SearchSpec("replicas", lo=1, hi=64)],
        requests_file=trace["path"],
        summary_only=True,
        quiet=True,
        intervals=False,
        extra=step,
    )
    c = fixed_head[0]
    at = result.searches[0].answer_probe
    fixed_ttft = at.slo.measured_s[slos[0].key] if at is not None and at.slo else None
    rows.insert(
        0,
        [
            f"fixed, fewest meeting the SLO ({c.fixed_replicas})",
            f"{c.fixed_replicas}",
            f"{c.fixed_gpu_hours:.2f}" if c.fixed_gpu_hours is not None else "-",
            "0%",
            ms(fixed_ttft),
            "yes" if c.fixed_replicas is not None else "no",
            "-",
            "-",
            "-",
        ],
    )
    head = [
        "pool",
        "replicas (mean active)",
        "GPU-hours",
        "saved vs fixed",
        "p99 TTFT",
        f"meets {ms(args.ttft_ms / 1e3)}",
        "scale ups/downs",
        "arrived during scale-ups",
        "of those over the SLO",
    ]
    probed = [int(v) for v, _ in result.searches[0].result.probes]
    print(f"SLO: {slos[0]}; fixed search probes: {probed}")
    print(table(head, rows))
    print(
        f"\n{result.num_replays + len(targets) * len(startups) * len(mins)} replays in "
        f"{time.perf_counter() - t0:.0f} s (run {result.run_id}, scratch {out})"
    )


if __name__ == "__main__":
    main()
