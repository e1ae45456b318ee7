"""Replay speed and memory: the fast loop and the replay stage on 100k and 1M requests.

The trace has the Azure conversation trace's length distribution (lengths drawn
with replacement, seed 1) and Poisson arrivals at about 75% of the default
profile's capacity (measured first by a saturated replay). The scenario is
``vllm`` with chunked prefill on one Llama-3-8B/H100 replica, every step
recorded in the timeline (runs of identical decode steps as one row).

Figures (medians of 3 runs, each in a fresh process; peak RSS: the max):
- loop: simulated requests per second of ``simulate`` alone;
- stage: wall seconds of ``replay()``: read Parquet, run, write sim tables;
- process: the same including interpreter start, imports and loading the
  compiled loop from numba's cache;
- the whole Azure conversation trace through the stage;
- the fast loop against the reference loop on the first 2,000 requests of the
  Azure trace (the reference takes minutes on the whole trace).

Run from the repository root:

    .venv/bin/python bench/sim_speed.py            # all figures, writes bench/RESULTS.md
    .venv/bin/python bench/sim_speed.py --quick    # 100k only, prints, writes nothing

Targets (issue 3): loop >= 300,000 requests/s; stage <= 10 s for 1M; peak RSS
<= 2 GB; cost linear in requests; whole Azure conv trace <= 2 s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import child, record  # noqa: E402

OUT = ROOT / "bench" / "out" / "sim"
AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SCENARIO = {"policy": "vllm", "enable_chunked_prefill": True, "max_model_len": 16384}

# Runs in a child: warm the compiled loop on a tiny input, then measure.
PRELUDE = """
import numpy as np
from pathlib import Path
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput
sc = build_scenario({scenario!r})
simulate(SimInput(np.zeros(2), np.array([5, 5]), np.array([3, 3])), sc.engine())
"""

LOOP = (
    PRELUDE
    + """
from pipeline.sim.replay_input import read_requests, prepare
from pipeline.warehouse import Warehouse
from pipeline.contracts import REQUESTS
frame = read_requests(Warehouse(Path({wh!r})).files(REQUESTS))
prep = prepare(frame, sc)
t = time.perf_counter()
res = simulate(prep.inp, sc.engine())
loop_s = time.perf_counter() - t
out = {{"loop_s": loop_s, "requests_per_s": len(prep.inp) / loop_s,
        "steps": res.num_steps, "step_rows": len(res.st)}}
"""
)

STAGE = (
    PRELUDE
    + """
import shutil
from pipeline.sim.replay import replay
t = time.perf_counter()
result = replay(Path({wh!r}), [sc], quiet=True, run_id="bench")
stage_s = time.perf_counter() - t
shutil.rmtree(Path({wh!r}) / "sim_requests" / "run_id=bench")
shutil.rmtree(Path({wh!r}) / "sim_steps" / "run_id=bench")
s = result.runs[0].summary
out = {{"stage_s": stage_s, "completed": s["completed"],
        "request_throughput": s["request_throughput"], "ttft_p99_s": s["ttft_p99_s"]}}
"""
)

VERSUS_REFERENCE = (
    PRELUDE
    + """
import polars as pl
from pipeline.sim.reference import simulate_reference
from pipeline.sim.replay_input import prepare
df = pl.read_csv({azure!r}, n_rows={n}).select(
    pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f").alias("t"),
    pl.col("ContextTokens").alias("prompt_tokens"),
    pl.col("GeneratedTokens").alias("output_tokens"))
df = df.with_columns(
    ((pl.col("t") - pl.col("t").min()).dt.total_microseconds() / 1e6).alias("arrival_s"),
    pl.lit(None, pl.Int32).alias("max_tokens"),
    pl.int_range(pl.len()).cast(pl.String).alias("request_id"))
prep = prepare(df, sc)
t = time.perf_counter(); fast = simulate(prep.inp, sc.engine()); fast_s = time.perf_counter() - t
t = time.perf_counter(); ref = simulate_reference(prep.inp, sc); ref_s = time.perf_counter() - t
same = bool(np.allclose(fast.rqf, ref.rqf, rtol=1e-9, equal_nan=True) and (fast.rq == ref.rq).all())
out = {{"fast_s": fast_s, "reference_s": ref_s, "speedup": ref_s / fast_s, "same": float(same),
        "steps": fast.num_steps}}
"""
)


def azure_lengths() -> tuple[object, object]:
    import polars as pl

    df = pl.read_csv(AZURE)
    return df["ContextTokens"].to_numpy(), df["GeneratedTokens"].to_numpy()


def capacity() -> float:
    """Requests per second the scenario sustains when saturated (20k Azure-length requests)."""
    import numpy as np

    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate
    from pipeline.sim.state import SimInput
    from pipeline.sim.summary import summarize

    prompt, output = azure_lengths()
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(prompt), 20_000)
    inp = SimInput(np.zeros(len(idx)), prompt[idx].astype(np.int64), output[idx].astype(np.int64))
    res = simulate(inp, build_scenario(SCENARIO).engine())
    return float(summarize(res)["request_throughput"])


def make_warehouse(n: int, rate: float) -> Path:
    """A warehouse with n requests: Azure lengths, Poisson arrivals at ``rate``."""
    from datetime import UTC, datetime

    import numpy as np
    import polars as pl

    from pipeline.contracts import REQUESTS
    from pipeline.warehouse import Warehouse

    wh = OUT / f"wh_{n}_{rate:g}"  # (the rate too: benches ask for the same size at others)
    if (wh / "requests").exists():
        return wh
    prompt, output = azure_lengths()
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(prompt), n)
    arrival_us = np.cumsum(rng.exponential(1e6 / rate, n)).astype(np.int64)
    start = int(datetime(2024, 5, 1, tzinfo=UTC).timestamp() * 1e6)
    frame = pl.DataFrame(
        {
            "request_id": pl.Series(np.arange(n)).cast(pl.String),
            "arrival_time": pl.Series(start + arrival_us).cast(pl.Datetime("us", "UTC")),
            "arrival_s": arrival_us / 1e6,
            "prompt_tokens": prompt[idx].astype(np.int32),
            "output_tokens": output[idx].astype(np.int32),
        }
    ).with_columns(
        pl.lit(None, pl.Int32).alias("max_tokens"),
        pl.lit(None, pl.Int32).alias("block_size"),
        pl.lit([], pl.List(pl.UInt64)).alias("prefix_hashes"),
        *[pl.lit(None, pl.String).alias(c) for c in ("model", "tenant", "session_id", "parent_id")],
        pl.lit(None, pl.Int32).alias("priority"),
        pl.lit(None, pl.Int32).alias("turn"),
        *[
            pl.lit(None, pl.Float64).alias(c)
            for c in ("observed_ttft_s", "observed_e2e_s", "observed_queue_s")
        ],
        pl.lit(None, pl.Int32).alias("cached_tokens"),
        pl.lit("bench").alias("source_format"),
        pl.lit("bench").alias("source_file"),
        pl.int_range(1, n + 1, dtype=pl.Int64).alias("source_line"),
    )
    Warehouse(wh).write(REQUESTS, frame.to_arrow(), {"date": "2024-05-01"}, "src-bench")
    return wh


def azure_warehouse() -> Path:
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.warehouse import Warehouse

    wh = OUT / "wh_azure_conv"
    if not (wh / "requests").exists():
        ingest_logs([str(AZURE)], Warehouse(wh), IngestOptions(quiet=True))
    return wh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k only; print, do not record")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    cap = capacity()
    rate = 0.75 * cap
    print(f"capacity {cap:.1f} req/s; Poisson arrivals at {rate:.1f} req/s", flush=True)
    rows = []
    sizes = [100_000] if args.quick else [100_000, 1_000_000]
    for n in sizes:
        wh = make_warehouse(n, rate)
        loop = child(LOOP.format(scenario=SCENARIO, wh=str(wh)))
        stage = child(STAGE.format(scenario=SCENARIO, wh=str(wh)))
        rows.append((n, loop, stage))
        print(
            f"{n:>9,}: loop {loop['requests_per_s']:,.0f} req/s ({loop['loop_s']:.2f} s, "
            f"{loop['steps']:,.0f} steps in {loop['step_rows']:,.0f} rows); stage "
            f"{stage['stage_s']:.2f} s, process {stage['wall_s']:.2f} s, "
            f"peak RSS {max(loop['peak_rss_mb'], stage['peak_rss_mb']):,.0f} MB",
            flush=True,
        )
    azure = child(STAGE.format(scenario={**SCENARIO}, wh=str(azure_warehouse())))
    print(
        f"Azure conv (19,366 requests): stage {azure['stage_s']:.2f} s, process "
        f"{azure['wall_s']:.2f} s",
        flush=True,
    )
    versus = child(VERSUS_REFERENCE.format(scenario=SCENARIO, azure=str(AZURE), n=2000), repeats=1)
    print(
        f"fast vs reference, first 2,000 Azure requests: {versus['speedup']:,.0f}x "
        f"({versus['fast_s'] * 1e3:.1f} ms vs {versus['reference_s']:.1f} s), "
        f"same results: {bool(versus['same'])}",
        flush=True,
    )
    if args.quick:
        return
    lines = [
        "Scenario: `vllm`, chunked prefill, 1 replica, profile llama-3-8b_h100-80gb_tp1; "
        f"Azure-conv lengths, Poisson arrivals at {rate:.1f} req/s (75% of the "
        f"{cap:.1f} req/s the scenario sustains saturated). Medians of 3 fresh processes.",
        "",
        "| requests | loop req/s | loop s | steps (rows) | stage s | process s | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, loop, stage in rows:
        lines.append(
            f"| {n:,} | {loop['requests_per_s']:,.0f} | {loop['loop_s']:.2f} | "
            f"{loop['steps']:,.0f} ({loop['step_rows']:,.0f}) | {stage['stage_s']:.2f} | "
            f"{stage['wall_s']:.2f} | {max(loop['peak_rss_mb'], stage['peak_rss_mb']):,.0f} |"
        )
    (n0, l0, _), (n1, l1, _) = rows[0], rows[-1]
    lines += [
        "",
        f"Cost per request, 1M vs 100k: {(l1['loop_s'] / n1) / (l0['loop_s'] / n0):.2f}x "
        "(1.00 = linear).",
        "",
        f"Whole Azure conversation trace (19,366 requests, its own timestamps): stage "
        f"{azure['stage_s']:.2f} s, process {azure['wall_s']:.2f} s, peak RSS "
        f"{azure['peak_rss_mb']:,.0f} MB.",
        "",
        f"Fast loop vs reference loop on the first 2,000 Azure requests (the reference "
        f"takes minutes on the whole trace): {versus['speedup']:,.0f}x "
        f"({versus['fast_s'] * 1e3:.1f} ms vs {versus['reference_s']:.1f} s), identical "
        f"results: {'yes' if versus['same'] else 'NO'}.",
        "",
        "Targets: loop >= 300,000 req/s; stage <= 10 s for 1M; peak RSS <= 2 GB; whole "
        "Azure conv <= 2 s.",
    ]
    record("Simulator", ".venv/bin/python bench/sim_speed.py", "\n".join(lines))
    print("recorded in bench/RESULTS.md")


if __name__ == "__main__":
    main()
